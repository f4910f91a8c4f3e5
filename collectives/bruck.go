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

// alltoAllBruck is Bruck's all-to-all: ⌈log2 n⌉ rounds where pairwise takes
// n-1, for small blocks (block bytes from every rank to every rank). Block i
// of this rank's working set is the one bound for rank me+i (mod n); in the
// round of distance 2^k every rank sends the blocks whose index has bit k
// set to rank me+2^k and receives as many, under the same indices, from
// rank me-2^k, so that a block of index i travels i ranks forward in the
// rounds of i's set bits, and at the end block i of rank me came from rank
// me-i. The usual rotations before and after cost nothing here: block i
// lives in recv at rank me-i's place from the first round it arrives (its
// final place), and a block that has not moved yet (no bit of i below k
// set) is sent straight from send. A round's blocks are sent in one stream
// of bytes, by descending index (ascending places in recv, so that runs of
// indices are runs of memory), cut into pieces through the pipes: each piece
// that spans several places is packed into the scratch slot first, and
// unpacked from the inbox on the receiving side. Each rank sends about half
// its data per round: (S/2)·log2 n bytes against pairwise's S, in log2 n
// hand-offs against n-1. Every rank sends to one rank and receives from
// another in each round, a piece in turn, as allGatherBruck does. send and
// recv must not overlap.
func alltoAllBruck(sc *sched, send, recv device.Ptr, block int64) {
	st := sc.st
	me, n := st.comm.Rank(), st.comm.Size()
	sc.copy(recv.Add(int64(me)*block), send.Add(int64(me)*block), block)
	if block == 0 {
		return
	}
	// at(i) is where block i lives in recv: rank me-i's place.
	at := func(i int) device.Ptr { return recv.Add(int64(mod(me-i, n)) * block) }
	per := sc.piece()
	scratch := sc.mySlot(st.lay.scratchOff())
	for h := 1; h < n; h *= 2 {
		var src, dst []span
		for i := n - 1; i > 0; i-- {
			if i&h == 0 {
				continue
			}
			from := at(i)
			if i&(h-1) == 0 { // not moved yet: still in send
				from = send.Add(int64(mod(me+i, n)) * block)
			}
			src = appendSpan(src, from, block, from != at(i))
			dst = appendSpan(dst, at(i), block, false)
		}
		var total int64 // the round's bytes
		for _, s := range src {
			total += s.n
		}
		to, from := mod(me+h, n), mod(me-h, n)
		for lo := int64(0); lo < total; lo += per {
			k := min(per, total-lo)
			if p, ok := oneSpan(src, lo, k); ok {
				sc.pipeSend(to, p, k)
			} else {
				gatherSpans(sc, scratch, src, lo, k)
				sc.pipeSend(to, scratch, k)
			}
			slot, done := sc.pipeRecv(from)
			scatterSpans(sc, dst, slot, lo, k)
			done()
		}
	}
}

// span is a run of bytes in device memory, in one of two buffers (send
// and recv: other is the second).
type span struct {
	p     device.Ptr
	n     int64
	other bool
}

// appendSpan appends n bytes at p, in buffer other, to spans, merging them
// into the last span where they continue it in the same buffer (two
// buffers may lie end to end: a span that ran from one into the other would
// fail the range checks of the copy or write that takes it).
func appendSpan(spans []span, p device.Ptr, n int64, other bool) []span {
	if l := len(spans); l > 0 && spans[l-1].other == other && spans[l-1].p.Add(spans[l-1].n) == p {
		spans[l-1].n += n
		return spans
	}
	return append(spans, span{p, n, other})
}

// walkSpans calls fn for each part of spans that bytes [lo, lo+n) of their
// concatenation cover, with the part's offset from lo.
func walkSpans(spans []span, lo, n int64, fn func(p device.Ptr, off, m int64)) {
	var base int64
	for _, s := range spans {
		if base >= lo+n {
			return
		}
		if a, b := max(lo, base), min(lo+n, base+s.n); a < b {
			fn(s.p.Add(a-base), a-lo, b-a)
		}
		base += s.n
	}
}

// oneSpan reports whether bytes [lo, lo+n) of spans' concatenation lie in
// one span, and where.
func oneSpan(spans []span, lo, n int64) (device.Ptr, bool) {
	var p device.Ptr
	parts := 0
	walkSpans(spans, lo, n, func(q device.Ptr, _, _ int64) { p = q; parts++ })
	return p, parts == 1
}

// gatherSpans copies bytes [lo, lo+n) of spans' concatenation to dst.
func gatherSpans(sc *sched, dst device.Ptr, spans []span, lo, n int64) {
	walkSpans(spans, lo, n, func(p device.Ptr, off, m int64) { sc.copy(dst.Add(off), p, m) })
}

// scatterSpans copies n bytes at src to bytes [lo, lo+n) of spans'
// concatenation.
func scatterSpans(sc *sched, spans []span, src device.Ptr, lo, n int64) {
	walkSpans(spans, lo, n, func(p device.Ptr, off, m int64) { sc.copy(p, src.Add(off), m) })
}
