//go:build amd64 && !race

package channel

// storeRelease stores v at p with release semantics: whoever loads v from p
// atomically sees every store this goroutine made before it. On amd64 that
// is a plain store (release_amd64.s), which lets the caller go on while the
// line travels to its reader — atomic.StoreUint64, a sequentially
// consistent XCHG, waits for the line first: about one cache-line transfer
// (~120 ns on the development VM) per line put, on the critical path of
// every small collective between ranks of one host. It is an assembly
// function so that the compiler keeps the stores before it before it.
//
//go:noescape
func storeRelease(p *uint64, v uint64)

// Fence orders every store this goroutine made before it (a line's release
// store included) before every load it makes after it, as a sequentially
// consistent atomic would: on amd64 a locked add of 0 to the stack's top
// word (release_amd64.s), which waits for the stores still on their way
// to be visible. A protocol that stores a line
// (PutLine) and then loads a word its peer stores — to learn whether the
// peer went to sleep waiting for the line, say — calls it between the two;
// without it both sides may load before either's store is visible (the
// store-load reordering every processor's store buffer allows).
func Fence()
