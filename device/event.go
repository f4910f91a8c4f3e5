package device

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hcomm-dev/hcomm/internal/spin"
)

// EventFlag selects an event's behaviour at creation. The values are CUDA's
// CUevent_flags; ACL's aclrtCreateEventWithFlag flags map as the README says
// (ACL_EVENT_SYNC and ACL_EVENT_TIME_LINE are what every event here does unless
// EventDisableTiming is given).
type EventFlag uint32

const (
	EventDefault       EventFlag = 0x0 // CU_EVENT_DEFAULT: timing on, synchronize spins before it sleeps
	EventBlockingSync  EventFlag = 0x1 // CU_EVENT_BLOCKING_SYNC: Synchronize sleeps at once instead of spinning
	EventDisableTiming EventFlag = 0x2 // CU_EVENT_DISABLE_TIMING: no timestamps; ElapsedTime returns ErrInvalidHandle
)

// EventRecordedStatus is the result of QueryStatus, with ACL's values
// (aclrtEventRecordedStatus: note NOT_READY is 0 and COMPLETE 1).
type EventRecordedStatus int32

const (
	EventRecordedStatusNotReady EventRecordedStatus = 0 // ACL_EVENT_RECORDED_STATUS_NOT_READY
	EventRecordedStatusComplete EventRecordedStatus = 1 // ACL_EVENT_RECORDED_STATUS_COMPLETE
)

func (s EventRecordedStatus) String() string {
	if s == EventRecordedStatusComplete {
		return "complete"
	}
	return "not ready"
}

// Event marks a point in a stream (aclrtEvent / CUevent). The rules, from the
// ACL and CUDA documents hcomm follows:
//
//  1. An event never recorded is complete: Query returns nil and Synchronize
//     returns at once.
//  2. Record captures the work enqueued on the stream at the time of the call;
//     recording again overwrites what the event holds.
//  3. Stream.WaitEvent waits for what the event held when WaitEvent was called;
//     a later Record does not change it.
//  4. Query never blocks; Synchronize blocks until the captured work is done.
//  5. ElapsedTime needs both events recorded and complete, with timing on.
//  6. Reset (enqueued on a stream) returns the event to the never-recorded state.
//  7. Destroy while captured work is pending is allowed; every later use of the
//     event is ErrInvalidHandle.
//
// Several streams may wait on one event. All methods are safe for concurrent use.
type Event struct {
	dev   *Device
	flags EventFlag

	mu        sync.Mutex
	destroyed bool
	rec       *capture // nil: never recorded, or reset
}

// capture is what one Record took: the stream and the sequence number of the
// record task, whose completion time is stamped when it runs.
type capture struct {
	s   *Stream
	seq uint64
	ns  atomic.Int64 // monotonic nanoseconds at completion; 0 until then
	// skip is why the record task did not run (a failure at or before it
	// made the stream skip it, or an abort dropped it): set by the stream's
	// worker before the task counts as completed, so read it after done.
	skip error
}

func (c *capture) done() bool { return c.s.completed.Load() >= c.seq }

// failure is the error of a completed capture whose work did not all run: a
// task at or before the captured one failed (and the stream skipped what
// followed it) and no Synchronize of the stream has reported it yet. The
// failure stays on the stream for its Synchronize, as CUDA's sticky errors
// are returned by every synchronize until reported.
func (c *capture) failure(op string) error {
	err := c.s.failedBy(c.seq)
	if err == nil {
		return nil
	}
	e := newErr(op, c.s.dev.id, c.s.id, CodeOf(err), "the captured work failed")
	e.Err = err
	return e
}

// skipped is the error of a completed capture whose record task did not
// run: the stream failed (or was aborted) at or before it, so some of the
// captured work did not run. Unlike failure, it does not depend on whether a
// Synchronize has reported the stream's failure since.
func (c *capture) skipped(op string, s *Stream) error {
	if c.skip == nil {
		return nil
	}
	e := s.errf(op, CodeOf(c.skip), "the awaited work on stream %d (up to task %d) failed", c.s.id, c.seq)
	e.Err = c.skip
	return e
}

var epoch = time.Now()

// CreateEvent creates an event with timing on (aclrtCreateEvent).
func (d *Device) CreateEvent() (*Event, error) { return d.CreateEventWithFlags(EventDefault) }

// CreateEventWithFlags creates an event (cuEventCreate / aclrtCreateEventWithFlag).
func (d *Device) CreateEventWithFlags(flags EventFlag) (*Event, error) {
	if err := d.check("CreateEvent"); err != nil {
		return nil, err
	}
	if flags&^(EventBlockingSync|EventDisableTiming) != 0 {
		return nil, newErr("CreateEvent", d.id, -1, ErrInvalidValue, "unknown event flags %#x", uint32(flags))
	}
	return &Event{dev: d, flags: flags}, nil
}

// Flags returns the flags the event was created with.
func (e *Event) Flags() EventFlag { return e.flags }

