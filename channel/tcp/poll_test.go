package tcp

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
)

// The polling path (progress.go): callers that wait read the sockets
// themselves, taking turns with the background readers.

// pollFor polls tr until notify n of its end is recorded, for at most the
// transport's spin, and reports whether it was.
func pollFor(tr channel.Transport, c *channel.Conn, n int, stop <-chan struct{}) bool {
	return tr.(channel.Poller).Poll(stop, 0, c.Notifies[n].TryReset)
}

// steady turns off, for the tests that need Poll to last its whole spin on
// a loaded machine, the early sleep of a Poll that lost its processor.
func steady(trs ...channel.Transport) {
	for _, tr := range trs {
		tr.(*conn).lostGap = 0
	}
}

// trickle writes wire to nc in pieces of at most n bytes, pausing after
// each.
func trickle(t *testing.T, nc net.Conn, wire []byte, n int, pause time.Duration) {
	t.Helper()
	for len(wire) > 0 {
		k := min(n, len(wire))
		if _, err := nc.Write(wire[:k]); err != nil {
			t.Fatal(err)
		}
		wire = wire[k:]
		time.Sleep(pause)
	}
}

// writeThenNotify is the bytes a peer with one socket sends for a WRITE of
// payload at addr and the NOTIFY of notify idx after it (its ordering
// vector counting the write).
func writeThenNotify(addr uint64, payload []byte, idx uint64) []byte {
	var wire []byte
	for _, f := range []struct {
		t       frameType
		id, adr uint64
		payload []byte
	}{
		{frameWrite, 0, addr, payload},
		{frameNotify, idx, 0, []byte{0, 0, 0, 0, 0, 0, 0, 1}},
	} {
		h := make(header, headerLen)
		h.encode(f.t, 0, 0, uint32(len(f.payload)), f.id, f.adr, 0)
		wire = append(append(wire, h...), f.payload...)
	}
	return wire
}

