package collectives

import (
	"context"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/internal/reduce"
)

// The butterfly handshake and the recursive-doubling all-reduce.
//
// Up to helloFullMax ranks a collective opens with the full handshake
// (handshake.go): every rank's hello to every peer, one round. Above it that
// costs each rank 2(n-1) messages per collective, which is what a small
// collective's time is made of on a host whose cores are all busy; there a
// collective opens instead with the butterfly — the exchange pattern of
// recursive doubling, log2(n) rounds in which a rank trades hellos with the
// partner whose (virtual) rank differs in one bit, so that each rank sends
// and receives log2(n) hellos (two more where the rank count is not a power
// of two: see butterflySteps). A rank that finds a peer's hello differing
// from its own does not stop: it goes on with its rounds, its hellos now
// poisoned (flagPoison) and carrying the two differing headers, and a rank
// that receives a poisoned hello does the same. After the last round every
// 2^k-block of ranks has either compared equal throughout or heard of a
// difference, for every k up to the whole group (by induction on the
// rounds), so that every rank of a mismatched collective fails with
// ErrMismatch naming both calls, and no rank waits for a hello that will not
// come — given that every rank runs the butterfly, which holds because the
// choice between the two handshakes depends on the rank count alone.
//
// The recursive-doubling all-reduce (AlgoRD) is the same exchange with data:
// each hello carries the rank's partial result inline, and each round
// combines the partner's with this rank's, lower virtual rank first, so that
// both partners compute the same bits and, after log2(n) rounds, every rank
// holds the result: log2(n) hand-offs for the whole collective, handshake
// included, in one stream task per rank. The input is sent and reduced
// from where it lies, and the last round reduces only the part a rank
// keeps, straight into its output: no copy in or out of the hello slots
// (among 16 processes over tcp a 64 KiB all-reduce took 13 % less
// processor time a rank).

//
// Where a host's ranks outnumber its cores (hcomm.Comm.Crowded), the rounds
// are a binomial tree's instead (treeSteps): every rank's hello goes up to
// its parent once it has its children's, and the root's comes back down —
// 2(n-1) messages a collective where the butterfly sends n·log2(n), in
// 2·log2(n) rounds instead of log2(n). On a crowded host a collective's
// time is the processor time of its messages (each a system call at both
// ends over tcp, and a wake-up of the process that waits for it), not its
// rounds: 16 processes on 2 cores over tcp, all-reduce of 256 B 250 µs →
// 200, 64 KiB 910 → 600; 32 processes 740 → 475 and 2.5 ms → 1.3 ms
// (BENCHMARKS.md, stop 27). The tree keeps the handshake's promise: every
// rank's call is compared with its parent's on the way up, so the root
// hears of any difference, and its hello tells every rank on the way down;
// and the pattern still depends on the communicator alone (its size and
// the cores every rank published), so that every rank runs the same one.
// The inline collectives ride it as they ride the butterfly: a partial
// result, blocks or the root's data go up, and the result comes down.
// HCOMM_HANDSHAKE=tree or butterfly overrides the choice (on every rank).

// helloFullMax is the largest rank count whose collectives open with the
// full handshake; above it they open with the butterfly.
const helloFullMax = 8

// flagPoison, in a butterfly hello, says that its sender has learnt of a
// mismatch; the payload then holds the two differing headers.
const flagPoison = 0x80

// sparse reports whether this communicator's collectives open with the
// butterfly rather than the full handshake.
func (s *sched) sparse() bool { return s.st.comm.Size() > helloFullMax }

// bfStep is one round of the butterfly for one rank: it sends its hello to
// peer, receives peer's, or both (in that order).
type bfStep struct {
	peer       int
	send, recv bool
	flag       uint32 // the hello's flag when the pair's hellos are flagged (ll.go), else 0
	lowerMine  bool   // the reduction puts this rank's partial first
	final      bool   // the received payload is the result (a folded rank)
	par        uint64 // the hello parity with peer
}

