package collectives

import "github.com/hcomm-dev/hcomm/device"

// allGatherBruck is Bruck's all-gather: ⌈log2 n⌉ rounds where the ring takes
// n-1. Before the round of distance h this rank holds the blocks of ranks
// me, me+1, …, me+h-1 (mod n), each already at its place in the output; it
// sends the first min(h, n-h) of them to rank me-h, which lacks exactly
// those, and receives as many from rank me+h, piece by piece through the
// pipes, a send and a receive in turn (every rank sends to one rank and
// receives from another, so that with two inbox slots per pipe no cycle of
// full inboxes can form). Every block travels at most log2(n) hops, the
// same bytes per rank as the ring: the choice for all-gathers above the
// inline size among many ranks over a network. out(p) is where rank p's
// block of bytes goes; this rank's own is in place before the call.
func allGatherBruck(sc *sched, out func(p int) device.Ptr, bytes int64) {
	st := sc.st
	me, n := st.comm.Rank(), st.comm.Size()
	per := st.lay.piece
	for h := 1; h < n; h *= 2 {
		m := min(h, n-h)
		to, from := mod(me-h, n), mod(me+h, n)
		for b := 0; b < m; b++ {
			src, dst := out(mod(me+b, n)), out(mod(me+h+b, n))
			for lo := int64(0); lo < bytes; lo += per {
				k := min(per, bytes-lo)
				sc.pipeSend(to, src.Add(lo), k)
				slot, done := sc.pipeRecv(from)
				sc.copy(dst.Add(lo), slot, k)
				done()
			}
		}
	}
}
