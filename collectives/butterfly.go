package collectives

import (
	"fmt"

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
// included, in one stream task per rank.

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

// bfCall is one butterfly in flight: what its stream task needs.
type bfCall struct {
	s     *sched
	h     header
	steps []bfStep
	src   device.Ptr // this rank's inline payload (the all-reduce's input)
	n     int64      // its bytes; 0 for the handshake alone
	red   *reduceArgs
	opSeq uint64
}

// butterfly opens a collective with the butterfly handshake (header only).
func (s *sched) butterfly(h header) {
	s.butterflyWith(h, 0, 0, nil)
}

// butterflyWith issues the butterfly task: with red, the recursive-doubling
// all-reduce of the n bytes at src into red.recv.
func (s *sched) butterflyWith(h header, src device.Ptr, n int64, red *reduceArgs) {
	st := s.st
	me := st.comm.Rank()
	h.seq = st.seq
	h.from = int32(me)
	h.size = int32(st.comm.Size())
	if n > st.lay.inline() {
		s.do(fmt.Errorf("%v: %d bytes of inline payload, the hello slots hold %d", h.kind, n, st.lay.inline()))
	}
	steps := butterflySteps(me, st.comm.Size())
	// A peer met twice (a fold) takes two parities, in the same order on
	// both sides: its hello in, then this rank's out (or the reverse).
	for i := range steps {
		p := steps[i].peer
		steps[i].par = st.hellos[p] % 2
		st.hellos[p]++
	}
	if !s.ok() {
		return
	}
	if len(steps) == 0 {
		if red != nil {
			s.copy(red.recv, src, n)
		}
		return
	}
	x := &bfCall{s: s, h: h, steps: steps, src: src, n: n, red: red, opSeq: s.opSeq}
	s.jitter()
	s.launchStop("collective butterfly", x.run)
}

// bfFailure is what a butterfly learnt of a mismatch: the two calls, or the
// error a peer's hello gave.
type bfFailure struct {
	a, b   header // the two differing calls (b.kind == 0: only a is known)
	peer   int    // the peer whose hello told it
	direct bool   // this rank compared a with b itself
	err    error  // a hello that could not be read
}

// run is the butterfly's stream task.
func (x *bfCall) run(stop <-chan struct{}) error {
	s, st := x.s, x.s.st
	lay := st.lay
	me := int(x.h.from)
	view := st.hello.Bytes()
	own := func(k int) int64 { return lay.helloOff(me, uint64(k)) }
	cur := 0
	b := view[own(cur) : own(cur)+lay.helloSlot]
	x.h.encode(b)
	if x.n > 0 {
		in, err := st.comm.Device().Map(x.src, x.n)
		if err != nil {
			return err
		}
		copy(b[headerSize:], in.Bytes())
		in.Unmap()
	}
	var (
		bad    *bfFailure
		result []byte // a folded rank's result, in its folder's hello
	)
	for _, stp := range x.steps {
		p := stp.peer
		if stp.send {
			length := headerSize + x.n
			b := view[own(cur) : own(cur)+lay.helloSlot]
			if bad != nil {
				length = x.poison(b, bad)
			}
			if err := st.hello.Flush(own(cur), length); err != nil {
				return err
			}
			if err := hcomm.WriteWithNotifyNbi(stop, st.chans[p], s.peerSlot(p, lay.helloOff(me, stp.par)), s.mySlot(own(cur)), length, nHello+int(stp.par)); err != nil {
				return err
			}
		}
		if !stp.recv {
			continue
		}
		if err := hcomm.CollectiveNotifyWait(stop, st.chans[p], nHello+int(stp.par), 0, x.h.kind.String(), x.opSeq, x.h.algo.String()); err != nil {
			return err
		}
		off := lay.helloOff(p, stp.par)
		if err := st.hello.Fetch(off, headerSize); err != nil {
			return err
		}
		if f := x.check(view[off:off+lay.helloSlot], off, p); f != nil && bad == nil {
			bad = f
		}
		if bad != nil || x.red == nil || x.n == 0 {
			continue
		}
		if err := st.hello.Fetch(off+headerSize, x.n); err != nil {
			return err
		}
		theirs := view[off+headerSize : off+headerSize+x.n]
		if stp.final {
			result = theirs
			continue
		}
		next := 1 - cur
		mine := view[own(cur)+headerSize : own(cur)+headerSize+x.n]
		dst := view[own(next) : own(next)+headerSize+x.n]
		copy(dst[:headerSize], view[own(cur):own(cur)+headerSize])
		lo, hi := mine, theirs
		if !stp.lowerMine {
			lo, hi = theirs, mine
		}
		if err := reduce.Reduce3(dst[headerSize:], lo, hi, int(x.red.count), x.red.dt, x.red.op); err != nil {
			return err
		}
		cur = next
	}
	if bad != nil {
		return x.failure(bad)
	}
	if x.red == nil || x.n == 0 {
		return nil
	}
	if result == nil {
		result = view[own(cur)+headerSize : own(cur)+headerSize+x.n]
	}
	out, err := st.comm.Device().Map(x.red.recv, x.n)
	if err != nil {
		return err
	}
	defer out.Unmap()
	copy(out.Bytes(), result)
	return out.Flush(0, x.n)
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
	sc.butterflyWith(h, send, count*int64(dt.Size()), &reduceArgs{recv: recv, count: count, dt: dt, op: op})
}
