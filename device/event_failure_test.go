package device_test

import (
	"context"
	"errors"
	"testing"
)

// TestEventSynchronizeReportsFailedCapture: an event recorded after a task
// that failed completes (the stream skips the rest), and its Synchronize
// says the captured work failed instead of returning nil; an event recorded
// before the failure is unaffected; the stream's Synchronize still reports
// the failure once, after which new events complete cleanly.
func TestEventSynchronizeReportsFailedCapture(t *testing.T) {
	d := open(t, 0)
	s, err := d.CreateStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
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
	err = after.Synchronize(ctx)
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
