//go:build amd64 && !purego

package reduce

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

//go:generate go run asm_gen.go

// kernelFunc is an assembly kernel: dst = a op b over the first n&^31 bytes.
type kernelFunc func(dst, a, b *byte, n int)

// hasAVX2 gates every kernel (x/sys/cpu also checks the OS saves the YMM
// registers); fp16 also needs F16C.
var (
	hasAVX2 = cpu.X86.HasAVX2
	hasF16C = cpu.X86.HasAVX2 && cpu.X86.HasF16C
)

// kernels[dt][op] is the kernel for a type and op, nil where there is none
// (int8/uint8 PROD) or the CPU lacks the features.
var kernels = func() (t [len(dtInfo)][len(opNames)]kernelFunc) {
	if !hasAVX2 {
		return t
	}
	t[Float32] = [4]kernelFunc{addF32, mulF32, maxF32, minF32}
	t[Float64] = [4]kernelFunc{addF64, mulF64, maxF64, minF64}
	t[Int8] = [4]kernelFunc{addI8, nil, maxI8, minI8}
	t[Uint8] = [4]kernelFunc{addI8, nil, maxU8, minU8}
	t[Int16] = [4]kernelFunc{addI16, mulI16, maxI16, minI16}
	t[Uint16] = [4]kernelFunc{addI16, mulI16, maxU16, minU16}
	t[Int32] = [4]kernelFunc{addI32, mulI32, maxI32, minI32}
	t[Uint32] = [4]kernelFunc{addI32, mulI32, maxU32, minU32}
	t[Int64] = [4]kernelFunc{addI64, mulI64, maxI64, minI64}
	t[Uint64] = [4]kernelFunc{addI64, mulI64, maxU64, minU64}
	t[BFloat16] = [4]kernelFunc{addBF16, mulBF16, maxBF16, minBF16}
	if hasF16C {
		t[Float16] = [4]kernelFunc{addF16, mulF16, maxF16, minF16}
	}
	return t
}()

// ntKernels[dt] is the non-temporal-store SUM kernel for the type, if any.
var ntKernels = func() (t [len(dtInfo)]kernelFunc) {
	if !hasAVX2 {
		return t
	}
	t[Float32], t[Float64] = addF32NT, addF64NT
	t[Int32], t[Uint32] = addI32NT, addI32NT
	t[Int64], t[Uint64] = addI64NT, addI64NT
	return t
}()

// ntThreshold is the output size from which an out-of-place SUM (dst is
// neither a nor b) uses non-temporal stores, which skip reading dst's lines
// before overwriting them (a quarter of the memory traffic). Measured on an
// AMD EPYC (BenchmarkNonTemporal): fp32 64 MiB 13 -> 18 GB/s, 16 MiB 19 -> 25.
// They also win on smaller buffers in a loop, but leave the result out of
// cache for whoever reads it next (a transport sending it on), so they start
// where the three buffers no longer fit comfortably in L3. In-place
// reductions read dst anyway and were slower with them (19 vs 21 GB/s).
var ntThreshold = 8 << 20

// haveKernel reports whether accelerate has a vector kernel for dt and op.
func haveKernel(dt DataType, op Op) bool { return kernels[dt][op] != nil }

// accelerate runs the vector kernel for dt and op, if there is one, over a
// middle part [lo, hi) of the byte buffers (all of the same length n) and
// returns it; the caller does the rest in Go. lo == hi means nothing was done.
func accelerate(dst, a, b []byte, dt DataType, op Op) (lo, hi int) {
	n := len(dst)
	if n < 32 {
		return 0, 0
	}
	k := kernels[dt][op]
	if k == nil {
		return 0, 0
	}
	pd, pa, pb := unsafe.SliceData(dst), unsafe.SliceData(a), unsafe.SliceData(b)
	if op == Sum && n >= ntThreshold && pd != pa && pd != pb {
		if nt := ntKernels[dt]; nt != nil {
			// Start at the first 32-byte aligned byte of dst, if that is on an
			// element boundary.
			lo = int(-uintptr(unsafe.Pointer(pd)) & 31)
			if lo%dt.Size() == 0 {
				hi = lo + (n-lo)&^31
				nt(&dst[lo], &a[lo], &b[lo], hi-lo)
				return lo, hi
			}
		}
	}
	hi = n &^ 31
	k(pd, pa, pb, hi)
	return 0, hi
}