// butterflySteps returns rank me's rounds among n ranks, without parities.
// With n = 2^k + r, the odd ranks below 2r fold: each sends its hello (and
// input) to the even rank before it, which combines it with its own and
// stands in for both in the 2^k-rank exchange, then sends the outcome back.
// Virtual rank v of the exchange is rank 2v below r, v + r above.
func butterflySteps(me, n int) []bfStep {
	if n <= 1 {
		return nil
	}
	pow := 1
	for pow*2 <= n {
		pow *= 2
	}
	r := n - pow
	if me < 2*r && me%2 == 1 {
		return []bfStep{{peer: me - 1, send: true}, {peer: me - 1, recv: true, final: true}}
	}
	var steps []bfStep
	virt := me - r
	if me < 2*r {
		virt = me / 2
		steps = append(steps, bfStep{peer: me + 1, recv: true, lowerMine: true})
	}
	real := func(v int) int {
		if v < r {
			return 2 * v
		}
		return v + r
	}
	for mask := 1; mask < pow; mask <<= 1 {
		v := virt ^ mask
		steps = append(steps, bfStep{peer: real(v), send: true, recv: true, lowerMine: virt < v})
	}
	if me < 2*r {
		steps = append(steps, bfStep{peer: me + 1, send: true})
	}
	return steps
}

// treeSteps returns rank me's rounds among n ranks when they form a
// binomial tree rooted at rank 0 (state.tree): the hellos of its children
// (rank me + 2^k for each k below its lowest set bit), in, then its own to
// its parent (me less its lowest set bit), out; then the parent's, in, with
// the result (final), and its own to its children, out, the farthest first.
func treeSteps(me, n int) []bfStep {
	var steps []bfStep
	mask := 1
	for ; mask < n; mask <<= 1 {
		if me&mask != 0 {
			steps = append(steps, bfStep{peer: me - mask, send: true})
			break
		}
		if me+mask < n {
			steps = append(steps, bfStep{peer: me + mask, recv: true, lowerMine: true})
		}
	}
	if me != 0 {
		steps = append(steps, bfStep{peer: me - mask, recv: true, final: true})
	}
	for mask >>= 1; mask > 0; mask >>= 1 {
		if me+mask < n {
			steps = append(steps, bfStep{peer: me + mask, send: true})
		}
	}
	return steps
}

// subtree returns the ranks [lo, hi) of the tree of treeSteps below rank q,
// q included: the ranks q + j for j below q's lowest set bit; all of them
// below rank 0.
func subtree(q, n int) (lo, hi int) {
	if q == 0 {
		return 0, n
	}
	return q, min(n, q+q&-q)
}

// envTree returns whether the butterfly's rounds form a tree: auto, the
// choice for the communicator (sparse and crowded), unless HCOMM_HANDSHAKE
// says otherwise ("tree" only counts for a sparse communicator: below it
// the full handshake opens the collectives).
func envTree(auto bool) (bool, error) {
	switch v := os.Getenv("HCOMM_HANDSHAKE"); v {
	case "":
		return auto, nil
	case "tree":
		return true, nil
	case "butterfly":
		return false, nil
	default:
		return false, fmt.Errorf("collectives: HCOMM_HANDSHAKE=%q: want tree or butterfly (or unset: a tree where some host's ranks outnumber its cores)", v)
	}
}

// bfMode is what a butterfly's hellos carry and how a rank combines its
// partner's with its own.
type bfMode uint8

const (
	bfHello  bfMode = iota // the header alone: the handshake
	bfReduce               // a partial result, reduced lower virtual rank first (all-reduce, reduce, reduce-scatter)
	bfGather               // every rank's block at its place, copied over (all-gather)
	bfBcast                // the root's data, once a rank has it (broadcast)
)

// bfCall is one butterfly in flight: what its stream task needs.
type bfCall struct {
	s      *sched
	h      header
	steps  []bfStep
	mode   bfMode
	src    device.Ptr    // this rank's input: the payload (bfReduce), its block (bfGather), the root's data (bfBcast)
	n      int64         // the payload's bytes; 0 for the handshake alone
	block  int64         // bfGather: bytes per rank's block
	root   int           // bfBcast: the root
	red    reduceArgs    // bfReduce: count, type, op
	out    device.Ptr    // where the result goes (0: nowhere)
	err    error         // the task's failure, set before failed is closed
	failed chan struct{} // closed when the task fails
	ended  chan struct{} // closed when the task ends, failed or not
	outLo  int64         // the part of the payload that goes there
	acc    device.View   // a butterfly all-gather's output, mapped, where it gathers (exchange)
	outN   int64
	halve  bool  // bfReduce: recursive halving (a power-of-two rank count): each round sends the half of its range the partner keeps
	part   int64 // halve: the bytes of one rank's part
	opSeq  uint64
	// stepBuf holds steps up to bfInlineSteps rounds (2^22 ranks): one
	// allocation a call, the call's own.
	stepBuf [bfInlineSteps]bfStep
	line    [channel.LineData]byte // sendHello's room for a line
}

