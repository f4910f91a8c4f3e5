package collectives

import (
	"math/bits"
	"slices"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// Binomial trees over root-relative ranks v = (rank - root) mod n: v's parent
// is v without its highest set bit, its children are v + 2^j for every 2^j
// above v's highest bit, while below n. Data moves in pieces through the
// pipes, a piece travelling down (broadcast) or up (reduce) the tree while
// the next one follows: log2(n) hops, where the ring takes n-1 — the choice
// for small and mid-size messages over a network.

func treeParent(v int) int {
	if v == 0 {
		return -1
	}
	return v &^ (1 << (bits.Len(uint(v)) - 1))
}

// treeChildren lists v's children, largest subtree first: v + 2^j's
// subtree holds the ranks v + 2^j + (multiples of 2^(j+1)) below n, so the
// nearest child heads the largest. Sending to it first is what keeps a
// broadcast at ⌈log2 n⌉ hops: the deepest rank, n−1, is reached through
// first sends only. (The farthest child first — the order of the loop
// below — makes its k-th ancestor's send to it the k-th of that
// ancestor's: ⌈log2 n⌉(⌈log2 n⌉+1)/2 sends' time; internal/sim's
// TestTreeBroadcastHops.)
func treeChildren(v, n int) []int {
	var out []int
	for m := 1 << bits.Len(uint(v)); v+m < n; m <<= 1 {
		out = append(out, v+m)
	}
	return out
}

// broadcastTree: each rank receives a piece from its parent, forwards it
// from its inbox to its children, and copies it out.
func broadcastTree(sc *sched, buf device.Ptr, bytes int64, root int, ln *loan) {
	st := sc.st
	me, n := st.comm.Rank(), st.comm.Size()
	v := mod(me-root, n)
	real := func(u int) int { return (u + root) % n }
	kids := treeChildren(v, n)
	per := sc.piece()
	ln.setPieces(bytes, per)
	for lo := int64(0); lo < bytes; lo += per {
		m := min(per, bytes-lo)
		if v == 0 {
			for _, k := range kids {
				sc.sendPiece(ln, real(k), lo, buf.Add(lo), m)
			}
			continue
		}
		if parent := real(treeParent(v)); ln.takes(parent) {
			sc.recvLent(ln, parent) // the piece is in buf
			for _, k := range kids {
				sc.sendPiece(ln, real(k), lo, buf.Add(lo), m)
			}
			continue
		}
		slot, done := sc.pipeRecv(real(treeParent(v)))
		for _, k := range kids {
			sc.sendPiece(ln, real(k), lo, slot, m)
		}
		sc.copy(buf.Add(lo), slot, m)
		done()
	}
}

// reduceTree: each rank combines its input piece with its children's
// partial results (in the scratch slot; on the root, straight into recv) and
// sends the result to its parent.
func reduceTree(sc *sched, send, recv device.Ptr, count int64, dt hcomm.DataType, op hcomm.ReduceOp, root int) {
	st := sc.st
	me, n := st.comm.Rank(), st.comm.Size()
	v := mod(me-root, n)
	real := func(u int) int { return (u + root) % n }
	// Smallest subtree first: its partial result is ready first, so the
	// rank combines it while the larger ones are still on their way.
	kids := treeChildren(v, n)
	slices.Reverse(kids)
	es := int64(dt.Size())
	per := sc.piece() / es
	scratch := sc.mySlot(st.lay.scratchOff())
	for lo := int64(0); lo < count; lo += per {
		m := min(per, count-lo)
		acc := scratch
		if v == 0 {
			acc = recv.Add(lo * es)
		}
		in := send.Add(lo * es)
		if len(kids) == 0 {
			acc = in // a leaf sends its input as it is
		}
		for i, k := range kids {
			slot, done := sc.pipeRecv(real(k))
			if i == 0 {
				sc.reduceTo(acc, in, slot, m, dt, op)
			} else {
				sc.reduce(acc, slot, m, dt, op)
			}
			done()
		}
		if v == 0 {
			if len(kids) == 0 {
				sc.copy(recv.Add(lo*es), in, m*es)
			}
			continue
		}
		sc.pipeSend(real(treeParent(v)), acc, m*es)
	}
}
