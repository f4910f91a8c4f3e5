package collectives

import (
	"context"
	"fmt"
	"math"
	"math/bits"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/internal/reduce"
)

// Options tune one collective call. The zero value (or nil) lets hcomm choose.
type Options struct {
	Algorithm Algorithm

	// level marks a call that is one level of a two-level schedule
	// (hier.go), on a sub-communicator: its algorithm is its own
	// selector's, since HCCL_ALGO names the two-level schedule itself
	// (which, forced on the level too, would call itself for ever).
	level bool
}

// levelOptions are the options of the calls a two-level schedule makes on
// its levels' communicators.
var levelOptions = &Options{level: true}

// copy returns a copy of o (nil for nil).
func (o *Options) copy() *Options {
	if o == nil {
		return nil
	}
	x := *o
	return &x
}

func algoOf(o *Options) Algorithm {
	if o == nil {
		return AlgoAuto
	}
	return o.Algorithm
}

// collErr makes a collective's error; c may be nil (rank -1).
func collErr(c *hcomm.Comm, op string, code hcomm.Result, err error, format string, args ...any) error {
	e := &hcomm.Error{Op: op, Rank: -1, Peer: -1, Code: code, Msg: fmt.Sprintf(format, args...), Err: err}
	if c != nil {
		e.Comm, e.Rank = c.Name(), c.Rank()
	}
	return e
}

// checkArgs validates what every rank can check alone.
func checkArgs(c *hcomm.Comm, op string, count int64, dt hcomm.DataType, rop hcomm.ReduceOp, s *device.Stream) error {
	if err := c.Check(); err != nil {
		return err
	}
	switch {
	case count < 0:
		return collErr(c, op, hcomm.ErrPara, nil, "count %d is negative", count)
	case dt.Valid() && overflows(count, int64(dt.Size()*c.Size())):
		// Every byte count a collective computes is at most count x
		// element size x ranks: checked once here, so that none wraps.
		return collErr(c, op, hcomm.ErrPara, nil, "count %d is too large: %d of %d-byte %v for %d ranks overflow a 64-bit byte count", count, count, dt.Size(), dt, c.Size())
	case !dt.Valid():
		return collErr(c, op, hcomm.ErrNotSupport, nil, "data type %v is not supported", dt)
	case !rop.Valid():
		return collErr(c, op, hcomm.ErrNotSupport, nil, "reduce op %v is not supported", rop)
	case s == nil:
		return collErr(c, op, hcomm.ErrPtr, nil, "nil stream")
	case s.Device() != c.Device():
		return collErr(c, op, hcomm.ErrPtr, nil, "stream belongs to another device context than the communicator")
	}
	return nil
}

// overflows reports whether count x m (count ≥ 0, m > 0) exceeds an int64:
// the product's high word, not a division (a 64-bit divide is tens of cycles
// of every call).
func overflows(count, m int64) bool {
	hi, lo := bits.Mul64(uint64(count), uint64(m))
	return hi != 0 || lo > math.MaxInt64
}

func checkBuf(c *hcomm.Comm, op, what string, p device.Ptr, n int64) error {
	if n == 0 {
		return nil
	}
	if err := c.Device().CheckRange(p, n); err != nil {
		return collErr(c, op, hcomm.ErrPara, err, "%s buffer", what)
	}
	return nil
}

// checkAlgo checks a chosen algorithm (not AlgoAuto) against the collective
// and the message of n bytes per rank.
func checkAlgo(c *hcomm.Comm, name string, k kind, algo Algorithm, n int64, lay layout) error {
	if algo == AlgoAuto {
		return nil
	}
	if !has(k, algo) {
		return collErr(c, name, hcomm.ErrNotSupport, nil, "%v has no %v algorithm (it has %v)", k, algo, algorithms[k])
	}
	if p := oneShotPayload(k, n, c.Size()); algo == AlgoOneShot && p > lay.inline() {
		return collErr(c, name, hcomm.ErrPara, nil, "oneshot carries at most %d bytes per hello with this HCCL buffer, %v of %d bytes per rank among %d ranks needs %d", lay.inline(), k, n, c.Size(), p)
	}
	if p := rdPayload(k, n, c.Size()); algo == AlgoRD && p > lay.inline() {
		return collErr(c, name, hcomm.ErrPara, nil, "rd carries at most %d bytes with this HCCL buffer, %v of %d bytes per rank among %d ranks needs %d", lay.inline(), k, n, c.Size(), p)
	}
	return nil
}

