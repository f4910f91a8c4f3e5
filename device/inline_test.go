package device_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/device"
)

// A task run inline is the stream's next task: tasks another goroutine
// enqueues while it runs wait behind it, an event recorded behind it is not
// complete before it ends, Query says the stream is busy, and its failure is
// the stream's, reported once by Synchronize.
func TestRunInlineKeepsStreamOrder(t *testing.T) {
	d := open(t, 0)
	s := stream(t, d)
	ev, err := d.CreateEvent()
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Destroy()

	var mu sync.Mutex
	var order []string
	note := func(x string) {
		mu.Lock()
		order = append(order, x)
		mu.Unlock()
	}
	entered, release := make(chan struct{}), make(chan struct{})
	queued := make(chan error, 1)
	go func() {
		<-entered
		// Enqueued while the inline task runs, from another goroutine.
		err := s.Launch("queued", func(<-chan struct{}) error { note("queued"); return nil })
		if err == nil {
			err = ev.Record(s)
		}
		queued <- err
	}()
	boom := errors.New("inline task failed")
	var ran bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		ran, err = s.RunInline("inline", func(<-chan struct{}) error {
			close(entered)
			<-release
			note("inline")
			return boom
		})
	}()
	if err := <-queued; err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // the worker would have started "queued" by now
	mu.Lock()
	early := append([]string(nil), order...)
	mu.Unlock()
	if len(early) != 0 {
		t.Fatalf("ran %v while the inline task was still running", early)
	}
	wantCode(t, s.Query(), device.ErrStreamNotComplete)
	wantCode(t, ev.Query(), device.ErrEventNotComplete)
	close(release)
	<-done
	if !ran || !errors.Is(err, boom) {
		t.Fatalf("RunInline = %v, %v; want true and the task's failure", ran, err)
	}
	// The inline task failed: the stream skips the queued one until the
	// failure is reported, as it would after a queued task's failure.
	if err := s.SynchronizeWithTimeout(5 * time.Second); !errors.Is(err, boom) {
		t.Fatalf("Synchronize = %v, want the inline task's failure", err)
	}
	mu.Lock()
	got := append([]string(nil), order...)
	mu.Unlock()
	if len(got) != 1 || got[0] != "inline" {
		t.Fatalf("ran %v, want [inline] (the queued task skipped after the failure)", got)
	}
	if err := s.SynchronizeWithTimeout(5 * time.Second); err != nil {
		t.Fatalf("second Synchronize = %v, want nil (the failure is reported once)", err)
	}

	// A healthy stream: inline, then queued from another goroutine, in order.
	order = nil
	entered, release = make(chan struct{}), make(chan struct{})
	go func() {
		<-entered
		queued <- s.Launch("queued", func(<-chan struct{}) error { note("queued"); return nil })
	}()
	go func() {
		<-entered
		time.Sleep(10 * time.Millisecond)
		close(release)
	}()
	if ran, err := s.RunInline("inline", func(<-chan struct{}) error {
		close(entered)
		<-release
		note("inline")
		return nil
	}); !ran || err != nil {
		t.Fatalf("RunInline = %v, %v on an idle stream", ran, err)
	}
	if err := <-queued; err != nil {
		t.Fatal(err)
	}
	if err := s.SynchronizeWithTimeout(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if len(order) != 2 || order[0] != "inline" || order[1] != "queued" {
		t.Fatalf("ran %v, want [inline queued]", order)
	}
}

