//go:build amd64 && !purego

package reduce

import (
	"math/rand/v2"
	"testing"

	"github.com/hcomm-dev/hcomm/internal/units"
)

// TestKernelsPresent fails if an AVX2 machine silently runs without the
// vector kernels.
func TestKernelsPresent(t *testing.T) {
	if !hasAVX2 {
		t.Skip("no AVX2: only the Go loops run")
	}
	for _, dt := range DataTypes() {
		for _, op := range Ops() {
			want := !((dt == Int8 || dt == Uint8) && op == Prod) && (dt != Float16 || hasF16C)
			if haveKernel(dt, op) != want {
				t.Errorf("%v %v: kernel present %v, want %v", dt, op, haveKernel(dt, op), want)
			}
		}
	}
	for _, dt := range []DataType{Float32, Float64, Int32, Uint32, Int64, Uint64} {
		if ntKernels[dt] == nil {
			t.Errorf("%v: no non-temporal sum kernel", dt)
		}
	}
}

// TestNonTemporalPath forces the non-temporal sum kernels onto small buffers,
// at every dst misalignment, and checks them against the reference.
func TestNonTemporalPath(t *testing.T) {
	defer func(v int) { ntThreshold = v }(ntThreshold)
	ntThreshold = 0
	rng := rand.New(rand.NewPCG(7, 8))
	for _, dt := range []DataType{Float32, Float64, Int32, Uint32, Int64, Uint64, Float16} {
		for _, count := range []int{8, 9, 33, 100, 1027} {
			for off := 0; off < 33; off++ {
				es := dt.Size()
				a := make([]byte, count*es)
				b := make([]byte, count*es)
				fill(rng, dt, a, count)
				fill(rng, dt, b, count)
				want := refReduce(a, b, count, dt, Sum)
				dst := make([]byte, count*es+off+64)[off:]
				dst[count*es] = 0x5a
				if err := Reduce3(dst, a, b, count, dt, Sum); err != nil {
					t.Fatal(err)
				}
				if i, ok := sameBits(dt, dst, want, count); !ok {
					t.Fatalf("%v count %d offset %d: element %d wrong", dt, count, off, i)
				}
				if dst[count*es] != 0x5a {
					t.Fatalf("%v count %d offset %d: wrote past the end", dt, count, off)
				}
			}
		}
	}
}

// BenchmarkNonTemporal measures out-of-place fp32 SUM with and without the
// non-temporal stores, to place ntThreshold.
func BenchmarkNonTemporal(b *testing.B) {
	for _, size := range []int{1 << 20, 4 << 20, 8 << 20, 16 << 20, 64 << 20} {
		for _, nt := range []bool{false, true} {
			name := units.SizeIEC(int64(size)) + "/plain"
			if nt {
				name = units.SizeIEC(int64(size)) + "/nt"
			}
			b.Run(name, func(b *testing.B) {
				defer func(v int) { ntThreshold = v }(ntThreshold)
				ntThreshold = 1 << 62
				if nt {
					ntThreshold = 0
				}
				x, y, o := make([]byte, size), make([]byte, size), make([]byte, size)
				for i := range x {
					x[i], y[i], o[i] = 1, 2, 3
				}
				b.SetBytes(int64(size))
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					Reduce3(o, x, y, size/4, Float32, Sum)
				}
			})
		}
	}
}
