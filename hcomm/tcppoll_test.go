package hcomm_test

import (
	"errors"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
)

// A notify wait on a tcp channel polls its sockets for Config.TCPSpin
// before it sleeps; its timeout and Abort still end it on time, however
// long the spin.
func TestPollingWaitEndsOnTimeoutAndAbort(t *testing.T) {
	cfg := &hcomm.Config{BufferSize: 32 << 10, Name: "test", TCPSpin: time.Second, ExecTimeout: time.Hour}
	comms := hcommtest.Options{Config: cfg}.New(t, 2, hcommtest.TCP)
	t.Cleanup(func() {
		for _, c := range comms {
			c.Abort()
		}
	})
	chs, ths := pairChannels(t, comms)
	if chs[0].Transport() != "tcp" {
		t.Fatalf("the channel runs over %s", chs[0].Transport())
	}
	// A record polled for arrives.
	if err := hcomm.ChannelNotifyRecord(nil, chs[1], 0); err != nil {
		t.Fatal(err)
	}
	if err := hcomm.ChannelNotifyWait(nil, chs[0], 0, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	const timeout = 50 * time.Millisecond
	start := time.Now()
	err := hcomm.ChannelNotifyWait(nil, chs[0], 0, timeout)
	if took := time.Since(start); !errors.Is(err, hcomm.ErrTimeout) || took > 500*time.Millisecond {
		t.Fatalf("a wait with timeout %v under a 1s spin: %v after %v", timeout, err, took)
	}
	// Bytes that keep arriving, none of them the record waited for, do
	// not stretch the timeout: the poll takes its part and the sleep the
	// rest (the poll alone would last as long as the bytes come).
	buf, _, err := comms[0].GetHcclBuffer()
	if err != nil {
		t.Fatal(err)
	}
	src, err := comms[1].Device().Malloc(1024)
	if err != nil {
		t.Fatal(err)
	}
	quit, wrote := make(chan struct{}), make(chan error, 1)
	go func() {
		for {
			select {
			case <-quit:
				wrote <- nil
				return
			default:
			}
			if err := hcomm.WriteNbi(nil, chs[1], buf, src, 1024); err != nil {
				wrote <- err
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	const streamed = 300 * time.Millisecond
	start = time.Now()
	err = hcomm.ChannelNotifyWait(nil, chs[0], 0, streamed)
	took := time.Since(start)
	close(quit)
	if werr := <-wrote; werr != nil {
		t.Fatal(werr)
	}
	if !errors.Is(err, hcomm.ErrTimeout) || took > streamed+streamed/2 {
		t.Fatalf("a wait with timeout %v while the peer kept writing: %v after %v", streamed, err, took)
	}
	hcomm.ChannelNotifyWaitOnThread(ths[0], chs[0], 1, 0)
	done := make(chan error, 1)
	go func() { done <- ths[0].Stream().SynchronizeWithTimeout(30 * time.Second) }()
	time.Sleep(20 * time.Millisecond) // the wait polls now
	start = time.Now()
	if err := comms[0].Abort(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, device.ErrStreamAbort) {
			t.Fatalf("err = %v, want stream abort", err)
		}
		if took := time.Since(start); took > 500*time.Millisecond {
			t.Fatalf("Abort took %v to end a polling wait", took)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Abort did not end the polling wait")
	}
}

// ChannelNotifyTryWait on a tcp channel looks at the sockets once
// (channel.Poller's PollOnce): it finds a record the peer sent, and a look
// that finds nothing allocates nothing (the lane calls it in its poll
// loop; through Poll it allocated a closure a look).
func TestTryWaitOverTCPLooksOnce(t *testing.T) {
	cfg := &hcomm.Config{BufferSize: 32 << 10, Name: "test", TCPSpin: time.Second}
	comms := hcommtest.Options{Config: cfg}.New(t, 2, hcommtest.TCP)
	chs, _ := pairChannels(t, comms)
	if ok, err := hcomm.ChannelNotifyTryWait(chs[0], 1); ok || err != nil {
		t.Fatalf("nothing recorded: TryWait = %v, %v", ok, err)
	}
	if n := testing.AllocsPerRun(200, func() { _, _ = hcomm.ChannelNotifyTryWait(chs[0], 1) }); n != 0 {
		t.Fatalf("a look that finds nothing allocates %v times", n)
	}
	if err := hcomm.ChannelNotifyRecord(nil, chs[1], 1); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		ok, err := hcomm.ChannelNotifyTryWait(chs[0], 1)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a record sent was not found by TryWait within 5s")
		}
	}
	if ok, _ := hcomm.ChannelNotifyTryWait(chs[0], 1); ok {
		t.Fatal("a record taken twice")
	}
}

// pairChannels gives each of the two ranks a channel to the other, with 2
// notifies, and a thread.
func pairChannels(t *testing.T, comms []*hcomm.Comm) ([2]*hcomm.Channel, [2]*hcomm.Thread) {
	t.Helper()
	var chs [2]*hcomm.Channel
	var ths [2]*hcomm.Thread
	hcommtest.Each(t, comms, func(t testing.TB, c *hcomm.Comm) {
		r := c.Rank()
		d := hcomm.ChannelDescInit(1)
		d[0].RemoteRank, d[0].Protocol, d[0].NotifyNum = 1-r, hcomm.ProtocolROCE, 2
		ch, err := c.ChannelAcquire(hcomm.EngineCPUTS, d)
		if err != nil {
			t.Fatal(err)
		}
		ts, err := c.ThreadAcquire(hcomm.EngineCPUTS, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		chs[r], ths[r] = ch[0], ts[0]
	})
	return chs, ths
}

// A tcp wait that has stopped polling is woken soon after its record
// arrives even while another goroutine keeps the process's only processor
// busy: Go's network poller, which wakes the channel's readers, runs only
// when a processor is idle (or every 10 ms), so the sleeper naps and looks
// at the sockets itself between naps. Without the naps the wake-ups took
// the network poller's period (median 5–10 ms here).
func TestSleepingWaitWokenOnBusyProcessor(t *testing.T) {
	cfg := &hcomm.Config{BufferSize: 32 << 10, Name: "test", TCPSpin: time.Microsecond, ExecTimeout: time.Hour}
	comms := hcommtest.Options{Config: cfg}.New(t, 2, hcommtest.TCP)
	chs, _ := pairChannels(t, comms)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	quit := make(chan struct{})
	var busy sync.WaitGroup
	busy.Add(1)
	go func() { // the enqueuer of a rank bound to one core, far ahead of its stream
		defer busy.Done()
		for {
			select {
			case <-quit:
				return
			default:
				runtime.Gosched()
			}
		}
	}()
	defer func() { close(quit); busy.Wait() }()
	const trials = 7
	lat := make([]time.Duration, 0, trials)
	for range trials {
		recorded := make(chan time.Time, 1)
		go func() {
			// The waiter naps by then (its spin is 1 µs), in a short nap (they
			// double from 50 µs: one begun t into the wait lasts about t); a
			// record 3 ms in fell into a 1.6–3.2 ms nap, over the bound on a
			// loaded machine.
			time.Sleep(200 * time.Microsecond)
			recorded <- time.Now()
			if err := hcomm.ChannelNotifyRecord(nil, chs[1], 0); err != nil {
				t.Error(err)
			}
		}()
		if err := hcomm.ChannelNotifyWait(nil, chs[0], 0, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		lat = append(lat, time.Since(<-recorded))
	}
	slices.Sort(lat)
	t.Logf("record to wake-up: %v", lat)
	if med := lat[trials/2]; med > 2*time.Millisecond {
		t.Errorf("a sleeping tcp wait on a busy processor woke %v after its record (median of %d; all: %v), want under 2ms", med, trials, lat)
	}
}

// A tcp wait that naps (it stopped polling at once: a 1 µs spin) still
// ends by its timeout — its naps add up to it, the error names the wait —,
// by Abort, and when the peer's end goes away, each within a bound.
func TestNappingWaitEnds(t *testing.T) {
	cfg := &hcomm.Config{BufferSize: 32 << 10, Name: "test", TCPSpin: time.Microsecond, ExecTimeout: time.Hour}
	comms := hcommtest.Options{Config: cfg}.New(t, 2, hcommtest.TCP)
	t.Cleanup(func() {
		for _, c := range comms {
			c.Abort()
		}
	})
	chs, ths := pairChannels(t, comms)

	const timeout = 30 * time.Millisecond // several naps: 50 µs doubling
	start := time.Now()
	err := hcomm.ChannelNotifyWait(nil, chs[0], 0, timeout)
	if took := time.Since(start); !errors.Is(err, hcomm.ErrTimeout) || took < timeout || took > 500*time.Millisecond {
		t.Fatalf("a napping wait with timeout %v: %v after %v", timeout, err, took)
	}

	// The peer's end goes away: the waiting rank's channel breaks its notifies.
	lost := make(chan error, 1)
	go func() { lost <- hcomm.ChannelNotifyWait(nil, chs[1], 1, 30*time.Second) }()
	time.Sleep(20 * time.Millisecond) // napping by now
	start = time.Now()
	if err := comms[0].ChannelDestroy([]*hcomm.Channel{chs[0]}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-lost:
		if err == nil {
			t.Fatal("a napping wait whose peer went away returned no error")
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("the peer's end went away; the wait ended %v later", took)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a napping wait outlived its peer's end")
	}

	// Abort ends a napping wait on a thread.
	hcomm.ChannelNotifyWaitOnThread(ths[1], chs[1], 0, 0)
	done := make(chan error, 1)
	go func() { done <- ths[1].Stream().SynchronizeWithTimeout(30 * time.Second) }()
	time.Sleep(20 * time.Millisecond)
	start = time.Now()
	if err := comms[1].Abort(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("an aborted napping wait returned no error")
		}
		if took := time.Since(start); took > 500*time.Millisecond {
			t.Fatalf("Abort took %v to end a napping wait", took)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Abort did not end the napping wait")
	}
}
