package reduce

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/hcomm-dev/hcomm/internal/units"
)

// ---- independent references ----

// getF and putF read and write element i of a little-endian buffer of a
// float type as float64 (fp16/bf16 decoded with the references below).
func getF(dt DataType, buf []byte, i int) float64 {
	switch dt {
	case Float32:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:])))
	case Float64:
		return math.Float64frombits(binary.LittleEndian.Uint64(buf[8*i:]))
	case Float16:
		return refF16ToF64(binary.LittleEndian.Uint16(buf[2*i:]))
	case BFloat16:
		return float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(buf[2*i:])) << 16))
	}
	panic("not a float type")
}

// getI reads element i of an integer type, sign- or zero-extended.
func getI(dt DataType, buf []byte, i int) int64 {
	switch dt {
	case Int8:
		return int64(int8(buf[i]))
	case Uint8:
		return int64(buf[i])
	case Int16:
		return int64(int16(binary.LittleEndian.Uint16(buf[2*i:])))
	case Uint16:
		return int64(binary.LittleEndian.Uint16(buf[2*i:]))
	case Int32:
		return int64(int32(binary.LittleEndian.Uint32(buf[4*i:])))
	case Uint32:
		return int64(binary.LittleEndian.Uint32(buf[4*i:]))
	}
	return int64(binary.LittleEndian.Uint64(buf[8*i:]))
}

// putRaw stores the low dt.Size() bytes of v as element i.
func putRaw(dt DataType, buf []byte, i int, v uint64) {
	es := dt.Size()
	for k := 0; k < es; k++ {
		buf[i*es+k] = byte(v >> (8 * k))
	}
}

func isFloat(dt DataType) bool {
	return dt == Float16 || dt == Float32 || dt == Float64 || dt == BFloat16
}

func isSigned(dt DataType) bool { return dt == Int8 || dt == Int16 || dt == Int32 || dt == Int64 }

// refF16ToF64 decodes fp16 bits from the definition.
func refF16ToF64(h uint16) float64 {
	s := 1.0
	if h&0x8000 != 0 {
		s = -1
	}
	e, m := int(h>>10)&0x1f, float64(h&0x3ff)
	switch e {
	case 0x1f:
		if m != 0 {
			return math.NaN()
		}
		return math.Inf(int(s))
	case 0:
		return s * math.Ldexp(m, -24)
	}
	return s * math.Ldexp(1024+m, e-25)
}

// refRound rounds finite x to a binary format with prec significand bits
// (implicit bit included), minimum normal exponent emin and maximum exponent
// emax, to nearest even, and returns the bit pattern (sign | exp | mantissa)
// of the standard layout with ebits exponent bits. Out of range -> Inf.
func refRound(x float64, prec, emin, emax, ebits int) uint64 {
	mbits := prec - 1
	var sign uint64
	if math.Signbit(x) {
		sign = 1 << (mbits + ebits)
	}
	inf := sign | uint64(1<<ebits-1)<<mbits
	if math.IsNaN(x) {
		return inf | 1<<(mbits-1)
	}
	a := math.Abs(x)
	if math.IsInf(a, 0) {
		return inf
	}
	if a == 0 {
		return sign
	}
	_, e := math.Frexp(a) // a = f * 2^e, f in [0.5, 1): leading bit is 2^(e-1)
	e--
	if e < emin {
		e = emin
	}
	q := math.RoundToEven(math.Ldexp(a, mbits-e)) // units of 2^(e-mbits); exact scaling
	if q >= float64(uint64(2)<<mbits) {
		q /= 2
		e++
	}
	if e > emax {
		return inf
	}
	qi := uint64(q)
	if qi < 1<<mbits { // subnormal (e == emin)
		return sign | qi
	}
	return sign | uint64(e+(1<<(ebits-1))-1)<<mbits | (qi - 1<<mbits)
}

func refF64ToF16(x float64) uint16  { return uint16(refRound(x, 11, -14, 15, 5)) }
func refF64ToBF16(x float64) uint16 { return uint16(refRound(x, 8, -126, 127, 8)) }

// refFloatOp is op in float64 with the package's NaN and signed-zero rules.
func refFloatOp(op Op, x, y float64) float64 {
	switch op {
	case Sum:
		return x + y
	case Prod:
		return x * y
	}
	if math.IsNaN(x) || math.IsNaN(y) {
		return math.NaN()
	}
	if op == Max {
		return math.Max(x, y) // Max(-0, +0) = +0
	}
	return math.Min(x, y)
}