// RunInline runs nothing on a stream that is busy or holds an unreported
// failure: the caller enqueues instead, behind what is there.
func TestRunInlineOnlyWhenIdle(t *testing.T) {
	d := open(t, 0)
	s := stream(t, d)
	release := make(chan struct{})
	if err := s.Launch("busy", func(<-chan struct{}) error { <-release; return nil }); err != nil {
		t.Fatal(err)
	}
	called := false
	if ran, err := s.RunInline("inline", func(<-chan struct{}) error { called = true; return nil }); ran || err != nil || called {
		t.Fatalf("RunInline on a busy stream = %v, %v (ran fn: %v); want false, nil, not run", ran, err, called)
	}
	close(release)
	if err := s.SynchronizeWithTimeout(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := s.Launch("fail", func(<-chan struct{}) error { return errors.New("x") }); err != nil {
		t.Fatal(err)
	}
	for s.Query() != nil {
		time.Sleep(time.Millisecond)
	}
	if ran, _ := s.RunInline("inline", func(<-chan struct{}) error { called = true; return nil }); ran || called {
		t.Fatal("RunInline ran on a stream with an unreported failure")
	}
	if err := s.SynchronizeWithTimeout(5 * time.Second); err == nil {
		t.Fatal("the failure was lost")
	}
	if ran, err := s.RunInline("inline", func(<-chan struct{}) error { called = true; return nil }); !ran || err != nil || !called {
		t.Fatalf("RunInline on an idle stream = %v, %v (ran fn: %v)", ran, err, called)
	}
	if err := s.Query(); err != nil {
		t.Fatalf("Query after an inline task = %v", err)
	}
}

// Abort and the device's Close end an inline task's wait through its stop
// channel, as they end a queued task's; Destroy waits for the task.
func TestRunInlineEndedByAbortAndClose(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(d *device.Device, s *device.Stream)
	}{
		{"Abort", func(_ *device.Device, s *device.Stream) { s.Abort() }},
		{"Close", func(d *device.Device, _ *device.Stream) { d.Close() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := open(t, 0)
			s := stream(t, d)
			entered := make(chan struct{})
			stopped := errors.New("stopped")
			res := make(chan error, 1)
			go func() {
				_, err := s.RunInline("wait", func(stop <-chan struct{}) error {
					close(entered)
					select {
					case <-stop:
						return stopped
					case <-time.After(10 * time.Second):
						return nil
					}
				})
				res <- err
			}()
			<-entered
			go tc.end(d, s) // Close waits for the task: not from this goroutine
			select {
			case err := <-res:
				if !errors.Is(err, stopped) {
					t.Fatalf("RunInline = %v, want the task's own failure", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the inline task's wait did not end")
			}
			if tc.name == "Abort" {
				// The abort came first: the stream reports it.
				wantCode(t, s.SynchronizeWithTimeout(5*time.Second), device.ErrStreamAbort)
			}
		})
	}
}

// Destroy waits for a task running inline, as it waits for a queued one.
func TestDestroyWaitsForInlineTask(t *testing.T) {
	d := open(t, 0)
	s, err := d.CreateStream()
	if err != nil {
		t.Fatal(err)
	}
	entered := make(chan struct{})
	var finished bool
	go s.RunInline("slow", func(<-chan struct{}) error {
		close(entered)
		time.Sleep(50 * time.Millisecond)
		finished = true
		return nil
	})
	<-entered
	if err := s.Destroy(); err != nil {
		t.Fatal(err)
	}
	if !finished {
		t.Fatal("Destroy returned while an inline task ran")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	wantCode(t, s.Synchronize(ctx), device.ErrInvalidHandle)
}

// An inline task that succeeds ends without the stream's lock
// (finishInline): a Synchronize from another goroutine, a task queued
// behind it and an event recorded behind it must still see its end, every
// time. One goroutine runs short tasks inline back to back while another
// launches tasks behind them and synchronizes; some inline tasks outlast the
// waiters' spin, so that they sleep and must be woken. Every wait must end
// within its bound and every task run once, in order.
func TestRunInlineEndSeenByWaiters(t *testing.T) {
	d := open(t, 0)
	s := stream(t, d)
	const inlineRuns, launches = 3000, 300
	var mu sync.Mutex
	var order []int // +i: inline task i, -i: launched task i
	note := func(v int) {
		mu.Lock()
		order = append(order, v)
		mu.Unlock()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 1; i <= inlineRuns; i++ {
			ran, err := s.RunInline("inline", func(<-chan struct{}) error {
				note(i)
				if i%4 == 0 { // outlast the waiters' spin, so that they sleep
					time.Sleep(300 * time.Microsecond)
				}
				return nil
			})
			if err != nil {
				t.Errorf("RunInline: %v", err)
				return
			}
			if !ran { // a launched task is pending: wait for the stream, as a caller would
				if err := s.SynchronizeWithTimeout(5 * time.Second); err != nil {
					t.Errorf("Synchronize behind launched tasks: %v", err)
					return
				}
				i--
			}
		}
	}()
	for i := 1; i <= launches; i++ {
		// A Synchronize alone waits for the inline task in progress, if
		// any: only its end can wake it.
		if err := s.SynchronizeWithTimeout(5 * time.Second); err != nil {
			t.Fatalf("before launch %d: %v", i, err)
		}
		if err := s.Launch("launched", func(<-chan struct{}) error { note(-i); return nil }); err != nil {
			t.Fatal(err)
		}
		if err := s.SynchronizeWithTimeout(5 * time.Second); err != nil { // ms: a lost wake would end here
			t.Fatalf("launch %d: %v", i, err)
		}
	}
	<-done
	if err := s.SynchronizeWithTimeout(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	nextIn, nextOut := 1, 1
	for _, v := range order {
		switch {
		case v > 0 && v == nextIn:
			nextIn++
		case v < 0 && -v == nextOut:
			nextOut++
		default:
			t.Fatalf("task %d ran out of order (next inline %d, next launched %d)", v, nextIn, nextOut)
		}
	}
	if nextIn != inlineRuns+1 || nextOut != launches+1 {
		t.Fatalf("ran %d inline and %d launched tasks, want %d and %d", nextIn-1, nextOut-1, inlineRuns, launches)
	}
}

// RunInline claims an idle stream without its lock (a compare-and-swap of
// the submitted count from the completed one, with the gate that a failure,
// Abort and Destroy close looked at before and after). Claims racing
// Launches, Aborts and failing tasks from other goroutines: no two of the
// stream's tasks ever run at once, no task runs inline on a stream whose
// task failure is unreported, and every task submitted completes.
func TestRunInlineClaimsRacingLaunchAbortAndFailure(t *testing.T) {
	d := open(t, 0)
	s := stream(t, d)
	var running, runs, submitted atomic.Int64
	boom := errors.New("task failed on purpose")
	task := func(fail bool) func(<-chan struct{}) error {
		return func(<-chan struct{}) error {
			if n := running.Add(1); n != 1 {
				t.Errorf("%d of the stream's tasks running at once", n)
			}
			runs.Add(1)
			running.Add(-1)
			if fail {
				return boom
			}
			return nil
		}
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := 0; g < 3; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ran, err := s.RunInline("inline", func(st <-chan struct{}) error {
					// Only this task runs: a failure of a task is
					// one from before it (an Abort's may come
					// meanwhile).
					if err := s.PeekError(); errors.Is(err, boom) {
						t.Errorf("RunInline ran a task on a stream with an unreported failure: %v", err)
					}
					return task(false)(st)
				})
				if ran {
					submitted.Add(1)
				}
				if err != nil && !errors.Is(err, device.ErrStreamAbort) {
					t.Errorf("RunInline: %v", err)
				}
				if i%7 == 0 {
					if err := s.Launch("launched", task(i%49 == 0)); err != nil {
						t.Errorf("Launch: %v", err)
					}
					submitted.Add(1)
				}
			}
		}()
	}
	for k := 0; k < 300; k++ {
		time.Sleep(50 * time.Microsecond)
		if k%10 == 0 {
			s.Abort()
		}
		// Synchronize reports a failure and reopens the stream.
		if err := s.Synchronize(context.Background()); err != nil && !errors.Is(err, boom) && !errors.Is(err, device.ErrStreamAbort) {
			t.Fatalf("Synchronize: %v", err)
		}
	}
	close(stop)
	wg.Wait()
	if err := s.Synchronize(context.Background()); err != nil && !errors.Is(err, boom) && !errors.Is(err, device.ErrStreamAbort) {
		t.Fatalf("Synchronize: %v", err)
	}
	if err := s.Query(); err != nil {
		t.Fatalf("after the last Synchronize: %v", err)
	}
	if runs.Load() == 0 || runs.Load() > submitted.Load() {
		t.Fatalf("%d task runs of %d submitted", runs.Load(), submitted.Load())
	}
}

// BenchmarkRunInline is an inline task's cost on an idle stream: what the
// small collectives' lane pays every call for being a stream task. On the
// development VM (stop 39): 40.5 ns/op taking s.mu (a lock, a swap and an
// unlock around the claim), 27 claiming with a compare-and-swap, 20 with
// the task set field by field.
func BenchmarkRunInline(b *testing.B) {
	d := open(b, 0)
	s := stream(b, d)
	fn := func(<-chan struct{}) error { return nil }
	for i := 0; i < b.N; i++ {
		if ran, err := s.RunInline("inline", fn); !ran || err != nil {
			b.Fatal(ran, err)
		}
	}
}
