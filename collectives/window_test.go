package collectives_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// windowRanks is one window per rank: the memory, its registration and a
// stream.
type windowRanks struct {
	base []device.Ptr
	wins []*collectives.Window
	ss   []*device.Stream
}

// registerWindows allocates size bytes on every rank and registers them as
// one window (a collective call, so every rank calls it at once).
func registerWindows(t *testing.T, comms []*hcomm.Comm, size func(r int) int64) (*windowRanks, error) {
	t.Helper()
	n := len(comms)
	w := &windowRanks{base: make([]device.Ptr, n), wins: make([]*collectives.Window, n), ss: make([]*device.Stream, n)}
	for r, c := range comms {
		p, err := c.Device().Malloc(size(r))
		if err != nil {
			t.Fatal(err)
		}
		s, err := c.Device().CreateStream()
		if err != nil {
			t.Fatal(err)
		}
		w.base[r], w.ss[r] = p, s
		t.Cleanup(func() { s.Destroy(); c.Device().Free(p) })
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.wins[r], errs[r] = collectives.RegisterWindow(c, w.base[r], size(r))
		}()
	}
	wg.Wait()
	return w, errors.Join(errs...)
}

// TestWindows runs Broadcast, AllGather and AlltoAll on buffers in a
// symmetric window,
// where peers read each other's buffers in place, against the reference: every
// root, in and out of place, odd sizes, over inproc and shm.
func TestWindows(t *testing.T) {
	for _, tr := range []string{"inproc", "shm"} {
		ranks := []int{1, 2, 3, 4, 5, 8}
		if tr == "shm" || raceEnabled {
			ranks = []int{2, 3}
		}
		for _, n := range ranks {
			t.Run(fmt.Sprintf("%s/ranks=%d", tr, n), func(t *testing.T) {
				comms := initAll(t, n, &hcomm.Config{Transport: tr, BufferSize: 64 << 10})
				const maxCount = 100003
				const off = 4096 + 64
				// The window holds the input (n blocks for an all-to-all) at
				// off and the output after it.
				const recvOff = off + 8*8*maxCount
				winSize := int64(recvOff + 8*8*maxCount)
				w, err := registerWindows(t, comms, func(int) int64 { return winSize })
				if err != nil {
					t.Fatal(err)
				}
				direct := &collectives.Options{Algorithm: collectives.AlgoDirect}
				for _, dt := range []hcomm.DataType{hcomm.Int8, hcomm.Float32, hcomm.Float64} {
					es := int64(dt.Size())
					for _, count := range []int64{0, 1, 7, 1023, maxCount} {
						cnt := int(count)
						in := func(r, k int) []byte { return encodeAll(dt, k*cnt, func(i int) float64 { return input(dt, r, i) }) }
						poison := func(r int) {
							if n*cnt > 0 {
								comms[r].Device().Memset(w.base[r].Add(recvOff), int64(n*cnt)*es, 0xA5)
							}
						}
						for root := 0; root < n; root++ {
							desc := fmt.Sprintf("Broadcast %v count %d root %d", dt, count, root)
							windowCase(t, comms, w, desc, func(r int) error {
								return collectives.Broadcast(w.base[r].Add(off), count, dt, root, comms[r], w.ss[r], direct)
							}, func(r int) (device.Ptr, []byte, device.Ptr, []byte) {
								return w.base[r].Add(off), in(r, 1), w.base[r].Add(off), in(root, 1)
							})
						}
						all := encodeAll(dt, n*cnt, func(i int) float64 { return input(dt, i/max(cnt, 1), i%max(cnt, 1)) })
						for _, inPlace := range []bool{false, true} {
							desc := fmt.Sprintf("AllGather %v count %d in-place=%v", dt, count, inPlace)
							windowCase(t, comms, w, desc, func(r int) error {
								send, recv := w.base[r].Add(off), w.base[r].Add(recvOff)
								if inPlace {
									send = recv.Add(int64(r) * count * es)
								}
								return collectives.AllGather(send, recv, count, dt, comms[r], w.ss[r], direct)
							}, func(r int) (device.Ptr, []byte, device.Ptr, []byte) {
								poison(r)
								if inPlace {
									return w.base[r].Add(recvOff + int64(r)*count*es), in(r, 1), w.base[r].Add(recvOff), all
								}
								return w.base[r].Add(off), in(r, 1), w.base[r].Add(recvOff), all
							})
						}
						desc := fmt.Sprintf("AlltoAll %v count %d", dt, count)
						windowCase(t, comms, w, desc, func(r int) error {
							return collectives.AlltoAll(w.base[r].Add(off), count, dt, w.base[r].Add(recvOff), count, dt, comms[r], w.ss[r], nil)
						}, func(r int) (device.Ptr, []byte, device.Ptr, []byte) {
							poison(r)
							// Rank r receives block r of every rank p's input.
							want := encodeAll(dt, n*cnt, func(i int) float64 { return input(dt, i/max(cnt, 1), r*cnt+i%max(cnt, 1)) })
							return w.base[r].Add(off), in(r, n), w.base[r].Add(recvOff), want
						})
						if t.Failed() {
							return
						}
					}
				}
				for r := range comms {
					if err := w.wins[r].Deregister(); err != nil {
						t.Fatal(err)
					}
					if err := w.wins[r].Deregister(); err != nil {
						t.Fatalf("a second Deregister: %v", err)
					}
				}
			})
		}
	}
}

