package tcp

import (
	"errors"
	"io"
	"runtime"
	"time"

	"github.com/hcomm-dev/hcomm/internal/spin"
)

// This file holds who drives the receive engine (rx.go): the background
// reader of each socket, which sleeps in Go's network poller, and callers
// that wait for something from the peer and poll the sockets themselves
// meanwhile (Poll), for at most Options.Spin.
//
// Why poll: a rank that sleeps until its record arrives is woken through the
// host — the network poller's thread, then the reader goroutine, then the
// waiter — which costs 30–70 µs a hand-off on the small machines hcomm is
// measured on, against 6 µs for a round trip between two processes that
// both busy-poll their sockets. So a waiter reads the channel's sockets
// itself, with non-blocking reads on the descriptors that never touch the
// network poller, as Open MPI's progress engine polls its endpoints; the
// reader goroutine stays parked in the network poller and takes over when
// nobody polls.
//
// The receive token (sock.rtok) makes the two take turns: only its holder
// reads the socket, and every holder reads until the kernel has nothing
// more before it lets go — a read that returns EAGAIN, or one that returns
// less than it asked for (it took all the kernel held: a message that came
// whole is one read, not two). So no byte is left unread in the kernel
// without the network poller seeing its arrival after the last read: the
// reader, woken by that arrival, takes the token (waiting for a poller to
// finish) and reads it, or finds it read. A frame half-read by one holder is
// finished by the next (rx.go).

// readSome reads into p what the socket holds now (errWouldBlock: nothing),
// or, without descriptor access, blocks in nc.Read. The caller holds s.rtok.
func (s *sock) readSome(p []byte) (int, error) {
	if s.rc == nil {
		return s.nc.Read(p)
	}
	s.rp = p
	err := s.rc.Control(s.readFn)
	s.rp = nil
	if err != nil {
		return 0, err
	}
	return s.rn, s.rerr
}

// readSomeV is readSome into the buffers a, b and c in turn (readv), for
// readSteered; s.rc is not nil.
func (s *sock) readSomeV(a, b, c []byte) (int, error) {
	s.rv = [3][]byte{a, b, c}
	err := s.rc.Control(s.readvFn)
	s.rv = [3][]byte{}
	if err != nil {
		return 0, err
	}
	return s.rn, s.rerr
}

// readLoop is the background reader of socket s: it parks in the network
// poller until the socket is readable, then takes the receive token and
// drains the socket, until the socket ends. It fails the channel on a
// protocol error, a reset or an EOF without CLOSE.
func (c *conn) readLoop(s *sock) {
	defer c.wg.Done()
	defer c.readers.Done()
	var done bool
	var err error
	if s.rc == nil {
		s.rtok.Lock() // blocking reads: nobody else reads this socket
		done, err = c.drain(s)
		s.rtok.Unlock()
	} else {
		// The wait for readability happens in the network poller (RawRead),
		// the reading outside it: a drain may fail the channel, which
		// closes the socket, and a close waits for RawRead to return.
		for !done && err == nil {
			if err = s.rc.Read(s.peekFn); err == nil {
				s.rtok.Lock()
				done, err = c.drain(s)
				s.rtok.Unlock()
			}
		}
	}
	s.rtok.Lock()
	s.rxAbandon()
	s.rtok.Unlock()
	if done {
		return
	}
	c.endRead(s, err)
}

// endRead turns the error that ended socket s's receiving into the
// channel's failure.
func (c *conn) endRead(s *sock, err error) {
	var e *Error
	if errors.As(err, &e) && errors.Is(err, ErrProtocol) {
		c.fail(err, true)
		return
	}
	if c.failure() != nil {
		return
	}
	if err == io.EOF && c.closing.Load() {
		return
	}
	// A peer that fails the channel sends ERROR on every socket and hangs
	// up; give the other sockets a moment to deliver its reason.
	t := time.NewTimer(errorGrace)
	select {
	case <-c.dead:
	case <-t.C:
	}
	t.Stop()
	c.lost("receive", s, err)
}

// Poll receives and applies what the peer sent, reading the channel's
// sockets itself without blocking, until done reports true, stop closes,
// the channel fails, or Options.Spin (or a shorter positive limit) passes
// without a byte read (channel.Poller). It reports whether done reported
// true; the caller then sleeps as usual (the background readers deliver
// what comes later). Between looks it yields the processor to the
// process's other goroutines and, with Options.Yield, to the host's other
// threads (sched_yield; from Options.Tight on, or once bytes came), so
// that ranks outnumbering the cores still progress. Safe for concurrent
// use: callers on several threads take turns on each socket, and whoever
// reads applies every frame for all of them.
//
// The spin counts from the last look that read something, not from the
// start: a long message is read while it arrives, and its notify found by
// the reader, however long it takes, as Open MPI's progress engine polls
// for as long as it has a message under way. The caller's limit (its
// wait's timeout) counts from the start whatever arrives. Bounded from the start, a
// 1 MiB write with its notify (280 µs here at 3.7 GB/s) outlasted the
// 200 µs, and the waiter slept through its end: the network poller's
// wake-up, 30–70 µs, on every such message (bench p2p, 2 processes, 1
// MiB, interleaved: 246–262 µs a round trip against 172–180).
func (c *conn) Poll(stop <-chan struct{}, limit time.Duration, done func() bool) bool {
	if done() {
		return true
	}
	d := c.spin
	if d <= 0 {
		return false
	}
	begin := spin.Mono()
	start, last := begin, begin
	streaming := false // a look read bytes: a message is coming in
	for look := 0; ; look++ {
		read, found := c.pollOnce(done, look&3 == 0 || c.rest.Load())
		if found || !read && done() {
			return true
		}
		// One channel each: a select of one case and a default looks
		// without taking the channel's lock.
		select {
		case <-stop:
			return false
		default:
		}
		select {
		case <-c.dead:
			return false
		default:
		}
		now := spin.Mono()
		if read {
			start = now
			streaming = true
		}
		if now-start >= d || limit > 0 && now-begin >= limit || c.lostGap > 0 && now-last >= c.lostGap {
			return false
		}
		last = now
		runtime.Gosched()
		if c.yield && (streaming || now-begin >= c.tight) {
			yieldThread()
		}
	}
}

