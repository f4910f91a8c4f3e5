package device_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

func open(t testing.TB, id int) *device.Device {
	t.Helper()
	d, err := device.Open(id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func stream(t testing.TB, d *device.Device) *device.Stream {
	t.Helper()
	s, err := d.CreateStream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Destroy() })
	return s
}

func event(t *testing.T, d *device.Device, flags device.EventFlag) *device.Event {
	t.Helper()
	e, err := d.CreateEventWithFlags(flags)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func sync0(t *testing.T, s *device.Stream) {
	t.Helper()
	if err := s.SynchronizeWithTimeout(10 * time.Second); err != nil {
		t.Fatal(err)
	}
}

// gate is a task that holds its stream until opened.
type gate chan struct{}

func block(t *testing.T, s *device.Stream) gate {
	t.Helper()
	g := make(gate)
	if err := s.Launch("gate", func(stop <-chan struct{}) error {
		select {
		case <-g:
		case <-stop:
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return g
}

func wantCode(t *testing.T, err error, code device.Code) {
	t.Helper()
	if !errors.Is(err, code) {
		t.Fatalf("got error %v, want code %v", err, code)
	}
	var e *device.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v is not a *device.Error", err)
	}
}

// --- Events, point 1: an event never recorded is complete.

func TestEvent1_NeverRecordedIsComplete(t *testing.T) {
	d := open(t, 0)
	e := event(t, d, device.EventDefault)
	if err := e.Query(); err != nil {
		t.Fatalf("Query of a never-recorded event: %v, want complete", err)
	}
	if st, err := e.QueryStatus(); err != nil || st != device.EventRecordedStatusComplete {
		t.Fatalf("QueryStatus = %v, %v; want ACL_EVENT_RECORDED_STATUS_COMPLETE", st, err)
	}
	if err := e.SynchronizeWithTimeout(0); err != nil {
		t.Fatalf("Synchronize of a never-recorded event: %v", err)
	}
	s := stream(t, d)
	if err := s.WaitEvent(e); err != nil {
		t.Fatal(err)
	}
	sync0(t, s) // waiting on it adds no wait
}

// --- Events, point 2: record captures the stream's work at the time of the
// call; re-recording overwrites it.

func TestEvent2_RecordCapturesWorkAtCallTime(t *testing.T) {
	d := open(t, 0)
	s := stream(t, d)
	e := event(t, d, device.EventDefault)
	g := block(t, s)
	if err := e.Record(s); err != nil {
		t.Fatal(err)
	}
	g2 := block(t, s) // enqueued after the record: not captured
	wantCode(t, e.Query(), device.ErrEventNotComplete)
	if st, _ := e.QueryStatus(); st != device.EventRecordedStatusNotReady {
		t.Fatalf("QueryStatus = %v, want not ready", st)
	}
	close(g)
	if err := e.SynchronizeWithTimeout(5 * time.Second); err != nil {
		t.Fatalf("event should complete while later work is still held: %v", err)
	}
	if err := s.Query(); !errors.Is(err, device.ErrStreamNotComplete) {
		t.Fatalf("stream Query = %v, want not complete (g2 holds it)", err)
	}
	close(g2)
	sync0(t, s)
}

func TestEvent2_ReRecordOverwrites(t *testing.T) {
	d := open(t, 0)
	s1, s2 := stream(t, d), stream(t, d)
	e := event(t, d, device.EventDefault)
	g := block(t, s1)
	if err := e.Record(s1); err != nil {
		t.Fatal(err)
	}
	wantCode(t, e.Query(), device.ErrEventNotComplete)
	if err := e.Record(s2); err != nil { // s2 is idle: the event now holds nothing pending
		t.Fatal(err)
	}
	if err := e.SynchronizeWithTimeout(5 * time.Second); err != nil {
		t.Fatalf("re-recorded event should follow s2, not s1: %v", err)
	}
	close(g)
	sync0(t, s1)
}

// --- Events, point 3: a stream wait uses what the event held when it was
// called; a later record does not change it.

func TestEvent3_StreamWaitUsesEventAtCallTime(t *testing.T) {
	d := open(t, 0)
	a, b, c := stream(t, d), stream(t, d), stream(t, d)
	e := event(t, d, device.EventDefault)
	if err := e.Record(a); err != nil { // a is idle: complete at once
		t.Fatal(err)
	}
	sync0(t, a)
	if err := b.WaitEvent(e); err != nil {
		t.Fatal(err)
	}
	g := block(t, c)
	if err := e.Record(c); err != nil { // now the event is pending on c
		t.Fatal(err)
	}
	// b's wait was taken when e held a's completed work: b must not wait for c.
	if err := b.SynchronizeWithTimeout(5 * time.Second); err != nil {
		t.Fatalf("b waited for a record made after its wait: %v", err)
	}
	// A wait enqueued now does wait for c.
	if err := b.WaitEvent(e); err != nil {
		t.Fatal(err)
	}
	var ran atomic.Bool
	b.Launch("after", func(<-chan struct{}) error { ran.Store(true); return nil })
	time.Sleep(20 * time.Millisecond)
	if ran.Load() {
		t.Fatal("task after WaitEvent ran before the event completed")
	}
	close(g)
	sync0(t, b)
	if !ran.Load() {
		t.Fatal("task after WaitEvent never ran")
	}
}

// --- Events, point 4: query never blocks; synchronize blocks with a timeout.

func TestEvent4_QueryDoesNotBlockSynchronizeDoes(t *testing.T) {
	for _, flags := range []device.EventFlag{device.EventDefault, device.EventBlockingSync} {
		d := open(t, 0)
		s := stream(t, d)
		e := event(t, d, flags)
		g := block(t, s)
		e.Record(s)
		start := time.Now()
		wantCode(t, e.Query(), device.ErrEventNotComplete)
		if time.Since(start) > time.Second {
			t.Fatal("Query blocked")
		}
		err := e.SynchronizeWithTimeout(30 * time.Millisecond)
		wantCode(t, err, device.ErrEventSyncTimeout)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("sync timeout %v does not match context.DeadlineExceeded", err)
		}
		wantCode(t, e.SynchronizeWithTimeout(0), device.ErrEventSyncTimeout) // 0 polls
		go func() { time.Sleep(10 * time.Millisecond); close(g) }()
		if err := e.Synchronize(context.Background()); err != nil {
			t.Fatalf("flags %v: %v", flags, err)
		}
		if err := e.Query(); err != nil {
			t.Fatal(err)
		}
	}
}

// --- Events, point 5: elapsed time between two events, and every error case
// of cuEventElapsedTime.

func TestEvent5_ElapsedTimeMeasuresWork(t *testing.T) {
	d := open(t, 0)
	s := stream(t, d)
	start, end := event(t, d, 0), event(t, d, 0)
	start.Record(s)
	s.Launch("sleep", func(<-chan struct{}) error { time.Sleep(5 * time.Millisecond); return nil })
	end.Record(s)
	sync0(t, s)
	ms, err := start.ElapsedTime(end)
	if err != nil {
		t.Fatal(err)
	}
	if ms < 5 || ms > 2000 {
		t.Fatalf("elapsed %v ms, want >= 5", ms)
	}
	// sub-microsecond resolution: two records back to back differ by < 1 ms and are not rounded to 0 ms steps
	a, b := event(t, d, 0), event(t, d, 0)
	a.Record(s)
	b.Record(s)
	sync0(t, s)
	ms, err = a.ElapsedTime(b)
	if err != nil || ms < 0 || ms >= 1 {
		t.Fatalf("back-to-back elapsed = %v, %v", ms, err)
	}
	if ms != 0 && ms*1e6 != float32(int64(ms*1e6)) && ms > 0.001 {
		// fine: value carries microsecond fractions
	}
}

func TestEvent5_ElapsedTimeNotRecordedIsInvalidHandle(t *testing.T) {
	d := open(t, 0)
	s := stream(t, d)
	a, b := event(t, d, 0), event(t, d, 0)
	_, err := a.ElapsedTime(b)
	wantCode(t, err, device.ErrInvalidHandle)
	a.Record(s)
	sync0(t, s)
	_, err = a.ElapsedTime(b) // end never recorded
	wantCode(t, err, device.ErrInvalidHandle)
	_, err = b.ElapsedTime(a) // start never recorded
	wantCode(t, err, device.ErrInvalidHandle)
}

func TestEvent5_ElapsedTimeNotCompleteIsNotReady(t *testing.T) {
	d := open(t, 0)
	s := stream(t, d)
	a, b := event(t, d, 0), event(t, d, 0)
	a.Record(s)
	g := block(t, s)
	b.Record(s)
	_, err := a.ElapsedTime(b)
	wantCode(t, err, device.ErrEventNotComplete)
	close(g)
	sync0(t, s)
	if _, err := a.ElapsedTime(b); err != nil {
		t.Fatal(err)
	}
}

func TestEvent5_ElapsedTimeTimingDisabledIsInvalidHandle(t *testing.T) {
	d := open(t, 0)
	s := stream(t, d)
	a, b := event(t, d, device.EventDisableTiming), event(t, d, 0)
	a.Record(s)
	b.Record(s)
	sync0(t, s)
	_, err := a.ElapsedTime(b)
	wantCode(t, err, device.ErrInvalidHandle)
	_, err = b.ElapsedTime(a)
	wantCode(t, err, device.ErrInvalidHandle)
}

// --- Events, point 6: reset returns a recorded event to not-recorded.

func TestEvent6_ResetReturnsToNotRecorded(t *testing.T) {
	d := open(t, 0)
	s := stream(t, d)
	a, b := event(t, d, 0), event(t, d, 0)
	a.Record(s)
	b.Record(s)
	sync0(t, s)
	if _, err := a.ElapsedTime(b); err != nil {
		t.Fatal(err)
	}
	if err := a.Reset(s); err != nil {
		t.Fatal(err)
	}
	sync0(t, s)
	_, err := a.ElapsedTime(b)
	wantCode(t, err, device.ErrInvalidHandle) // not recorded any more
	if err := a.Query(); err != nil {
		t.Fatalf("reset event should be complete like a new one: %v", err)
	}
}

// ACL's documented sequence: create -> record -> stream wait -> reset.
func TestACLSequence_CreateRecordStreamWaitReset(t *testing.T) {
	d := open(t, 0)
	producer, consumer := stream(t, d), stream(t, d)
	e, err := d.CreateEvent()
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	var mu sync.Mutex
	note := func(s string) func(<-chan struct{}) error {
		return func(<-chan struct{}) error { mu.Lock(); order = append(order, s); mu.Unlock(); return nil }
	}
	g := block(t, producer)
	producer.Launch("produce", note("produce"))
	if err := e.Record(producer); err != nil {
		t.Fatal(err)
	}
	if err := consumer.WaitEvent(e); err != nil {
		t.Fatal(err)
	}
	consumer.Launch("consume", note("consume"))
	if err := e.Reset(consumer); err != nil {
		t.Fatal(err)
	}
	close(g)
	sync0(t, consumer)
	sync0(t, producer)
	if len(order) != 2 || order[0] != "produce" || order[1] != "consume" {
		t.Fatalf("order %v", order)
	}
	if err := e.Destroy(); err != nil {
		t.Fatal(err)
	}
}

// --- Events, point 7 (here 6 in DESIGN's list of destroy): destroy while
// captured work is pending; any later use is an invalid handle, never a crash.

func TestEvent7_DestroyWhilePending(t *testing.T) {
	d := open(t, 0)
	s, w := stream(t, d), stream(t, d)
	e := event(t, d, 0)
	g := block(t, s)
	e.Record(s)
	w.WaitEvent(e) // taken before destroy: still waits for the work
	var after atomic.Bool
	w.Launch("after", func(<-chan struct{}) error { after.Store(true); return nil })
	if err := e.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := e.Destroy(); err != nil { // idempotent
		t.Fatal(err)
	}
	wantCode(t, e.Query(), device.ErrInvalidHandle)
	wantCode(t, e.Record(s), device.ErrInvalidHandle)
	wantCode(t, e.SynchronizeWithTimeout(0), device.ErrInvalidHandle)
	wantCode(t, w.WaitEvent(e), device.ErrInvalidHandle)
	wantCode(t, e.Reset(s), device.ErrInvalidHandle)
	_, err := e.ElapsedTime(e)
	wantCode(t, err, device.ErrInvalidHandle)
	time.Sleep(10 * time.Millisecond)
	if after.Load() {
		t.Fatal("wait taken before destroy did not wait")
	}
	close(g)
	sync0(t, w)
	if !after.Load() {
		t.Fatal("work after the wait never ran")
	}
}

// --- Events: several streams may wait on one event.

func TestEvent_SeveralStreamsWaitOnOne(t *testing.T) {
	d := open(t, 0)
	p := stream(t, d)
	e := event(t, d, 0)
	g := block(t, p)
	e.Record(p)
	var n atomic.Int32
	var ws []*device.Stream
	for i := 0; i < 4; i++ {
		w := stream(t, d)
		w.WaitEvent(e)
		w.Launch("count", func(<-chan struct{}) error { n.Add(1); return nil })
		ws = append(ws, w)
	}
	time.Sleep(10 * time.Millisecond)
	if n.Load() != 0 {
		t.Fatal("a waiter ran before the event")
	}
	close(g)
	for _, w := range ws {
		sync0(t, w)
	}
	if n.Load() != 4 {
		t.Fatalf("%d of 4 waiters ran", n.Load())
	}
}

func TestStreamWaitEventWithTimeoutFailsStream(t *testing.T) {
	d := open(t, 0)
	p, w := stream(t, d), stream(t, d)
	var info *device.ExceptionInfo
	var mu sync.Mutex
	d.SetExceptionInfoCallback(func(i *device.ExceptionInfo) { mu.Lock(); info = i; mu.Unlock() })
	e := event(t, d, 0)
	g := block(t, p)
	e.Record(p)
	w.WaitEventWithTimeout(e, 20*time.Millisecond)
	var skipped atomic.Bool
	w.Launch("after", func(<-chan struct{}) error { skipped.Store(true); return nil })
	err := w.SynchronizeWithTimeout(5 * time.Second)
	wantCode(t, err, device.ErrWaitTimeout)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal("wait timeout should match DeadlineExceeded")
	}
	if skipped.Load() {
		t.Fatal("task after a failed task ran")
	}
	mu.Lock()
	if info == nil || info.ErrorCode != uint32(device.ErrWaitTimeout) || info.StreamID != uint32(w.ID()) {
		t.Fatalf("exception info %+v", info)
	}
	mu.Unlock()
	// After Synchronize reported the error, the stream runs tasks again.
	w.Launch("again", func(<-chan struct{}) error { skipped.Store(true); return nil })
	sync0(t, w)
	if !skipped.Load() {
		t.Fatal("stream did not recover after its error was reported")
	}
	close(g)
}

func TestEventRecordedOnAnotherDevicesStream(t *testing.T) {
	d0, d1 := open(t, 0), open(t, 1)
	e := event(t, d0, 0)
	s1 := stream(t, d1)
	wantCode(t, e.Record(s1), device.ErrInvalidHandle)
	wantCode(t, s1.WaitEvent(e), device.ErrInvalidHandle)
	wantCode(t, e.Reset(s1), device.ErrInvalidHandle)
	var nilE *device.Event
	wantCode(t, nilE.Query(), device.ErrInvalidHandle)
	wantCode(t, nilE.Record(s1), device.ErrInvalidHandle)
	wantCode(t, s1.WaitEvent(nil), device.ErrInvalidHandle)
	if _, err := d0.CreateEventWithFlags(0x80); !errors.Is(err, device.ErrInvalidValue) {
		t.Fatalf("unknown flag: %v", err)
	}
}

// --- Streams

func TestStreamRunsTasksInOrder(t *testing.T) {
	d := open(t, 0)
	s := stream(t, d)
	var got []int
	for i := 0; i < 1000; i++ {
		i := i
		s.Launch("append", func(<-chan struct{}) error { got = append(got, i); return nil })
	}
	sync0(t, s)
	for i, v := range got {
		if v != i {
			t.Fatalf("task %d ran at position %d", v, i)
		}
	}
	if len(got) != 1000 {
		t.Fatalf("%d tasks ran", len(got))
	}
}

func TestStreamSynchronizeTimeoutAndPoll(t *testing.T) {
	d := open(t, 0)
	s := stream(t, d)
	g := block(t, s)
	wantCode(t, s.Query(), device.ErrStreamNotComplete)
	err := s.SynchronizeWithTimeout(20 * time.Millisecond)
	wantCode(t, err, device.ErrStreamSyncTimeout)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal("stream sync timeout should match DeadlineExceeded")
	}
	wantCode(t, s.SynchronizeWithTimeout(0), device.ErrStreamSyncTimeout)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	wantCode(t, s.Synchronize(ctx), device.ErrStreamSyncTimeout)
	close(g)
	if err := s.SynchronizeWithTimeout(-1); err != nil {
		t.Fatal(err)
	}
	if err := s.Query(); err != nil {
		t.Fatal(err)
	}
}

