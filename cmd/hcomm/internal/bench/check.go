package bench

import (
	"encoding/binary"
	"math"

	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/internal/reduce"
)

// value is one element in the reference computation: integer types are
// carried in int64 (wrapping like the kernels: two's complement sum and
// product commute with truncation), floating-point types in float64 (the
// inputs are small integers, so every partial result is exact in every
// float type and the order of reduction does not matter).
type value struct {
	i int64
	f float64
}

// input is element j of rank r's input: a deterministic small integer
// (-2..2, or 1..4 for unsigned types, so that products do not vanish).
func input(dt hcomm.DataType, r int, j int64) value {
	v := (j*7 + int64(r)*3 + j/5) % 5
	if isUnsigned(dt) {
		if v == 0 {
			v = 1
		}
	} else {
		v -= 2
	}
	return value{i: v, f: float64(v)}
}

func isUnsigned(dt hcomm.DataType) bool {
	return dt == hcomm.Uint8 || dt == hcomm.Uint16 || dt == hcomm.Uint32 || dt == hcomm.Uint64
}

// folder returns the reduction of values in rank order with op.
func folder(dt hcomm.DataType, op hcomm.ReduceOp) func([]value) value {
	return func(vs []value) value {
		acc := vs[0]
		for _, v := range vs[1:] {
			switch op {
			case hcomm.Sum:
				acc.i += v.i
				acc.f += v.f
			case hcomm.Prod:
				acc.i *= v.i
				acc.f *= v.f
			case hcomm.Max:
				acc.i, acc.f = max(acc.i, v.i), max(acc.f, v.f)
			case hcomm.Min:
				acc.i, acc.f = min(acc.i, v.i), min(acc.f, v.f)
			}
		}
		return acc
	}
}

// encode writes v as one element of dt at b.
func encode(b []byte, dt hcomm.DataType, v value) {
	le := binary.LittleEndian
	switch dt {
	case hcomm.Int8, hcomm.Uint8:
		b[0] = byte(v.i)
	case hcomm.Int16, hcomm.Uint16:
		le.PutUint16(b, uint16(v.i))
	case hcomm.Int32, hcomm.Uint32:
		le.PutUint32(b, uint32(v.i))
	case hcomm.Int64, hcomm.Uint64:
		le.PutUint64(b, uint64(v.i))
	case hcomm.Float16:
		le.PutUint16(b, reduce.Float32ToFloat16(float32(v.f)))
	case hcomm.BFloat16:
		le.PutUint16(b, reduce.Float32ToBFloat16(float32(v.f)))
	case hcomm.Float32:
		le.PutUint32(b, math.Float32bits(float32(v.f)))
	case hcomm.Float64:
		le.PutUint64(b, math.Float64bits(v.f))
	}
}

// decode reads one element of dt at b.
func decode(b []byte, dt hcomm.DataType) value {
	le := binary.LittleEndian
	var v value
	switch dt {
	case hcomm.Int8:
		v.i = int64(int8(b[0]))
	case hcomm.Uint8:
		v.i = int64(b[0])
	case hcomm.Int16:
		v.i = int64(int16(le.Uint16(b)))
	case hcomm.Uint16:
		v.i = int64(le.Uint16(b))
	case hcomm.Int32:
		v.i = int64(int32(le.Uint32(b)))
	case hcomm.Uint32:
		v.i = int64(le.Uint32(b))
	case hcomm.Int64, hcomm.Uint64:
		v.i = int64(le.Uint64(b))
	case hcomm.Float16:
		v.f = float64(reduce.Float16ToFloat32(le.Uint16(b)))
	case hcomm.BFloat16:
		v.f = float64(reduce.BFloat16ToFloat32(le.Uint16(b)))
	case hcomm.Float32:
		v.f = float64(math.Float32frombits(le.Uint32(b)))
	case hcomm.Float64:
		v.f = math.Float64frombits(le.Uint64(b))
	}
	return v
}

// fill writes rank r's input pattern for count elements of dt into b.
func fill(b []byte, dt hcomm.DataType, r int, count int64) {
	es := int64(dt.Size())
	for j := int64(0); j < count; j++ {
		encode(b[j*es:], dt, input(dt, r, j))
	}
}

// countWrong compares out (count elements of dt) with want(i) and returns the
// number of elements that differ. want's value is first rounded to dt
// (encoded and decoded), so that integer wrap-around and float rounding match
// what the kernels store; floats compare by value (-0 == +0).
func countWrong(out []byte, dt hcomm.DataType, count int64, want func(i int64) value) int64 {
	es := int64(dt.Size())
	var tmp [8]byte
	var wrong int64
	for i := int64(0); i < count; i++ {
		encode(tmp[:], dt, want(i))
		w := decode(tmp[:], dt)
		g := decode(out[i*es:], dt)
		if dt.IsFloat() {
			if g.f != w.f {
				wrong++
			}
		} else if g.i != w.i {
			wrong++
		}
	}
	return wrong
}
