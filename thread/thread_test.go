package thread_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/leakcheck"
	"github.com/hcomm-dev/hcomm/thread"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

func TestAcquireAndNotifyByIndex(t *testing.T) {
	d, _ := device.Open(0)
	defer d.Close()
	ts, err := thread.Acquire(d, "comm0 rank0", 2, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, th := range ts {
			th.Free()
		}
	}()
	if ts[0].NotifyNum() != 3 || ts[0].Stream() == ts[1].Stream() {
		t.Fatal("threads must have their own streams and 3 notifies")
	}
	var first atomic.Bool
	var ordered atomic.Bool
	ts[0].Stream().Launch("first", func(<-chan struct{}) error { time.Sleep(2 * time.Millisecond); first.Store(true); return nil })
	// HcommThreadNotifyRecordOnThread(threads[0], threads[1], 2); Wait(threads[1], 2)
	if err := ts[0].NotifyRecord(ts[1], 2); err != nil {
		t.Fatal(err)
	}
	if err := ts[1].NotifyWait(2, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	ts[1].Stream().Launch("second", func(<-chan struct{}) error { ordered.Store(first.Load()); return nil })
	if err := ts[1].Stream().SynchronizeWithTimeout(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if !ordered.Load() {
		t.Fatal("thread 1 ran past its wait before thread 0's record")
	}
}

func TestBadIndicesAndCounts(t *testing.T) {
	d, _ := device.Open(0)
	defer d.Close()
	if _, err := thread.Acquire(d, "x", 0, 1); err == nil {
		t.Fatal("0 threads accepted")
	}
	if _, err := thread.Acquire(d, "x", 1, -1); err == nil {
		t.Fatal("negative notify count accepted")
	}
	if _, err := thread.Acquire(d, "x", 1, thread.MaxNotifies+1); err == nil {
		t.Fatal("too many notifies accepted")
	}
	ts, _ := thread.Acquire(d, "x", 2, 2)
	defer ts[0].Free()
	defer ts[1].Free()
	for _, idx := range []int{-1, 2, 1 << 20} {
		if err := ts[0].NotifyRecord(ts[1], idx); err == nil {
			t.Fatalf("record index %d accepted", idx)
		}
		if err := ts[0].NotifyWait(idx, time.Second); err == nil {
			t.Fatalf("wait index %d accepted", idx)
		}
	}
	if err := ts[0].NotifyRecord(nil, 0); err == nil {
		t.Fatal("nil destination accepted")
	}
	if _, err := thread.WithStream(nil, "x", 1); err == nil {
		t.Fatal("nil stream accepted")
	}
}

func TestWithStreamLeavesStreamToOwner(t *testing.T) {
	d, _ := device.Open(0)
	defer d.Close()
	s, _ := d.CreateStream()
	th, err := thread.WithStream(s, "x", 2)
	if err != nil {
		t.Fatal(err)
	}
	th.Free()
	// the caller's stream still works
	if err := s.Launch("x", func(<-chan struct{}) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := s.SynchronizeWithTimeout(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	owned, _ := thread.Acquire(d, "y", 1, 0)
	owned[0].Free()
	if err := owned[0].Stream().Launch("x", func(<-chan struct{}) error { return nil }); !errors.Is(err, device.ErrInvalidHandle) {
		t.Fatalf("freed thread's stream still usable: %v", err)
	}
	s.Destroy()
}

// A batch caches what Launch and the notify calls enqueue and runs it, in
// order, as one task at EndBatch; mismatched Begin/End fail; a freed thread
// refuses every call with ErrFreed.
func TestBatchAndFree(t *testing.T) {
	d, _ := device.Open(0)
	defer d.Close()
	ts, err := thread.Acquire(d, "b", 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer ts[1].Free()
	th := ts[0]
	if err := th.EndBatch(""); err == nil {
		t.Error("EndBatch without BeginBatch accepted")
	}
	if err := th.BeginBatch("x"); err != nil {
		t.Fatal(err)
	}
	if err := th.BeginBatch("y"); err == nil {
		t.Error("a second BeginBatch accepted")
	}
	var order []int
	for i := range 3 {
		if err := th.Launch("step", func(<-chan struct{}) error { order = append(order, i); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if err := th.NotifyRecord(ts[1], 0); err != nil {
		t.Fatal(err)
	}
	if err := ts[1].NotifyWait(0, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := ts[1].Stream().SynchronizeWithTimeout(100 * time.Millisecond); err == nil {
		t.Error("the cached record ran before EndBatch")
	}
	if err := th.Stream().Query(); err != nil || len(order) != 0 {
		t.Errorf("the stream has work before EndBatch: %v, ran %v", err, order)
	}
	if err := th.EndBatch("y"); err == nil {
		t.Error("EndBatch with another tag accepted")
	}
	if err := th.EndBatch("x"); err != nil {
		t.Fatal(err)
	}
	if err := th.Stream().SynchronizeWithTimeout(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := ts[1].Stream().SynchronizeWithTimeout(5 * time.Second); err != nil {
		t.Fatalf("the batch's record: %v", err)
	}
	if len(order) != 3 || order[0] != 0 || order[2] != 2 {
		t.Errorf("the batch ran %v, want [0 1 2]", order)
	}
	th.Free()
	if !th.Freed() {
		t.Error("Freed is false after Free")
	}
	for name, err := range map[string]error{
		"Launch":       th.Launch("x", func(<-chan struct{}) error { return nil }),
		"NotifyRecord": th.NotifyRecord(ts[1], 0),
		"NotifyWait":   th.NotifyWait(0, time.Second),
		"BeginBatch":   th.BeginBatch(""),
	} {
		if !errors.Is(err, thread.ErrFreed) {
			t.Errorf("%s on a freed thread: %v, want ErrFreed", name, err)
		}
	}
}