func TestDeviceSynchronize(t *testing.T) {
	d := open(t, 0)
	s1, s2 := stream(t, d), stream(t, d)
	g := block(t, s1)
	s2.Launch("x", func(<-chan struct{}) error { return nil })
	wantCode(t, d.SynchronizeWithTimeout(10*time.Millisecond), device.ErrStreamSyncTimeout)
	close(g)
	if err := d.SynchronizeWithTimeout(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	ds, err := d.DefaultStream()
	if err != nil {
		t.Fatal(err)
	}
	ds.Launch("x", func(<-chan struct{}) error { return nil })
	if err := d.Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestStreamAbortFailsPendingWork(t *testing.T) {
	d := open(t, 0)
	s := stream(t, d)
	block(t, s) // never opened: only Abort ends it
	var ran atomic.Bool
	s.Launch("later", func(<-chan struct{}) error { ran.Store(true); return nil })
	if err := s.Abort(); err != nil {
		t.Fatal(err)
	}
	wantCode(t, s.SynchronizeWithTimeout(5*time.Second), device.ErrStreamAbort)
	if ran.Load() {
		t.Fatal("a dropped task ran")
	}
	s.Launch("after", func(<-chan struct{}) error { ran.Store(true); return nil })
	sync0(t, s)
	if !ran.Load() {
		t.Fatal("stream unusable after Abort")
	}
}

func TestUseAfterDestroyIsInvalidHandle(t *testing.T) {
	d := open(t, 0)
	s, err := d.CreateStream()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := s.Destroy(); err != nil {
		t.Fatal("Destroy is idempotent:", err)
	}
	wantCode(t, s.Launch("x", func(<-chan struct{}) error { return nil }), device.ErrInvalidHandle)
	wantCode(t, s.SynchronizeWithTimeout(0), device.ErrInvalidHandle)
	wantCode(t, s.Query(), device.ErrInvalidHandle)
	p, _ := d.Malloc(64)
	wantCode(t, s.MemcpyAsync(p, p, 8, device.MemcpyDeviceToDevice), device.ErrInvalidHandle)
	var ns *device.Stream
	wantCode(t, ns.Launch("x", nil), device.ErrInvalidHandle)
	wantCode(t, ns.SynchronizeWithTimeout(0), device.ErrInvalidHandle)
	d.Close()
	if err := d.Close(); err != nil {
		t.Fatal("Close is idempotent:", err)
	}
	_, err = d.CreateStream()
	wantCode(t, err, device.ErrInvalidHandle)
	_, err = d.Malloc(8)
	wantCode(t, err, device.ErrInvalidHandle)
	var nd *device.Device
	_, err = nd.Malloc(8)
	wantCode(t, err, device.ErrInvalidHandle)
	_, err = device.Open(-1)
	wantCode(t, err, device.ErrInvalidDeviceID)
	_, err = device.Open(device.MaxDevices)
	wantCode(t, err, device.ErrInvalidDeviceID)
}

func TestDeviceCloseAbortsWaitingTasks(t *testing.T) {
	d, _ := device.Open(3)
	s, _ := d.CreateStream()
	block(t, s)
	done := make(chan error, 1)
	go func() { done <- d.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close hung on a blocked task")
	}
}

func TestTaskPanicFailsStreamNotProcess(t *testing.T) {
	d := open(t, 0)
	s := stream(t, d)
	s.Launch("boom", func(<-chan struct{}) error { panic("boom") })
	wantCode(t, s.SynchronizeWithTimeout(5*time.Second), device.ErrInternal)
}

// --- Host callbacks

func TestCallbackBlockHoldsLaterTasks(t *testing.T) {
	d := open(t, 0)
	s := stream(t, d)
	release := make(chan struct{})
	var cbDone, later atomic.Bool
	s.LaunchCallback(func() { <-release; cbDone.Store(true) }, device.CallbackBlock)
	s.Launch("later", func(<-chan struct{}) error {
		if !cbDone.Load() {
			return errors.New("ran before the blocking callback returned")
		}
		later.Store(true)
		return nil
	})
	time.Sleep(20 * time.Millisecond)
	if later.Load() {
		t.Fatal("later task ran while a blocking callback held the stream")
	}
	close(release)
	sync0(t, s)
	if !later.Load() {
		t.Fatal("later task did not run")
	}
}

func TestCallbackNoBlockLetsLaterTasksRun(t *testing.T) {
	d := open(t, 0)
	s := stream(t, d)
	release := make(chan struct{})
	s.LaunchCallback(func() { <-release }, device.CallbackNoBlock)
	var later atomic.Bool
	s.Launch("later", func(<-chan struct{}) error { later.Store(true); return nil })
	sync0(t, s) // completes although the callback is still running
	if !later.Load() {
		t.Fatal("later task did not run")
	}
	close(release)
	if err := s.LaunchCallback(nil, device.CallbackBlock); !errors.Is(err, device.ErrInvalidValue) {
		t.Fatalf("nil callback: %v", err)
	}
	if err := s.LaunchCallback(func() {}, 7); !errors.Is(err, device.ErrInvalidValue) {
		t.Fatalf("bad block type: %v", err)
	}
}

func TestReportModelSubscribeProcessUnsubscribe(t *testing.T) {
	d := open(t, 0)
	s := stream(t, d)
	const tid = 77
	if err := device.SubscribeReport(tid, s); err != nil {
		t.Fatal(err)
	}
	wantCode(t, device.SubscribeReport(tid+1, s), device.ErrStreamSubscribe)
	var ranOn atomic.Int32 // 1 = report goroutine
	var onReport atomic.Bool
	s.LaunchCallback(func() {
		if onReport.Load() {
			ranOn.Store(1)
		}
	}, device.CallbackBlock)
	var later atomic.Bool
	s.Launch("later", func(<-chan struct{}) error { later.Store(true); return nil })
	time.Sleep(10 * time.Millisecond)
	if later.Load() {
		t.Fatal("blocking callback did not hold the stream before ProcessReport")
	}
	onReport.Store(true)
	if err := device.ProcessReport(tid, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	sync0(t, s)
	if ranOn.Load() != 1 || !later.Load() {
		t.Fatal("callback did not run on the report goroutine")
	}
	err := device.ProcessReport(tid, 10*time.Millisecond)
	wantCode(t, err, device.ErrReportTimeout)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal("report timeout should match DeadlineExceeded")
	}
	wantCode(t, device.UnsubscribeReport(tid+1, s), device.ErrThreadSubscribe)
	if err := device.UnsubscribeReport(tid, s); err != nil {
		t.Fatal(err)
	}
	wantCode(t, device.ProcessReport(tid, 0), device.ErrThreadSubscribe)
	// Unsubscribed: callbacks run the plain Go way again.
	var plain atomic.Bool
	s.LaunchCallback(func() { plain.Store(true) }, device.CallbackBlock)
	sync0(t, s)
	if !plain.Load() {
		t.Fatal("callback did not run after unsubscribe")
	}
}

// --- Exception info

func TestExceptionInfoOnCopyOutOfBounds(t *testing.T) {
	d := open(t, 5)
	s := stream(t, d)
	infos := make(chan *device.ExceptionInfo, 4)
	d.SetExceptionInfoCallback(func(i *device.ExceptionInfo) { infos <- i })
	desc, _ := d.Malloc(64)
	src, _ := d.Malloc(16)
	dst, _ := d.Malloc(16)
	if err := d.SetMemcpyDesc(desc, device.MemcpyInnerDeviceToDevice, src, dst, 16); err != nil {
		t.Fatal(err)
	}
	// Rewrite the descriptor so that, when the task reads it, the copy runs out of bounds.
	raw, _ := d.Bytes(desc, 32)
	raw[24] = 200
	if err := s.MemcpyAsyncWithDesc(desc, device.MemcpyInnerDeviceToDevice); err != nil {
		t.Fatal(err)
	}
	err := s.SynchronizeWithTimeout(5 * time.Second)
	wantCode(t, err, device.ErrInvalidValue)
	var info *device.ExceptionInfo
	select {
	case info = <-infos:
	case <-time.After(5 * time.Second):
		t.Fatal("no exception info")
	}
	if device.GetTaskIDFromExceptionInfo(info) != 1 ||
		device.GetStreamIDFromExceptionInfo(info) != uint32(s.ID()) ||
		device.GetDeviceIDFromExceptionInfo(info) != 5 ||
		device.GetErrorCodeFromExceptionInfo(info) != uint32(device.ErrInvalidValue) ||
		device.GetThreadIDFromExceptionInfo(info) == 0 || device.GetThreadIDFromExceptionInfo(info) == 0xFFFFFFFF {
		t.Fatalf("exception info %+v", info)
	}
	if device.GetTaskIDFromExceptionInfo(nil) != 0xFFFFFFFF || device.GetErrorCodeFromExceptionInfo(nil) != 0xFFFFFFFF ||
		device.GetStreamIDFromExceptionInfo(nil) != 0xFFFFFFFF || device.GetThreadIDFromExceptionInfo(nil) != 0xFFFFFFFF ||
		device.GetDeviceIDFromExceptionInfo(nil) != 0xFFFFFFFF {
		t.Fatal("getters on nil must return 0xFFFFFFFF")
	}
	d.SetExceptionInfoCallback(nil)
}

// --- Memory

func TestMemcpyEveryKind(t *testing.T) {
	d := open(t, 0)
	s := stream(t, d)
	const n = 4099
	h1, _ := d.MallocHost(n)
	h2, _ := d.MallocHost(n)
	d1, _ := d.Malloc(n)
	d2, _ := d.Malloc(n)
	want := make([]byte, n)
	for i := range want {
		want[i] = byte(i*7 + 3)
	}
	hb, _ := d.Bytes(h1, n)
	copy(hb, want)
	steps := []struct {
		dst, src device.Ptr
		kind     device.MemcpyKind
	}{
		{h2, h1, device.MemcpyHostToHost},
		{d1, h2, device.MemcpyHostToDevice},
		{d2, d1, device.MemcpyDeviceToDevice},
		{d1, d2, device.MemcpyInnerDeviceToDevice},
		{d2, d1, device.MemcpyDefault},
		{h2, d2, device.MemcpyDeviceToHost},
	}
	for _, st := range steps {
		if err := d.Memset(st.dst, n, 0); err != nil {
			t.Fatal(err)
		}
		if err := s.MemcpyAsync(st.dst, st.src, n, st.kind); err != nil {
			t.Fatalf("%v: %v", st.kind, err)
		}
		sync0(t, s)
		got := make([]byte, n)
		d.MemcpyDtoH(got, st.dst)
		if !bytes.Equal(got, want) {
			t.Fatalf("%v: data differs", st.kind)
		}
		if err := d.Memcpy(st.dst, st.src, n, st.kind); err != nil {
			t.Fatalf("sync %v: %v", st.kind, err)
		}
	}
	// Go slices to and from device memory, async.
	out := make([]byte, n)
	s.MemsetAsync(d1, n, 0)
	s.MemcpyHtoDAsync(d1, want)
	s.MemcpyDtoHAsync(out, d1)
	sync0(t, s)
	if !bytes.Equal(out, want) {
		t.Fatal("HtoD/DtoH async round trip differs")
	}
	// Inter-device copy between two device contexts.
	o := open(t, 1)
	od, _ := o.Malloc(n)
	if err := d.Memcpy(od, d1, n, device.MemcpyInterDeviceToDevice); err != nil {
		t.Fatal(err)
	}
	o.MemcpyDtoH(out, od)
	if !bytes.Equal(out, want) {
		t.Fatal("inter-device copy differs")
	}
	wantCode(t, d.Memcpy(d2, d1, n, device.MemcpyInterDeviceToDevice), device.ErrInvalidValue)
	wantCode(t, d.Memcpy(od, d1, n, device.MemcpyInnerDeviceToDevice), device.ErrInvalidValue)
}

// TestRangeErrorsNameTheRangeOnce checks the messages of a bad range: each
// names the argument and the range, and says no word twice in a row (the
// argument's name once ran into the message's own: "address address").
func TestRangeErrorsNameTheRangeOnce(t *testing.T) {
	d := open(t, 0)
	p, err := d.Malloc(64)
	if err != nil {
		t.Fatal(err)
	}
	bytesErr := func(p device.Ptr, n int64) error {
		_, err := d.Bytes(p, n)
		return err
	}
	shareErr := func(p device.Ptr, n int64) error {
		fd, _, err := d.Share(p, n)
		if err == nil {
			t.Errorf("Share(%#x, %d) succeeded", uintptr(p), n)
			os.NewFile(uintptr(fd), "shared").Close()
		}
		return err
	}
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"Bytes wild", bytesErr(0x1000, 8), "range [0x1000, +8) is not in any live allocation"},
		{"Bytes past the end", bytesErr(p+60, 8), "range [" + hex(p+60) + ", +8) runs 4 bytes past the end"},
		{"Bytes nil", bytesErr(0, 8), "range is a nil address"},
		{"Share wild", shareErr(0x1000, 8), "range [0x1000, +8) is not in any live allocation"},
		{"Memset past the end", d.Memset(p, 65, 0), "dst [" + hex(p) + ", +65) runs 1 bytes past the end"},
		{"MemcpyDtoH wild", d.MemcpyDtoH(make([]byte, 8), 0x1000), "src [0x1000, +8) is not in any live allocation"},
	}
	for _, c := range cases {
		if c.err == nil {
			t.Errorf("%s: no error", c.name)
			continue
		}
		msg := c.err.Error()
		if !strings.Contains(msg, c.want) {
			t.Errorf("%s: error %q does not say %q", c.name, msg, c.want)
		}
		words := strings.Fields(msg)
		for i := 1; i < len(words); i++ {
			if words[i] == words[i-1] {
				t.Errorf("%s: error %q says %q twice", c.name, msg, words[i])
			}
		}
	}
}

