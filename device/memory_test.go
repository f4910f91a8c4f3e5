package device_test

import (
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

// TestHeldPinsAgainstFree: memory held by another rank's copy (Held.Pin)
// cannot be freed under it — the Free waits for Unpin — and a Pin after
// the Free fails instead of handing out unmapped memory (which a copy would
// fault on, taking the whole process down).
func TestHeldPinsAgainstFree(t *testing.T) {
	d, err := device.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	p, err := d.Malloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
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
