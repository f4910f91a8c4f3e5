package hcomm

import (
	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
)

// Steer is a steer armed by ChannelSteer. The zero Steer is not armed: its
// End reports SteerUnused.
type Steer struct{ s channel.Steered }

// SteerResult is what Steer.End reports (channel.SteerResult): SteerUnused,
// SteerLanded or SteerCut.
type SteerResult = channel.SteerResult

// What a steer became (Steer.End).
const (
	SteerUnused = channel.SteerUnused // no write took it: the write's bytes are where it was addressed
	SteerLanded = channel.SteerLanded // a write took it: its bytes past keep are in to
	SteerCut    = channel.SteerCut    // a write took it and was cut short: neither place is whole
)

// ChannelSteer asks ch's transport to store the next write of exactly n
// bytes that its peer makes at local — this rank's registered memory, a
// range the peer's write addresses — with its first keep bytes at local as
// usual and the n-keep after them into to, this rank's memory, instead. A
// receiver that knows where the write's payload goes next (a collective's
// hello: a header, then the block the call copies into its receive buffer)
// saves that copy: the transport places the bytes there as they arrive.
//
// armed is false when the transport does not steer — inproc and shm, whose
// peer stores into this rank's memory itself — or cannot now (every slot in
// use, a failed channel): the write then lands at local, as every write
// does. An armed Steer must be ended with End, after the wait for the
// record that follows the write, and to must not be read or written before
// it is: until then the transport may use it as room for a read, so what
// it holds after a SteerUnused End is undefined, for the caller to fill. A write that arrived before the steer was armed is not steered.
// Nothing is stored into to after End returns. Bad arguments are an
// ErrPara error naming them.
func ChannelSteer(ch *Channel, local device.Ptr, n, keep int64, to device.Ptr) (s Steer, armed bool, err error) {
	const op = "ChannelSteer"
	c, err := chanComm(op, ch)
	if err != nil {
		return Steer{}, false, err
	}
	if n <= 0 || keep < 0 || keep >= n {
		return Steer{}, false, c.errorf(op, ch.remote, ErrPara, nil, "keep %d of a write of %d bytes: want 0 <= keep < n", keep, n)
	}
	b, err := c.dev.Bytes(to, n-keep)
	if err != nil {
		return Steer{}, false, c.errorf(op, ch.remote, ErrPara, err, "to: %d bytes at %#x", n-keep, uint64(to))
	}
	st, ok := ch.tr.(channel.Steerer)
	if !ok {
		return Steer{}, false, nil
	}
	t, ok := st.Steer(local, n, keep, b)
	if !ok {
		return Steer{}, false, nil
	}
	return Steer{t}, true, nil
}

// End withdraws the steer and reports what became of the write it waited
// for (channel.Steered), and makes s the zero Steer: ending it again reports
// SteerUnused. (A copy of s made before End still names the transport's
// steer, which by then may be another call's: end a Steer through one
// variable.)
func (s *Steer) End() SteerResult {
	t := s.s
	if t == nil {
		return SteerUnused
	}
	s.s = nil
	return t.End()
}