func hex(p device.Ptr) string { return fmt.Sprintf("%#x", uintptr(p)) }

func TestMemcpyWrongKindOrRangeIsClearError(t *testing.T) {
	d := open(t, 0)
	s := stream(t, d)
	h, _ := d.MallocHost(64)
	p, _ := d.Malloc(64)
	cases := []struct {
		name      string
		dst, src  device.Ptr
		n         int64
		kind      device.MemcpyKind
		wantCode  device.Code
		wantWords string
	}{
		{"H2D with device src", p, p, 8, device.MemcpyHostToDevice, device.ErrInvalidValue, "host memory at src"},
		{"D2H with device dst", p, p, 8, device.MemcpyDeviceToHost, device.ErrInvalidValue, "host memory at dst"},
		{"H2H with device", h, p, 8, device.MemcpyHostToHost, device.ErrInvalidValue, "host memory at src"},
		{"past the end", p, p, 65, device.MemcpyDeviceToDevice, device.ErrInvalidValue, "past the end"},
		{"offset past the end", p + 60, p, 8, device.MemcpyDeviceToDevice, device.ErrInvalidValue, "past the end"},
		{"negative", p, p, -1, device.MemcpyDeviceToDevice, device.ErrInvalidValue, "negative"},
		{"nil", 0, p, 8, device.MemcpyDeviceToDevice, device.ErrInvalidValue, "nil"},
		{"wild", 0x1000, p, 8, device.MemcpyDeviceToDevice, device.ErrInvalidValue, "not in any live allocation"},
		{"huge", p, p, 1 << 62, device.MemcpyDeviceToDevice, device.ErrInvalidValue, "past the end"},
		{"unknown kind", p, p, 8, 42, device.ErrInvalidValue, "unknown copy kind"},
		{"buf kind", p, h, 8, device.MemcpyHostToBufToDevice, device.ErrFeatureNotSupported, "not supported"},
	}
	for _, c := range cases {
		err := s.MemcpyAsync(c.dst, c.src, c.n, c.kind)
		wantCode(t, err, c.wantCode)
		if !bytes.Contains([]byte(err.Error()), []byte(c.wantWords)) {
			t.Errorf("%s: error %q does not say %q", c.name, err, c.wantWords)
		}
		wantCode(t, d.Memcpy(c.dst, c.src, c.n, c.kind), c.wantCode)
	}
	wantCode(t, s.MemsetAsync(p, 65, 0), device.ErrInvalidValue)
	wantCode(t, d.Memset(p+64, 1, 0), device.ErrInvalidValue)
	_, err := d.Bytes(p, 65)
	wantCode(t, err, device.ErrInvalidValue)
	wantCode(t, d.MemcpyHtoD(p, make([]byte, 65)), device.ErrInvalidValue)
	wantCode(t, d.MemcpyDtoH(make([]byte, 65), p), device.ErrInvalidValue)
	_, err = d.Malloc(0)
	wantCode(t, err, device.ErrInvalidValue)
	_, err = d.Malloc(-5)
	wantCode(t, err, device.ErrInvalidValue)
	_, err = d.Malloc(1 << 50)
	wantCode(t, err, device.ErrMemoryAllocation)
	wantCode(t, d.Free(p+1), device.ErrInvalidValue)
	other := open(t, 1)
	wantCode(t, other.Free(p), device.ErrInvalidValue) // foreign handle
	if err := d.Free(p); err != nil {
		t.Fatal(err)
	}
	wantCode(t, d.Free(p), device.ErrInvalidValue) // double free
	wantCode(t, s.MemcpyAsync(h, p, 8, device.MemcpyDefault), device.ErrInvalidValue)
	// zero-length copies are no-ops, even with nil addresses
	if err := s.MemcpyAsync(0, 0, 0, device.MemcpyDeviceToDevice); err != nil {
		t.Fatal(err)
	}
	sync0(t, s)
}

