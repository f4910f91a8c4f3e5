package collectives

import (
	"math/bits"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// The double binary tree all-reduce (AlgoDBTree), after NCCL's: two binary
// trees over the ranks, each carrying half of the message — reduced up to
// its root piece by piece, then broadcast down — such that a rank with
// children in one tree is a leaf in the other (but for a rank or two where
// the rank count is odd). A binomial tree's root and inner ranks receive
// and send the whole message log2(n) times; here every rank sends and
// receives about the message once each way per phase, as the ring does,
// while a piece is 2·log2(n) hops deep, as in a tree. The two trees' pieces
// are issued in turn, piece by piece, on the call's one stream: a rank's
// wait in one tree holds up its part in the other, so the trees do not
// flow as the two independent pipelines NCCL runs on separate channels
// (the simulator, 64 ranks, 1 MiB: 164 ms against halving-doubling's 27),
// and the selector never picks it (cost.go). Running each tree on a
// stream of its own is what it lacks.
//
// The first tree is the in-order binary tree over ranks 1 … n-1 (rank r's
// children are r ∓ lowbit(r)/2; past n-1 the right child is the nearest
// rank of its subtree that exists), hung below rank 0; its leaves are the
// odd ranks. The second is the first over relabelled ranks: r → n-1-r for
// an even n, whose leaves are then the even ranks, and r → r+1 (mod n) for
// an odd one.

// btree is one binary tree over n ranks: each rank's parent (-1 at the
// root) and children.
type btree struct {
	parent []int
	kids   [][]int
}

// inorderTree returns the first tree over n ranks (the package comment).
func inorderTree(n int) btree {
	t := btree{parent: make([]int, n), kids: make([][]int, n)}
	for r := range t.parent {
		t.parent[r] = -1
	}
	link := func(p, c int) {
		t.parent[c] = p
		t.kids[p] = append(t.kids[p], c)
	}
	if n < 2 {
		return t
	}
	top := 1 << (bits.Len(uint(n-1)) - 1) // the in-order root of 1 … n-1
	link(0, top)
	for r := 1; r < n; r++ {
		h := (r & -r) >> 1
		if h == 0 {
			continue // odd: a leaf
		}
		link(r, r-h) // the left child, below r
		for ; h > 0; h >>= 1 {
			if r+h < n {
				link(r, r+h) // the right one: the nearest of its subtree that exists
				break
			}
		}
	}
	return t
}

// dbTrees returns the two trees of the double binary tree over n ranks.
func dbTrees(n int) [2]btree {
	a := inorderTree(n)
	relabel := func(r int) int { return n - 1 - r }
	if n%2 == 1 {
		relabel = func(r int) int { return (r + 1) % n }
	}
	// b's rank relabel(r) plays a's rank r.
	b := btree{parent: make([]int, n), kids: make([][]int, n)}
	for r := 0; r < n; r++ {
		p := a.parent[r]
		if p >= 0 {
			p = relabel(p)
		}
		b.parent[relabel(r)] = p
		for _, k := range a.kids[r] {
			b.kids[relabel(r)] = append(b.kids[relabel(r)], relabel(k))
		}
	}
	return [2]btree{a, b}
}

// dbTrees returns the communicator's double binary tree, worked out at its
// first use.
func (st *state) dbTrees() [2]btree {
	if st.dbt == nil {
		t := dbTrees(st.comm.Size())
		st.dbt = &t
	}
	return *st.dbt
}

// dbtPeers returns the ranks rank me talks to in the double binary tree
// trees: its parents and children in both, each once.
func dbtPeers(me int, trees [2]btree) []int {
	var ps []int
	seen := map[int]bool{me: true}
	for _, t := range trees {
		for _, p := range append([]int{t.parent[me]}, t.kids[me]...) {
			if p >= 0 && !seen[p] {
				seen[p] = true
				ps = append(ps, p)
			}
		}
	}
	return ps
}

// allReduceDBTree issues the double binary tree all-reduce of count elements
// (the call opened): the first half of the elements over the first tree,
// the rest over the second, in pieces through the pipes, reduced up to each
// tree's root and broadcast back down. A rank combines its children's
// partial results with its input in the scratch slot (its root straight in
// recv) and sends the result up; down, it forwards the piece from its
// inbox to its children and copies it out.
func allReduceDBTree(sc *sched, send, recv device.Ptr, count int64, dt hcomm.DataType, op hcomm.ReduceOp) {
	st := sc.st
	me, n := st.comm.Rank(), st.comm.Size()
	es := int64(dt.Size())
	if n == 1 {
		sc.copy(recv, send, count*es)
		return
	}
	trees := st.dbTrees()
	half := count / 2
	lo, cnt := [2]int64{0, half}, [2]int64{half, count - half}
	per := sc.piece() / es
	scratch := sc.mySlot(st.lay.scratchOff())
	steps := max(pieces(cnt[0], per), pieces(cnt[1], per))
	// eachPiece calls fn for piece i of each tree in turn, for every i:
	// the tree, the piece's elements and its byte offset in the message.
	eachPiece := func(fn func(t btree, m, off int64)) {
		for i := int64(0); i < steps && sc.ok(); i++ {
			for j, t := range trees {
				if at := i * per; at < cnt[j] {
					fn(t, min(per, cnt[j]-at), (lo[j]+at)*es)
				}
			}
		}
	}
	// Up.
	eachPiece(func(t btree, m, off int64) {
		in := send.Add(off)
		acc := scratch
		switch {
		case t.parent[me] < 0:
			acc = recv.Add(off)
		case len(t.kids[me]) == 0:
			acc = in // a leaf sends its input as it is
		}
		for k, c := range t.kids[me] {
			slot, done := sc.pipeRecv(c)
			if k == 0 {
				sc.reduceTo(acc, in, slot, m, dt, op)
			} else {
				sc.reduce(acc, slot, m, dt, op)
			}
			done()
		}
		if p := t.parent[me]; p >= 0 {
			sc.pipeSend(p, acc, m*es)
		} else if len(t.kids[me]) == 0 {
			sc.copy(recv.Add(off), in, m*es)
		}
	})
	// Down: the same pieces from each tree's root.
	eachPiece(func(t btree, m, off int64) {
		if t.parent[me] < 0 {
			for _, c := range t.kids[me] {
				sc.pipeSend(c, recv.Add(off), m*es)
			}
			return
		}
		slot, done := sc.pipeRecv(t.parent[me])
		for _, c := range t.kids[me] {
			sc.pipeSend(c, slot, m*es)
		}
		sc.copy(recv.Add(off), slot, m*es)
		done()
	})
}