// refReduce computes want = a op b element by element from the definitions:
// floats in float64 and rounded once to the type (fp16/bf16: to float32 first,
// as the op is done in float32), integers in int64 and truncated.
func refReduce(a, b []byte, count int, dt DataType, op Op) []byte {
	out := make([]byte, count*dt.Size())
	for i := 0; i < count; i++ {
		if !isFloat(dt) {
			x, y := getI(dt, a, i), getI(dt, b, i)
			var r int64
			switch op {
			case Sum:
				r = x + y
			case Prod:
				r = x * y
			case Max, Min:
				less := x < y
				if dt == Uint64 {
					less = uint64(x) < uint64(y)
				}
				if (op == Max) == less {
					r = y
				} else {
					r = x
				}
			}
			putRaw(dt, out, i, uint64(r))
			continue
		}
		r := refFloatOp(op, getF(dt, a, i), getF(dt, b, i))
		switch dt {
		case Float64:
			putRaw(dt, out, i, math.Float64bits(r))
		case Float32:
			putRaw(dt, out, i, uint64(math.Float32bits(float32(r))))
		case Float16:
			putRaw(dt, out, i, uint64(refF64ToF16(float64(float32(r)))))
		case BFloat16:
			putRaw(dt, out, i, uint64(refF64ToBF16(float64(float32(r)))))
		}
	}
	return out
}

// sameBits reports whether got and want hold the same count elements: bit
// for bit, except that any NaN equals any NaN. It returns the first mismatch.
func sameBits(dt DataType, got, want []byte, count int) (int, bool) {
	es := dt.Size()
	for i := 0; i < count; i++ {
		g, w := got[i*es:(i+1)*es], want[i*es:(i+1)*es]
		if string(g) == string(w) {
			continue
		}
		if isFloat(dt) && math.IsNaN(getF(dt, got, i)) && math.IsNaN(getF(dt, want, i)) {
			continue
		}
		return i, false
	}
	return -1, true
}

// ---- inputs ----

// fill writes count random elements of dt: integers of any bit pattern, and
// for floats a mix of ordinary values of both signs and magnitudes, random
// bit patterns (NaN, Inf, subnormals included) and explicit specials.
func fill(rng *rand.Rand, dt DataType, buf []byte, count int) {
	for i := 0; i < count; i++ {
		if !isFloat(dt) {
			putRaw(dt, buf, i, rng.Uint64())
			continue
		}
		var bits uint64
		switch k := rng.IntN(10); {
		case k < 6: // ordinary value
			putFloat(dt, buf, i, rng.NormFloat64()*math.Ldexp(1, rng.IntN(20)-10))
			continue
		case k < 8:
			bits = rng.Uint64()
		default:
			specials := []float64{math.NaN(), math.Inf(1), math.Inf(-1), 0, math.Copysign(0, -1), 1, -1,
				math.MaxFloat64, 65504, 3.4e38, 1e-40, 6e-8, -6e-8, 1e-310}
			putFloat(dt, buf, i, specials[rng.IntN(len(specials))])
			continue
		}
		putRaw(dt, buf, i, bits)
	}
}

// putFloat stores v rounded to dt (using the reference rounding).
func putFloat(dt DataType, buf []byte, i int, v float64) {
	switch dt {
	case Float64:
		putRaw(dt, buf, i, math.Float64bits(v))
	case Float32:
		putRaw(dt, buf, i, uint64(math.Float32bits(float32(v))))
	case Float16:
		putRaw(dt, buf, i, uint64(refF64ToF16(float64(float32(v)))))
	case BFloat16:
		putRaw(dt, buf, i, uint64(refF64ToBF16(float64(float32(v)))))
	}
}

// pairUp makes some elements of b equal to a's, or a's negation, or ±0
// against ∓0, so MAX/MIN ties and signed zeros are exercised.
func pairUp(rng *rand.Rand, dt DataType, a, b []byte, count int) {
	es := dt.Size()
	for i := 0; i < count; i++ {
		switch rng.IntN(8) {
		case 0:
			copy(b[i*es:(i+1)*es], a[i*es:(i+1)*es])
		case 1:
			if isFloat(dt) { // flip the sign bit: x vs -x, +0 vs -0
				copy(b[i*es:(i+1)*es], a[i*es:(i+1)*es])
				b[(i+1)*es-1] ^= 0x80
			}
		case 2:
			if isFloat(dt) {
				putFloat(dt, a, i, 0)
				putFloat(dt, b, i, math.Copysign(0, -1))
				if rng.IntN(2) == 0 {
					a, b = b, a
				}
			}
		}
	}
}