// bfInlineSteps is how many rounds a bfCall holds without a slice of its
// own: log2(n) and the two of a fold.
const bfInlineSteps = 24

// butterfly opens a collective with the butterfly handshake (header only);
// also are the peers the schedule that follows talks to, whose channels are
// set up with the butterfly's own (state.need: one setup per call, so that
// no cycle of ranks waiting for each other's setups can form).
func (s *sched) butterfly(h header, also []int) {
	s.butterflyWith(&bfCall{h: h}, also)
}

// butterflyWith issues the butterfly task x (h, mode and the data fields
// set by the caller), after setting up the channels to its partners and to
// the peers in also.
func (s *sched) butterflyWith(x *bfCall, also []int) {
	st := s.st
	me := st.comm.Rank()
	if st.bfSteps == nil {
		// This rank's rounds, and its partners, are the communicator's
		// for its life: worked out once.
		if st.tree && s.sparse() {
			st.bfSteps = treeSteps(me, st.comm.Size())
		} else {
			st.bfSteps = butterflySteps(me, st.comm.Size())
		}
		st.bfPeers = make([]int, 0, len(st.bfSteps))
		for _, stp := range st.bfSteps {
			st.bfPeers = append(st.bfPeers, stp.peer)
		}
	}
	steps := append(x.stepBuf[:0], st.bfSteps...) // x's own: parities and flags are set below
	peers := st.bfPeers
	// The channels to the partners met for the first time (state.go); a
	// setup that failed leaves the hello counters as they were. Partners
	// are mutual, so that every rank's setup completes whatever the others
	// call next; the schedule's own peers are set up after the butterfly
	// is enqueued (alsoNeed).
	if s.need(peers); s.unset {
		return
	}
	defer s.alsoNeed(x, also)
	x.s, x.opSeq, x.failed, x.ended = s, s.opSeq, make(chan struct{}), make(chan struct{})
	x.h.seq = st.seq
	x.h.from = int32(me)
	x.h.size = int32(st.comm.Size())
	if x.n > st.lay.inline() {
		s.do(fmt.Errorf("%v: %d bytes of inline payload, the hello slots hold %d", x.h.kind, x.n, st.lay.inline()))
	}
	if x.halve {
		// The rounds from the highest bit down, so that every range a
		// rank keeps or sends is one run of parts.
		slices.Reverse(steps)
	}
	x.steps = steps
	// A peer met twice (a fold) takes two parities, in the same order on
	// both sides: its hello in, then this rank's out (or the reverse).
	for i := range x.steps {
		p := x.steps[i].peer
		x.steps[i].par = st.hellos[p] % 2
		x.steps[i].flag = st.helloFlag(p, st.hellos[p]) // ll.go
		st.hellos[p]++
	}
	if !s.ok() {
		return
	}
	if len(x.steps) == 0 {
		switch x.mode {
		case bfReduce:
			s.copy(x.out, x.src.Add(x.outLo), x.outN)
		case bfGather:
			s.copy(x.out, x.src, x.block)
		}
		return
	}
	s.jitter()
	s.launchStop("collective butterfly", x.run)
}

// setupGrace is how long a failed setup of a schedule's peers waits for
// the call's butterfly to end, so that a mismatch it finds is the error.
const setupGrace = time.Second