// AllReduce enqueues on s the reduction of count elements of dt with op
// across all ranks; every rank's recv receives the result (HcclAllReduce).
// send == recv is in-place. Every rank must call it, in the same order as its
// other collectives, with the same count, dt and op. It returns once the work
// is enqueued; synchronize s to wait for it. Results are identical on every
// rank, and run after run (every rank reduces in an order fixed by the
// schedule); with HCCL_DETERMINISTIC=strict they are the rank-order
// reduction, whatever the algorithm and transport (see the package doc).
func AllReduce(send, recv device.Ptr, count int64, dt hcomm.DataType, op hcomm.ReduceOp, c *hcomm.Comm, s *device.Stream, o *Options) error {
	const name = "AllReduce"
	if err := checkArgs(c, name, count, dt, op, s); err != nil {
		return err
	}
	if done, err := laneAllReduce(c, s, o, send, recv, count, dt, op); done { // lane.go
		return err
	}
	n := count * int64(dt.Size())
	if err := checkBuf(c, name, "send", send, n); err != nil {
		return err
	}
	if err := checkBuf(c, name, "recv", recv, n); err != nil {
		return err
	}
	h := header{kind: kAllReduce, dt: dt, op: op, flags: flagOp, count: count}
	if grouping(c) {
		o := o.copy() // the call as it was made, whatever the caller does to *o before GroupEnd
		if recordCall(c, name, func() error { return AllReduce(send, recv, count, dt, op, c, s, o) }) {
			return nil // group.go: GroupEnd issues it
		}
	}
	return issue(c, name, kAllReduce, s, o, n, func(sc *sched, algo Algorithm) error {
		switch algo {
		case AlgoOneShot:
			allReduceOneShot(sc, h, send, recv, count, dt, op)
		case AlgoRD:
			allReduceRD(sc, h, send, recv, count, dt, op)
		case AlgoRing:
			sc.open(h, algo)
			allReduceRing(sc, send, recv, count, dt, op)
		case AlgoDirect:
			if !sc.st.directReads() || sc.sparse() || c.Size() == 1 {
				// Ranks that cannot read each other's memory: the
				// ring, on every rank alike (directReads is the
				// communicator's).
				h.algo = AlgoRing
				sc.open(h, AlgoRing)
				allReduceRing(sc, send, recv, count, dt, op)
				break
			}
			allReduceDirect(sc, h, send, recv, count, dt, op)
		case AlgoHD:
			var ln *loan
			if c.Size() == 2 {
				// Over tcp the all-gather half goes by lent pipes: each
				// rank's half straight to its place in the other's recv
				// (hd.go).
				ln = sc.openPipes(h, algo, recv, n)
			} else {
				sc.open(h, algo)
			}
			allReduceHD(sc, send, recv, count, dt, op, ln)
		case AlgoTree:
			// A reduce up the binomial tree to rank 0 and a broadcast down
			// it, each pipelined in pieces: 2 log2(n) hops deep, each piece
			// reduced once per hop. Where the pairs lend (tcp:
			// openBroadcast), the broadcast half goes by lent pipes, each
			// piece written straight to its place in recv, and the copy
			// out of the inbox is gone; the reduce half stays staged (a
			// piece reduced as it arrives would still land in a buffer
			// first, the socket's, and cost the same passes).
			if c.Size() == 1 {
				sc.open(h, algo)
				sc.copy(recv, send, n)
				break
			}
			ln := openBroadcast(sc, h, algo, recv, n, 0)
			reduceTree(sc, send, recv, count, dt, op, 0)
			broadcastTree(sc, recv, n, 0, ln)
		case AlgoDBTree:
			sc.open(h, algo)
			allReduceDBTree(sc, send, recv, count, dt, op)
		case AlgoHier:
			sc.open(h, algo)
			allReduceHier(sc, s, send, recv, count, dt, op)
		case AlgoOrdered:
			sc.open(h, algo)
			allReduceOrdered(sc, send, recv, count, dt, op)
		default:
			return collErr(c, name, hcomm.ErrNotSupport, nil, "algorithm %v is not available for allreduce", algo)
		}
		return nil
	})
}