// ---- tests ----

var counts = []int{0, 1, 2, 3, 7, 8, 15, 16, 17, 31, 33, 63, 65, 127, 1023, 4099}

// paths names the implementations every result is checked on.
var paths = []struct {
	name string
	path path
}{{"accel", pathAccel}, {"generic", pathGo}, {"chunked", pathChunked}}

func TestReduceEveryTypeAndOp(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, dt := range DataTypes() {
		for _, op := range Ops() {
			for _, count := range counts {
				es := dt.Size()
				// a, b and dst at different misalignments.
				offA, offB, offD := rng.IntN(8), rng.IntN(8), rng.IntN(8)
				a := make([]byte, count*es+offA)[offA:]
				b := make([]byte, count*es+offB)[offB:]
				fill(rng, dt, a, count)
				fill(rng, dt, b, count)
				pairUp(rng, dt, a, b, count)
				want := refReduce(a, b, count, dt, op)
				for _, p := range paths {
					check := func(what string, got []byte) {
						t.Helper()
						if i, ok := sameBits(dt, got, want, count); !ok {
							es := dt.Size()
							t.Fatalf("%s %v %v count %d (%s): element %d of %x op %x = %x, want %x", p.name, dt, op, count, what, i,
								a[i*es:(i+1)*es], b[i*es:(i+1)*es], got[i*es:(i+1)*es], want[i*es:(i+1)*es])
						}
					}
					// out of place, with a guard byte after dst
					dst := make([]byte, count*es+offD+1)[offD:]
					dst[count*es] = 0xa5
					reduce3(dst, a, b, count, dt, op, p.path)
					check("dst = a op b", dst)
					if dst[count*es] != 0xa5 {
						t.Fatalf("%s %v %v count %d: wrote past the end", p.name, dt, op, count)
					}
					// in place over a, and over b
					d := append([]byte(nil), a...)
					reduce3(d, d, b, count, dt, op, p.path)
					check("a = a op b", d)
					d = append([]byte(nil), b...)
					reduce3(d, a, d, count, dt, op, p.path)
					check("b = a op b", d)
				}
				// the public API (accelerated path)
				d := append([]byte(nil), a...)
				if err := Reduce(d, b, count, dt, op); err != nil {
					t.Fatal(err)
				}
				if i, ok := sameBits(dt, d, want, count); !ok {
					t.Fatalf("Reduce %v %v count %d: element %d wrong", dt, op, count, i)
				}
				out := make([]byte, count*es)
				if err := Reduce3(out, a, b, count, dt, op); err != nil {
					t.Fatal(err)
				}
				if i, ok := sameBits(dt, out, want, count); !ok {
					t.Fatalf("Reduce3 %v %v count %d: element %d wrong", dt, op, count, i)
				}
			}
		}
	}
}

