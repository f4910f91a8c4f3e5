package reduce

import (
	"math"
	"sync"
)

// The portable kernels. Each computes d[i] = x[i] op y[i] over typed slices
// of equal length; run (view.go) feeds them the byte buffers. On amd64 they
// give bit-for-bit the results of the assembly kernels, NaN payloads aside.

type integer interface {
	~int8 | ~int16 | ~int32 | ~int64 | ~uint8 | ~uint16 | ~uint32 | ~uint64
}

type float interface{ ~float32 | ~float64 }

type element interface{ integer | float }

// reduceGeneric computes dst = a op b for count elements of dt in Go.
// chunked forces the copying element access (see run).
func reduceGeneric(dst, a, b []byte, count int, dt DataType, op Op, chunked bool) {
	if count <= 0 || op < Sum || op > Min {
		return
	}
	switch dt {
	case Int8:
		run(dst, a, b, count, kernelsInt8[op], chunked)
	case Uint8:
		run(dst, a, b, count, kernelsUint8[op], chunked)
	case Int16:
		run(dst, a, b, count, kernelsInt16[op], chunked)
	case Uint16:
		run(dst, a, b, count, kernelsUint16[op], chunked)
	case Int32:
		run(dst, a, b, count, kernelsInt32[op], chunked)
	case Uint32:
		run(dst, a, b, count, kernelsUint32[op], chunked)
	case Int64:
		run(dst, a, b, count, kernelsInt64[op], chunked)
	case Uint64:
		run(dst, a, b, count, kernelsUint64[op], chunked)
	case Float32:
		run(dst, a, b, count, kernelsFloat32[op], chunked)
	case Float64:
		run(dst, a, b, count, kernelsFloat64[op], chunked)
	case Float16:
		run(dst, a, b, count, kernelsFloat16[op], chunked)
	case BFloat16:
		run(dst, a, b, count, kernelsBFloat16[op], chunked)
	}
}

// The kernels of each type, by Op, made once: a generic function used as a
// value is a closure allocated where it is used, and a small reduction (the
// one-shot all-reduce of a few bytes) should allocate nothing.
var (
	kernelsInt8     = intKernels[int8]()
	kernelsUint8    = intKernels[uint8]()
	kernelsInt16    = intKernels[int16]()
	kernelsUint16   = intKernels[uint16]()
	kernelsInt32    = intKernels[int32]()
	kernelsUint32   = intKernels[uint32]()
	kernelsInt64    = intKernels[int64]()
	kernelsUint64   = intKernels[uint64]()
	kernelsFloat32  = floatKernels[float32]()
	kernelsFloat64  = floatKernels[float64]()
	kernelsFloat16  = [4]func(d, x, y []uint16){Sum: addF16Go, Prod: mulF16Go, Max: maxF16Go, Min: minF16Go}
	kernelsBFloat16 = [4]func(d, x, y []uint16){Sum: addBF16Go, Prod: mulBF16Go, Max: maxBF16Go, Min: minBF16Go}
)

func intKernels[T integer]() [4]func(d, x, y []T) {
	return [4]func(d, x, y []T){Sum: addSlices[T], Prod: mulSlices[T], Max: maxInts[T], Min: minInts[T]}
}

func floatKernels[T float]() [4]func(d, x, y []T) {
	return [4]func(d, x, y []T){Sum: addSlices[T], Prod: mulSlices[T], Max: maxFloats[T], Min: minFloats[T]}
}

// addSlices is unrolled by four, which keeps four independent adds in flight
// and lets the compiler drop most bounds checks.
func addSlices[T element](d, x, y []T) {
	x, y = x[:len(d)], y[:len(d)]
	i := 0
	for ; i+4 <= len(d); i += 4 {
		dd, xx, yy := d[i:i+4:i+4], x[i:i+4:i+4], y[i:i+4:i+4]
		dd[0] = xx[0] + yy[0]
		dd[1] = xx[1] + yy[1]
		dd[2] = xx[2] + yy[2]
		dd[3] = xx[3] + yy[3]
	}
	for ; i < len(d); i++ {
		d[i] = x[i] + y[i]
	}
}

func mulSlices[T element](d, x, y []T) {
	x, y = x[:len(d)], y[:len(d)]
	i := 0
	for ; i+4 <= len(d); i += 4 {
		dd, xx, yy := d[i:i+4:i+4], x[i:i+4:i+4], y[i:i+4:i+4]
		dd[0] = xx[0] * yy[0]
		dd[1] = xx[1] * yy[1]
		dd[2] = xx[2] * yy[2]
		dd[3] = xx[3] * yy[3]
	}
	for ; i < len(d); i++ {
		d[i] = x[i] * y[i]
	}
}

