package collectives

import (
	"time"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// Algorithm names a schedule. The zero value lets the selector choose.
type Algorithm int

const (
	AlgoAuto    Algorithm = iota // the selector decides by size
	AlgoOneShot                  // every rank sends its whole buffer to every peer's HCCL buffer: latency-optimised
	AlgoRing                     // ring through the HCCL buffers, pipelined in pieces: bandwidth-optimised
)

func (a Algorithm) String() string {
	switch a {
	case AlgoAuto:
		return "auto"
	case AlgoOneShot:
		return "oneshot"
	case AlgoRing:
		return "ring"
	}
	return "unknown"
}

// sched issues one rank's part of a schedule on a thread. It only enqueues:
// the work runs when the stream reaches it. The first error stops issuing.
type sched struct {
	st  *state
	t   *hcomm.Thread
	err error
}

func (s *sched) ok() bool { return s.err == nil }

func (s *sched) do(err error) {
	if s.err == nil {
		s.err = err
	}
}

func (s *sched) peerSlot(peer int, off int64) device.Ptr { return s.st.peerBuf[peer].Add(off) }
func (s *sched) mySlot(off int64) device.Ptr             { return s.st.buf.Add(off) }

func (s *sched) write(peer int, dst, src device.Ptr, n int64) {
	if s.ok() && n > 0 {
		s.do(hcomm.WriteOnThread(s.t, s.st.chans[peer], dst, src, n))
	}
}

func (s *sched) record(peer, idx int) {
	if s.ok() {
		s.do(hcomm.ChannelNotifyRecordOnThread(s.t, s.st.chans[peer], idx))
	}
}

func (s *sched) wait(peer, idx int) {
	if s.ok() {
		s.do(hcomm.ChannelNotifyWaitOnThread(s.t, s.st.chans[peer], idx, time.Duration(0)))
	}
}

func (s *sched) copy(dst, src device.Ptr, n int64) {
	if s.ok() && n > 0 && dst != src {
		s.do(hcomm.LocalCopyOnThread(s.t, dst, src, n))
	}
}

func (s *sched) reduce(dst, src device.Ptr, count int64, dt hcomm.DataType, op hcomm.ReduceOp) {
	if s.ok() && count > 0 {
		s.do(hcomm.LocalReduceOnThread(s.t, dst, src, count, dt, op))
	}
}

// --- the ring link: this rank writes pieces into its right neighbour's two
// ring slots and reads pieces its left neighbour wrote into its own.

func (s *sched) right() int { return (s.st.comm.Rank() + 1) % s.st.comm.Size() }
func (s *sched) left() int  { return (s.st.comm.Rank() + s.st.comm.Size() - 1) % s.st.comm.Size() }

// sendPiece writes n bytes at src into the right neighbour's next ring slot.
func (s *sched) sendPiece(src device.Ptr, n int64) {
	i := s.st.ringSent
	s.st.ringSent++
	k := i % 2
	r := s.right()
	if i >= 2 {
		s.wait(r, nAck+int(k)) // the neighbour consumed the slot's last piece
	}
	s.write(r, s.peerSlot(r, s.st.lay.ringSlotOff(k)), src, n)
	s.record(r, nData+int(k))
}

// recvPiece waits for the next piece from the left neighbour and returns where
// it lies in this rank's HCCL buffer; done must be called once it is consumed.
func (s *sched) recvPiece() (slot device.Ptr, done func()) {
	j := s.st.ringRecvd
	s.st.ringRecvd++
	k := j % 2
	l := s.left()
	s.wait(l, nData+int(k))
	return s.mySlot(s.st.lay.ringSlotOff(k)), func() { s.record(l, nAck+int(k)) }
}

// chunk returns the element range of chunk c of count split n ways.
func chunk(count int64, n, c int) (off, cnt int64) {
	lo := count * int64(c) / int64(n)
	hi := count * int64(c+1) / int64(n)
	return lo, hi - lo
}

func pieces(cnt, per int64) int64 {
	if cnt == 0 {
		return 0
	}
	return (cnt + per - 1) / per
}

func mod(a, n int) int { return ((a % n) + n) % n }
