package reduce

import (
	"math/rand/v2"
	"testing"
)

// TestResultIndependentOfPlacement pins what the collectives' strict
// determinism (HCCL_DETERMINISTIC=strict) relies on: an element's result is
// a function of its two operands alone, not of where it lies in the buffers,
// of how long the call is, or of which path (vector body, Go head and tail,
// non-temporal stores) computed it. The same operands reduced in one call
// and in pieces of random lengths at random misalignments give the same bits.
func TestResultIndependentOfPlacement(t *testing.T) {
	defer func(v int) { ntThreshold = v }(ntThreshold)
	rng := rand.New(rand.NewPCG(11, 12))
	const count = 5000
	for _, nt := range []int{ntThreshold, 0} {
		ntThreshold = nt
		for _, dt := range []DataType{Float32, Float16, BFloat16, Float64} {
			for _, op := range Ops() {
				es := dt.Size()
				a, b := make([]byte, count*es), make([]byte, count*es)
				fill(rng, dt, a, count)
				fill(rng, dt, b, count)
				whole := make([]byte, count*es)
				if err := Reduce3(whole, a, b, count, dt, op); err != nil {
					t.Fatal(err)
				}
				for lo := 0; lo < count; {
					m := min(count-lo, 1+rng.IntN(300))
					// the piece's operands and result at fresh misalignments
					off := rng.IntN(32)
					pa := append(make([]byte, off), a[lo*es:(lo+m)*es]...)[off:]
					pb := append(make([]byte, rng.IntN(32)), b[lo*es:(lo+m)*es]...)
					pb = pb[len(pb)-m*es:]
					if rng.IntN(2) == 0 {
						if err := Reduce(pa, pb, m, dt, op); err != nil {
							t.Fatal(err)
						}
					} else {
						dst := make([]byte, m*es+off+1)[off+1:]
						if err := Reduce3(dst, pa, pb, m, dt, op); err != nil {
							t.Fatal(err)
						}
						pa = dst
					}
					if i, ok := sameBits(dt, pa, whole[lo*es:(lo+m)*es], m); !ok {
						t.Fatalf("%v %v (non-temporal from %d bytes): element %d reduced in a piece [%d, %d) = %x, in one call %x",
							dt, op, nt, lo+i, lo, lo+m, pa[i*es:(i+1)*es], whole[(lo+i)*es:(lo+i+1)*es])
					}
					lo += m
				}
			}
		}
	}
}
