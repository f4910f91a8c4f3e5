package collectives

import (
	"context"
	"fmt"
	"time"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// sched issues one rank's part of a schedule on a thread. It only enqueues:
// the work runs when the stream reaches it. The first error stops issuing.
type sched struct {
	st    *state
	t     *hcomm.Thread
	err   error
	opSeq uint64 // the collective's number (BeginOp)
	per   int64  // bytes of the pipeline's piece for this call (pieceFor): at most the layout's slot
	// poll bounds the inline poll for the peers' hellos (launchHello):
	// HCOMM_HELLO_POLL's (helloPoll by default) when zero.
	poll time.Duration
	// afterSmall: the previous collective on the stream was one hello,
	// so what the stream has pending drains as soon as the peers answer
	// (launchHello waits a moment for it).
	afterSmall bool

	ctx    context.Context // bounds the channel setups (need); nil: none beyond the communicator's
	issued int             // calls that enqueued (do)
	unset  bool            // err is a setup of need's that failed before anything was enqueued
	// atEnd are tasks issued after the schedule's closing drains (lent.go:
	// the end of a loan of this rank's receive buffer).
	atEnd []func(stop <-chan struct{}) error
}

// pollFor returns the schedule's poll bound.
func (s *sched) pollFor() time.Duration {
	if s.poll > 0 {
		return s.poll
	}
	if s.st.helloPoll > 0 {
		return s.st.helloPoll
	}
	return helloPoll
}

func (s *sched) ok() bool { return s.err == nil }

// eagerMax bounds the bytes of a task that a collective runs in its
// caller's goroutine while the stream is idle (hcomm.Thread's eager
// issuing). Below it the hand-off to the stream's goroutine costs more than
// the task (2 ranks in one process, back to back, 4 KiB: all-gather 7.3 →
// 3.0–4.2 µs, broadcast 4.9 → 2.3–2.4); above it the caller would do work
// that the stream's goroutine does beside the caller's next call: with
// every task run in the caller, 64 KiB broadcasts took 8.1–8.3 µs against
// 5.9–6.7 queued.
const eagerMax = 16 << 10

func (s *sched) piece() int64 {
	if s.per > 0 {
		return s.per
	}
	return s.st.lay.piece
}

func (s *sched) do(err error) {
	if s.err == nil {
		s.err = err
		s.issued++
	}
}

// ch returns the channel to peer. A schedule that reaches a peer it did
// not need (state.need) fails here, naming the peer, rather than at hcomm's
// check of a nil channel.
func (s *sched) ch(peer int) *hcomm.Channel {
	c := s.st.chans[peer]
	if c == nil && s.err == nil {
		s.err = fmt.Errorf("collectives: rank %d's schedule reaches rank %d before it set up their channel (need)", s.st.comm.Rank(), peer)
	}
	return c
}

func (s *sched) peerSlot(peer int, off int64) device.Ptr { return s.st.peerBuf[peer].Add(off) }
func (s *sched) mySlot(off int64) device.Ptr             { return s.st.buf.Add(off) }

func (s *sched) write(peer int, dst, src device.Ptr, n int64) {
	if s.ok() && n > 0 {
		s.do(hcomm.WriteOnThread(s.t, s.ch(peer), dst, src, n))
	}
}

// launchStop enqueues a local task of the schedule (the handshake): fn gets
// the task's stop channel, for the immediate calls it makes.
func (s *sched) launchStop(name string, fn func(stop <-chan struct{}) error) {
	if s.ok() {
		s.do(s.t.Stream().Launch(name, fn))
	}
}

// launchNow is launchStop for a task that cannot block and moves n bytes:
// on the schedule's eager thread, with its stream idle, it runs now in the
// calling goroutine (hcomm.Thread's LaunchNow).
func (s *sched) launchNow(name string, n int64, fn func(stop <-chan struct{}) error) {
	if s.ok() {
		s.do(s.t.LaunchNow(name, n, fn))
	}
}

func (s *sched) read(peer int, dst, src device.Ptr, n int64) {
	if s.ok() && n > 0 {
		s.do(hcomm.ReadOnThread(s.t, s.ch(peer), dst, src, n))
	}
}

// writeNotify writes n bytes (possibly none) into peer's memory and then
// records its notify idx, in one task.
func (s *sched) writeNotify(peer int, dst, src device.Ptr, n int64, idx int) {
	if s.ok() {
		s.do(hcomm.WriteWithNotifyOnThread(s.t, s.ch(peer), dst, src, n, idx))
	}
}

func (s *sched) record(peer, idx int) {
	if s.ok() {
		s.do(hcomm.ChannelNotifyRecordOnThread(s.t, s.ch(peer), idx))
	}
}

func (s *sched) wait(peer, idx int) {
	if s.ok() {
		s.do(hcomm.ChannelNotifyWaitOnThread(s.t, s.ch(peer), idx, time.Duration(0)))
	}
}

func (s *sched) copy(dst, src device.Ptr, n int64) {
	if s.ok() && n > 0 && dst != src {
		s.do(hcomm.LocalCopyOnThread(s.t, dst, src, n))
	}
}

func (s *sched) reduce(dst, src device.Ptr, count int64, dt hcomm.DataType, op hcomm.ReduceOp) {
	s.jitter()
	if s.ok() && count > 0 {
		s.do(hcomm.LocalReduceOnThread(s.t, dst, src, count, dt, op))
	}
}

// reduceTo enqueues dst = a op b.
func (s *sched) reduceTo(dst, a, b device.Ptr, count int64, dt hcomm.DataType, op hcomm.ReduceOp) {
	s.jitter()
	if s.ok() && count > 0 {
		s.do(hcomm.LocalReduceToOnThread(s.t, dst, a, b, count, dt, op))
	}
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
