//go:build amd64

package channel

// Fence orders every store this goroutine made before it (a line's release
// store included) before every load it makes after it: on amd64 a locked
// add of 0 to the stack's top word (fence_amd64.s), a full barrier that
// waits for the stores still on their way to be visible. A protocol in
// which each side stores and then loads what the other stored — a line
// against a sleeper's wake word — calls it on both sides between the two;
// without it both may load before either's store is visible (the
// store-load reordering every processor's store buffer allows). It is a
// barrier in race-detector builds too, whose atomics run through the
// detector's runtime: there a store and a later load were seen out of
// order without it (TestFenceOrdersLineBeforeLoad, 1 round in 20000).
func Fence()