// yieldThread gives the processor to the host's other threads: a poll's
// yield (Options.Yield), a variable so that a test can count them.
var yieldThread = spin.Yield

// lostProcessor is the gap between two looks of Poll that tells it the
// host has more runnable threads than processors: someone else ran in
// between. Poll then sleeps rather than spin on: a sleeper that the network
// poller wakes is scheduled ahead of spinners, and the processor goes to
// the threads that have work. The gap counts the look too: one that read
// and applied for that long (a reduction on receipt) also hands the
// processor over (4 processes on 2 cores, 1 MiB reduce-scatter: 630–830
// µs counted so, 700–1060 counting only the yield).
const lostProcessor = 50 * time.Microsecond

// PollOnce receives and applies what the sockets hold now, once
// (channel.Poller): pollOnce without Poll's clock, for a caller that looks
// once and goes on.
func (c *conn) PollOnce() bool {
	if c.spin <= 0 {
		return false // polling is off: the background readers receive
	}
	read, _ := c.pollOnce(nil, true)
	return read
}

// pollOnce drains every socket of the channel nobody else is reading, and
// reports whether some read brought bytes. With done, it asks done after
// each socket that brought bytes and stops at the first true (found): a
// small frame comes on the first socket (lockSock), and the look need not
// hear EAGAIN from the others.
func (c *conn) pollOnce(done func() bool, all bool) (read, found bool) {
	rest := false
	for i, s := range c.socks {
		if i > 0 && !all {
			break
		}
		if s.rc == nil || !s.rtok.TryLock() {
			continue
		}
		got := s.got.Load()
		_, err := c.drain(s)
		brought := s.got.Load() != got
		s.rtok.Unlock()
		if err != nil && errors.Is(err, ErrProtocol) {
			// A broken frame fails the channel at once; an ended socket
			// is the background reader's to report (it wakes to the same
			// end, EOF or reset, and reads the error sticky in rx).
			c.fail(err, true)
		}
		if brought {
			rest = rest || i > 0
			read = true
			if done != nil && done() {
				found = true
				break
			}
		}
	}
	if all && len(c.socks) > 1 && !found {
		// Whether the sockets past the first brought bytes in this look
		// decides whether the next looks read them too.
		c.rest.Store(rest)
	}
	return read, found
}

// awaitPolling waits for ch to close, polling the channel's sockets first
// for at most Options.Spin: the wait of Read and Fence for their answer.
func (c *conn) awaitPolling(stop <-chan struct{}, ch <-chan struct{}) bool {
	return c.Poll(stop, 0, func() bool { return isClosed(ch) })
}

// The naps of a wait whose poll gave up (Options.Nap): the first, the
// longest, and how much later than asked one may end before the waiter
// takes it that its processor went idle (an idle processor's timers are
// late by up to the network poller's millisecond).
const (
	napFirst  = 50 * time.Microsecond
	napMost   = 10 * time.Millisecond
	overslept = 300 * time.Microsecond
)

// awaitNapping is awaitPolling, then, with Options.Nap, naps until ch,
// stop or the channel's end: each nap is a timer's, which the scheduler
// runs between any two goroutines, and is followed by one look at the
// sockets — so a waiter whose processor stays busy sees its answer within
// a nap, not when the network poller next runs. A nap that ends late (the
// processor went idle, and an idle processor waits in the network poller,
// which wakes the readers) ends the napping. The caller's select, which
// follows, returns at once or sleeps as before.
func (c *conn) awaitNapping(stop <-chan struct{}, ch <-chan struct{}) {
	if c.awaitPolling(stop, ch) || !c.nap || c.spin <= 0 {
		return
	}
	t := time.NewTimer(napFirst)
	defer t.Stop()
	for nap := napFirst; ; nap = min(2*nap, napMost) {
		began := spin.Mono()
		select {
		case <-ch:
			return
		case <-stop:
			return
		case <-c.dead:
			return
		case <-t.C:
		}
		if _, found := c.pollOnce(func() bool { return isClosed(ch) }, true); found || isClosed(ch) {
			return
		}
		if spin.Mono()-began > nap+overslept {
			return
		}
		t.Reset(min(2*nap, napMost))
	}
}

// isClosed reports whether ch is closed (it is only ever closed).
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