func (e *Event) live(op string) error {
	if e == nil {
		return newErr(op, -1, -1, ErrInvalidHandle, "nil event")
	}
	if err := e.dev.check(op); err != nil {
		return err
	}
	if e.destroyed {
		return newErr(op, e.dev.id, -1, ErrInvalidHandle, "event is destroyed")
	}
	return nil
}

// Record captures the work enqueued on s so far (aclrtRecordEvent /
// cuEventRecord): the event completes when that work has. s must belong to the
// event's device; a nil s is that device's default stream (DefaultStream), as
// ACL and CUDA take a NULL stream.
func (e *Event) Record(s *Stream) error {
	const op = "Event.Record"
	if s == nil && e != nil {
		var err error
		if s, err = s.orDefault(op, e.dev); err != nil {
			return err
		}
	}
	if err := s.usable(op); err != nil {
		return err
	}
	if e == nil {
		return newErr(op, s.dev.id, s.id, ErrInvalidHandle, "nil event")
	}
	if s.dev != e.dev {
		return s.errf(op, ErrInvalidHandle, "event of device %d recorded on a stream of device %d (another context)", e.dev.id, s.dev.id)
	}
	c := &capture{s: s}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.live(op); err != nil {
		return err
	}
	seq, err := s.enqueueTask(task{name: op, run: func(<-chan struct{}) error {
		c.ns.Store(int64(time.Since(epoch)) + 1)
		return nil
	}, skipped: func(err error) { c.skip = err }})
	if err != nil {
		return err
	}
	c.seq = seq
	e.rec = c
	return nil
}

