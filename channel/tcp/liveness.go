package tcp

import (
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/internal/reduce"
)

// This file holds how a channel notices a peer that is gone or stuck
// (spec.md §4): the heartbeat monitor, and the watchdog that lets a stopped
// caller end a write the peer no longer reads.

// watchDelay is how long a one-frame write runs before its watchdog
// starts to look at the caller's stop channel (every millisecond).
const watchDelay = 2 * time.Millisecond

// writeWatched writes one frame like writeVec, for a caller that may be
// stopped: a write still going out after watchDelay (the peer stopped
// reading and the kernel buffers are full) is watched, and when stop closes
// the channel is killed, which ends the write; half a frame cannot be taken
// back. It reports whether that happened. The caller holds s.wmu.
//
// Why a timer and not a goroutine per write: almost every write is done in
// microseconds, and a reused timer costs no allocation. Why armed lazily
// (watchLazy): almost every frame goes out whole at the first attempt,
// which cannot block, and the timer's reset and stop (the runtime's timer
// heap, under its locks) were 3 % of the processor time of a 16 B
// all-reduce among 4 processes over tcp.
func (s *sock) writeWatched(c *conn, op string, stop <-chan struct{}, t frameType, dt reduce.DataType, rop reduce.Op, id, addr, size uint64, vec, payload []byte) (bool, error) {
	s.watchLazy(c, op, stop)
	err := s.writeVec(t, dt, rop, id, addr, size, vec, payload)
	return s.watchDone(), err
}

// watchLazy makes the writes of the frames that follow, until watchDone,
// watched writes for stop (nil: none): writeOut arms the watchdog once a
// write has to wait for the kernel (armLazy). The caller holds s.wmu.
func (s *sock) watchLazy(c *conn, op string, stop <-chan struct{}) {
	s.wlConn, s.wlOp, s.wlStop, s.wlArmed = c, op, stop, false
}

// armLazy arms the watchdog for the watched write under way, once.
func (s *sock) armLazy() {
	if s.wlStop != nil && !s.wlArmed {
		s.wlArmed = true
		s.watchStart(s.wlConn, s.wlOp, s.wlStop)
	}
}

// watchDone ends watchLazy and reports whether the watchdog fired (it
// killed the channel: the write was stopped).
func (s *sock) watchDone() bool {
	armed := s.wlArmed
	s.wlConn, s.wlOp, s.wlStop, s.wlArmed = nil, "", nil, false
	return armed && s.watchEnd()
}

// watchStart arms the watchdog of a write that stop may end; watchEnd
// disarms it and reports whether it fired. The caller holds s.wmu.
func (s *sock) watchStart(c *conn, op string, stop <-chan struct{}) {
	if s.wt == nil {
		s.wexit = make(chan struct{}, 1)
		s.wt = time.AfterFunc(time.Hour, func() { s.watchdog(c) })
		s.wt.Stop()
	}
	s.wdog.Lock()
	s.wstop, s.wop, s.wbusy, s.wfired = stop, op, true, false
	s.wdog.Unlock()
	s.wt.Reset(watchDelay)
}

func (s *sock) watchEnd() bool {
	s.wdog.Lock()
	s.wbusy = false
	s.wdog.Unlock()
	if !s.wt.Stop() {
		<-s.wexit // the watchdog ran: wait until it is gone
	}
	s.wdog.Lock()
	fired := s.wfired
	s.wstop = nil
	s.wdog.Unlock()
	return fired
}

// watchdog runs on the timer's goroutine while a watched write is slow: it
// polls the writer's stop channel until the write ends.
func (s *sock) watchdog(c *conn) {
	defer func() { s.wexit <- struct{}{} }()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		s.wdog.Lock()
		busy, stop, op := s.wbusy, s.wstop, s.wop
		s.wdog.Unlock()
		if !busy {
			return
		}
		select {
		case <-stop:
			s.wdog.Lock()
			fired := s.wbusy
			s.wfired = fired
			s.wdog.Unlock()
			if fired {
				c.fail(c.errorf(op, 0, 0, aborted(op, "stop closed"),
					"stopped while a frame was going out on socket %d; half a frame cannot be recalled, so the channel is closed", s.idx), true)
			}
			return
		case <-tick.C:
		}
	}
}

// monitor sends heartbeats on idle sockets and fails the channel when the
// peer has been silent, or a send stuck, for longer than the peer timeout.
// It watches counts that the data path keeps anyway (reads that brought
// bytes, frames sent, writes begun and ended) and notes the tick at which
// each last moved: a frame costs no read of the clock. Silence is measured
// from the tick that saw the last move, which is after the move itself, so
// a channel is never failed early; it may be failed up to a tick (a quarter
// of the timeout) late.
func (c *conn) monitor() {
	defer c.wg.Done()
	tick := time.NewTicker(max(c.timeout/4, time.Millisecond))
	defer tick.Stop()
	type seen struct {
		n  uint64
		at time.Time
	}
	start := time.Now()
	rx, tx, w := make([]seen, len(c.socks)), make([]seen, len(c.socks)), make([]seen, len(c.socks))
	for i := range c.socks {
		rx[i].at, tx[i].at, w[i].at = start, start, start
	}
	moved := func(v *seen, n uint64, now time.Time) bool {
		if v.n != n {
			v.n, v.at = n, now
			return true
		}
		return false
	}
	for {
		select {
		case <-c.dead:
			return
		case <-tick.C:
		}
		now := time.Now()
		for i, s := range c.socks {
			moved(&rx[i], s.got.Load(), now)
			sent := moved(&tx[i], s.sent.Load(), now)
			moved(&w[i], s.wseq.Load(), now)
			if quiet := now.Sub(rx[i].at); quiet > c.timeout && !s.closedBy.Load() {
				c.fail(c.errorf("heartbeat", 0, 0, channel.ErrPeerLost, "socket %d heard nothing from rank %d for %v (peer timeout %v)",
					s.idx, c.peer, quiet.Round(time.Millisecond), c.timeout), true)
				return
			}
			if w[i].n&1 == 1 && now.Sub(w[i].at) > c.timeout {
				c.fail(c.errorf("heartbeat", 0, 0, channel.ErrPeerLost, "a send on socket %d has been stuck for more than %v: rank %d stopped reading",
					s.idx, c.timeout, c.peer), false)
				return
			}
			// A socket that sent nothing since the last tick sends a
			// ping: the peer hears from an idle one every other tick,
			// half its timeout.
			if !sent && s.wmu.TryLock() {
				s.nc.SetWriteDeadline(now.Add(c.timeout))
				err := s.writeFrame(framePing, 0, 0, 0, 0, 0, nil)
				s.nc.SetWriteDeadline(time.Time{})
				s.wmu.Unlock()
				if err != nil {
					c.lost("heartbeat", s, err)
					return
				}
			}
		}
	}
}
