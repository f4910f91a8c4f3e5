package reduce

import "math"

// Float16ToFloat32 converts IEEE half precision bits to float32 (exact).
func Float16ToFloat32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	man := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // Inf or NaN
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp == 0:
		if man == 0 {
			return math.Float32frombits(sign)
		}
		// subnormal: value = man * 2^-24
		f := float32(man) * (1.0 / (1 << 24))
		if sign != 0 {
			f = -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
}

// Float32ToFloat16 rounds f to half precision, to nearest with ties to even;
// overflow gives Inf, NaN stays NaN (quiet).
func Float32ToFloat16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	man := b & 0x7fffff
	if exp == 0xff {
		if man != 0 {
			return sign | 0x7e00 | uint16(man>>13)
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		if e < -10 {
			return sign // too small even for a subnormal: rounds to zero
		}
		m := man | 0x800000
		shift := uint32(14 - e)
		half := uint32(1) << (shift - 1)
		r := m >> shift
		rem := m & (1<<shift - 1)
		if rem > half || (rem == half && r&1 == 1) {
			r++
		}
		return sign | uint16(r)
	}
	r := uint32(e)<<10 | man>>13
	rem := man & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && r&1 == 1) {
		r++ // may carry into the exponent, up to Inf: correct
	}
	return sign | uint16(r)
}

// BFloat16ToFloat32 converts bfloat16 bits to float32 (exact).
func BFloat16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// Float32ToBFloat16 rounds f to bfloat16, to nearest with ties to even; NaN
// stays NaN (quiet).
func Float32ToBFloat16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7f800000 == 0x7f800000 && b&0x7fffff != 0 {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}