// snapshot returns what the event holds now.
func (e *Event) snapshot(op string) (*capture, error) {
	if e == nil {
		return nil, newErr(op, -1, -1, ErrInvalidHandle, "nil event")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.live(op); err != nil {
		return nil, err
	}
	return e.rec, nil
}

// Query reports, without blocking, whether the captured work is complete
// (cuEventQuery): nil when it is (or the event was never recorded),
// ErrEventNotComplete when not.
func (e *Event) Query() error {
	c, err := e.snapshot("Event.Query")
	if err != nil {
		return err
	}
	if c != nil && !c.done() {
		return newErr("Event.Query", e.dev.id, c.s.id, ErrEventNotComplete, "captured task %d not complete", c.seq)
	}
	return nil
}

// QueryStatus is Query with ACL's result (aclrtQueryEventStatus).
func (e *Event) QueryStatus() (EventRecordedStatus, error) {
	err := e.Query()
	switch {
	case err == nil:
		return EventRecordedStatusComplete, nil
	case CodeOf(err) == ErrEventNotComplete:
		return EventRecordedStatusNotReady, nil
	}
	return EventRecordedStatusNotReady, err
}

// Synchronize blocks until the captured work is complete or ctx is done
// (aclrtSynchronizeEvent / cuEventSynchronize). Without EventBlockingSync the
// caller spins briefly before it sleeps. On expiry it returns
// ErrEventSyncTimeout, which matches context.DeadlineExceeded. When a task
// at or before the captured one failed (so the stream skipped the rest of
// the captured work) and no Stream.Synchronize has reported that failure yet,
// it returns an error wrapping the failure, whose code is the failure's; the
// failure stays for the stream's Synchronize. A waiter on an event therefore
// never mistakes skipped work for done work.
func (e *Event) Synchronize(ctx context.Context) error {
	const op = "Event.Synchronize"
	if ctx == nil {
		return newErr(op, -1, -1, ErrInvalidValue, "nil context")
	}
	c, err := e.snapshot(op)
	if err != nil || c == nil {
		return err
	}
	if c.done() {
		return c.failure(op)
	}
	spinFor := spin.Default
	if e.flags&EventBlockingSync != 0 {
		spinFor = 0
	}
	if ctx.Err() == nil && c.s.awaitProgress(c.seq, spinFor, nil, ctx.Done()) == reached {
		return c.failure(op)
	}
	er := newErr(op, e.dev.id, c.s.id, ErrEventSyncTimeout, "captured task %d not complete", c.seq)
	er.Err = ctx.Err()
	return er
}

// SynchronizeWithTimeout is Synchronize with ACL's timeout convention
// (aclrtSynchronizeEventWithTimeout): negative waits forever, zero polls.
func (e *Event) SynchronizeWithTimeout(timeout time.Duration) error {
	ctx, cancel := timeoutContext(timeout)
	defer cancel()
	return e.Synchronize(ctx)
}

// ElapsedTime returns the milliseconds between two events' completions
// (cuEventElapsedTime / aclrtEventElapsedTime), with the resolution of the
// monotonic clock (nanoseconds). Errors, as in cuEventElapsedTime:
// ErrInvalidHandle when either event was never recorded (or was reset), was
// created with EventDisableTiming, or is destroyed; ErrEventNotComplete when
// both are recorded but either has not completed.
func (start *Event) ElapsedTime(end *Event) (float32, error) {
	const op = "Event.ElapsedTime"
	a, err := start.snapshot(op)
	if err != nil {
		return 0, err
	}
	b, err := end.snapshot(op)
	if err != nil {
		return 0, err
	}
	if start.dev != end.dev {
		return 0, newErr(op, start.dev.id, -1, ErrInvalidHandle, "events belong to two contexts (devices %d and %d)", start.dev.id, end.dev.id)
	}
	if start.flags&EventDisableTiming != 0 || end.flags&EventDisableTiming != 0 {
		return 0, newErr(op, start.dev.id, -1, ErrInvalidHandle, "an event was created with EventDisableTiming")
	}
	if a == nil || b == nil {
		return 0, newErr(op, start.dev.id, -1, ErrInvalidHandle, "an event has not been recorded")
	}
	if !a.done() || !b.done() {
		return 0, newErr(op, start.dev.id, -1, ErrEventNotComplete, "an event's captured work is not complete")
	}
	ta, tb := a.ns.Load(), b.ns.Load()
	if ta == 0 || tb == 0 { // the record task was skipped after a failure
		return 0, newErr(op, start.dev.id, -1, ErrInvalidHandle, "an event's record task did not run (its stream had failed)")
	}
	return float32(float64(tb-ta) / 1e6), nil
}

// Reset enqueues on s the return of the event to the never-recorded state
// (aclrtResetEvent). Waits enqueued before it are not affected. A nil s is the
// event's device's default stream.
func (e *Event) Reset(s *Stream) error {
	const op = "Event.Reset"
	if s == nil && e != nil {
		var err error
		if s, err = s.orDefault(op, e.dev); err != nil {
			return err
		}
	}
	if err := s.usable(op); err != nil {
		return err
	}
	if e == nil {
		return s.errf(op, ErrInvalidHandle, "nil event")
	}
	if s.dev != e.dev {
		return s.errf(op, ErrInvalidHandle, "event of device %d reset on a stream of device %d (another context)", e.dev.id, s.dev.id)
	}
	c, err := e.snapshot(op)
	if err != nil {
		return err
	}
	return s.Launch(op, func(<-chan struct{}) error {
		e.mu.Lock()
		if e.rec == c { // a Record after this Reset call wins
			e.rec = nil
		}
		e.mu.Unlock()
		return nil
	})
}

// Destroy releases the event (aclrtDestroyEvent / cuEventDestroy). Work the
// event captured may still be pending: it runs to completion, and waits already
// enqueued on it still wait for it. Destroy is idempotent; any other use after it
// returns ErrInvalidHandle.
func (e *Event) Destroy() error {
	if e == nil {
		return newErr("Event.Destroy", -1, -1, ErrInvalidHandle, "nil event")
	}
	e.mu.Lock()
	e.destroyed = true
	e.rec = nil
	e.mu.Unlock()
	return nil
}

// WaitEvent makes the tasks enqueued on s after this call wait until the work
// e holds now is complete (aclrtStreamWaitEvent / cuStreamWaitEvent). A never
// recorded event adds no wait. A later Record of e does not change this wait.
// A nil s is the default stream of e's device.
//
// Failures cross streams through the wait, as CUDA's sticky errors do: when
// the work e holds completed but did not all run (a task at or before the
// recorded point failed, so its stream skipped the rest, or the stream was
// aborted), the wait task fails with an error that wraps that failure and
// carries its code, so s skips the tasks after it and s's Synchronize
// reports it. The producing stream still reports its own failure. This holds
// even when the producer's Synchronize has reported its failure before the
// wait ran: skipped work is never taken for done work. A wait on an event
// recorded before the failure is not affected.
func (s *Stream) WaitEvent(e *Event) error { return s.WaitEventWithTimeout(e, -1) }

// WaitEventWithTimeout is WaitEvent with a bound (aclrtStreamWaitEventWithTimeout):
// when the event's work is not complete within timeout the wait task fails
// with ErrWaitTimeout. A negative timeout waits forever. A failure of the
// awaited work fails the wait as WaitEvent says.
func (s *Stream) WaitEventWithTimeout(e *Event, timeout time.Duration) error {
	const op = "Stream.WaitEvent"
	if s == nil && e != nil {
		var err error
		if s, err = s.orDefault(op, e.dev); err != nil {
			return err
		}
	}
	if err := s.usable(op); err != nil {
		return err
	}
	if e == nil {
		return s.errf(op, ErrInvalidHandle, "nil event")
	}
	if s.dev != e.dev {
		return s.errf(op, ErrInvalidHandle, "stream of device %d waits on an event of device %d (another context)", s.dev.id, e.dev.id)
	}
	c, err := e.snapshot(op)
	if err != nil {
		return err
	}
	if c == nil {
		return nil
	}
	return s.Launch(op, func(stop <-chan struct{}) error {
		if c.done() {
			return c.skipped(op, s)
		}
		var expire <-chan struct{}
		if timeout >= 0 {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			expire = ctx.Done()
		}
		switch c.s.awaitProgress(c.seq, spin.Default, stop, expire) {
		case reached:
			return c.skipped(op, s)
		case stopped:
			return s.stopError(op)
		}
		return s.errf(op, ErrWaitTimeout, "event on stream %d (task %d) not complete after %v", c.s.id, c.seq, timeout)
	})
}