// TestReduceSemantics pins the documented rules with hand-picked values.
func TestReduceSemantics(t *testing.T) {
	nan := math.NaN()
	negz := math.Copysign(0, -1)
	f32 := func(vs ...float64) []byte {
		b := make([]byte, 4*len(vs))
		for i, v := range vs {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(v)))
		}
		return b
	}
	// 40 elements so the vector kernels see them.
	rep := func(vs ...float64) []float64 {
		var out []float64
		for len(out) < 40 {
			out = append(out, vs...)
		}
		return out[:40]
	}
	x := rep(1, nan, 0, negz, 2, math.Inf(1), nan, -5)
	y := rep(nan, 1, negz, 0, 3, 1, nan, -7)
	wantMax := rep(nan, nan, 0, 0, 3, math.Inf(1), nan, -5)
	wantMin := rep(nan, nan, negz, negz, 2, 1, nan, -7)
	for _, p := range paths {
		for _, c := range []struct {
			op   Op
			want []float64
		}{{Max, wantMax}, {Min, wantMin}} {
			got := make([]byte, 4*40)
			reduce3(got, f32(x...), f32(y...), 40, Float32, c.op, p.path)
			if i, ok := sameBits(Float32, got, f32(c.want...), 40); !ok {
				t.Errorf("%s fp32 %v element %d: %v %v -> %v, want %v", p.name, c.op, i, x[i], y[i],
					math.Float32frombits(binary.LittleEndian.Uint32(got[4*i:])), c.want[i])
			}
		}
		// integer wraparound
		a := make([]byte, 4*40)
		b := make([]byte, 4*40)
		for i := 0; i < 40; i++ {
			binary.LittleEndian.PutUint32(a[4*i:], math.MaxInt32)
			binary.LittleEndian.PutUint32(b[4*i:], 2)
		}
		got := make([]byte, 4*40)
		reduce3(got, a, b, 40, Int32, Sum, p.path)
		if v := int32(binary.LittleEndian.Uint32(got[4*39:])); v != math.MinInt32+1 {
			t.Errorf("%s int32 MaxInt32+2 = %d", p.name, v)
		}
		reduce3(got, a, b, 40, Int32, Prod, p.path)
		if v := int32(binary.LittleEndian.Uint32(got[4*39:])); v != -2 {
			t.Errorf("%s int32 MaxInt32*2 = %d", p.name, v)
		}
		reduce3(got, a, b, 40, Uint32, Max, p.path)
		binary.LittleEndian.PutUint32(b[4*39:], 0xffffffff)
		reduce3(got, a, b, 40, Uint32, Max, p.path)
		if v := binary.LittleEndian.Uint32(got[4*39:]); v != 0xffffffff {
			t.Errorf("%s uint32 max = %#x", p.name, v)
		}
		reduce3(got, a, b, 40, Int32, Max, p.path)
		if v := int32(binary.LittleEndian.Uint32(got[4*39:])); v != math.MaxInt32 {
			t.Errorf("%s int32 max = %d", p.name, v)
		}
	}
}

func TestReduceErrors(t *testing.T) {
	b := make([]byte, 64)
	for _, c := range []struct {
		name     string
		dst, src []byte
		count    int
		dt       DataType
		op       Op
		msg      string
	}{
		{"short both", b[:16], b[32:48], 5, Float32, Sum, "need 20 bytes"},
		{"short dst", b[:3], b[32:], 1, Float32, Sum, "dst has 3"},
		{"short src", b[:16], b[32:35], 1, Float32, Sum, "src 3"},
		{"nil src", b[:16], nil, 1, Int8, Sum, "src 0"},
		{"dtype 12", b[:16], b[32:48], 1, 12, Sum, "DataType(12)"},
		{"dtype 255", b[:16], b[32:48], 1, 255, Sum, "DataType(255)"},
		{"dtype -1", b[:16], b[32:48], 1, -1, Sum, "DataType(-1)"},
		{"op 4", b[:16], b[32:48], 1, Int8, 4, "Op(4)"},
		{"op -1", b[:16], b[32:48], 1, Int8, -1, "Op(-1)"},
		{"negative count", b[:16], b[32:48], -1, Int8, Sum, "negative count"},
		{"huge count", b[:16], b[32:48], math.MaxInt / 2, Float64, Sum, "overflows"},
		{"overlap", b[:16], b[4:20], 4, Float32, Sum, "overlap"},
	} {
		err := Reduce(c.dst, c.src, c.count, c.dt, c.op)
		if err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: Reduce error %v, want one containing %q", c.name, err, c.msg)
		}
		err = Reduce3(c.dst, c.dst, c.src, c.count, c.dt, c.op)
		if err == nil {
			t.Errorf("%s: Reduce3 accepted", c.name)
		}
	}
	if err := Reduce3(b[:16], b[:16], b[8:24], 4, Float32, Sum); err == nil {
		t.Error("Reduce3 with b partially overlapping dst accepted")
	}
	if err := Reduce3(b[8:24], b[:16], b[32:48], 4, Float32, Sum); err == nil {
		t.Error("Reduce3 with a partially overlapping dst accepted")
	}
	// Allowed: exact aliasing, empty work, and adjacent (non-overlapping) buffers.
	if err := Reduce3(b[:16], b[:16], b[:16], 4, Float32, Sum); err != nil {
		t.Error(err)
	}
	if err := Reduce(nil, nil, 0, Float16, Min); err != nil {
		t.Error(err)
	}
	if err := Reduce(b[:16], b[16:32], 4, Int32, Prod); err != nil {
		t.Error(err)
	}
}

