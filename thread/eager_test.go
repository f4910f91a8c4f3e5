package thread_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/thread"
)

// where launches fn through launch and reports whether fn ran in the
// calling goroutine: fn waits (up to 200 ms) for the caller to say that
// launch returned, which it can only hear when another goroutine runs it.
// It waits for the stream before it returns.
func where(t *testing.T, th *thread.Thread, launch func(fn func(<-chan struct{}) error) error) (inCaller bool) {
	t.Helper()
	returned := make(chan struct{})
	var here atomic.Bool
	err := launch(func(<-chan struct{}) error {
		select {
		case <-returned:
		case <-time.After(200 * time.Millisecond):
			here.Store(true)
		}
		return nil
	})
	close(returned)
	if err != nil {
		t.Fatal(err)
	}
	if err := th.Stream().SynchronizeWithTimeout(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	return here.Load()
}

// newThread acquires a thread on a device of its own, both released when
// the test ends.
func newThread(t *testing.T) *thread.Thread {
	t.Helper()
	d, err := device.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	ts, err := thread.Acquire(d, "eager", 1, 1)
	if err != nil {
		d.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ts[0].Free()
		d.Close()
	})
	return ts[0]
}

func TestLaunchNow(t *testing.T) {
	th := newThread(t)
	now := func(n int64) func(fn func(<-chan struct{}) error) error {
		return func(fn func(<-chan struct{}) error) error { return th.LaunchNow("now", n, fn) }
	}
	if where(t, th, now(8)) {
		t.Fatal("LaunchNow ran in the caller on a thread that is not eager")
	}
	th.SetEager(time.Millisecond, 1<<10)
	if !where(t, th, now(8)) {
		t.Fatal("LaunchNow did not run in the caller on an eager thread whose stream is idle")
	}
	if !where(t, th, now(1<<10)) {
		t.Fatal("LaunchNow of exactly the bound did not run in the caller")
	}
	if where(t, th, now(1<<10+1)) {
		t.Fatal("LaunchNow of more bytes than the bound ran in the caller")
	}

	// A busy stream: the task queues behind the work ahead of it, in order.
	release := make(chan struct{})
	var order []int
	th.Launch("ahead", func(<-chan struct{}) error { <-release; order = append(order, 1); return nil })
	if err := th.LaunchNow("behind", 8, func(<-chan struct{}) error { order = append(order, 2); return nil }); err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := th.Stream().SynchronizeWithTimeout(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if len(order) != 2 || order[0] != 1 || order[1] != 2 {
		t.Fatalf("order %v, want [1 2]: LaunchNow overtook a queued task", order)
	}

	// A batch takes the task, as Launch's.
	if err := th.BeginBatch("b"); err != nil {
		t.Fatal(err)
	}
	var ran atomic.Bool
	th.LaunchNow("batched", 8, func(<-chan struct{}) error { ran.Store(true); return nil })
	if ran.Load() {
		t.Fatal("LaunchNow ran a task of an open batch")
	}
	if err := th.EndBatch("b"); err != nil {
		t.Fatal(err)
	}
	th.Stream().SynchronizeWithTimeout(5 * time.Second)
	if !ran.Load() {
		t.Fatal("the batch did not run the task")
	}

	// A failure of a task run now is the stream's, as a queued one's.
	boom := errors.New("boom")
	if err := th.LaunchNow("fails", 8, func(<-chan struct{}) error { return boom }); err != nil {
		t.Fatalf("LaunchNow returned %v; a failure run now belongs to the stream", err)
	}
	if err := th.Stream().SynchronizeWithTimeout(5 * time.Second); !errors.Is(err, boom) {
		t.Fatalf("Synchronize: %v, want the task's failure", err)
	}

	th.SetEager(0, 0)
	if where(t, th, now(8)) {
		t.Fatal("LaunchNow ran in the caller after SetEager(0, 0)")
	}
}

func TestLaunchPoll(t *testing.T) {
	th := newThread(t)
	th.SetEager(2*time.Millisecond, 1<<10)
	var queued atomic.Int32
	wait := func(<-chan struct{}) error { queued.Add(1); return nil }

	// The condition holds: polled in the caller, nothing queued.
	var polls atomic.Int32
	if err := th.LaunchPoll("holds", func(d time.Duration, _ <-chan struct{}) bool { polls.Add(1); return d == 2*time.Millisecond }, wait); err != nil {
		t.Fatal(err)
	}
	th.Stream().SynchronizeWithTimeout(5 * time.Second)
	if polls.Load() != 1 || queued.Load() != 0 {
		t.Fatalf("polls %d, queued waits %d: want the poll once with the eager bound and no wait", polls.Load(), queued.Load())
	}

	// It does not: the wait is queued, and whatever follows waits behind it.
	release := make(chan struct{})
	if err := th.LaunchPoll("later", func(time.Duration, <-chan struct{}) bool { return false }, func(<-chan struct{}) error { <-release; queued.Add(1); return nil }); err != nil {
		t.Fatal(err)
	}
	var after atomic.Bool
	th.LaunchNow("after", 8, func(<-chan struct{}) error { after.Store(queued.Load() == 1); return nil })
	close(release)
	th.Stream().SynchronizeWithTimeout(5 * time.Second)
	if queued.Load() != 1 || !after.Load() {
		t.Fatalf("queued waits %d, the next task after it: %v", queued.Load(), after.Load())
	}

	// Not eager: the wait is queued without a poll.
	th.SetEager(0, 0)
	polls.Store(0)
	th.LaunchPoll("off", func(time.Duration, <-chan struct{}) bool { polls.Add(1); return true }, wait)
	th.Stream().SynchronizeWithTimeout(5 * time.Second)
	if polls.Load() != 0 || queued.Load() != 2 {
		t.Fatalf("polls %d, queued waits %d: want no poll and the wait queued", polls.Load(), queued.Load())
	}
}
