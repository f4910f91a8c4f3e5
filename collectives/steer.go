package collectives

import (
	"fmt"
	"math/bits"
	"sync/atomic"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// Steering a hello's payload. Over tcp a peer's hello — a header and the
// block this rank's one-shot all-to-all or all-gather then copies into its
// receive buffer — arrives through the channel's receive engine, which
// copies it from its read buffer into the hello slot; then copies it again,
// into recv. Before it sends its own hellos, the call asks each tcp channel
// to steer the peer's hello (hcomm.ChannelSteer): the header still goes to
// the slot, where verify checks it, but the block goes straight to its place
// in recv, and then skips it. A hello that arrived before the steer was
// armed (a peer ahead of this rank, its bytes already taken in) lands in its
// slot as before and is copied as before.
//
// The blocks a peer's hello carries are its own to choose only in length:
// the channel steers a write of exactly the slot's header and n bytes, so
// a peer whose call differs (a mismatch that verify then reports) writes at
// most n bytes of recv, which a failed call leaves undefined anyway.

// steerMin is the smallest payload worth steering: below it the copy it
// saves costs less than arming and ending a steer per peer.
const steerMin = 4 << 10

// steersLanded counts the payloads steered into place (for the tests).
var steersLanded atomic.Int64

// helloSteers are the steers of one call's hellos, one a peer.
type helloSteers struct {
	t      [helloFullMax]hcomm.Steer
	armed  uint16 // bit p: t[p] is armed
	landed uint16 // bit p: peer p's payload landed in place
}

// arm steers, when p's channel is tcp, the payload of p's hello of parity
// par, n bytes after its header, to to. An error (to not in memory the host
// sees, a channel already broken) steers nothing: the hello's own writes
// and waits report what is wrong with the channel.
func (b *helloSteers) arm(st *state, p int, par uint64, n int64, to device.Ptr) {
	ch := st.chans[p]
	if p >= len(b.t) || ch.Transport() != hcomm.TransportTCP {
		return
	}
	at := st.buf.Add(st.lay.helloOff(p, par))
	if t, ok, err := hcomm.ChannelSteer(ch, at, headerSize+n, headerSize, to); err == nil && ok {
		b.t[p] = t
		b.armed |= 1 << p
	}
}

// end ends every armed steer, marking the payloads that landed in place. A
// steer whose write was cut short is an error (of the collective op, rank
// me): neither the slot nor the receive buffer holds the whole payload.
func (b *helloSteers) end(st *state, op string, me int, n int64) error {
	var err error
	for b.armed != 0 {
		p := bits.TrailingZeros16(b.armed)
		b.armed &^= 1 << p
		switch b.t[p].End() {
		case hcomm.SteerLanded:
			b.landed |= 1 << p
			steersLanded.Add(1)
		case hcomm.SteerCut:
			if err == nil {
				err = &hcomm.Error{Op: op, Comm: st.comm.Name(), Rank: me, Peer: p, Code: hcomm.ErrInternal,
					Err: fmt.Errorf("rank %d's hello of %d bytes was cut short as it arrived", p, headerSize+n)}
			}
		}
	}
	return err
}

// in reports whether peer p's payload landed in place.
func (b *helloSteers) in(p int) bool { return b.landed&(1<<p) != 0 }

// steer arms a steer of each peer's hello that is not a flagged line, for
// the payload to go to outAt(x, p).
func (x *helloCall) steer() {
	for _, p := range x.peers {
		if !x.isFlagged(p) {
			x.steers.arm(x.s.st, p, x.par[p], x.n, x.outAt(x, p))
		}
	}
}

// endSteers ends x's steers (helloSteers.end). With none armed it touches
// nothing else of x: release calls it on a call that never got as far as
// its schedule (x.s nil).
func (x *helloCall) endSteers() error {
	if x.steers.armed == 0 {
		return nil
	}
	return x.steers.end(x.s.st, x.h.kind.String(), int(x.h.from), x.n)
}

// inPlace reports whether peer p's payload already lies at outAt(x, p).
func (x *helloCall) inPlace(p int) bool { return x.steers.in(p) }

// alltoAllAt is the one-shot all-to-all's outAt: peer p's block goes to
// recv + p·n.
func alltoAllAt(x *helloCall, p int) device.Ptr { return x.red.recv.Add(int64(p) * x.n) }

// allGatherAt is the one-shot all-gather's outAt.
func allGatherAt(x *helloCall, p int) device.Ptr { return x.red.recv.Add(x.outDispls[p] * x.blkES) }

// bfSteers are a butterfly all-gather's steers, one a round (the first
// bfSteerMax rounds: 2^8 ranks).
type bfSteers struct {
	t       [bfSteerMax]hcomm.Steer
	armed   uint8
	settled uint8 // bit i: round i's steer ended, landed or not
	in      uint8 // bit i: round i's blocks landed in place
}

const bfSteerMax = 8

// landed ends round i's steer, if armed, and reports whether the
// partner's blocks landed in place. A write cut short cannot have been
// waited for: it reports false, and the blocks are copied from the slot,
// which the check of the hello will have found wanting first.
func (b *bfSteers) landed(i int) bool {
	if i >= bfSteerMax || b.armed&(1<<i) == 0 {
		return false
	}
	b.armed &^= 1 << i
	if b.t[i].End() == hcomm.SteerLanded {
		b.in |= 1 << i
		steersLanded.Add(1)
	}
	return b.in&(1<<i) != 0
}

// end ends the steers still armed (a butterfly that failed or skipped a
// copy: a mismatch).
func (b *bfSteers) end() {
	for b.armed != 0 {
		i := bits.TrailingZeros8(b.armed)
		b.armed &^= 1 << i
		b.t[i].End()
	}
}

// steerGather arms, for each round of x (a butterfly all-gather, not the
// tree's) in which the partner's hello over tcp carries blocks of other
// ranks than this one, enough of them to be worth it, a steer of the
// hello's blocks to their places in the output, which the round would copy
// them to.
func (x *bfCall) steerGather(b *bfSteers) {
	st := x.s.st
	me, size := int(x.h.from), st.comm.Size()
	r := foldR(size)
	for i, stp := range x.steps {
		if i >= bfSteerMax {
			break
		}
		p := stp.peer
		if !stp.recv || stp.final || stp.flag != 0 || st.chans[p].Transport() != hcomm.TransportTCP {
			continue
		}
		lo, hi := x.partnerSpan(stp, r)
		got := int64(hi-lo) * x.block
		if got < steerMin || lo <= me && me < hi {
			continue
		}
		at := x.s.mySlot(st.lay.helloOff(p, stp.par))
		to := x.out.Add(int64(lo) * x.block)
		if t, ok, err := hcomm.ChannelSteer(st.chans[p], at, headerSize+got, headerSize, to); err == nil && ok {
			b.t[i] = t
			b.armed |= 1 << i
		}
	}
}

// partnerSpan returns the ranks whose blocks the partner of a butterfly
// all-gather's round stp (not final, not the tree's) sends, [lo, hi): its
// own or its folded partner's (a fold in), or those of its half of the
// round, as exchange's partnerHas says.
func (x *bfCall) partnerSpan(stp bfStep, r int) (lo, hi int) {
	me, p := int(x.h.from), stp.peer
	bit := bitOf(me, p, r)
	return rankSpan(x.s.st.comm.Size(), func(q int) bool {
		if bit == 0 {
			return q == p
		}
		return virt(q, r)&^(bit-1) == virt(p, r)&^(bit-1)
	})
}