func TestTypeNames(t *testing.T) {
	names := []string{"int8", "int16", "int32", "fp16", "fp32", "int64", "uint64", "uint8", "uint16", "uint32", "fp64", "bf16"}
	sizes := []int{1, 2, 4, 2, 4, 8, 8, 1, 2, 4, 8, 2}
	dts := DataTypes()
	if len(dts) != len(names) {
		t.Fatalf("%d data types", len(dts))
	}
	for i, d := range dts {
		if int(d) != i || d.String() != names[i] || d.Size() != sizes[i] || !d.Valid() {
			t.Errorf("DataType %d: %q size %d valid %v", int(d), d.String(), d.Size(), d.Valid())
		}
		if p, err := ParseDataType(strings.ToUpper(names[i])); err != nil || p != d {
			t.Errorf("ParseDataType(%q) = %v, %v", names[i], p, err)
		}
	}
	for s, want := range map[string]DataType{"float32": Float32, "float": Float32, "half": Float16, "float16": Float16,
		"bfloat16": BFloat16, "bfp16": BFloat16, "double": Float64, "float64": Float64} {
		if p, err := ParseDataType(s); err != nil || p != want {
			t.Errorf("ParseDataType(%q) = %v, %v", s, p, err)
		}
	}
	if _, err := ParseDataType("int128"); err == nil {
		t.Error("ParseDataType accepted int128")
	}
	for _, d := range []DataType{12, 255, -1} {
		if d.Valid() || d.Size() != 0 || d.String() != "DataType("+itoa(int(d))+")" {
			t.Errorf("DataType(%d): valid %v size %d %q", int(d), d.Valid(), d.Size(), d.String())
		}
	}
	for i, o := range Ops() {
		if int(o) != i || o.String() != []string{"sum", "prod", "max", "min"}[i] || !o.Valid() {
			t.Errorf("Op %d: %q", i, o.String())
		}
		if p, err := ParseOp(o.String()); err != nil || p != o {
			t.Errorf("ParseOp(%q) = %v, %v", o.String(), p, err)
		}
	}
	if Op(4).Valid() || Op(4).String() != "Op(4)" {
		t.Error("Op(4)")
	}
	if _, err := ParseOp("avg"); err == nil {
		t.Error("ParseOp accepted avg")
	}
}

func itoa(n int) string {
	if n < 0 {
		return "-" + itoa(-n)
	}
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}

// ---- conversions ----

func TestFloat16ToFloat32Exhaustive(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := Float16ToFloat32(uint16(h))
		want := refF16ToF64(uint16(h))
		if math.IsNaN(want) {
			fb := math.Float32bits(f)
			// NaN: sign and payload carried over exactly
			if !math.IsNaN(float64(f)) || fb>>31 != uint32(h>>15) || fb&0x7fffff != uint32(h&0x3ff)<<13 {
				t.Fatalf("fp16 %#04x -> %#08x, want a NaN with the same sign and payload", h, fb)
			}
		} else if float64(f) != want || math.Signbit(float64(f)) != math.Signbit(want) {
			t.Fatalf("fp16 %#04x -> %v, want %v", h, f, want)
		}
		back := Float32ToFloat16(f)
		if math.IsNaN(want) {
			if back != uint16(h)|0x200 { // quiet bit set, otherwise unchanged
				t.Fatalf("NaN %#04x came back as %#04x", h, back)
			}
			continue
		}
		if back != uint16(h) {
			t.Fatalf("fp16 %#04x -> %v -> %#04x", h, f, back)
		}
	}
}