// issue runs the part every collective shares: set up (first call), order
// after the previous collective, pick the algorithm for kind k and a message
// of n bytes per rank, issue the schedule (which opens with the handshake),
// and record the completion.
func issue(c *hcomm.Comm, name string, k kind, s *device.Stream, o *Options, n int64, body func(sc *sched, algo Algorithm) error) error {
	return issueWindowed(c, name, k, s, o, n, nil, body)
}

// issueWindowed is issue for a collective that reads peers in place when its
// buffers lie in a window: windowed (called once, with st.mu held, before
// body) says whether they do, for the selector.
func issueWindowed(c *hcomm.Comm, name string, k kind, s *device.Stream, o *Options, n int64, windowed func(st *state) bool, body func(sc *sched, algo Algorithm) error) error {
	st, err := lockLocal(c)
	if err != nil {
		return collErr(c, name, hcomm.ResultOf(err), err, "setting up the collectives")
	}
	defer st.mu.Unlock()
	// A call this rank can tell is wrong fails here, before the channels
	// are set up: at once, and with the communicator still usable.
	algo, from := algoOf(o), "Options.Algorithm"
	if algo == AlgoAuto && (o == nil || !o.level) {
		algo, from = st.forced[k], "HCCL_ALGO"
	}
	if st.strict && reduces(k) {
		if algo, err = strictAlgo(c, name, k, algo, from, n, st.lay); err != nil {
			return err
		}
	}
	if err := checkAlgo(c, name, k, algo, n, st.lay); err != nil {
		return err
	}
	if err := st.connect(context.Background()); err != nil {
		return collErr(c, name, hcomm.ResultOf(err), err, "setting up the collective channels")
	}
	inWin := windowed != nil && windowed(st) // always: the schedule uses what it finds
	if algo == AlgoAuto {
		algo = choose(k, n, c.Size(), st.lay, st.costs, st.mapped, st.multiHost, inWin)
		if st.multiHost && !inWin {
			algo = chooseLevels(k, n, algo, st.lay, st.costs, st.mapped, st.shape())
		}
		algo = crowdedChoice(k, c.Size(), n, st.mapped, st.crowdedComm, algo)
		algo = preferLent(k, n, c.Size(), st, algo)
	}
	t, err := st.begin(s)
	if err != nil {
		return collErr(c, name, hcomm.ResultOf(err), err, "")
	}
	// BeginOp numbers the collective for errors and logs, and times it when
	// metrics are on; endOp enqueues the closing task.
	opSeq, endOp := c.BeginOp(t, name, algo.String())
	sc := &sched{st: st, t: t, opSeq: opSeq, ctx: st.setupCtx(s), per: pieceFor(k, algo, n, c.Size(), st.mapped, st.lay.piece)}
	if s == st.own {
		sc.poll = slicePoll // the host-slice layer's stream: its caller waits anyway
	}
	sc.afterSmall = st.lastStream == s && st.lastSmall
	st.lastSmall = algo == AlgoOneShot // a schedule that is one hello
	st.seq++
	if st.helloPoll >= 0 { // HCOMM_HELLO_POLL=off: nothing runs in the caller
		t.SetEager(sc.pollFor(), eagerMax)
		defer t.SetEager(0, 0)
	}
	if err := body(sc, algo); err != nil {
		return err
	}
	if sc.unset { // need failed before anything was enqueued: take the call back
		st.seq--
		endOp()
		return collErr(c, name, hcomm.ResultOf(sc.err), sc.err, "setting up the collective channels")
	}
	sc.drainGathers()
	sc.drainPipes()
	for _, f := range sc.atEnd {
		sc.launchStop("collective end", f)
	}
	if sc.err == nil {
		sc.do(endOp())
	}
	if sc.err == nil {
		sc.do(st.end(s))
	}
	if sc.err != nil {
		st.err = sc.err // a half-issued schedule leaves the peers out of step
		return collErr(c, name, hcomm.ResultOf(sc.err), sc.err, "issuing the schedule")
	}
	return nil
}

