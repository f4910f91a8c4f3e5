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
