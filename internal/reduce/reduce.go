package reduce

import (
	"fmt"
	"math"
	"math/bits"
	"unsafe"
)

// Reduce computes dst[i] = dst[i] op src[i] for count elements of dt. dst and
// src are raw little-endian element buffers of at least count*dt.Size() bytes.
// It never panics: a bad type, op, count, short buffer or partial overlap of
// dst and src is an error naming it.
func Reduce(dst, src []byte, count int, dt DataType, op Op) error {
	if err := check(dst, dst, src, count, dt, op, "Reduce", "src"); err != nil {
		return err
	}
	reduce3(dst, dst, src, count, dt, op, pathAccel)
	return nil
}

// Reduce3 computes dst[i] = a[i] op b[i] for count elements of dt. dst may be
// exactly a or b (same start), but must not partially overlap them.
func Reduce3(dst, a, b []byte, count int, dt DataType, op Op) error {
	if err := check(dst, a, b, count, dt, op, "Reduce3", "a"); err != nil {
		return err
	}
	reduce3(dst, a, b, count, dt, op, pathAccel)
	return nil
}

func check(dst, a, b []byte, count int, dt DataType, op Op, fn, aName string) error {
	if !dt.Valid() {
		return fmt.Errorf("reduce.%s: unsupported data type %v", fn, dt)
	}
	if !op.Valid() {
		return fmt.Errorf("reduce.%s: unsupported reduce op %v", fn, op)
	}
	if count < 0 {
		return fmt.Errorf("reduce.%s: negative count %d", fn, count)
	}
	es := dt.Size()
	// A product's high word, not a division (a 64-bit divide is tens of
	// cycles, and every reduction of a small collective passes here).
	if hi, lo := bits.Mul64(uint64(count), uint64(es)); hi != 0 || lo > math.MaxInt {
		return fmt.Errorf("reduce.%s: count %d of %v overflows", fn, count, dt)
	}
	n := count * es
	if len(dst) < n || len(a) < n || len(b) < n {
		if fn == "Reduce" {
			return fmt.Errorf("reduce.%s: %d %v elements (%v) need %d bytes; dst has %d, src %d",
				fn, count, dt, op, n, len(dst), len(b))
		}
		return fmt.Errorf("reduce.%s: %d %v elements (%v) need %d bytes; dst has %d, a %d, b %d",
			fn, count, dt, op, n, len(dst), len(a), len(b))
	}
	if partialOverlap(dst[:n], a[:n]) {
		return fmt.Errorf("reduce.%s: dst and %s partially overlap", fn, aName)
	}
	if partialOverlap(dst[:n], b[:n]) {
		bName := "b"
		if fn == "Reduce" {
			bName = "src"
		}
		return fmt.Errorf("reduce.%s: dst and %s partially overlap", fn, bName)
	}
	return nil
}

// PartialOverlap reports whether x and y share memory without starting at
// the same address: what Reduce and Reduce3 refuse between dst and a source.
func PartialOverlap(x, y []byte) bool { return partialOverlap(x, y) }

// partialOverlap reports whether x and y share memory without starting at
// the same address.
func partialOverlap(x, y []byte) bool {
	if len(x) == 0 || len(y) == 0 {
		return false
	}
	px := uintptr(unsafe.Pointer(unsafe.SliceData(x)))
	py := uintptr(unsafe.Pointer(unsafe.SliceData(y)))
	return px != py && px < py+uintptr(len(y)) && py < px+uintptr(len(x))
}

// path selects an implementation: tests and benchmarks compare them.
type path int

const (
	pathAccel   path = iota // vector kernels where there are some, Go loops for the rest
	pathGo                  // the Go loops only
	pathChunked             // the Go loops through copied chunks (as on big-endian machines)
)

// smallBytes bounds the reductions reduceSmall takes: below the vector
// kernels' 32 bytes, where the portable kernels would run anyway.
const smallBytes = 32

// reduceSmall reduces a few elements of the common types with loops typed
// at compile time, reporting whether it did: for the 16 bytes of a small
// all-reduce, looking a kernel up and calling it through a function value
// costs several times the work. It computes what the portable kernels
// compute, bit for bit but for a NaN's payload, as the vector kernels do
// (TestReduceSmall).
func reduceSmall(dst, a, b []byte, count int, dt DataType, op Op) bool {
	switch dt {
	case Float32:
		smallSlices(view[float32](dst, count), view[float32](a, count), view[float32](b, count), op)
	case Float64:
		smallSlices(view[float64](dst, count), view[float64](a, count), view[float64](b, count), op)
	case Int32:
		smallSlices(view[int32](dst, count), view[int32](a, count), view[int32](b, count), op)
	case Int64:
		smallSlices(view[int64](dst, count), view[int64](a, count), view[int64](b, count), op)
	default:
		return false
	}
	return true
}

func smallSlices[T element](d, x, y []T, op Op) {
	x, y = x[:len(d)], y[:len(d)]
	switch op {
	case Sum:
		for i := range d {
			d[i] = x[i] + y[i]
		}
	case Prod:
		for i := range d {
			d[i] = x[i] * y[i]
		}
	case Max:
		for i := range d {
			d[i] = fmax(x[i], y[i])
		}
	case Min:
		for i := range d {
			d[i] = fmin(x[i], y[i])
		}
	}
}

// reduce3 does the work of Reduce3 on validated arguments.
func reduce3(dst, a, b []byte, count int, dt DataType, op Op, p path) {
	if count == 0 {
		return
	}
	es := dt.Size()
	n := count * es
	dst, a, b = dst[:n:n], a[:n:n], b[:n:n]
	chunked := p == pathChunked
	if directView && !chunked && n < smallBytes && reduceSmall(dst, a, b, count, dt, op) {
		return
	}
	if p == pathAccel {
		lo, hi := accelerate(dst, a, b, dt, op)
		if lo < hi {
			reduceGeneric(dst[:lo], a[:lo], b[:lo], lo/es, dt, op, chunked)
			reduceGeneric(dst[hi:], a[hi:], b[hi:], (n-hi)/es, dt, op, chunked)
			return
		}
	}
	reduceGeneric(dst, a, b, count, dt, op, chunked)
}