// alsoNeed sets up the channels to the peers in also, the schedule's after
// the butterfly's, once the butterfly x is enqueued: a rank whose call
// differs from its peers' (another algorithm, needing other peers) would
// otherwise wait in that setup for peers that never join it, until
// HCCL_CONNECT_TIMEOUT, and never send the hellos that tell the others.
// Here the butterfly runs meanwhile, and its failure ends the setup: the
// call fails with the butterfly's error (ErrMismatch).
func (s *sched) alsoNeed(x *bfCall, also []int) {
	if len(also) == 0 || !s.ok() {
		return
	}
	parent := s.ctx
	if parent == nil {
		parent = context.Background()
	}
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	go func() {
		select {
		case <-x.failed:
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := s.st.need(ctx, also); err != nil {
		// A setup that failed because the peer already failed this call
		// (its butterfly found a mismatch, and its channels went with
		// it) is told by this rank's butterfly as well, moments later:
		// give it setupGrace to end, and report the mismatch rather than
		// the setup.
		t := time.NewTimer(setupGrace)
		select {
		case <-x.ended:
		case <-t.C:
		}
		t.Stop()
		select {
		case <-x.failed:
			s.do(x.err)
		default:
			s.do(err)
		}
	}
}

// virt is rank q's virtual rank in the butterfly among n = pow + r ranks
// (a folded rank's is its folder's).
func virt(q, r int) int {
	if q < 2*r {
		return q / 2
	}
	return q - r
}

// foldR returns r of n = pow + r.
func foldR(n int) int { return n - 1<<lg2(n) }

// bitOf returns the mask of a butterfly round with peer p (0 for a fold).
func bitOf(me, p, r int) int {
	if p/2 == me/2 && me < 2*r && p < 2*r {
		return 0
	}
	return virt(me, r) ^ virt(p, r)
}

// bfFailure is what a butterfly learnt of a mismatch: the two calls, or the
// error a peer's hello gave.
type bfFailure struct {
	a, b   header // the two differing calls (b.kind == 0: only a is known)
	peer   int    // the peer whose hello told it
	direct bool   // this rank compared a with b itself
	err    error  // a hello that could not be read
}

// run is the butterfly's stream task; a failure closes x.failed, and its
// end x.ended.
func (x *bfCall) run(stop <-chan struct{}) error {
	defer close(x.ended)
	err := x.exchange(stop)
	if err != nil {
		x.err = err
		close(x.failed)
	}
	return err
}

// exchange is run's body: the rounds, the checks, the combining.
func (x *bfCall) exchange(stop <-chan struct{}) error {
	s, st := x.s, x.s.st
	lay := st.lay
	me, size := int(x.h.from), st.comm.Size()
	r := foldR(size)
	view := st.hello.Bytes()
	own := func(k int) int64 { return lay.helloOff(me, uint64(k)) }
	cur := 0
	b := view[own(cur) : own(cur)+lay.helloSlot]
	x.h.encode(b)
	have := true // bfBcast: this rank holds the root's data
	// A butterfly all-gather (not the tree's) gathers straight into its
	// output: its own block copied there first, every partner's blocks
	// copied (or steered) there as they come, its hellos' blocks sent from
	// there — no slot to copy out of at the end.
	var acc []byte
	if x.mode == bfGather && x.n > 0 && !x.tree() {
		ov, err := st.comm.Device().Map(x.out, x.n)
		if err != nil {
			return err
		}
		defer ov.Unmap()
		acc = ov.Bytes()
		in, err := st.comm.Device().Map(x.src, x.block)
		if err != nil {
			return err
		}
		copy(acc[int64(me)*x.block:], in.Bytes()) // nothing to do in place
		in.Unmap()
		x.acc = ov
	}
	// bfReduce: the input, read where it lies — sent from there and
	// reduced from there — until the first round's result is in the slot.
	var input []byte
	if in := x.n; in > 0 && acc == nil {
		at, src := int64(0), x.src
		switch x.mode {
		case bfGather:
			at, in = int64(me)*x.block, x.block
		case bfBcast:
			have = me == x.root
			if !have {
				in = 0
			}
		}
		if in > 0 {
			v, err := st.comm.Device().Map(src, in)
			if err != nil {
				return err
			}
			if x.mode == bfReduce {
				defer v.Unmap()
				input = v.Bytes()
			} else {
				copy(b[headerSize+at:], v.Bytes())
				v.Unmap()
			}
		}
	}
	var (
		bad    *bfFailure
		result []byte // a folded rank's result, in its folder's hello
	)
	// An all-gather's partners' blocks, steered over tcp straight to their
	// places in this rank's slot (steer.go): every round's armed before the
	// first is sent, since a partner may be rounds ahead.
	var steers bfSteers
	defer steers.end()
	if acc != nil {
		x.steerGather(&steers)
	}
	plo, phi := int64(0), int64(size) // halve: the parts this rank's partial result covers
	for i, stp := range x.steps {
		p := stp.peer
		klo, khi, slo, shi := plo, phi, plo, phi // halve: the parts kept and sent this round
		if x.halve {
			mid := plo + (phi-plo)/2
			if me&bitOf(me, p, r) == 0 {
				khi, slo = mid, mid
			} else {
				klo, shi = mid, mid
			}
		}
		if stp.send {
			length := headerSize + x.n
			if !have {
				length = headerSize
			}
			b := view[own(cur) : own(cur)+lay.helloSlot]
			if bad != nil {
				length = x.poison(b, bad)
			}
			payload, flushed := s.mySlot(own(cur)).Add(headerSize), length
			switch {
			case bad != nil:
			case x.halve:
				// The half the partner keeps, from the input or the slot.
				length = headerSize + (shi-slo)*x.part
				if input != nil {
					payload, flushed = x.src.Add(slo*x.part), headerSize
				} else {
					payload, flushed = payload.Add(slo*x.part), headerSize+shi*x.part
				}
			case input != nil:
				payload, flushed = x.src, headerSize
			case x.mode == bfGather && x.n > 0:
				// Only the blocks this rank holds, which lie side by
				// side: they land in the partner's slot from its
				// payload's start (the partner knows which they are).
				lo, hi := x.holds(stp)
				length, flushed = headerSize+int64(hi-lo)*x.block, headerSize+int64(hi)*x.block
				if acc == nil {
					payload = payload.Add(int64(lo) * x.block)
					break
				}
				payload, flushed = x.out.Add(int64(lo)*x.block), headerSize
				if err := x.acc.Flush(int64(lo)*x.block, int64(hi-lo)*x.block); err != nil {
					return err
				}
			}
			if err := st.hello.Flush(own(cur), flushed); err != nil {
				return err
			}
			if err := s.sendHello(stop, p, stp.par, stp.flag, s.mySlot(own(cur)), payload, length-headerSize, &x.line); err != nil {
				return err
			}
		}
		if !stp.recv {
			continue
		}
		if err := st.awaitHello(stop, p, stp.par, stp.flag, opTag{x.h.kind, x.opSeq, x.h.algo}); err != nil {
			return err
		}
		off := lay.helloOff(p, stp.par)
		if err := st.hello.Fetch(off, headerSize); err != nil {
			return err
		}
		if f := x.check(view[off:off+lay.helloSlot], off, p); f != nil && bad == nil {
			bad = f
		}
		if bad != nil || x.mode == bfHello || x.n == 0 {
			continue
		}
		// What the partner holds: all of it after its rounds (a folded
		// rank's result), its own block or its folded partner's (a fold
		// in), or what the ranks of its half of the round hold.
		bit := bitOf(me, p, r)
		partnerHas := func(q int) bool {
			switch {
			case stp.final:
				return true
			case x.tree():
				lo, hi := subtree(p, size)
				return lo <= q && q < hi
			case bit == 0:
				return q == p
			}
			return virt(q, r)&^(bit-1) == virt(p, r)&^(bit-1)
		}
		if x.mode == bfBcast && (have || !partnerHas(x.root)) {
			continue
		}
		got, from := x.n, 0 // the partner's payload: from rank from's block on (bfGather)
		switch {
		case x.mode == bfGather:
			lo, hi := rankSpan(size, partnerHas)
			got, from = int64(hi-lo)*x.block, lo
		case x.halve:
			got = (khi - klo) * x.part // its partial of the half this rank keeps
		}
		if err := st.hello.Fetch(off+headerSize, got); err != nil {
			return err
		}
		theirs := view[off+headerSize : off+headerSize+got]
		if stp.final {
			if i == len(x.steps)-1 {
				result = theirs
				continue
			}
			// A tree's inner rank hands the result down to its
			// children: it goes to this rank's free slot, whence they
			// are sent (its children's hellos, read, are not needed).
			next := 1 - cur
			copy(view[own(next):own(next)+headerSize], view[own(cur):own(cur)+headerSize])
			copy(view[own(next)+headerSize:own(next)+headerSize+x.n], theirs)
			cur, input, have = next, nil, true
			continue
		}
		mine := input
		if acc != nil {
			mine = acc
		} else if mine == nil {
			mine = view[own(cur)+headerSize : own(cur)+headerSize+x.n]
		}
		switch x.mode {
		case bfBcast:
			copy(mine, theirs)
			have = true
		case bfGather:
			if steers.landed(i) {
				break // the partner's blocks are in place already
			}
			for q := 0; q < size; q++ {
				if q != me && partnerHas(q) {
					copy(mine[int64(q)*x.block:int64(q+1)*x.block], theirs[int64(q-from)*x.block:])
				}
			}
		case bfReduce:
			// The range this round reduces: all of it, or the half kept.
			at, m := int64(0), x.n
			if x.halve {
				at, m = klo*x.part, (khi-klo)*x.part
			}
			lo, hi := mine[at:at+m], theirs[:m]
			if !stp.lowerMine {
				lo, hi = hi, lo
			}
			spare := view[own(1-cur)+headerSize : own(1-cur)+headerSize+x.n]
			if i == len(x.steps)-1 {
				// The last round: only the part this rank keeps, and
				// straight into its place.
				if x.halve {
					if at != x.outLo || m != x.outN {
						return fmt.Errorf("collectives: recursive halving ends with bytes [%d, +%d) on rank %d, whose part is [%d, +%d)", at, m, me, x.outLo, x.outN)
					}
					return x.reduceOut(lo, hi, spare)
				}
				return x.reduceOut(lo[x.outLo:x.outLo+x.outN], hi[x.outLo:x.outLo+x.outN], spare)
			}
			next := 1 - cur
			dst := view[own(next) : own(next)+headerSize+x.n]
			copy(dst[:headerSize], view[own(cur):own(cur)+headerSize])
			if err := reduce.Reduce3(dst[headerSize+at:headerSize+at+m], lo, hi, int(m)/x.red.dt.Size(), x.red.dt, x.red.op); err != nil {
				return err
			}
			cur, input = next, nil
			plo, phi = klo, khi
		}
	}
	if bad != nil {
		return x.failure(bad)
	}
	if x.mode == bfHello || x.outN == 0 {
		return nil
	}
	if acc != nil {
		if result != nil { // a folded rank: the whole output from its folder
			copy(acc, result)
		}
		return x.acc.Flush(0, x.n)
	}
	if result == nil {
		result = view[own(cur)+headerSize : own(cur)+headerSize+x.n]
	}
	out, err := st.comm.Device().Map(x.out, x.outN)
	if err != nil {
		return err
	}
	defer out.Unmap()
	copy(out.Bytes(), result[x.outLo:x.outLo+x.outN])
	return out.Flush(0, x.outN)
}

// holds returns the ranks whose blocks a bfGather's rank holds when it
// sends its hello of step stp, [lo, hi): its own (a folded rank handing
// it over), every rank's (a folding rank handing the result back), or the
// ranks of its half of the round — ranks side by side, since a virtual
// rank below r stands for two neighbours.
func (x *bfCall) holds(stp bfStep) (lo, hi int) {
	me, size := int(x.h.from), x.s.st.comm.Size()
	if x.tree() {
		if stp.peer < me { // up, to the parent: its subtree's
			return subtree(me, size)
		}
		return 0, size // down: everything
	}
	r := foldR(size)
	bit := bitOf(me, stp.peer, r)
	switch {
	case bit == 0 && me%2 == 1:
		return me, me + 1
	case bit == 0:
		return 0, size
	}
	return rankSpan(size, func(q int) bool { return virt(q, r)&^(bit-1) == virt(me, r)&^(bit-1) })
}

// tree reports whether x's rounds are a tree's (treeSteps).
func (x *bfCall) tree() bool { return x.s.st.tree && x.s.sparse() }

// rankSpan returns the first rank q below size with has(q) and one past the
// last (0, 0: none).
func rankSpan(size int, has func(q int) bool) (lo, hi int) {
	lo, hi = size, 0
	for q := 0; q < size; q++ {
		if has(q) {
			lo, hi = min(lo, q), q+1
		}
	}
	return min(lo, hi), hi
}

// reduceOut is a bfReduce's last round: lo + hi, the part this rank keeps
// (x.outN bytes), reduced straight into its output (no output: nothing to
// do), or through spare, a free hello slot's payload, where the output
// partly overlaps the input that lo or hi may be.
func (x *bfCall) reduceOut(lo, hi, spare []byte) error {
	if x.outN == 0 {
		return nil
	}
	out, err := x.s.st.comm.Device().Map(x.out, x.outN)
	if err != nil {
		return err
	}
	defer out.Unmap()
	dst, through := out.Bytes(), false
	if reduce.PartialOverlap(dst, lo) || reduce.PartialOverlap(dst, hi) {
		dst, through = spare[:x.outN], true
	}
	if err := reduce.Reduce3(dst, lo, hi, int(x.outN)/x.red.dt.Size(), x.red.dt, x.red.op); err != nil {
		return err
	}
	if through {
		copy(out.Bytes(), dst)
	}
	return out.Flush(0, x.outN)
}

// check compares peer p's hello b (at off in the hello region; its header
// fetched) with this rank's call, and returns what it learnt of a mismatch:
// a difference, or the poison the peer passes on.
func (x *bfCall) check(b []byte, off int64, p int) *bfFailure {
	st := x.s.st
	got, err := decodeHeader(b)
	if err == nil && got.from != int32(p) {
		err = fmt.Errorf("the hello in rank %d's slot says it is from rank %d", p, got.from)
	}
	if err != nil {
		return &bfFailure{peer: p, err: err}
	}
	if got.flags&flagPoison != 0 {
		f := &bfFailure{peer: p}
		carried := min(2, int(st.lay.inline()/headerSize))
		if err := st.hello.Fetch(off+headerSize, int64(carried)*headerSize); err != nil {
			return &bfFailure{peer: p, err: err}
		}
		if f.a, err = decodeHeader(b[headerSize:]); err != nil {
			f.a = got
		}
		if carried > 1 {
			f.b, _ = decodeHeader(b[2*headerSize:])
		}
		return f
	}
	if st.noCheck {
		return nil
	}
	if !got.same(x.h) || got.seq != x.h.seq {
		return &bfFailure{a: x.h, b: got, peer: p, direct: true}
	}
	return nil
}

// poison turns this rank's hello b into a poisoned one carrying what it
// learnt, and returns the bytes to send.
func (x *bfCall) poison(b []byte, f *bfFailure) int64 {
	h := x.h
	h.flags |= flagPoison
	h.encode(b)
	carried := min(2, int(x.s.st.lay.inline()/headerSize))
	a, o := f.a, f.b
	if f.err != nil || a.kind == 0 {
		a, o = x.h, header{}
	}
	a.encode(b[headerSize:])
	if carried > 1 {
		if o.kind != 0 {
			o.encode(b[2*headerSize:])
		} else {
			clear(b[2*headerSize : 3*headerSize])
		}
	}
	return headerSize + int64(carried)*headerSize
}

// failure is the error a butterfly that learnt of a mismatch ends with.
func (x *bfCall) failure(f *bfFailure) error {
	st := x.s.st
	me, h := int(x.h.from), x.h
	if f.err != nil {
		return &hcomm.Error{Op: h.kind.String(), Comm: st.comm.Name(), Rank: me, Peer: f.peer, Code: hcomm.ErrInternal, Err: f.err}
	}
	var msg string
	switch {
	case f.b.kind != 0:
		msg = fmt.Sprintf("collective mismatch: rank %d called %s as its collective #%d, rank %d called %s as its #%d",
			f.a.from, f.a.call(), f.a.seq, f.b.from, f.b.call(), f.b.seq)
	default:
		msg = fmt.Sprintf("collective mismatch: rank %d saw a difference from its call %s as its collective #%d",
			f.a.from, f.a.call(), f.a.seq)
	}
	if !f.direct {
		msg += fmt.Sprintf(" (told by rank %d; this rank called %s as its #%d)", f.peer, h.call(), h.seq)
	}
	return &hcomm.Error{Op: h.kind.String(), Comm: st.comm.Name(), Rank: me, Peer: f.peer, Code: hcomm.ErrPara, Err: ErrMismatch, Msg: msg}
}

// allReduceRD issues the recursive-doubling all-reduce: the butterfly with
// every rank's partial result inline (the data must fit a hello slot).
func allReduceRD(sc *sched, h header, send, recv device.Ptr, count int64, dt hcomm.DataType, op hcomm.ReduceOp) {
	h.algo = AlgoRD
	n := count * int64(dt.Size())
	sc.butterflyWith(&bfCall{h: h, mode: bfReduce, src: send, n: n, red: reduceArgs{count: count, dt: dt, op: op}, out: recv, outN: n}, nil)
}

// reduceRD is the recursive-doubling all-reduce of send whose result only
// root keeps (Reduce).
func reduceRD(sc *sched, h header, send, recv device.Ptr, count int64, dt hcomm.DataType, op hcomm.ReduceOp, root int) {
	h.algo = AlgoRD
	n := count * int64(dt.Size())
	x := &bfCall{h: h, mode: bfReduce, src: send, n: n, red: reduceArgs{count: count, dt: dt, op: op}}
	if sc.st.comm.Rank() == root {
		x.out, x.outN = recv, n
	}
	sc.butterflyWith(x, nil)
}

// reduceScatterRD is the recursive-doubling all-reduce of the whole input
// (total elements) of which each rank keeps its part, cnt elements at off:
// log2(n) hand-offs where the ring takes n-1 (small messages).
//
// Among a power-of-two count of ranks, a ReduceScatter (whose parts are all
// alike: every rank knows that, where the V form's counts differ) halves
// instead (recursive halving): each round, from the highest bit down, sends
// the partner the half of the range the partner keeps and reduces the half
// this rank keeps, so that a rank sends and reduces (n-1)/n of its input in
// all where doubling moves all of it log2(n) times, in the same log2(n)
// hand-offs (tcp, 4 processes, 64 KiB in all: 49–52 µs against the
// one-shot's 63–68; 4 KiB 33 against 46–52).
func reduceScatterRD(sc *sched, h header, send, recv device.Ptr, total, off, cnt int64, dt hcomm.DataType, op hcomm.ReduceOp) {
	h.algo = AlgoRD
	es := int64(dt.Size())
	n := sc.st.comm.Size()
	x := &bfCall{h: h, mode: bfReduce, src: send, n: total * es, red: reduceArgs{count: total, dt: dt, op: op},
		out: recv, outLo: off * es, outN: cnt * es}
	if h.kind == kReduceScatter && n&(n-1) == 0 && !(sc.st.tree && sc.sparse()) {
		x.halve, x.part = true, cnt*es
	}
	sc.butterflyWith(x, nil)
}

// allGatherRD is the recursive-doubling all-gather: each hello carries the
// whole output, with the blocks this rank holds so far in place, and each
// round copies over the blocks the partner held (the output must fit a
// hello slot).
func allGatherRD(sc *sched, h header, send, recv device.Ptr, block int64) {
	h.algo = AlgoRD
	n := int64(sc.st.comm.Size()) * block
	sc.butterflyWith(&bfCall{h: h, mode: bfGather, src: send, n: n, block: block, out: recv, outN: n}, nil)
}

// broadcastRD is the recursive-doubling broadcast: the root's data rides
// the butterfly's hellos from the ranks that hold it, log2(n) hand-offs with
// the handshake included (the data must fit a hello slot).
func broadcastRD(sc *sched, h header, buf device.Ptr, bytes int64, root int) {
	h.algo = AlgoRD
	x := &bfCall{h: h, mode: bfBcast, src: buf, n: bytes, root: root}
	if sc.st.comm.Rank() != root {
		x.out, x.outN = buf, bytes
	}
	sc.butterflyWith(x, nil)
}

// schedulePeers returns the peers the schedule of algorithm a for the call
// h talks to after its handshake, beyond the butterfly's partners (which
// halving-doubling shares): a binomial tree's parent and children, Bruck's
// partners at distances 1, 2, 4, …; every peer for the others.
func (s *sched) schedulePeers(h header, a Algorithm) []int {
	me, n := s.st.comm.Rank(), s.st.comm.Size()
	switch a {
	case AlgoHD:
		if s.st.tree && s.sparse() {
			// The butterfly's partners, which the tree's handshake did
			// not set up.
			var ps []int
			for _, stp := range butterflySteps(me, n) {
				ps = append(ps, stp.peer)
			}
			return ps
		}
		return nil
	case AlgoHier: // hier talks through its levels' communicators
		return nil
	case AlgoTree:
		root := int(h.root) // 0 for the all-reduce, which has none
		v := mod(me-root, n)
		var ps []int
		if v != 0 {
			ps = append(ps, (treeParent(v)+root)%n)
		}
		for _, k := range treeChildren(v, n) {
			ps = append(ps, (k+root)%n)
		}
		return ps
	case AlgoDBTree:
		return dbtPeers(me, s.st.dbTrees())
	case AlgoBruck:
		var ps []int
		for d := 1; d < n; d *= 2 {
			ps = append(ps, mod(me-d, n), mod(me+d, n))
		}
		return ps
	}
	return s.others()
}
