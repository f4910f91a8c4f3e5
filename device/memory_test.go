package device_test

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/device"
)

// AllocEpoch changes with every allocation and every free, of any device
// context, and with nothing else: a range checked under one epoch is the
// same live memory while the epoch stays.
func TestAllocEpoch(t *testing.T) {
	d, err := device.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	e0 := device.AllocEpoch()
	p, err := d.Malloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	e1 := device.AllocEpoch()
	if e1 == e0 {
		t.Fatalf("Malloc left the epoch at %d", e0)
	}
	if _, err := d.Bytes(p, 4096); err != nil {
		t.Fatal(err)
	}
	if err := d.Memset(p, 4096, 1); err != nil {
		t.Fatal(err)
	}
	if e := device.AllocEpoch(); e != e1 {
		t.Fatalf("using memory moved the epoch from %d to %d", e1, e)
	}
	if err := d.Free(p); err != nil {
		t.Fatal(err)
	}
	if e := device.AllocEpoch(); e == e1 {
		t.Fatalf("Free left the epoch at %d", e1)
	}
}

// deviceWith opens device 0, closed when the test ends, and allocates size
// bytes on it.
func deviceWith(t *testing.T, size int64) (*device.Device, device.Ptr) {
	t.Helper()
	d, err := device.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	p, err := d.Malloc(size)
	if err != nil {
		t.Fatal(err)
	}
	return d, p
}

// mapped reports whether the process maps address p (/proc/self/maps), and
// skips the test where the maps cannot be read.
func mapped(t *testing.T, p device.Ptr) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Skipf("no /proc/self/maps: %v", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		lo, hi, ok := strings.Cut(strings.Fields(l + " x")[0], "-")
		if !ok {
			continue
		}
		a, err1 := strconv.ParseUint(lo, 16, 64)
		z, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 == nil && err2 == nil && uint64(p) >= a && uint64(p) < z {
			return true
		}
	}
	return false
}

// TestHeldKeepsMemoryMapped: memory kept (Held.Keep) is freed by its Free —
// Hold and Pin fail from then on — but stays mapped, so that bytes taken
// before the Free may still be stored to, until the last Release unmaps it;
// a Keep after the Free holds nothing; Device.Close defers the same way.
func TestHeldKeepsMemoryMapped(t *testing.T) {
	d, p := deviceWith(t, 1<<20)
	h, err := d.Hold(p, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if !h.Keep() || !h.Keep() {
		t.Fatal("Keep of live memory failed")
	}
	b, _ := h.Bytes()
	if err := d.Free(p); err != nil {
		t.Fatal(err)
	}
	if _, ok := h.Pin(); ok {
		t.Fatal("Pin after Free succeeded")
	}
	if _, err := d.Hold(p, 8); err == nil {
		t.Fatal("Hold of freed memory succeeded")
	}
	if h.Keep() {
		t.Fatal("Keep after Free succeeded")
	}
	for i := range b {
		b[i] = byte(i) // still mapped: kept twice
	}
	if err := h.Release(); err != nil {
		t.Fatal(err)
	}
	if !mapped(t, p) {
		t.Fatal("unmapped with one Keep left")
	}
	b[0] = 1
	if err := h.Release(); err != nil {
		t.Fatal(err)
	}
	if mapped(t, p) {
		t.Fatal("still mapped after the last Release")
	}
	if err := h.Release(); err != nil { // one too many: nothing happens
		t.Fatal(err)
	}

	// Device.Close frees what is kept the same way.
	d2, err := device.Open(1)
	if err != nil {
		t.Fatal(err)
	}
	q, err := d2.Malloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	k, err := d2.Hold(q, 4096)
	if err != nil || !k.Keep() {
		t.Fatalf("Hold, Keep: %v", err)
	}
	if err := d2.Close(); err != nil {
		t.Fatal(err)
	}
	if !mapped(t, q) {
		t.Fatal("Close unmapped kept memory")
	}
	if err := k.Release(); err != nil {
		t.Fatal(err)
	}
	if mapped(t, q) {
		t.Fatal("still mapped after Release")
	}
}

// TestHeldPinsAgainstFree: memory held by another rank's copy (Held.Pin)
// cannot be freed under it — the Free waits for Unpin — and a Pin after
// the Free fails instead of handing out unmapped memory (which a copy would
// fault on, taking the whole process down).
func TestHeldPinsAgainstFree(t *testing.T) {
	d, p := deviceWith(t, 1<<20)
	h, err := d.Hold(p.Add(4096), 8192)
	if err != nil {
		t.Fatal(err)
	}
	b, ok := h.Pin()
	if !ok || len(b) != 8192 {
		t.Fatalf("Pin of live memory: %d bytes, %v", len(b), ok)
	}
	freed := make(chan error, 1)
	go func() { freed <- d.Free(p) }()
	select {
	case err := <-freed:
		t.Fatalf("Free returned (%v) while the memory was pinned", err)
	case <-time.After(50 * time.Millisecond):
	}
	for i := range b {
		b[i] = byte(i) // still mapped: the Free is waiting
	}
	h.Unpin()
	select {
	case err := <-freed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Free still waits after Unpin")
	}
	if b, ok := h.Pin(); ok {
		t.Fatalf("Pin after Free handed out %d bytes", len(b))
	}
	if _, err := d.Hold(p, 8); err == nil {
		t.Fatal("Hold of freed memory succeeded")
	}
}

// TestPinsRaceFree: goroutines pin one allocation and store into it for as
// long as their pins succeed, while it is freed. A Free that unmapped under
// a live pin would fault the process at a store; a pin that succeeded
// after the Free returned would too, or store into memory given back.
func TestPinsRaceFree(t *testing.T) {
	d, p := deviceWith(t, 1<<20)
	h, err := d.Hold(p, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var pinned atomic.Int64
	var after atomic.Bool // the Free returned
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				b, ok := h.Pin()
				if !ok {
					return
				}
				if after.Load() {
					t.Error("Pin succeeded after Free returned")
				}
				pinned.Add(1)
				for j := 0; j < len(b); j += 4096 {
					b[j]++
				}
				h.Unpin()
				runtime.Gosched()
			}
		}()
	}
	for pinned.Load() < 100 {
		runtime.Gosched()
	}
	if err := d.Free(p); err != nil {
		t.Fatal(err)
	}
	after.Store(true)
	wg.Wait()
}

// TestZeroHeldUnpin: the zero Held holds nothing, and its Unpin does
// nothing — callers hand it out for memory they need not pin (the
// in-process channel's copies into the peer's HCCL buffer).
func TestZeroHeldUnpin(t *testing.T) {
	var h device.Held
	h.Unpin()
	if b, ok := h.Bytes(); ok || b != nil {
		t.Fatalf("the zero Held's Bytes: %d bytes, %v", len(b), ok)
	}
}