func maxInts[T integer](d, x, y []T) {
	x, y = x[:len(d)], y[:len(d)]
	for i := range d {
		d[i] = max(x[i], y[i])
	}
}

func minInts[T integer](d, x, y []T) {
	x, y = x[:len(d)], y[:len(d)]
	for i := range d {
		d[i] = min(x[i], y[i])
	}
}

// maxFloats: NaN if either is NaN (p+q, the NaN the vector kernels produce
// too), else the larger, with -0 < +0 (Go's max).
func maxFloats[T float](d, x, y []T) {
	x, y = x[:len(d)], y[:len(d)]
	for i := range d {
		d[i] = fmax(x[i], y[i])
	}
}

func minFloats[T float](d, x, y []T) {
	x, y = x[:len(d)], y[:len(d)]
	for i := range d {
		d[i] = fmin(x[i], y[i])
	}
}

// fmax and fmin are max and min with a NaN operand giving a NaN (p+q). For
// an integer type the NaN test is never true and they are max and min.
func fmax[T element](p, q T) T {
	if p != p || q != q {
		return p + q
	}
	return max(p, q)
}

func fmin[T element](p, q T) T {
	if p != p || q != q {
		return p + q
	}
	return min(p, q)
}

// f16Table maps every fp16 bit pattern to its float32 value (256 KiB, built
// on first use).
var f16Table = sync.OnceValue(func() *[1 << 16]float32 {
	t := new([1 << 16]float32)
	for i := range t {
		t[i] = Float16ToFloat32(uint16(i))
	}
	return t
})

func addF16Go(d, x, y []uint16) {
	t := f16Table()
	x, y = x[:len(d)], y[:len(d)]
	for i := range d {
		b := math.Float32bits(t[x[i]] + t[y[i]])
		h, ok := float32ToFloat16Normal(b) // Float32ToFloat16, common case inlined
		if !ok {
			h = float32ToFloat16Slow(b)
		}
		d[i] = h
	}
}

func mulF16Go(d, x, y []uint16) {
	t := f16Table()
	x, y = x[:len(d)], y[:len(d)]
	for i := range d {
		b := math.Float32bits(t[x[i]] * t[y[i]])
		h, ok := float32ToFloat16Normal(b) // Float32ToFloat16, common case inlined
		if !ok {
			h = float32ToFloat16Slow(b)
		}
		d[i] = h
	}
}

func maxF16Go(d, x, y []uint16) {
	t := f16Table()
	x, y = x[:len(d)], y[:len(d)]
	for i := range d {
		b := math.Float32bits(fmax(t[x[i]], t[y[i]]))
		h, ok := float32ToFloat16Normal(b) // Float32ToFloat16, common case inlined
		if !ok {
			h = float32ToFloat16Slow(b)
		}
		d[i] = h
	}
}

func minF16Go(d, x, y []uint16) {
	t := f16Table()
	x, y = x[:len(d)], y[:len(d)]
	for i := range d {
		b := math.Float32bits(fmin(t[x[i]], t[y[i]]))
		h, ok := float32ToFloat16Normal(b) // Float32ToFloat16, common case inlined
		if !ok {
			h = float32ToFloat16Slow(b)
		}
		d[i] = h
	}
}

func addBF16Go(d, x, y []uint16) {
	x, y = x[:len(d)], y[:len(d)]
	for i := range d {
		d[i] = Float32ToBFloat16(BFloat16ToFloat32(x[i]) + BFloat16ToFloat32(y[i]))
	}
}

func mulBF16Go(d, x, y []uint16) {
	x, y = x[:len(d)], y[:len(d)]
	for i := range d {
		d[i] = Float32ToBFloat16(BFloat16ToFloat32(x[i]) * BFloat16ToFloat32(y[i]))
	}
}

func maxBF16Go(d, x, y []uint16) {
	x, y = x[:len(d)], y[:len(d)]
	for i := range d {
		d[i] = Float32ToBFloat16(fmax(BFloat16ToFloat32(x[i]), BFloat16ToFloat32(y[i])))
	}
}

func minBF16Go(d, x, y []uint16) {
	x, y = x[:len(d)], y[:len(d)]
	for i := range d {
		d[i] = Float32ToBFloat16(fmin(BFloat16ToFloat32(x[i]), BFloat16ToFloat32(y[i])))
	}
}
