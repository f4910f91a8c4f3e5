package reduce

import "math"

// Float16ToFloat32 converts IEEE 754 binary16 bits to float32. Every fp16
// value, subnormals included, is exactly representable; Inf stays Inf and a
// NaN keeps its sign and payload (a quiet NaN stays quiet).
func Float16ToFloat32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	man := uint32(h) & 0x3ff
	switch exp {
	case 0x1f: // Inf or NaN
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case 0:
		if man == 0 {
			return math.Float32frombits(sign)
		}
		// subnormal: man * 2^-24, exact in float32
		f := float32(man) * (1.0 / (1 << 24))
		if sign != 0 {
			f = -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
}

// Float32ToFloat16 rounds f to IEEE 754 binary16 bits, to nearest with ties to
// even. Values beyond the fp16 range (after rounding) become ±Inf, values
// below half the smallest subnormal become ±0, and NaN stays NaN: the result
// is quiet, with the sign and the top payload bits of f (as x86's VCVTPS2PH).
func Float32ToFloat16(f float32) uint16 {
	b := math.Float32bits(f)
	if h, ok := float32ToFloat16Normal(b); ok {
		return h
	}
	return float32ToFloat16Slow(b)
}

// float32ToFloat16Normal converts float32 bits whose fp16 result is a normal
// number (float32 exponents 113..142, 2^-14 <= |f| < 2^16) and reports ok;
// otherwise ok is false. Small enough to inline into loops.
func float32ToFloat16Normal(b uint32) (h uint16, ok bool) {
	u := b&0x7fffffff - 113<<23
	// RNE on the 13 dropped bits; a carry may reach the exponent, up to Inf.
	return uint16(b>>16)&0x8000 | uint16((u+1<<23+0xfff+(u>>13)&1)>>13), u < 30<<23
}

func float32ToFloat16Slow(b uint32) uint16 {
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	man := b & 0x7fffff
	switch {
	case exp == 0xff && man != 0: // NaN: quiet, keep the payload's top bits
		return sign | 0x7e00 | uint16(man>>13)
	case exp >= 143: // |f| >= 2^16 or Inf
		return sign | 0x7c00
	case exp >= 113: // normal
		h, _ := float32ToFloat16Normal(b)
		return h
	case exp < 102: // |f| < 2^-25: rounds to zero (2^-25 is the tie with 0)
		return sign
	}
	// subnormal result: value in units of 2^-24 is m * 2^(exp-126)
	m := man | 0x800000
	shift := uint32(126 - exp)
	r := m >> shift
	rem := m & (1<<shift - 1)
	half := uint32(1) << (shift - 1)
	if rem > half || (rem == half && r&1 == 1) {
		r++ // may carry into the smallest normal, which is correct
	}
	return sign | uint16(r)
}

// BFloat16ToFloat32 converts bfloat16 bits to float32 (exact: bf16 is the top
// half of a float32).
func BFloat16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// Float32ToBFloat16 rounds f to bfloat16 bits, to nearest with ties to even;
// overflow gives ±Inf, subnormals round like any other value, and NaN stays
// NaN (made quiet, sign and top payload bits kept).
func Float32ToBFloat16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}