// TestFloat32ToFloat16 checks rounding against the float64 reference at
// every fp16 value, the midpoints between neighbours, one ulp either side of
// them, and random float32 bit patterns.
func TestFloat32ToFloat16(t *testing.T) {
	check := func(f float32) {
		t.Helper()
		got := Float32ToFloat16(f)
		want := refF64ToF16(float64(f))
		if math.IsNaN(float64(f)) {
			b := math.Float32bits(f)
			want = uint16(b>>16)&0x8000 | 0x7e00 | uint16(b>>13)&0x3ff
		}
		if got != want {
			t.Fatalf("Float32ToFloat16(%g = %#08x) = %#04x, want %#04x", f, math.Float32bits(f), got, want)
		}
	}
	for h := 0; h < 1<<16; h++ {
		lo := refF16ToF64(uint16(h))
		if math.IsNaN(lo) || math.IsInf(lo, 0) {
			continue
		}
		next := refF16ToF64(uint16(h + 1)) // the next larger magnitude (or Inf)
		if h&0x7fff == 0x7bff {
			next = math.Copysign(65536, lo) // past the largest finite: the Inf boundary is at 65520
		}
		mid := float32((lo + next) / 2) // exact in float32
		for _, f := range []float32{float32(lo), mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, float32(math.Inf(1))),
			math.Nextafter32(mid, float32(math.Inf(-1))), math.Nextafter32(float32(lo), 0)} {
			check(f)
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	n := 1 << 20
	if testing.Short() || raceEnabled {
		n = 1 << 16
	}
	for i := 0; i < n; i++ {
		check(math.Float32frombits(rng.Uint32()))
	}
	// named cases
	for _, c := range []struct {
		f    float32
		want uint16
	}{
		{1 + 1.0/2048, 0x3c00}, // tie between 1 and 1+2^-10: to even (down)
		{1 + 3.0/2048, 0x3c02}, // tie, odd below: up
		{65504, 0x7bff},        // largest finite
		{65519.996, 0x7bff},    // just below the Inf boundary
		{65520, 0x7c00},        // tie with 65536 rounds to even: Inf
		{70000, 0x7c00},        // overflow
		{-70000, 0xfc00},       //
		{float32(math.Inf(1)), 0x7c00},
		{0x1p-24, 0x0001},        // smallest subnormal
		{0x1p-25, 0x0000},        // tie with 0: even (0)
		{0x1.8p-24, 0x0002},      // tie between 1 and 2 units: even (2)
		{0x1.000002p-25, 0x0001}, // just above the tie: up
		{0x1p-14, 0x0400},        // smallest normal
		{0x1.ffcp-15, 0x0400},    // largest subnormal + half ulp: tie, rounds to the even normal
		{1e-40, 0},               // float32 subnormal
		{float32(math.Copysign(0, -1)), 0x8000},
	} {
		if got := Float32ToFloat16(c.f); got != c.want {
			t.Errorf("Float32ToFloat16(%g) = %#04x, want %#04x", c.f, got, c.want)
		}
	}
	if b := Float32ToFloat16(float32(math.NaN())); b&0x7c00 != 0x7c00 || b&0x200 == 0 {
		t.Errorf("NaN -> %#04x, want a quiet NaN", b)
	}
	if b := Float32ToFloat16(math.Float32frombits(0x7f800001)); b&0x7c00 != 0x7c00 || b&0x3ff == 0 {
		t.Errorf("signalling NaN with a low payload -> %#04x, not a NaN", b)
	}
}

func TestBFloat16(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := BFloat16ToFloat32(uint16(h))
		if math.Float32bits(f) != uint32(h)<<16 {
			t.Fatalf("bf16 %#04x -> %#08x", h, math.Float32bits(f))
		}
		back := Float32ToBFloat16(f)
		if math.IsNaN(float64(f)) {
			if back != uint16(h)|0x40 {
				t.Fatalf("NaN %#04x came back as %#04x", h, back)
			}
			continue
		}
		if back != uint16(h) {
			t.Fatalf("bf16 %#04x -> %v -> %#04x", h, f, back)
		}
		// the midpoint to the next bf16 and its neighbours
		if h&0x7fff < 0x7f80 {
			mid := uint32(h)<<16 | 0x8000
			for _, b := range []uint32{mid, mid - 1, mid + 1, uint32(h)<<16 | 1, uint32(h)<<16 | 0xffff} {
				g := Float32ToBFloat16(math.Float32frombits(b))
				w := refF64ToBF16(float64(math.Float32frombits(b)))
				if g != w {
					t.Fatalf("Float32ToBFloat16(%#08x) = %#04x, want %#04x", b, g, w)
				}
			}
		}
	}
	for _, c := range []struct {
		b    uint32
		want uint16
	}{
		{0x3f808000, 0x3f80}, // tie -> even (down)
		{0x3f818000, 0x3f82}, // tie -> even (up)
		{0x7f7fffff, 0x7f80}, // MaxFloat32 overflows to Inf
		{0xff7f8000, 0xff80}, // tie at the top: -Inf
		{0x7f7f7fff, 0x7f7f}, // just below the tie: largest finite
		{0x00008000, 0x0000}, // subnormal tie to even (0)
		{0x00018000, 0x0002}, // subnormal tie to even (2)
		{0x7f800001, 0x7fc0}, // signalling NaN with only low payload: quiet NaN, not Inf
		{0xffc00000, 0xffc0}, // negative quiet NaN keeps its sign
	} {
		if got := Float32ToBFloat16(math.Float32frombits(c.b)); got != c.want {
			t.Errorf("Float32ToBFloat16(%#08x) = %#04x, want %#04x", c.b, got, c.want)
		}
	}
}

