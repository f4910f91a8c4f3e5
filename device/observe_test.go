package device_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/hcomm-dev/hcomm/device"
)

// An observer is told of every task the device's streams run, queued or
// inline, failed or not, in each stream's order, with the stream, sequence
// number and times; a second observer gets the same; stopping one (twice
// is fine) ends its feed and leaves the other's.
func TestObserveTasks(t *testing.T) {
	d := open(t, 0)
	s := stream(t, d)
	var mu sync.Mutex
	var a, b []device.TaskSpan
	stopA := d.ObserveTasks(func(sp device.TaskSpan) { mu.Lock(); a = append(a, sp); mu.Unlock() })
	stopB := d.ObserveTasks(func(sp device.TaskSpan) { mu.Lock(); b = append(b, sp); mu.Unlock() })
	defer stopB()
	if ran, err := s.RunInline("inline one", func(<-chan struct{}) error { return nil }); !ran || err != nil {
		t.Fatalf("RunInline on an idle stream: ran %v, err %v", ran, err)
	}
	if err := s.Launch("queued one", func(<-chan struct{}) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := s.Launch("failing one", func(<-chan struct{}) error { return errors.New("boom") }); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(context.Background()); err == nil {
		t.Fatal("Synchronize after a failing task: no error")
	}
	stopA()
	stopA()
	if err := s.Launch("after the stop", func(<-chan struct{}) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []struct {
		name           string
		inline, failed bool
	}{{"inline one", true, false}, {"queued one", false, false}, {"failing one", false, true}}
	if len(a) != len(want) {
		t.Fatalf("first observer saw %d tasks, want %d: %+v", len(a), len(want), a)
	}
	for i, w := range want {
		sp := a[i]
		if sp.Name != w.name || sp.Inline != w.inline || sp.Failed != w.failed || sp.Stream != s.ID() || sp.Seq != uint64(i+1) || sp.End < sp.Start || sp.Start == 0 {
			t.Errorf("task %d: %+v, want %q inline %v failed %v on stream %d, seq %d, start <= end", i, sp, w.name, w.inline, w.failed, s.ID(), i+1)
		}
	}
	if len(b) != len(want)+1 || b[len(b)-1].Name != "after the stop" {
		t.Errorf("second observer saw %d tasks (want %d, the last \"after the stop\"): %+v", len(b), len(want)+1, b)
	}
}
