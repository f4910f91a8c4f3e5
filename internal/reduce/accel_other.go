//go:build !amd64 || purego

package reduce

// haveKernel reports whether accelerate has a vector kernel for dt and op:
// never, on this build.
func haveKernel(dt DataType, op Op) bool { return false }

// accelerate does nothing here: every byte goes through the Go loops.
func accelerate(dst, a, b []byte, dt DataType, op Op) (lo, hi int) { return 0, 0 }