// allReduceOneShot: every rank's input travels inline with its hello into
// every peer's hello slot; once all have arrived, each rank reduces the n
// inputs in rank order into recv (so that every rank gets the same bits).
// One hand-off deep.
func allReduceOneShot(sc *sched, h header, send, recv device.Ptr, count int64, dt hcomm.DataType, op hcomm.ReduceOp) {
	h.algo = AlgoOneShot
	// The reduction runs in the handshake's task (reduceInline): one task
	// per rank for the whole collective. Inputs are read from the hello
	// slots (this rank's own copy included), so in place is safe.
	x := helloPool.Get().(*helloCall)
	x.red = reduceArgs{recv: recv, count: count, dt: dt, op: op}
	sc.helloWith(x, h, sc.others(), send, count*int64(dt.Size()), nil, reduceInline)
}

// reduceInline is the one-shot all-reduce's reduction: recv = the inputs in
// the hello slots, combined in rank order.
func reduceInline(x *helloCall) error {
	r := x.red
	if r.count == 0 {
		return nil
	}
	// The kernels run on the host, over host views: recv's is the memory
	// itself on the host backend, a copy flushed below on an accelerator's.
	out, err := x.dev.Map(r.recv, x.n)
	if err != nil {
		return err
	}
	defer out.Unmap()
	dst := out.Bytes()
	n := x.s.st.comm.Size()
	if n == 1 {
		copy(dst, x.payload(0))
	} else {
		if err := reduce.Reduce3(dst, x.payload(0), x.payload(1), int(r.count), r.dt, r.op); err != nil {
			return err
		}
		for p := 2; p < n; p++ {
			if err := reduce.Reduce(dst, x.payload(p), int(r.count), r.dt, r.op); err != nil {
				return err
			}
		}
	}
	return out.Flush(0, x.n)
}

// allReduceRing: a ring reduce-scatter, then an all-gather in which every
// rank reads the other ranks' results straight from their HCCL buffers — run
// on blocks of n pieces, so that a block's data stays in cache from the first
// step to the last (NCCL's ring loop does the same).
//
// In a block, chunk c is piece c. The reduce-scatter moves one piece per step
// through the right neighbour's two ring slots. A received piece is combined
// with this rank's own input straight into its destination
// (LocalReduceToOnThread): no pass copies send to recv first. The last step's
// result goes into one of this rank's two gather slots; the rank copies it to
// its recv, signals every peer, and every peer reads it from there into its own
// recv: one copy per receiver, where a ring all-gather costs a write and a
// copy. Memory traffic is then close to the floor: each input read once, each
// output written once.
func allReduceRing(sc *sched, send, recv device.Ptr, count int64, dt hcomm.DataType, op hcomm.ReduceOp) {
	st := sc.st
	es := int64(dt.Size())
	n := int64(st.comm.Size())
	if n == 1 {
		sc.copy(recv, send, count*es)
		return
	}
	block := n * (sc.piece() / es)
	// Software-pipelined: the all-gather reads of block b are issued after the
	// reduce-scatter of block b+1, so that by the time this rank waits for a
	// peer's result the peer has long published it, and a rank that is a
	// little behind does not stall the others at every block.
	var gather func()
	for base := int64(0); base < count; base += block {
		next := allReduceBlock(sc, send.Add(base*es), recv.Add(base*es), min(block, count-base), dt, op)
		if gather != nil {
			gather()
		}
		gather = next
	}
	if gather != nil {
		gather()
	}
}

