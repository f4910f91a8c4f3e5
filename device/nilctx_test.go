package device_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/hcomm-dev/hcomm/device"
)

// TestNilContext: a nil context is the caller's mistake, reported as
// ErrInvalidValue naming the call — not a nil-pointer panic inside the wait.
// The stream has work pending, so a missing check would reach ctx.Done().
func TestNilContext(t *testing.T) {
	d := open(t, 0)
	s := stream(t, d)
	ev, err := d.CreateEvent()
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Destroy()
	gate := make(chan struct{})
	release := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(release) // first of the cleanups: the stream's Destroy waits for the gate
	if err := s.Launch("gate", func(<-chan struct{}) error { <-gate; return nil }); err != nil {
		t.Fatal(err)
	}
	if err := ev.Record(s); err != nil {
		t.Fatal(err)
	}
	var nilCtx context.Context
	for _, c := range []struct {
		op   string
		call func() error
	}{
		{"Stream.Synchronize", func() error { return s.Synchronize(nilCtx) }},
		{"Synchronize", func() error { return d.Synchronize(nilCtx) }},
		{"Event.Synchronize", func() error { return ev.Synchronize(nilCtx) }},
	} {
		err := c.call()
		var de *device.Error
		if !errors.As(err, &de) || de.Op != c.op || de.Code != device.ErrInvalidValue || !strings.Contains(err.Error(), "nil context") {
			t.Errorf("%s(nil): %v, want an ErrInvalidValue *device.Error of %s naming the nil context", c.op, err, c.op)
		}
	}
	release()
	if err := s.Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}
}
