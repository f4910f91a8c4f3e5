package reduce

import (
	"fmt"
	"math"
	"unsafe"
)

// Reduce computes dst[i] = dst[i] op src[i] for count elements of dt. It never
// panics: a bad type, op, count or short buffer is an error naming it.
func Reduce(dst, src []byte, count int, dt DataType, op Op) error {
	return Reduce3(dst, dst, src, count, dt, op)
}

// Reduce3 computes dst[i] = a[i] op b[i]. dst may alias a or b exactly, but must
// not partially overlap them.
func Reduce3(dst, a, b []byte, count int, dt DataType, op Op) error {
	if !dt.Valid() {
		return fmt.Errorf("reduce: unsupported data type %v", dt)
	}
	if !op.Valid() {
		return fmt.Errorf("reduce: unsupported op %v", op)
	}
	if count < 0 {
		return fmt.Errorf("reduce: negative count %d", count)
	}
	n := count * dt.Size()
	if len(dst) < n || len(a) < n || len(b) < n {
		return fmt.Errorf("reduce: %d %v elements need %d bytes; dst has %d, a %d, b %d", count, dt, n, len(dst), len(a), len(b))
	}
	if count == 0 {
		return nil
	}
	switch dt {
	case Int8:
		ints(view[int8](dst, count), view[int8](a, count), view[int8](b, count), op)
	case Uint8:
		ints(view[uint8](dst, count), view[uint8](a, count), view[uint8](b, count), op)
	case Int16:
		ints(view[int16](dst, count), view[int16](a, count), view[int16](b, count), op)
	case Uint16:
		ints(view[uint16](dst, count), view[uint16](a, count), view[uint16](b, count), op)
	case Int32:
		ints(view[int32](dst, count), view[int32](a, count), view[int32](b, count), op)
	case Uint32:
		ints(view[uint32](dst, count), view[uint32](a, count), view[uint32](b, count), op)
	case Int64:
		ints(view[int64](dst, count), view[int64](a, count), view[int64](b, count), op)
	case Uint64:
		ints(view[uint64](dst, count), view[uint64](a, count), view[uint64](b, count), op)
	case Float32:
		floats(view[float32](dst, count), view[float32](a, count), view[float32](b, count), op)
	case Float64:
		floats(view[float64](dst, count), view[float64](a, count), view[float64](b, count), op)
	case Float16:
		halfs(view[uint16](dst, count), view[uint16](a, count), view[uint16](b, count), op, Float16ToFloat32, Float32ToFloat16)
	case BFloat16:
		halfs(view[uint16](dst, count), view[uint16](a, count), view[uint16](b, count), op, BFloat16ToFloat32, Float32ToBFloat16)
	}
	return nil
}

// view reinterprets b as count elements of T. x86-64 and arm64 load unaligned
// elements correctly, which is all hcomm runs on.
func view[T any](b []byte, count int) []T {
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), count)
}

type integer interface {
	~int8 | ~int16 | ~int32 | ~int64 | ~uint8 | ~uint16 | ~uint32 | ~uint64
}

func ints[T integer](d, a, b []T, op Op) {
	b = b[:len(d)]
	a = a[:len(d)]
	switch op {
	case Sum:
		for i := range d {
			d[i] = a[i] + b[i]
		}
	case Prod:
		for i := range d {
			d[i] = a[i] * b[i]
		}
	case Max:
		for i := range d {
			d[i] = max(a[i], b[i])
		}
	case Min:
		for i := range d {
			d[i] = min(a[i], b[i])
		}
	}
}

func floats[T float32 | float64](d, a, b []T, op Op) {
	b = b[:len(d)]
	a = a[:len(d)]
	switch op {
	case Sum:
		sumFloats(d, a, b)
	case Prod:
		for i := range d {
			d[i] = a[i] * b[i]
		}
	case Max: // Go's max returns NaN when either is NaN
		for i := range d {
			d[i] = max(a[i], b[i])
		}
	case Min:
		for i := range d {
			d[i] = min(a[i], b[i])
		}
	}
}

// sumFloats is unrolled by four: it lets the compiler keep four independent
// adds in flight.
func sumFloats[T float32 | float64](d, a, b []T) {
	i := 0
	for ; i+4 <= len(d); i += 4 {
		x, y, z := d[i:i+4:i+4], a[i:i+4:i+4], b[i:i+4:i+4]
		x[0] = y[0] + z[0]
		x[1] = y[1] + z[1]
		x[2] = y[2] + z[2]
		x[3] = y[3] + z[3]
	}
	for ; i < len(d); i++ {
		d[i] = a[i] + b[i]
	}
}

func halfs(d, a, b []uint16, op Op, to func(uint16) float32, from func(float32) uint16) {
	b = b[:len(d)]
	a = a[:len(d)]
	for i := range d {
		x, y := to(a[i]), to(b[i])
		var r float32
		switch op {
		case Sum:
			r = x + y
		case Prod:
			r = x * y
		case Max:
			r = max(x, y)
		case Min:
			r = min(x, y)
		}
		d[i] = from(r)
	}
}

var _ = math.NaN