func TestFreeWhileCopyQueuedFailsTaskCleanly(t *testing.T) {
	d := open(t, 0)
	s := stream(t, d)
	a, _ := d.Malloc(1 << 16)
	b, _ := d.Malloc(1 << 16)
	g := block(t, s)
	s.MemcpyAsync(a, b, 1<<16, device.MemcpyDeviceToDevice)
	d.Free(b)
	close(g)
	wantCode(t, s.SynchronizeWithTimeout(5*time.Second), device.ErrInvalidValue)
}

// --- Copy descriptor (aclrtGetMemcpyDescSize -> device memory -> aclrtSetMemcpyDesc -> aclrtMemcpyAsyncWithDesc)

func TestMemcpyDescRoundTrip(t *testing.T) {
	d := open(t, 0)
	s := stream(t, d)
	size, err := device.MemcpyDescSize(device.MemcpyInnerDeviceToDevice)
	if err != nil || size <= 0 {
		t.Fatalf("desc size %d, %v", size, err)
	}
	desc, _ := d.Malloc(size)
	const n = 1031
	src, _ := d.Malloc(n)
	dst, _ := d.Malloc(n)
	want := bytes.Repeat([]byte{0xA5, 0x3C, 0x7E}, n/3+1)[:n]
	d.MemcpyHtoD(src, want)
	if err := d.SetMemcpyDesc(desc, device.MemcpyInnerDeviceToDevice, src, dst, n); err != nil {
		t.Fatal(err)
	}
	if err := s.MemcpyAsyncWithDesc(desc, device.MemcpyInnerDeviceToDevice); err != nil {
		t.Fatal(err)
	}
	sync0(t, s)
	got := make([]byte, n)
	d.MemcpyDtoH(got, dst)
	if !bytes.Equal(got, want) {
		t.Fatal("descriptor copy differs")
	}
	// The descriptor is read when the task runs: rewriting it between enqueue and run is honoured.
	g := block(t, s)
	s.MemcpyAsyncWithDesc(desc, device.MemcpyInnerDeviceToDevice)
	d.Memset(dst, n, 0)
	d.SetMemcpyDesc(desc, device.MemcpyInnerDeviceToDevice, src, dst, 10)
	close(g)
	sync0(t, s)
	d.MemcpyDtoH(got, dst)
	if !bytes.Equal(got[:10], want[:10]) || got[10] != 0 {
		t.Fatal("descriptor rewritten before the task ran was not honoured")
	}
}