// windowCase writes each rank's input (prep returns where and what, where
// the rank's output lies and what it must hold afterwards), runs call on
// every rank and compares.
func windowCase(t *testing.T, comms []*hcomm.Comm, w *windowRanks, desc string, call func(r int) error, prep func(r int) (device.Ptr, []byte, device.Ptr, []byte)) {
	t.Helper()
	wants := make([][]byte, len(comms))
	outs := make([]device.Ptr, len(comms))
	for r, c := range comms {
		at, in, out, want := prep(r)
		if len(in) > 0 {
			if err := c.Device().MemcpyHtoD(at, in); err != nil {
				t.Fatal(err)
			}
		}
		wants[r], outs[r] = want, out
	}
	run(t, comms, func(c *hcomm.Comm) error {
		r := c.Rank()
		if err := call(r); err != nil {
			return fmt.Errorf("%s: rank %d: %w", desc, r, err)
		}
		if err := w.ss[r].SynchronizeWithTimeout(60 * time.Second); err != nil {
			return fmt.Errorf("%s: rank %d: %w", desc, r, err)
		}
		got := make([]byte, len(wants[r]))
		if len(got) > 0 {
			if err := c.Device().MemcpyDtoH(got, outs[r]); err != nil {
				return err
			}
		}
		if i := firstDiff(got, wants[r]); i >= 0 {
			return fmt.Errorf("%s: rank %d: byte %d = %#x, want %#x", desc, r, i, got[i], wants[r][i])
		}
		return nil
	})
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// Windows are symmetric: ranks whose buffers lie at different offsets, or
// in a window on one rank and not on another, get ErrMismatch — never a read
// of the wrong bytes.
func TestWindowMismatch(t *testing.T) {
	comms := initAll(t, 2, &hcomm.Config{Transport: "inproc", BufferSize: 64 << 10})
	w, err := registerWindows(t, comms, func(int) int64 { return 1 << 16 })
	if err != nil {
		t.Fatal(err)
	}
	outside, err := comms[1].Device().Malloc(1 << 12)
	if err != nil {
		t.Fatal(err)
	}
	defer comms[1].Device().Free(outside)
	for _, tc := range []struct {
		name string
		buf  func(r int) device.Ptr
		want string
	}{
		{"offsets differ", func(r int) device.Ptr { return w.base[r].Add(int64(64 * (r + 1))) }, "window 1 at offset 128"},
		{"one rank outside the window", func(r int) device.Ptr {
			if r == 1 {
				return outside
			}
			return w.base[r]
		}, "window 1 at offset 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := make([]error, 2)
			var wg sync.WaitGroup
			for r, c := range comms {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := collectives.Broadcast(tc.buf(r), 256, hcomm.Float32, 0, c, w.ss[r], &collectives.Options{Algorithm: collectives.AlgoDirect}); err != nil {
						errs[r] = err
						return
					}
					errs[r] = w.ss[r].SynchronizeWithTimeout(30 * time.Second)
				}()
			}
			wg.Wait()
			for r, err := range errs {
				if !errors.Is(err, collectives.ErrMismatch) {
					t.Fatalf("rank %d: %v, want ErrMismatch", r, err)
				}
				if !strings.Contains(err.Error(), tc.want) {
					t.Errorf("rank %d: %q does not name %q", r, err, tc.want)
				}
			}
		})
	}
}

