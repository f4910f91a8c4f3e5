package reduce

import (
	"math"
	"math/rand/v2"
	"testing"
)

// ref computes one element the naive way, in float64 for floats and in the
// type itself (wrapping) for integers.
func refElem(dt DataType, op Op, a, b []byte) []byte {
	out := make([]byte, dt.Size())
	f := func(x, y float64) float64 {
		switch op {
		case Sum:
			return x + y
		case Prod:
			return x * y
		case Max:
			if math.IsNaN(x) || math.IsNaN(y) {
				return math.NaN()
			}
			return math.Max(x, y)
		}
		if math.IsNaN(x) || math.IsNaN(y) {
			return math.NaN()
		}
		return math.Min(x, y)
	}
	switch dt {
	case Float32:
		x, y := view[float32](a, 1)[0], view[float32](b, 1)[0]
		view[float32](out, 1)[0] = float32(f(float64(x), float64(y)))
	case Float64:
		x, y := view[float64](a, 1)[0], view[float64](b, 1)[0]
		view[float64](out, 1)[0] = f(x, y)
	case Float16:
		x, y := Float16ToFloat32(view[uint16](a, 1)[0]), Float16ToFloat32(view[uint16](b, 1)[0])
		view[uint16](out, 1)[0] = Float32ToFloat16(float32(f(float64(x), float64(y))))
	case BFloat16:
		x, y := BFloat16ToFloat32(view[uint16](a, 1)[0]), BFloat16ToFloat32(view[uint16](b, 1)[0])
		view[uint16](out, 1)[0] = Float32ToBFloat16(float32(f(float64(x), float64(y))))
	default:
		// integers: operate on the sign-extended value and truncate (wraps as C does)
		var x, y int64
		for i := dt.Size() - 1; i >= 0; i-- {
			x = x<<8 | int64(a[i])
			y = y<<8 | int64(b[i])
		}
		shift := 64 - 8*dt.Size()
		signed := dt == Int8 || dt == Int16 || dt == Int32 || dt == Int64
		if signed && shift > 0 {
			x, y = x<<shift>>shift, y<<shift>>shift
		}
		var r int64
		switch op {
		case Sum:
			r = x + y
		case Prod:
			r = x * y
		case Max, Min:
			less := x < y
			if !signed {
				less = uint64(x) < uint64(y)
			}
			if (op == Max) == less {
				r = y
			} else {
				r = x
			}
		}
		for i := 0; i < dt.Size(); i++ {
			out[i] = byte(r >> (8 * i))
		}
	}
	return out
}

func same(dt DataType, x, y []byte) bool {
	if dt.IsFloat() {
		var a, b float64
		switch dt {
		case Float32:
			a, b = float64(view[float32](x, 1)[0]), float64(view[float32](y, 1)[0])
		case Float64:
			a, b = view[float64](x, 1)[0], view[float64](y, 1)[0]
		case Float16:
			a, b = float64(Float16ToFloat32(view[uint16](x, 1)[0])), float64(Float16ToFloat32(view[uint16](y, 1)[0]))
		case BFloat16:
			a, b = float64(BFloat16ToFloat32(view[uint16](x, 1)[0])), float64(BFloat16ToFloat32(view[uint16](y, 1)[0]))
		}
		if math.IsNaN(a) || math.IsNaN(b) {
			return math.IsNaN(a) && math.IsNaN(b)
		}
	}
	return string(x) == string(y)
}

func TestReduceEveryTypeAndOp(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, dt := range DataTypes() {
		for _, op := range Ops() {
			for _, count := range []int{0, 1, 2, 3, 7, 8, 15, 16, 17, 31, 33, 63, 65, 127, 1023, 4099} {
				es := dt.Size()
				a := make([]byte, count*es+1)[1:] // unaligned on purpose
				b := make([]byte, count*es)
				for i := range a {
					a[i] = byte(rng.Uint32())
					b[i] = byte(rng.Uint32())
				}
				if dt.IsFloat() && count > 4 { // some specials
					switch dt {
					case Float32:
						view[float32](a, count)[1] = float32(math.NaN())
						view[float32](b, count)[2] = float32(math.Inf(-1))
					case Float64:
						view[float64](a, count)[1] = math.NaN()
						view[float64](b, count)[2] = math.Copysign(0, -1)
					}
				}
				want := make([]byte, count*es)
				for i := 0; i < count; i++ {
					copy(want[i*es:], refElem(dt, op, a[i*es:(i+1)*es], b[i*es:(i+1)*es]))
				}
				dst := append([]byte(nil), a...)
				if err := Reduce(dst, b, count, dt, op); err != nil {
					t.Fatal(err)
				}
				out3 := make([]byte, count*es)
				if err := Reduce3(out3, a, b, count, dt, op); err != nil {
					t.Fatal(err)
				}
				for i := 0; i < count; i++ {
					if !same(dt, dst[i*es:(i+1)*es], want[i*es:(i+1)*es]) || !same(dt, out3[i*es:(i+1)*es], want[i*es:(i+1)*es]) {
						t.Fatalf("%v %v count %d element %d: got %x / %x, want %x", dt, op, count, i,
							dst[i*es:(i+1)*es], out3[i*es:(i+1)*es], want[i*es:(i+1)*es])
					}
				}
			}
		}
	}
}