func TestMemcpyDescErrors(t *testing.T) {
	d := open(t, 0)
	s := stream(t, d)
	for _, k := range []device.MemcpyKind{device.MemcpyHostToHost, device.MemcpyHostToDevice, device.MemcpyDeviceToHost,
		device.MemcpyDeviceToDevice, device.MemcpyDefault, device.MemcpyInterDeviceToDevice} {
		_, err := device.MemcpyDescSize(k)
		wantCode(t, err, device.ErrFeatureNotSupported)
	}
	desc, _ := d.Malloc(32)
	small, _ := d.Malloc(16)
	hostDesc, _ := d.MallocHost(32)
	a, _ := d.Malloc(64)
	h, _ := d.MallocHost(64)
	inner := device.MemcpyInnerDeviceToDevice
	wantCode(t, d.SetMemcpyDesc(desc, device.MemcpyDeviceToDevice, a, a, 8), device.ErrFeatureNotSupported)
	wantCode(t, d.SetMemcpyDesc(small, inner, a, a, 8), device.ErrInvalidValue)    // descriptor too small
	wantCode(t, d.SetMemcpyDesc(hostDesc, inner, a, a, 8), device.ErrInvalidValue) // descriptor in host memory
	wantCode(t, d.SetMemcpyDesc(desc, inner, h, a, 8), device.ErrInvalidValue)     // host source
	wantCode(t, d.SetMemcpyDesc(desc, inner, a, a, 65), device.ErrInvalidValue)    // out of range
	other := open(t, 1)
	od, _ := other.Malloc(64)
	wantCode(t, d.SetMemcpyDesc(desc, inner, od, a, 8), device.ErrInvalidValue) // another device
	wantCode(t, s.MemcpyAsyncWithDesc(desc, device.MemcpyDeviceToDevice), device.ErrFeatureNotSupported)
	wantCode(t, s.MemcpyAsyncWithDesc(small, inner), device.ErrInvalidValue)
	// A descriptor never set fails the stream when the task runs.
	if err := s.MemcpyAsyncWithDesc(desc, inner); err != nil {
		t.Fatal(err)
	}
	err := s.SynchronizeWithTimeout(5 * time.Second)
	wantCode(t, err, device.ErrInvalidValue)
	if !bytes.Contains([]byte(err.Error()), []byte("never set")) {
		t.Fatalf("error %q", err)
	}
}

