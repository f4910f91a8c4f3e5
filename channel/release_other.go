//go:build !amd64 || race

package channel

import "sync/atomic"

// storeRelease stores v at p with release semantics (release_amd64.go):
// here a sequentially consistent atomic store, which is also what the race
// detector needs to see the publication.
func storeRelease(p *uint64, v uint64) { atomic.StoreUint64(p, v) }
