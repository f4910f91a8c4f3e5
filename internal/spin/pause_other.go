//go:build !amd64 && !arm64

package spin

// Pause tells the processor that this thread is in a spin-wait loop; where
// hcomm has no instruction for it (architectures other than amd64 and
// arm64), it does nothing.
func Pause() {}