// ---- fuzz ----

// FuzzReduce checks that the accelerated and the portable paths agree bit
// for bit (NaNs: any NaN equals any NaN), that both match the reference, and
// that nothing panics, for any bytes, type, op and misalignment.
func FuzzReduce(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8}, []byte{8, 7, 6, 5, 4, 3, 2, 1}, int32(4), int32(0), uint8(0))
	f.Add([]byte{0xff, 0x7f}, []byte{1, 0}, int32(3), int32(2), uint8(1))
	f.Add(make([]byte, 100), []byte("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"), int32(11), int32(3), uint8(3))
	f.Add([]byte{0, 0, 0xc0, 0x7f}, []byte{0, 0, 0x80, 0x7f}, int32(4), int32(1), uint8(2))
	f.Fuzz(func(t *testing.T, a, b []byte, dt, op int32, off uint8) {
		d, o := DataType(dt), Op(op)
		if !d.Valid() || !o.Valid() {
			if Reduce(a, b, 1, d, o) == nil || Reduce3(a, a, b, 1, d, o) == nil {
				t.Fatal("invalid type or op accepted")
			}
			return
		}
		k := int(off % 8)
		if len(a) > k {
			a = a[k:] // misalign
		}
		count := min(len(a), len(b)) / d.Size()
		want := refReduce(a, b, count, d, o)
		acc := make([]byte, len(a))
		gen := make([]byte, len(a))
		reduce3(acc, a, b, count, d, o, pathAccel)
		reduce3(gen, a, b, count, d, o, pathGo)
		if i, ok := sameBits(d, acc, gen, count); !ok {
			es := d.Size()
			t.Fatalf("%v %v element %d: accelerated %x, generic %x", d, o, i, acc[i*es:(i+1)*es], gen[i*es:(i+1)*es])
		}
		chk := make([]byte, len(a))
		reduce3(chk, a, b, count, d, o, pathChunked)
		if i, ok := sameBits(d, chk, gen, count); !ok {
			t.Fatalf("%v %v element %d: chunked and in-place Go loops differ", d, o, i)
		}
		if i, ok := sameBits(d, gen, want, count); !ok {
			es := d.Size()
			t.Fatalf("%v %v element %d: %x, want %x", d, o, i, gen[i*es:(i+1)*es], want[i*es:(i+1)*es])
		}
		inPlace := append([]byte(nil), a...)
		if err := Reduce(inPlace, b, count, d, o); err != nil {
			t.Fatal(err)
		}
		if i, ok := sameBits(d, inPlace, want, count); !ok {
			t.Fatalf("%v %v in place: element %d differs", d, o, i)
		}
		// one element more than the shorter buffer holds is an error
		if Reduce(a, b, count+1, d, o) == nil && (count+1)*d.Size() > min(len(a), len(b)) {
			t.Fatal("short buffer accepted")
		}
	})
}

// ---- benchmarks ----

