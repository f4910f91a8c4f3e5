package device_test

import (
	"testing"

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