// A window registered with different sizes is refused, naming the rank.
func TestWindowSizesMustAgree(t *testing.T) {
	comms := initAll(t, 2, &hcomm.Config{Transport: "inproc", BufferSize: 64 << 10})
	_, err := registerWindows(t, comms, func(r int) int64 { return int64(4096 * (r + 1)) })
	if err == nil || !strings.Contains(err.Error(), "every rank registers the same size") {
		t.Fatalf("err = %v, want the sizes named", err)
	}
}

// The V forms ignore windows: a rank that sends nothing may pass any send
// pointer (here nil) while the others' buffers lie in the window.
func TestWindowAllGatherVZeroCountRank(t *testing.T) {
	comms := initAll(t, 3, &hcomm.Config{Transport: "inproc", BufferSize: 64 << 10})
	w, err := registerWindows(t, comms, func(int) int64 { return 1 << 16 })
	if err != nil {
		t.Fatal(err)
	}
	counts, displs := []int64{5, 0, 7}, []int64{0, 5, 5}
	const recvOff = 4096
	all := encodeAll(hcomm.Int32, 12, func(i int) float64 {
		if i < 5 {
			return input(hcomm.Int32, 0, i)
		}
		return input(hcomm.Int32, 2, i-5)
	})
	windowCase(t, comms, w, "AllGatherV with a zero-count rank", func(r int) error {
		send := w.base[r]
		if counts[r] == 0 {
			send = 0
		}
		return collectives.AllGatherV(send, counts[r], w.base[r].Add(recvOff), counts, displs, hcomm.Int32, comms[r], w.ss[r], nil)
	}, func(r int) (device.Ptr, []byte, device.Ptr, []byte) {
		return w.base[r], encodeAll(hcomm.Int32, int(counts[r]), func(i int) float64 { return input(hcomm.Int32, r, i) }), w.base[r].Add(recvOff), all
	})
}

// Bad arguments are errors naming what was wrong, not panics.
func TestRegisterWindowBadArguments(t *testing.T) {
	comms := initAll(t, 1, &hcomm.Config{Transport: "inproc", BufferSize: 64 << 10})
	c := comms[0]
	if _, err := collectives.RegisterWindow(c, 0, 4096); err == nil || !strings.Contains(err.Error(), "not live device memory") {
		t.Errorf("nil pointer: %v, want an error naming the range", err)
	}
	p, err := c.Device().Malloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Device().Free(p)
	if _, err := collectives.RegisterWindow(c, p, 0); err == nil || !strings.Contains(err.Error(), "window size 0") {
		t.Errorf("size 0: %v, want an error naming the size", err)
	}
	if _, err := collectives.RegisterWindow(c, p, 8192); err == nil || !strings.Contains(err.Error(), "not live device memory") {
		t.Errorf("past the allocation: %v, want an error naming the range", err)
	}
	w, err := collectives.RegisterWindow(c, p, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Deregister(); err != nil {
		t.Fatal(err)
	}
}

// Deregister gives the memory back at once: over shm, once every rank has
// deregistered a window, no rank maps a peer's memory for it any more (the
// window's channels are destroyed, and each end unmaps what it mapped from
// the other), long before the communicator is destroyed; the memory of a
// window still registered stays reachable.
func TestWindowDeregisterUnmaps(t *testing.T) {
	comms := initAll(t, 3, &hcomm.Config{Transport: "shm", BufferSize: 64 << 10})
	memfds := func() int {
		b, _ := os.ReadFile("/proc/self/maps")
		return strings.Count(string(b), "memfd:")
	}
	if _, err := registerWindows(t, comms, func(int) int64 { return 1 << 16 }); err != nil {
		t.Fatal(err) // the collectives' own channels are up from here
	}
	mem := make([]device.Ptr, len(comms))
	for r, c := range comms {
		p, err := c.Device().Malloc(1 << 16)
		if err != nil {
			t.Fatal(err)
		}
		mem[r] = p
		t.Cleanup(func() { c.Device().Free(p) })
	}
	before := memfds()
	wins := make([]*collectives.Window, len(comms))
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wins[r], errs[r] = collectives.RegisterWindow(c, mem[r], 1<<16)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if memfds() <= before {
		t.Fatal("the window's channels map no memory file")
	}
	for r := range comms {
		if err := wins[r].Deregister(); err != nil {
			t.Fatalf("rank %d: Deregister: %v", r, err)
		}
		if err := wins[r].Deregister(); err != nil {
			t.Fatalf("rank %d: a second Deregister: %v", r, err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for memfds() != before && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := memfds(); got != before {
		t.Errorf("%d memory-file mappings after every rank deregistered the window, %d before it was registered", got, before)
	}
}
