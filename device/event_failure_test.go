package device_test

import (
	"context"
	"errors"
	"testing"

	"github.com/hcomm-dev/hcomm/device"
)

// TestEventSynchronizeReportsFailedCapture: an event recorded after a task
// that failed completes (the stream skips the rest), and its Synchronize
// says the captured work failed instead of returning nil; an event recorded
// before the failure is unaffected; the stream's Synchronize still reports
// the failure once, after which new events complete cleanly.
func TestEventSynchronizeReportsFailedCapture(t *testing.T) {
	d := open(t, 0)
	s := stream(t, d)
	before, _ := d.CreateEvent()
	after, _ := d.CreateEvent()
	defer before.Destroy()
	defer after.Destroy()
	ctx := context.Background()
	boom := errors.New("boom")
	ran := false
	if err := before.Record(s); err != nil {
		t.Fatal(err)
	}
	if err := s.Launch("fails", func(<-chan struct{}) error { return boom }); err != nil {
		t.Fatal(err)
	}
	if err := s.Launch("skipped", func(<-chan struct{}) error { ran = true; return nil }); err != nil {
		t.Fatal(err)
	}
	if err := after.Record(s); err != nil {
		t.Fatal(err)
	}
	if err := before.Synchronize(ctx); err != nil {
		t.Fatalf("event recorded before the failure: %v", err)
	}
	err := after.Synchronize(ctx)
	if !errors.Is(err, boom) {
		t.Fatalf("event recorded after a failed task: %v, want the failure", err)
	}
	if err := after.Synchronize(ctx); !errors.Is(err, boom) {
		t.Fatalf("second Synchronize of the event: %v, want the failure again", err)
	}
	if ran {
		t.Fatal("the task after the failure ran")
	}
	if err := s.Synchronize(ctx); !errors.Is(err, boom) {
		t.Fatalf("stream Synchronize: %v, want the failure", err)
	}
	if err := after.Record(s); err != nil {
		t.Fatal(err)
	}
	if err := after.Synchronize(ctx); err != nil {
		t.Fatalf("event after the stream reported its failure: %v", err)
	}
}

// TestStreamWaitEventPassesFailureOn: stream B waits on an event recorded on
// stream A after a failed task; B's wait fails with an error wrapping A's
// failure, so B's next task does not run and B's Synchronize reports it,
// even when A's Synchronize reported the failure before B's wait ran. A
// still reports its own failure; a wait on an event recorded before the
// failure is unaffected; TakeError takes a failure without waiting.
func TestStreamWaitEventPassesFailureOn(t *testing.T) {
	d := open(t, 0)
	ctx := context.Background()
	mk := func() *device.Stream {
		s, err := d.CreateStream()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Destroy() })
		return s
	}
	a, b, c := mk(), mk(), mk()
	before, _ := d.CreateEvent()
	after, _ := d.CreateEvent()
	defer before.Destroy()
	defer after.Destroy()
	boom := errors.New("boom")
	gate := make(chan struct{})
	// b and c are held until A's failure has been reported, so that the
	// waits run after A's Synchronize cleared A's failure.
	for _, s := range []*device.Stream{b, c} {
		if err := s.Launch("gate", func(<-chan struct{}) error { <-gate; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if err := before.Record(a); err != nil {
		t.Fatal(err)
	}
	if err := a.Launch("fails", func(<-chan struct{}) error { return boom }); err != nil {
		t.Fatal(err)
	}
	if err := after.Record(a); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitEvent(before); err != nil {
		t.Fatal(err)
	}
	cRan := false
	if err := c.Launch("after before", func(<-chan struct{}) error { cRan = true; return nil }); err != nil {
		t.Fatal(err)
	}
	if err := b.WaitEvent(after); err != nil {
		t.Fatal(err)
	}
	bRan := false
	if err := b.Launch("after the wait", func(<-chan struct{}) error { bRan = true; return nil }); err != nil {
		t.Fatal(err)
	}
	if err := a.Synchronize(ctx); !errors.Is(err, boom) {
		t.Fatalf("A's Synchronize: %v, want its own failure", err)
	}
	close(gate)
	err := b.Synchronize(ctx)
	if !errors.Is(err, boom) || device.CodeOf(err) != device.CodeOf(boom) {
		t.Fatalf("B's Synchronize: %v, want an error wrapping A's failure", err)
	}
	if bRan {
		t.Fatal("B's task after the failed wait ran")
	}
	if err := c.Synchronize(ctx); err != nil || !cRan {
		t.Fatalf("a wait on an event recorded before the failure: %v (task ran: %v), want nil", err, cRan)
	}
	// TakeError: the failure is taken once, and the stream runs again.
	if err := b.Launch("fails", func(<-chan struct{}) error { return boom }); err != nil {
		t.Fatal(err)
	}
	if err := after.Record(b); err != nil {
		t.Fatal(err)
	}
	if err := after.Synchronize(ctx); !errors.Is(err, boom) {
		t.Fatalf("event after B's failure: %v", err)
	}
	if err := b.TakeError(); !errors.Is(err, boom) {
		t.Fatalf("TakeError: %v, want the failure", err)
	}
	if err := b.TakeError(); err != nil {
		t.Fatalf("second TakeError: %v, want nil", err)
	}
	bRan = false
	if err := b.Launch("after TakeError", func(<-chan struct{}) error { bRan = true; return nil }); err != nil {
		t.Fatal(err)
	}
	if err := b.Synchronize(ctx); err != nil || !bRan {
		t.Fatalf("B after TakeError: %v (task ran: %v)", err, bRan)
	}
}