// --- Goroutines

func TestCloseLeavesNoGoroutine(t *testing.T) {
	before := runtime.NumGoroutine()
	for i := 0; i < 3; i++ {
		d, _ := device.Open(i)
		for j := 0; j < 4; j++ {
			s, _ := d.CreateStream()
			s.Launch("x", func(<-chan struct{}) error { return nil })
			s.LaunchCallback(func() {}, device.CallbackNoBlock)
			if j%2 == 0 {
				s.Destroy()
			}
		}
		d.DefaultStream()
		d.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Fatalf("%d goroutines before, %d after closing every device", before, n)
	}
}

func TestErrorsCarryContext(t *testing.T) {
	d := open(t, 2)
	s := stream(t, d)
	p, _ := d.Malloc(8)
	err := s.MemcpyAsync(p, p, 9, device.MemcpyDeviceToDevice)
	var e *device.Error
	if !errors.As(err, &e) || e.Device != 2 || e.Stream != s.ID() || e.Op != "MemcpyAsync" {
		t.Fatalf("error %#v", err)
	}
	if device.CodeOf(err) != device.ErrInvalidValue || device.CodeOf(nil) != device.Success ||
		device.CodeOf(errors.New("x")) != device.ErrInternal {
		t.Fatal("CodeOf")
	}
	if device.ErrEventNotComplete.Timeout() || !device.ErrWaitTimeout.Timeout() {
		t.Fatal("Timeout()")
	}
}