// pollTrickled polls rp's channel for notify idx while the raw peer sends
// wire in pieces of 5 bytes, 300 µs apart, and fails the test unless the
// poll sees the record.
func pollTrickled(t *testing.T, rp *rawPeer, idx int, wire []byte) {
	t.Helper()
	got := make(chan bool, 1)
	go func() { got <- pollFor(rp.c1.Transport, rp.c1, idx, nil) }()
	trickle(t, rp.nc, wire, 5, 300*time.Microsecond)
	select {
	case ok := <-got:
		if !ok {
			t.Fatal("Poll gave up before the record came")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Poll did not return")
	}
}

func TestPollReceivesAFrameSentInPieces(t *testing.T) {
	rp := connectRaw(t, Options{Spin: 10 * time.Second})
	steady(rp.c1.Transport)
	mine := rp.r1.bytes(t)
	clear(mine)
	// Pieces of 5 bytes with pauses: headers and payloads are cut, and
	// every holder of the receive token finds a frame begun by the last.
	pollTrickled(t, rp, 1, writeThenNotify(uint64(rp.r1.buf.Addr)+64, []byte("split across many reads"), 1))
	if s := string(mine[64 : 64+len("split across many reads")]); s != "split across many reads" {
		t.Fatalf("memory holds %q", s)
	}
}

// TestPollSpinCountsFromTheLastBytes: a message that keeps arriving for
// longer than the spin, with no pause as long as it, is polled to its end:
// the bound counts from the last read that brought bytes. Bounded from the
// first look instead, Poll gives up a tenth of the way in.
func TestPollSpinCountsFromTheLastBytes(t *testing.T) {
	const spinFor = 100 * time.Millisecond
	rp := connectRaw(t, Options{Spin: spinFor})
	steady(rp.c1.Transport)
	mine := rp.r1.bytes(t)
	clear(mine)
	payload := make([]byte, 8000)
	for i := range payload {
		payload[i] = byte(i%251 + 1)
	}
	wire := writeThenNotify(uint64(rp.r1.buf.Addr), payload, 0)
	got := make(chan bool, 1)
	start := time.Now()
	var took time.Duration
	go func() {
		ok := pollFor(rp.c1.Transport, rp.c1, 0, nil)
		took = time.Since(start)
		got <- ok
	}()
	// 16 bytes a millisecond or so: 500 pieces, at least 10 spins' worth
	// in all, each pause far shorter than one.
	trickle(t, rp.nc, wire, 16, time.Millisecond)
	select {
	case ok := <-got:
		if !ok {
			t.Fatalf("Poll gave up after %v, while the message was still arriving (spin %v, the message %v)", took, spinFor, time.Since(start))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Poll did not return")
	}
	if d := time.Since(start); d < 5*spinFor {
		t.Fatalf("the message took %v, not the several spins the test needs", d)
	}
	for i, b := range mine[:len(payload)] {
		if b != payload[i] {
			t.Fatalf("byte %d is %d, want %d", i, b, payload[i])
		}
	}

	// The caller's limit (a wait's timeout) still counts from the start:
	// bytes that keep coming do not stretch it.
	wire = writeThenNotify(uint64(rp.r1.buf.Addr), payload, 0)
	const limit = 50 * time.Millisecond
	start = time.Now()
	go func() {
		ok := rp.c1.Transport.(channel.Poller).Poll(nil, limit, rp.c1.Notifies[0].TryReset)
		took = time.Since(start)
		got <- ok
	}()
	trickle(t, rp.nc, wire, 16, time.Millisecond)
	if ok := <-got; ok || took > limit+spinFor/2 {
		t.Fatalf("Poll limited to %v over a message arriving for %v: reported %v after %v", limit, time.Since(start), ok, took)
	}
	if !pollFor(rp.c1.Transport, rp.c1, 0, nil) {
		t.Fatal("the record of the second message never came")
	}
}

// TestPollTwoWaitersOneChannel has two threads of each rank wait on one
// channel at once, each for its own notify: whoever reads the sockets sets
// the other's record.
func TestPollTwoWaitersOneChannel(t *testing.T) {
	for _, streams := range []int{1, 2} {
		o := Options{Streams: streams, Spin: time.Second}
		p := connectPair(t, o, o, 4096, 2)
		const rounds = 300
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		errc := make(chan error, 4)
		var wg sync.WaitGroup
		// wait polls, then sleeps, as hcomm's notify wait does.
		wait := func(c *channel.Conn, n int) error {
			if pollFor(c.Transport, c, n, ctx.Done()) {
				return nil
			}
			return c.Notifies[n].WaitNow(ctx)
		}
		for i := 0; i < 2; i++ {
			wg.Add(2)
			go func() { // rank 1: answers record i with record i
				defer wg.Done()
				for r := 0; r < rounds; r++ {
					if err := wait(p.c1, i); err != nil {
						errc <- err
						return
					}
					if err := p.c1.Transport.NotifyRecord(nil, i); err != nil {
						errc <- err
						return
					}
				}
			}()
			go func() { // rank 0: records i, waits for the answer
				defer wg.Done()
				for r := 0; r < rounds; r++ {
					if err := p.c0.Transport.NotifyRecord(nil, i); err != nil {
						errc <- err
						return
					}
					if err := wait(p.c0, i); err != nil {
						errc <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errc)
		for err := range errc {
			t.Fatalf("streams=%d: %v", streams, err)
		}
	}
}

// TestPollPeerDiesMidPoll kills the peer while a frame is half sent and a
// waiter polls with a long spin: the poll ends, and the wait fails naming
// the peer.
func TestPollPeerDiesMidPoll(t *testing.T) {
	rp := connectRaw(t, Options{Spin: 30 * time.Second})
	steady(rp.c1.Transport)
	got := make(chan bool, 1)
	go func() { got <- pollFor(rp.c1.Transport, rp.c1, 0, nil) }()
	h := make(header, headerLen)
	h.encode(frameWrite, 0, 0, 4096, 0, uint64(rp.r1.buf.Addr), 0)
	if _, err := rp.nc.Write(append(h, make([]byte, 100)...)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	start := time.Now()
	rp.nc.Close()
	select {
	case ok := <-got:
		if ok {
			t.Fatal("Poll reports a record that never came")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Poll did not end when the peer died")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := rp.c1.Notifies[0].WaitNow(ctx)
	if !errors.Is(err, channel.ErrPeerLost) || !strings.Contains(err.Error(), "rank 0") {
		t.Fatalf("wait: %v, want channel.ErrPeerLost naming rank 0", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("the loss took %v to end the wait", d)
	}
}

func TestPollEndsOnStopAndSpin(t *testing.T) {
	p := connectPair(t, Options{Spin: 30 * time.Second}, Options{Spin: 20 * time.Millisecond}, 4096, 1)
	steady(p.c0.Transport, p.c1.Transport)
	stop := make(chan struct{})
	time.AfterFunc(20*time.Millisecond, func() { close(stop) })
	start := time.Now()
	if pollFor(p.c0.Transport, p.c0, 0, stop) {
		t.Fatal("Poll reports a record nobody made")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("a stopped Poll took %v", d)
	}
	// The transport's own bound, and a shorter limit given by the caller.
	start = time.Now()
	if pollFor(p.c1.Transport, p.c1, 0, nil) {
		t.Fatal("Poll reports a record nobody made")
	}
	if d := time.Since(start); d < 20*time.Millisecond || d > 5*time.Second {
		t.Fatalf("Poll with a 20ms spin took %v", d)
	}
	start = time.Now()
	if p.c0.Transport.(channel.Poller).Poll(nil, 10*time.Millisecond, p.c0.Notifies[0].TryReset) {
		t.Fatal("Poll reports a record nobody made")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Poll limited to 10ms took %v", d)
	}
	// A record that is there already needs no polling, even with it off.
	off := connectPair(t, Options{Spin: -1}, Options{Spin: -1}, 4096, 1)
	if err := off.c0.Transport.NotifyRecord(nil, 0); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for !off.c1.Notifies[0].IsSet() && ctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	if !pollFor(off.c1.Transport, off.c1, 0, nil) {
		t.Fatal("Poll with polling off missed a record already there")
	}
}

// TestPollYieldsOnlyAfterTight: with Options.Yield, a poll gives the
// processor to the host's other threads only once it has lasted
// Options.Tight, and with no Tight from its first look.
func TestPollYieldsOnlyAfterTight(t *testing.T) {
	var yields int
	var start time.Time
	var first time.Duration
	defer func(f func()) { yieldThread = f }(yieldThread)
	yieldThread = func() { // Poll calls it in this goroutine
		if yields++; yields == 1 {
			first = time.Since(start)
		}
	}
	for _, tc := range []struct {
		tight, limit time.Duration
		want         bool // any yield
	}{
		{time.Hour, 20 * time.Millisecond, false},
		{0, 20 * time.Millisecond, true},
		{5 * time.Millisecond, 40 * time.Millisecond, true},
	} {
		p := connectPair(t, Options{Spin: time.Minute, Yield: true, Tight: tc.tight}, Options{}, 4096, 1)
		steady(p.c0.Transport)
		yields, first, start = 0, 0, time.Now()
		if p.c0.Transport.(channel.Poller).Poll(nil, tc.limit, p.c0.Notifies[0].TryReset) {
			t.Fatal("Poll reports a record nobody made")
		}
		if got := yields > 0; got != tc.want {
			t.Fatalf("Tight %v, a %v poll: %d yields to other threads, want any: %v", tc.tight, tc.limit, yields, tc.want)
		}
		if yields > 0 && first < tc.tight {
			t.Fatalf("Tight %v: the first yield to other threads came %v into the poll", tc.tight, first)
		}
	}
}

// TestPollYieldsOnceBytesComeIn: a poll that has read part of a message
// yields to the host's other threads between its looks from then on, Tight
// or not: a message that arrives over many reads is the kernel's work on
// this host as much as the peer's, and the poll must not hold the processor
// against it.
func TestPollYieldsOnceBytesComeIn(t *testing.T) {
	var yields atomic.Int64
	defer func(f func()) { yieldThread = f }(yieldThread)
	yieldThread = func() { yields.Add(1) }
	rp := connectRaw(t, Options{Spin: 10 * time.Second, Yield: true, Tight: time.Hour})
	steady(rp.c1.Transport)
	pollTrickled(t, rp, 0, writeThenNotify(uint64(rp.r1.buf.Addr), []byte("in pieces"), 0))
	if yields.Load() == 0 {
		t.Fatal("a poll that read a message in pieces never yielded to other threads")
	}
}

// TestPollOneProcessor runs a ping-pong of polling waiters, with writes,
// on one processor (GOMAXPROCS=1): each waiter must let the other side's
// goroutines run.
func TestPollOneProcessor(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	o := Options{Streams: 1, Spin: time.Millisecond}
	p := connectPair(t, o, o, 1<<16, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	wait := func(c *channel.Conn) error {
		if pollFor(c.Transport, c, 0, ctx.Done()) {
			return nil
		}
		return c.Notifies[0].WaitNow(ctx)
	}
	const rounds = 1000
	src := make([]byte, 1000)
	m1 := p.r1.bytes(t)
	errc := make(chan error, 1)
	go func() {
		for r := 0; r < rounds; r++ {
			if err := wait(p.c1); err != nil {
				errc <- err
				return
			}
			if m1[999] != byte(r) {
				errc <- errors.New("the write was not in memory when its record was")
				return
			}
			if err := p.c1.Transport.NotifyRecord(nil, 0); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	for r := 0; r < rounds; r++ {
		src[999] = byte(r)
		if err := p.c0.Transport.(channel.WriteNotifier).WriteWithNotify(nil, p.r1.buf.Addr, src, 0); err != nil {
			t.Fatal(err)
		}
		if err := wait(p.c0); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// TestPollSleepsWhenItLostItsProcessor: a look that comes long after the
// last one (someone else had the processor) ends the poll early, so that
// the waiter sleeps and the network poller wakes it.
func TestPollSleepsWhenItLostItsProcessor(t *testing.T) {
	p := connectPair(t, Options{Spin: 30 * time.Second}, Options{}, 4096, 1)
	start := time.Now()
	looks := 0
	ok := p.c0.Transport.(channel.Poller).Poll(nil, 0, func() bool {
		looks++
		if looks == 3 {
			time.Sleep(2 * lostProcessor) // as if descheduled between looks
		}
		return false
	})
	if ok || time.Since(start) > 10*time.Second {
		t.Fatalf("Poll = %v after %v and %d looks; want false soon after the gap", ok, time.Since(start), looks)
	}
}

// echoNotifies answers every record of c's notify 0 with a record of the
// peer's, until a wait or record fails (ctx ended); the error comes out of
// the channel. With poll, each wait polls the sockets first (Poll).
func echoNotifies(ctx context.Context, c *channel.Conn, stop <-chan struct{}, poll bool) <-chan error {
	echo := make(chan error, 1)
	go func() {
		for {
			if err := awaitRecord(ctx, c, poll); err != nil {
				echo <- err
				return
			}
			if err := c.Transport.NotifyRecord(stop, 0); err != nil {
				echo <- err
				return
			}
		}
	}()
	return echo
}

// awaitRecord waits for c's notify 0: with poll, polling the sockets for the
// transport's spin before it sleeps, as hcomm's waits do.
func awaitRecord(ctx context.Context, c *channel.Conn, poll bool) error {
	if poll && pollFor(c.Transport, c, 0, nil) {
		return nil
	}
	return c.Notifies[0].WaitNow(ctx)
}

// TestDrainStopsAfterAShortRead: a message that came whole is one read. A
// read that returns less than it asked for took everything the kernel held,
// and what comes later raises the network poller's edge, so the drain
// applies what came and stops instead of reading again to hear EAGAIN (a
// system call, and the socket's lock, per message).
func TestDrainStopsAfterAShortRead(t *testing.T) {
	rp, c, s, mine := drainable(t)
	for round := 0; round < 4; round++ {
		// Hold the receive token: neither the background reader nor a
		// poller reads while the frames arrive.
		s.rtok.Lock()
		msg := []byte{byte('a' + round), 'b', 'c'}
		if round == 3 {
			// A payload of directRead bytes, the longest that goes
			// through the buffer: its frame and the next still come in
			// one read.
			msg = bytes.Repeat(msg, directRead/3+1)[:directRead]
		}
		sendWriteNotify(t, rp, s, 128, msg, byte(2*round+1))
		reads := 0
		orig := s.readFn
		s.readFn = func(fd uintptr) { reads++; orig(fd) }
		_, err := c.drain(s)
		s.readFn = orig
		s.rtok.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		if reads != 1 {
			t.Errorf("round %d: %d reads for two frames that came whole, want 1", round, reads)
		}
		if !rp.c1.Notifies[0].TryReset() {
			t.Errorf("round %d: the notify was not recorded", round)
		}
		if !bytes.Equal(mine[128:128+len(msg)], msg) {
			t.Errorf("round %d: memory holds %q, want %q", round, mine[128:min(128+len(msg), 160)], msg[:min(len(msg), 32)])
		}
	}
}

// TestDrainReadsALongPayloadInPlace: a read that begins a frame asks for
// little more than directRead bytes, so that a long payload whose header
// it brings goes mostly straight into its destination by the reads after
// it — not into the socket's buffer and then a second time where it
// belongs (a copy of every byte of every 64 KiB write, before).
func TestDrainReadsALongPayloadInPlace(t *testing.T) {
	rp, c, s, mine := drainable(t)
	payload := make([]byte, 60000)
	rng := rand.New(rand.NewPCG(1, 2)) // no period: a probe matches one place only
	for i := range payload {
		payload[i] = byte(rng.Uint32())
	}
	s.rtok.Lock()
	clear(s.rx.buf)
	sendWriteNotify(t, rp, s, 0, payload, 1)
	_, err := c.drain(s)
	s.rtok.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if !rp.c1.Notifies[0].TryReset() {
		t.Fatal("the notify was not recorded")
	}
	if !bytes.Equal(mine[:len(payload)], payload) {
		t.Fatal("the payload did not land whole")
	}
	if probe := payload[directRead+4096 : directRead+4352]; bytes.Contains(s.rx.buf, probe) {
		t.Errorf("the payload's bytes past the first %d went through the socket's buffer", directRead)
	}
}

// drainable connects a raw peer to a one-socket channel whose socket's
// descriptor the test can read (skipping where it cannot), and returns the
// peer, the channel's end, its socket and the memory the peer writes into.
func drainable(t *testing.T) (*rawPeer, *conn, *sock, []byte) {
	t.Helper()
	rp := connectRaw(t, Options{Spin: time.Second})
	c := rp.c1.Transport.(*conn)
	s := c.socks[0]
	if s.rc == nil {
		t.Skip("no descriptor access: reads block on the background reader")
	}
	return rp, c, s, rp.r1.bytes(t)
}

// sendWriteNotify sends, as rp's end of socket s, a WRITE of payload at off
// bytes into r1's memory and a NOTIFY whose ordering vector counts vec
// frames, and waits until s holds both. The caller holds s.rtok, so that
// neither the background reader nor a poller takes them first; a failure
// lets it go.
func sendWriteNotify(t *testing.T, rp *rawPeer, s *sock, off uint64, payload []byte, vec byte) {
	t.Helper()
	rp.send(t, frameWrite, 0, 0, 0, uint64(rp.r1.buf.Addr)+off, 0, payload)
	rp.send(t, frameNotify, 0, 0, 0, 0, 0, []byte{0, 0, 0, 0, 0, 0, 0, vec})
	deadline := time.Now().Add(5 * time.Second)
	for !rawReadableN(t, s, 2*headerLen+len(payload)+8) {
		if time.Now().After(deadline) {
			s.rtok.Unlock()
			t.Fatal("the frames did not arrive")
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// rawReadableN reports whether socket s holds at least n bytes, looking with
// a peek that leaves them there.
func rawReadableN(t *testing.T, s *sock, n int) bool {
	t.Helper()
	buf := make([]byte, n)
	got := 0
	if err := s.rc.Control(func(fd uintptr) {
		got, _, _ = syscall.Recvfrom(int(fd), buf, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	}); err != nil {
		t.Fatal(err)
	}
	return got >= n
}