// allReduceBlock issues the reduce-scatter of one block and publishes this
// rank's result; it returns the function that issues the block's all-gather.
func allReduceBlock(sc *sched, send, recv device.Ptr, count int64, dt hcomm.DataType, op hcomm.ReduceOp) (gather func()) {
	st := sc.st
	if !st.mapped {
		return allReduceBlockPush(sc, send, recv, count, dt, op)
	}
	me, n := st.comm.Rank(), st.comm.Size()
	es := int64(dt.Size())
	others := sc.others()
	k, slot := sc.claimGather(others)
	// Rank p ends the reduce-scatter with the result of chunk p+1, in its
	// gather slot.
	ringReduceScatter(sc, 0, func(c int) (int64, int64) { return chunk(count, n, c) }, send,
		func(int) device.Ptr { return slot }, dt, op)
	sc.publish(k, others)
	off, cnt := chunk(count, n, mod(me+1, n))
	sc.copy(recv.Add(off*es), slot, cnt*es)
	ks := make([]uint64, n)
	for _, p := range others {
		ks[p] = sc.nextGather(p)
	}
	return func() {
		for i := 1; i < n; i++ {
			p := mod(me-i, n)
			off, cnt := chunk(count, n, mod(p+1, n))
			sc.readGather(p, ks[p], recv.Add(off*es), 0, cnt*es)
		}
	}
}

// allReduceBlockPush is allReduceBlock where a peer is behind a network: a
// read there is a round trip, and the stream issues the n-1 reads of the
// all-gather one after another. Instead the reduce-scatter ends in recv, and
// the all-gather has every rank write its result into every peer's inbox
// (one-way, all at once) and copy the peers' results out of its own: one
// hop where the reads took n-1 round trips, the same bytes on every link.
// The sends and the receives both go in the returned function, so that
// every pipe carries its pieces in the same order on both of its ends.
func allReduceBlockPush(sc *sched, send, recv device.Ptr, count int64, dt hcomm.DataType, op hcomm.ReduceOp) (gather func()) {
	me, n := sc.st.comm.Rank(), sc.st.comm.Size()
	es := int64(dt.Size())
	at := func(c int) device.Ptr {
		off, _ := chunk(count, n, c)
		return recv.Add(off * es)
	}
	// Rank p ends the reduce-scatter with the result of chunk p+1.
	ringReduceScatter(sc, 0, func(c int) (int64, int64) { return chunk(count, n, c) }, send, at, dt, op)
	return func() {
		mine := mod(me+1, n)
		if _, cnt := chunk(count, n, mine); cnt > 0 {
			for i := 1; i < n; i++ {
				sc.pipeSend(mod(me+i, n), at(mine), cnt*es)
			}
		}
		for i := 1; i < n; i++ {
			p := mod(me-i, n)
			if _, cnt := chunk(count, n, mod(p+1, n)); cnt > 0 {
				slot, done := sc.pipeRecv(p)
				sc.copy(at(mod(p+1, n)), slot, cnt*es)
				done()
			}
		}
	}
}

// ringReduceScatter reduces n chunks (chunkAt(c): element offset into send
// and count; each fits one piece) around the ring: at step s this rank sends
// its partial result of chunk me+shift-s to its right neighbour and combines
// the partial of chunk me+shift-s-1 from its left with its own input. Step 0
// sends straight from send; partials between steps live in the scratch slot;
// the last step writes chunk me+shift+1 to final(chunk).
func ringReduceScatter(sc *sched, shift int, chunkAt func(c int) (int64, int64), send device.Ptr, final func(c int) device.Ptr, dt hcomm.DataType, op hcomm.ReduceOp) {
	st := sc.st
	me, n := st.comm.Rank(), st.comm.Size()
	es := int64(dt.Size())
	scratch := sc.mySlot(st.lay.scratchOff())
	right, left := mod(me+1, n), mod(me-1, n)
	for step := 0; step < n-1; step++ {
		sc_ := mod(me+shift-step, n)
		rc := mod(me+shift-step-1, n)
		sOff, sCnt := chunkAt(sc_)
		rOff, rCnt := chunkAt(rc)
		if sCnt > 0 {
			src := scratch
			if step == 0 {
				src = send.Add(sOff * es)
			}
			sc.pipeSend(right, src, sCnt*es)
		}
		if rCnt > 0 {
			piece, done := sc.pipeRecv(left)
			dst := scratch
			if step == n-2 {
				dst = final(rc)
			}
			sc.reduceTo(dst, send.Add(rOff*es), piece, rCnt, dt, op)
			done()
		}
	}
}
