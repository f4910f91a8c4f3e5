//go:build !amd64

package channel

// Fence orders the stores before it before the loads after it
// (fence_amd64.go). Here storeRelease is a sequentially consistent atomic
// store, and the loads that matter are atomic loads, which Go's memory
// model orders after it: nothing more is done.
func Fence() {}