func TestReduceErrors(t *testing.T) {
	b := make([]byte, 16)
	for _, c := range []struct {
		dst, src []byte
		count    int
		dt       DataType
		op       Op
	}{
		{b, b, 5, Float32, Sum}, {b[:3], b, 1, Float32, Sum}, {b, b[:3], 1, Float32, Sum},
		{b, b, 1, 12, Sum}, {b, b, 1, 255, Sum}, {b, b, 1, -1, Sum}, {b, b, 1, Int8, 4}, {b, b, -1, Int8, Sum},
	} {
		if err := Reduce(c.dst, c.src, c.count, c.dt, c.op); err == nil {
			t.Errorf("Reduce(%d bytes, %d bytes, %d, %v, %v) accepted", len(c.dst), len(c.src), c.count, c.dt, c.op)
		}
	}
}

func TestFloat16AllValuesRoundTrip(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := Float16ToFloat32(uint16(h))
		back := Float32ToFloat16(f)
		if math.IsNaN(float64(f)) {
			if back&0x7c00 != 0x7c00 || back&0x3ff == 0 {
				t.Fatalf("NaN %#04x came back as %#04x", h, back)
			}
			continue
		}
		if back != uint16(h) {
			t.Fatalf("fp16 %#04x -> %v -> %#04x", h, f, back)
		}
	}
	// ties to even: 1 + 2^-11 lies halfway between 1 and 1+2^-10 -> 1 (even)
	if got := Float32ToFloat16(1 + 1.0/2048); got != 0x3c00 {
		t.Fatalf("tie rounded to %#04x", got)
	}
	if got := Float32ToFloat16(1 + 3.0/2048); got != 0x3c02 { // halfway, odd below -> up
		t.Fatalf("tie rounded to %#04x", got)
	}
	if Float32ToFloat16(70000) != 0x7c00 || Float32ToFloat16(-70000) != 0xfc00 {
		t.Fatal("overflow is not Inf")
	}
	if Float32ToFloat16(1e-8) != 0 || Float32ToFloat16(6e-8) != 1 { // smallest subnormal is 5.96e-8
		t.Fatal("subnormal rounding")
	}
}

func TestBFloat16RoundTrip(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := BFloat16ToFloat32(uint16(h))
		back := Float32ToBFloat16(f)
		if math.IsNaN(float64(f)) {
			if !math.IsNaN(float64(BFloat16ToFloat32(back))) {
				t.Fatalf("NaN %#04x came back as %#04x", h, back)
			}
			continue
		}
		if back != uint16(h) {
			t.Fatalf("bf16 %#04x -> %v -> %#04x", h, f, back)
		}
	}
	if got := Float32ToBFloat16(math.Float32frombits(0x3f808000)); got != 0x3f80 { // tie -> even
		t.Fatalf("tie rounded to %#04x", got)
	}
	if got := Float32ToBFloat16(math.Float32frombits(0x3f818000)); got != 0x3f82 {
		t.Fatalf("tie rounded to %#04x", got)
	}
}

func FuzzReduce(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8}, []byte{8, 7, 6, 5, 4, 3, 2, 1}, int32(4), int32(0)) // fp32 sum
	f.Add([]byte{0xff, 0x7f}, []byte{1, 0}, int32(3), int32(2))                               // fp16 max
	f.Fuzz(func(t *testing.T, a, b []byte, dt, op int32) {
		n := min(len(a), len(b))
		d := DataType(dt)
		if !d.Valid() || !Op(op).Valid() {
			if Reduce(a, b, 1, d, Op(op)) == nil {
				t.Fatal("invalid type or op accepted")
			}
			return
		}
		count := n / d.Size()
		dst := append([]byte(nil), a...)
		if err := Reduce(dst, b, count, d, Op(op)); err != nil {
			t.Fatal(err)
		}
		es := d.Size()
		for i := 0; i < count; i++ {
			want := refElem(d, Op(op), a[i*es:(i+1)*es], b[i*es:(i+1)*es])
			if !same(d, dst[i*es:(i+1)*es], want) {
				t.Fatalf("element %d: %x, want %x", i, dst[i*es:(i+1)*es], want)
			}
		}
	})
}

func BenchmarkReduce(b *testing.B) {
	for _, c := range []struct {
		dt   DataType
		size int
	}{{Float32, 4 << 10}, {Float32, 1 << 20}, {Float32, 64 << 20}, {Float16, 64 << 20}, {BFloat16, 64 << 20}, {Int32, 64 << 20}, {Float64, 64 << 20}} {
		b.Run(c.dt.String()+"/sum/"+sizeName(c.size), func(b *testing.B) {
			x := make([]byte, c.size)
			y := make([]byte, c.size)
			o := make([]byte, c.size)
			count := c.size / c.dt.Size()
			b.SetBytes(int64(c.size))
			for i := 0; i < b.N; i++ {
				Reduce3(o, x, y, count, c.dt, Sum)
			}
		})
	}
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return itoa(n>>20) + "MiB"
	case n >= 1<<10:
		return itoa(n>>10) + "KiB"
	}
	return itoa(n) + "B"
}

func itoa(n int) string { return string(rune('0'+n/10%10)) + string(rune('0'+n%10)) }