// A caller that enqueues faster than the stream runs waits once MaxPending
// tasks are queued: every task finds at most MaxPending tasks still queued
// from the moment it was taken.
func TestEnqueueWaitsWhenQueueIsFull(t *testing.T) {
	d := open(t, 0)
	s := stream(t, d)
	const n = 8 * device.MaxPending
	var launched atomic.Int64
	var worst atomic.Int64
	for i := int64(1); i <= n; i++ {
		if err := s.Launch("slow", func(<-chan struct{}) error {
			// Tasks cost more than enqueues (about 2 µs each), so that an
			// unbounded queue would run far ahead.
			for t0 := time.Now(); time.Since(t0) < 2*time.Microsecond; {
			}
			if ahead := launched.Load() - i; ahead > worst.Load() {
				worst.Store(ahead)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		launched.Add(1)
	}
	sync0(t, s)
	if w := worst.Load(); w > device.MaxPending {
		t.Fatalf("a task saw %d tasks queued behind it, the bound is %d", w, device.MaxPending)
	}
}

// A caller far ahead of its stream yields the processor at each further
// enqueue, so that where the two share one processor the worker runs
// between the enqueues: with GOMAXPROCS 1, no-op tasks never pile up much
// past YieldAhead. Without the yield the caller ran on to MaxPending before
// the worker ran a task, and, released from the throttle at MaxPending/2,
// enqueued the next MaxPending/2 in one go while the worker waited.
func TestEnqueueFarAheadYields(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	d := open(t, 0)
	s := stream(t, d)
	var worst uint64
	for i := 0; i < 4*device.MaxPending; i++ {
		if err := s.Launch("no-op", func(<-chan struct{}) error { return nil }); err != nil {
			t.Fatal(err)
		}
		worst = max(worst, s.Pending())
	}
	sync0(t, s)
	if worst > 2*device.YieldAhead {
		t.Fatalf("the caller ran %d tasks ahead of its stream on one processor; past %d each enqueue should yield to the worker", worst, device.YieldAhead)
	}
}

// A blocking host callback that enqueues on its own full stream — which
// waits for the callback — must not deadlock: the enqueue stops waiting when
// the stream makes no progress.
func TestEnqueueFromOwnCallbackOnFullStreamDoesNotDeadlock(t *testing.T) {
	d := open(t, 0)
	s := stream(t, d)
	done := make(chan error, 1)
	if err := s.LaunchCallback(func() {
		done <- s.Launch("from callback", func(<-chan struct{}) error { return nil })
	}, device.CallbackBlock); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < device.MaxPending; i++ {
		if err := s.Launch("filler", func(<-chan struct{}) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an enqueue from a blocking callback on its own full stream hung")
	}
	sync0(t, s)
}