func BenchmarkReduce(b *testing.B) {
	for _, c := range []struct {
		dt   DataType
		op   Op
		size int
		kind string // "" = Reduce in place, "reduce3" = out of place, "generic" = portable Go, in place
	}{
		{Float32, Sum, 4 << 10, ""}, {Float32, Sum, 1 << 20, ""}, {Float32, Sum, 64 << 20, ""},
		{Float32, Sum, 64 << 20, "reduce3"}, {Float32, Sum, 64 << 20, "generic"},
		{Float32, Max, 64 << 20, ""},
		{Float16, Sum, 64 << 20, ""}, {BFloat16, Sum, 64 << 20, ""},
		{Int32, Sum, 64 << 20, ""}, {Float64, Sum, 64 << 20, ""},
		{Float16, Sum, 64 << 20, "generic"}, {BFloat16, Sum, 64 << 20, "generic"},
	} {
		name := c.dt.String() + "/" + c.op.String() + "/" + units.SizeIEC(int64(c.size))
		if c.kind != "" {
			name += "-" + c.kind
		}
		b.Run(name, func(b *testing.B) {
			count := c.size / c.dt.Size()
			rng := rand.New(rand.NewPCG(5, 6))
			x := make([]byte, c.size)
			y := make([]byte, c.size)
			benchFill(c.dt, x, rng)
			benchFill(c.dt, y, rng)
			var o []byte
			if c.kind == "reduce3" {
				o = make([]byte, c.size)
				for i := range o { // fault the pages in before timing
					o[i] = 1
				}
			}
			b.SetBytes(int64(c.size)) // output bytes
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				switch c.kind {
				case "reduce3":
					if err := Reduce3(o, x, y, count, c.dt, c.op); err != nil {
						b.Fatal(err)
					}
				case "generic":
					reduce3(x, x, y, count, c.dt, c.op, pathGo)
				default:
					if err := Reduce(x, y, count, c.dt, c.op); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// benchFill fills buf with small random values of either sign: 64 KiB of
// them, repeated.
func benchFill(dt DataType, buf []byte, rng *rand.Rand) {
	n := min(len(buf), 64<<10) / dt.Size()
	for i := 0; i < n; i++ {
		if isFloat(dt) {
			putFloat(dt, buf, i, rng.NormFloat64())
		} else {
			putRaw(dt, buf, i, uint64(rng.IntN(2001)-1000))
		}
	}
	for off := n * dt.Size(); off < len(buf); off += n * dt.Size() {
		copy(buf[off:], buf[:n*dt.Size()])
	}
}

// A small reduction allocates nothing, whatever the type and op: the
// one-shot all-reduce runs one per peer per call, and a kernel picked as a
// generic function value would allocate a closure each time.
func TestSmallReduceDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, dt := range []DataType{Int8, Uint8, Int16, Uint16, Int32, Uint32, Int64, Uint64, Float16, BFloat16, Float32, Float64} {
		for _, op := range []Op{Sum, Prod, Max, Min} {
			const count = 3 // under every vector kernel's width: the Go kernels run
			n := count * dt.Size()
			dst, a, b := make([]byte, n), make([]byte, n), make([]byte, n)
			// pathChunked (big-endian machines) copies through buffers
			// that escape to the kernel call: not asked of it.
			for _, p := range []path{pathAccel, pathGo} {
				if allocs := testing.AllocsPerRun(20, func() { reduce3(dst, a, b, count, dt, op, p) }); allocs != 0 {
					t.Errorf("%v %v (path %d): %v allocations per reduction, want 0", dt, op, p, allocs)
				}
			}
		}
	}
}

// TestReduceSmall checks reduceSmall against the portable kernels bit for
// bit (NaN payloads aside), at every count it takes, with NaNs, infinities and both zeros among
// the floats, and that it refuses the types it leaves to them.
func TestReduceSmall(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	special := map[DataType][]uint64{
		Float32: {0, 1 << 31, 0x7fc00000, 0xffc00001, 0x7f800000, 0xff800000, 0x3f800000},
		Float64: {0, 1 << 63, 0x7ff8000000000000, 0xfff8000000000001, 0x7ff0000000000000, 0x3ff0000000000000},
	}
	for _, dt := range DataTypes() {
		es := dt.Size()
		for _, op := range Ops() {
			for count := 1; count*es < smallBytes; count++ {
				for trial := 0; trial < 20; trial++ {
					a, b := make([]byte, count*es), make([]byte, count*es)
					fill(rng, dt, a, count)
					fill(rng, dt, b, count)
					if sp := special[dt]; sp != nil {
						for i := 0; i < count; i++ {
							if rng.IntN(3) == 0 {
								putBits(a[i*es:], es, sp[rng.IntN(len(sp))])
							}
							if rng.IntN(3) == 0 {
								putBits(b[i*es:], es, sp[rng.IntN(len(sp))])
							}
						}
					}
					got, want := make([]byte, count*es), make([]byte, count*es)
					if !reduceSmall(got, a, b, count, dt, op) {
						switch dt {
						case Float32, Float64, Int32, Int64:
							t.Fatalf("reduceSmall refused %v %v", dt, op)
						}
						continue
					}
					reduceGeneric(want, a, b, count, dt, op, false)
					if _, ok := sameBits(dt, got, want, count); !ok {
						t.Fatalf("%v %v count %d: a %x b %x: got %x, the kernels %x", dt, op, count, a, b, got, want)
					}
				}
			}
		}
	}
}

func putBits(b []byte, es int, v uint64) {
	if es == 4 {
		binary.LittleEndian.PutUint32(b, uint32(v))
	} else {
		binary.LittleEndian.PutUint64(b, v)
	}
}
