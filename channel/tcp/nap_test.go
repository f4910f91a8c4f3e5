package tcp

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/device"
)

// readFrameFrom reads the next frame but pings from nc (rawPeer.readFrame
// for a goroutine other than the test's).
func readFrameFrom(rp *rawPeer) (header, error) {
	rp.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		h := make(header, headerLen)
		if _, err := io.ReadFull(rp.nc, h); err != nil {
			return nil, err
		}
		if _, err := io.CopyN(io.Discard, rp.nc, int64(h.length())); err != nil {
			return nil, err
		}
		if h.typ() != framePing {
			return h, nil
		}
	}
}

// napWaits are the waits of a caller for its peer's answer that nap
// (awaitNapping), each with the frame it sends and the answer to it.
func napWaits(rp *rawPeer) []struct {
	name   string
	asks   frameType
	call   func(stop <-chan struct{}) error
	answer func(h header) []byte
} {
	tr := rp.c1.Transport
	return []struct {
		name   string
		asks   frameType
		call   func(stop <-chan struct{}) error
		answer func(h header) []byte
	}{
		{"Read", frameRead, func(stop <-chan struct{}) error { return tr.Read(stop, make([]byte, 8), 4096) },
			func(h header) []byte { return frameBytes(frameReadResp, 0, 0, h.id(), 0, 0, make([]byte, 8)) }},
		{"Fence", frameFence, func(stop <-chan struct{}) error { return tr.Fence(stop) },
			func(h header) []byte { return frameBytes(frameFenceAck, 0, 0, h.id(), 0, 0, nil) }},
	}
}

// TestNappingWaitsOnBusyProcessor: with Options.Nap, a Read and a Fence
// whose poll gave up (a 1 µs spin) see their answer within a nap although
// the process's one processor never idles — a goroutine yields in a loop,
// as the caller of a rank bound to one core issuing ahead does — so Go's
// network poller, which wakes the background reader, runs only every
// 10 ms. Without the naps the same waits woke 5–10 ms after their answer.
func TestNappingWaitsOnBusyProcessor(t *testing.T) {
	rp := connectRaw(t, Options{Spin: time.Microsecond, Nap: true})
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	quit := make(chan struct{})
	var busy sync.WaitGroup
	busy.Go(func() {
		for {
			select {
			case <-quit:
				return
			default:
				runtime.Gosched()
			}
		}
	})
	defer func() { close(quit); busy.Wait() }()
	const trials = 7
	for _, w := range napWaits(rp) {
		lat := make([]time.Duration, 0, trials)
		for range trials {
			answered := make(chan time.Time, 1)
			failed := make(chan error, 1)
			go func() {
				// The waiter naps by then, and the nap it is in is short (the naps
				// double from 50 µs: one that began t into the wait lasts about t),
				// so the answer is seen well within the bound; the network poller
				// alone would see it 0–10 ms late. (An answer 3 ms in fell into a
				// 1.6–3.2 ms nap, over the bound on a loaded machine.)
				time.Sleep(200 * time.Microsecond)
				h, err := readFrameFrom(rp)
				if err == nil && h.typ() != w.asks {
					err = fmt.Errorf("got a %v frame, want %v", h.typ(), w.asks)
				}
				if err != nil {
					failed <- err
					return
				}
				answered <- time.Now()
				if _, err := rp.nc.Write(w.answer(h)); err != nil {
					failed <- err
				}
			}()
			if err := w.call(nil); err != nil {
				t.Fatalf("%s: %v", w.name, err)
			}
			select {
			case at := <-answered:
				lat = append(lat, time.Since(at))
			case err := <-failed:
				t.Fatalf("%s: the peer: %v", w.name, err)
			}
		}
		slices.Sort(lat)
		t.Logf("%s: answer to return: %v", w.name, lat)
		if med := lat[trials/2]; med > 2*time.Millisecond {
			t.Errorf("a napping %s on a busy processor returned %v after its answer (median of %d: %v), want under 2ms", w.name, med, trials, lat)
		}
	}
}

// TestNappingWaitsEnd: a napping Read or Fence that is never answered ends
// when its stop closes and when the channel dies, each within a bound.
func TestNappingWaitsEnd(t *testing.T) {
	for _, how := range []string{"stop", "peer gone"} {
		rp := connectRaw(t, Options{Spin: time.Microsecond, Nap: true})
		for _, w := range napWaits(rp) {
			stop := make(chan struct{})
			ended := make(chan error, 1)
			go func() { ended <- w.call(stop) }()
			time.Sleep(30 * time.Millisecond) // several naps: 50 µs doubling
			start := time.Now()
			if how == "stop" {
				close(stop)
			} else {
				rp.nc.Close()
			}
			select {
			case err := <-ended:
				if err == nil || how == "stop" && !errors.Is(err, device.ErrStreamAbort) {
					t.Fatalf("%s ended by %s: %v", w.name, how, err)
				}
				t.Logf("%s ended by %s after %v: %v", w.name, how, time.Since(start).Round(time.Microsecond), err)
			case <-time.After(5 * time.Second):
				t.Fatalf("a napping %s outlived its %s by 5s", w.name, how)
			}
			if how != "stop" {
				break // the channel is dead: the next wait fails at once
			}
		}
	}
}
