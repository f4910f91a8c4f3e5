package collectives

import (
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// Determinism (HCCL_DETERMINISTIC, hcomm.Config.Deterministic).
//
// Level 1 ("true"): the same bits run after run. Every reducing schedule
// here already gives that, whatever the timing: each rank's stream combines
// a fixed operand with a fixed peer's piece at a fixed step, because every
// receive waits for one named peer's notify (pipeRecv, readGather, the
// hello) and there is no "whichever arrives first". In detail:
//
//   - oneshot (all-reduce, reduce-scatter, reduce): the inputs are reduced
//     in rank order once every hello has arrived.
//   - ring (all-reduce, reduce-scatter, reduce): chunk c is reduced around
//     the ring starting after its owner, x(c+1), x(c+2), …, each rank adding
//     its own input to the partial from its left neighbour; then copied.
//   - hd: fixed partners at each halving step, each rank combining its own
//     half with its partner's; the folding of non-powers of two is fixed too.
//   - tree (reduce): a rank combines its input with its children's partials
//     in a fixed child order (largest subtree first).
//   - hier: a reduce within each host and an all-reduce among the leaders,
//     each on a sub-communicator whose selector depends only on sizes and
//     transports.
//   - ordered: below.
//
// The collectives use none of the data plane's reducing writes
// (WriteReduceOnThread, ReadReduceOnThread), whose transports may apply
// concurrent writes in arrival order; the reduction kernels
// (internal/reduce) are elementwise, and their vector and Go loops give the
// same bits for every element wherever it lies in a buffer. So level 1 costs
// nothing; TestDeterministicRunToRun guards it.
//
// What level 1 does not give: the same bits from two algorithms, or from one
// algorithm on two rank counts or sizes (the ring's order per chunk depends
// on the chunk's owner, and the selector's choice on the transport and
// size). Floating-point reductions are not associative, so those differ in
// the last bits.
//
// Level 2 ("strict", hcomm's addition): every element is reduced in rank
// order, ((x0 op x1) op x2) op … op x(n-1), each step rounded to the data
// type as a two-input reduction is, so that the result is one function of
// the inputs whatever the algorithm, transport and timing. Two algorithms
// honour it: oneshot (it reduces the inline inputs in rank order) and
// ordered (below); under strict the selector picks oneshot where the data
// fits inline and ordered elsewhere, and a reducing collective forced onto
// another algorithm (Options.Algorithm, HCCL_ALGO) fails with ErrNotSupport
// naming it, rather than quietly giving other bits. Ranks that disagree on
// the level pick different algorithms above the inline size and get
// ErrMismatch from the handshake.

// reduces reports whether collectives of kind k reduce.
func reduces(k kind) bool {
	return k == kAllReduce || k == kReduceScatter || k == kReduceScatterV || k == kReduce
}

// inRankOrder reports whether algo reduces every element in rank order.
func inRankOrder(algo Algorithm) bool { return algo == AlgoOneShot || algo == AlgoOrdered }

// strictAlgo is the selector under HCCL_DETERMINISTIC=strict for a reducing
// collective of kind k moving bytes per rank: algo is the algorithm asked for
// (AlgoAuto: none), from says by whom, for the error.
func strictAlgo(c *hcomm.Comm, name string, k kind, algo Algorithm, from string, bytes int64, l layout) (Algorithm, error) {
	switch {
	case algo == AlgoAuto && has(k, AlgoOneShot) && bytes <= l.inline() && l.n <= helloFullMax:
		// Above helloFullMax ranks every collective the selector picks
		// opens with the butterfly (butterfly.go): ordered does.
		return AlgoOneShot, nil
	case algo == AlgoAuto:
		return AlgoOrdered, nil
	case inRankOrder(algo) || !has(k, algo): // checkAlgo refuses what k lacks
		return algo, nil
	}
	return algo, collErr(c, name, hcomm.ErrNotSupport, nil,
		"HCCL_DETERMINISTIC=strict reduces in rank order, which the %v algorithm (from %s) does not; use ordered, oneshot or let hcomm choose", algo, from)
}

// orderedReduceScatter is the ordered algorithm's reduce-scatter of one block:
// this rank sends chunk p of its input (chunkAt(p): element offset into send
// and count, at most one piece) to rank p through p's inbox, for every peer
// p, and reduces its own chunk from every rank's in rank order into dst:
// dst = ((x0 op x1) op x2) op … . Every rank receives from each peer once per
// block, in rank order, so the order of operations is the same whatever the
// timing, the transport or the algorithm's piece size.
func orderedReduceScatter(sc *sched, chunkAt func(p int) (int64, int64), send, dst device.Ptr, dt hcomm.DataType, op hcomm.ReduceOp) {
	st := sc.st
	me, n := st.comm.Rank(), st.comm.Size()
	es := int64(dt.Size())
	// Sends first, starting at the next rank, so that the ranks do not all
	// write to rank 0 at once; the inbox's two slots per sender take them
	// without waiting for this block's receives.
	for i := 1; i < n; i++ {
		p := mod(me+i, n)
		if off, cnt := chunkAt(p); cnt > 0 {
			sc.pipeSend(p, send.Add(off*es), cnt*es)
		}
	}
	off, cnt := chunkAt(me)
	if cnt == 0 {
		return
	}
	own := send.Add(off * es)
	if me >= 2 && own < dst.Add(cnt*es) && dst < own.Add(cnt*es) {
		// In place: dst holds the partial before this rank's input is
		// added; keep the input in the scratch slot until then.
		scratch := sc.mySlot(st.lay.scratchOff())
		sc.copy(scratch, own, cnt*es)
		own = scratch
	}
	input := func(p int) (device.Ptr, func()) {
		if p == me {
			return own, func() {}
		}
		return sc.pipeRecv(p)
	}
	x0, done0 := input(0)
	x1, done1 := input(1)
	sc.reduceTo(dst, x0, x1, cnt, dt, op)
	done0()
	done1()
	for p := 2; p < n; p++ {
		x, done := input(p)
		sc.reduce(dst, x, cnt, dt, op)
		done()
	}
}

// allReduceOrdered: the ordered reduce-scatter, then an all-gather in which
// every rank reads the others' results from their gather slots, on blocks of
// n pieces as the ring all-reduce does (and software-pipelined the same way).
// Rank p reduces chunk p of each block. Each rank sends and receives
// (n-1)/n of the data, as in the ring, but to and from every peer rather than
// its neighbours: the same memory traffic on mapped transports, all-to-all
// traffic on a network.
func allReduceOrdered(sc *sched, send, recv device.Ptr, count int64, dt hcomm.DataType, op hcomm.ReduceOp) {
	st := sc.st
	es := int64(dt.Size())
	me, n := st.comm.Rank(), st.comm.Size()
	if n == 1 {
		sc.copy(recv, send, count*es)
		return
	}
	block := int64(n) * (st.lay.piece / es)
	others := sc.others()
	var gather func()
	for base := int64(0); base < count; base += block {
		cnt := min(block, count-base)
		in, out := send.Add(base*es), recv.Add(base*es)
		k, slot := sc.claimGather(others)
		orderedReduceScatter(sc, func(p int) (int64, int64) { return chunk(cnt, n, p) }, in, slot, dt, op)
		sc.publish(k, others)
		off, c := chunk(cnt, n, me)
		sc.copy(out.Add(off*es), slot, c*es)
		ks := make([]uint64, n)
		for _, p := range others {
			ks[p] = sc.nextGather(p)
		}
		next := func() {
			for i := 1; i < n; i++ {
				p := mod(me-i, n)
				off, c := chunk(cnt, n, p)
				sc.readGather(p, ks[p], out.Add(off*es), 0, c*es)
			}
		}
		if gather != nil {
			gather()
		}
		gather = next
	}
	if gather != nil {
		gather()
	}
}

// reduceScatterOrdered: blocks of one piece per rank, each an ordered
// reduce-scatter straight into recv.
func reduceScatterOrdered(sc *sched, send device.Ptr, counts, displs []int64, recv device.Ptr, dt hcomm.DataType, op hcomm.ReduceOp) {
	es := int64(dt.Size())
	per := sc.st.lay.piece / es
	var blocks int64
	for _, x := range counts {
		blocks = max(blocks, pieces(x, per))
	}
	for b := int64(0); b < blocks; b++ {
		lo := b * per
		orderedReduceScatter(sc, func(p int) (int64, int64) {
			return displs[p] + lo, max(0, min(per, counts[p]-lo))
		}, send, recv.Add(lo*es), dt, op)
	}
}

// reduceOrdered: the all-reduce's ordered reduce-scatter on blocks of n
// pieces, after which the root alone reads every rank's result from its
// gather slot (as reduceRing does). Rank p holds piece p.
func reduceOrdered(sc *sched, send, recv device.Ptr, count int64, dt hcomm.DataType, op hcomm.ReduceOp, root int) {
	n := sc.st.comm.Size()
	reduceBlocks(sc, send, recv, count, dt, root, func(p int) int { return p },
		func(cnt int64, in, slot device.Ptr) {
			orderedReduceScatter(sc, func(p int) (int64, int64) { return chunk(cnt, n, p) }, in, slot, dt, op)
		})
}

// testJitter, when not nil, is run as a stream task of its own before each
// step of a schedule (a hello, a piece sent or received, a read from a gather
// slot, a reduction), with the rank that runs it: the determinism tests
// perturb the timing with it. Set only by tests, while no collective runs.
var testJitter func(rank int)

// testIssue, when not nil, is run before each step of a schedule (where
// testJitter is enqueued), on the goroutine that issues the schedule, with
// its rank: a test holds a rank's issuing there until the stream tasks it
// already enqueued have run (a hello that found a mismatch). Set only by
// tests, while no collective runs.
var testIssue func(rank int)

// jitter runs testIssue and enqueues testJitter, when set.
func (s *sched) jitter() {
	if f := testIssue; f != nil && s.ok() {
		f(s.st.comm.Rank())
	}
	if f := testJitter; f != nil && s.ok() {
		me := s.st.comm.Rank()
		s.do(s.t.Stream().Launch("test jitter", func(<-chan struct{}) error { f(me); return nil }))
	}
}
