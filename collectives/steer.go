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

// steer arms a steer on the tcp channel to each peer whose hello is not a
// flagged line, for the payload to go to outAt(x, p).
func (x *helloCall) steer() {
	st := x.s.st
	if st.comm.Size() > len(x.steers) {
		return
	}
	for _, p := range x.peers {
		ch := st.chans[p]
		if x.isFlagged(p) || ch.Transport() != hcomm.TransportTCP {
			continue
		}
		// An error (recv not in memory the host sees, a channel
		// already broken) steers nothing: the hello's own writes and
		// waits report what is wrong with the channel.
		if t, ok, err := hcomm.ChannelSteer(ch, x.s.mySlot(x.slotOff(p)), headerSize+x.n, headerSize, x.outAt(x, p)); err == nil && ok {
			x.steers[p] = t
			x.steered |= 1 << p
		}
	}
}

// endSteers ends every armed steer, marking the payloads that landed in
// place. A steer whose write was cut short is an error: neither the slot
// nor the receive buffer holds the whole payload.
func (x *helloCall) endSteers() error {
	var err error
	for x.steered != 0 {
		p := bits.TrailingZeros16(x.steered)
		x.steered &^= 1 << p
		switch x.steers[p].End() {
		case hcomm.SteerLanded:
			x.landed |= 1 << p
			steersLanded.Add(1)
		case hcomm.SteerCut:
			if err == nil {
				err = &hcomm.Error{Op: x.h.kind.String(), Comm: x.s.st.comm.Name(), Rank: int(x.h.from), Peer: p, Code: hcomm.ErrInternal,
					Err: fmt.Errorf("rank %d's hello of %d bytes was cut short as it arrived", p, headerSize+x.n)}
			}
		}
	}
	return err
}

// inPlace reports whether peer p's payload already lies at outAt(x, p).
func (x *helloCall) inPlace(p int) bool { return x.landed&(1<<p) != 0 }

// alltoAllAt is the one-shot all-to-all's outAt: peer p's block goes to
// recv + p·n.
func alltoAllAt(x *helloCall, p int) device.Ptr { return x.red.recv.Add(int64(p) * x.n) }

// allGatherAt is the one-shot all-gather's outAt.
func allGatherAt(x *helloCall, p int) device.Ptr { return x.red.recv.Add(x.outDispls[p] * x.blkES) }
