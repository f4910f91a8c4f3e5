package device

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hcomm-dev/hcomm/internal/spin"
)

// Stream is a FIFO queue of tasks that run asynchronously and in order
// (aclrtStream / CUstream). Calls that enqueue return at once; a task that
// fails makes the stream skip the tasks after it until the failure is reported
// by the next Synchronize (and through the device's exception callback).
//
// All methods are safe for concurrent use; tasks enqueued from several
// goroutines run in the order their enqueue calls took effect.
type Stream struct {
	dev       *Device
	id        int64
	tid       uint32
	isDefault bool

	mu   sync.Mutex
	q    []task // q[head:] are queued; the consumed front is reused (compact)
	head int
	// nall counts the tasks submitted (queued or run inline): the newest
	// one's seq. Launch adds to it with s.mu held; RunInline claims the
	// next seq with a compare-and-swap from completed, which succeeds only
	// on an idle stream (nothing queued or running), with or without s.mu.
	nall      atomic.Uint64
	nsub      atomic.Uint64 // the newest queued task's seq, for the worker's lock-free polls
	completed atomic.Uint64 // tasks finished (run, skipped or failed)
	// gate lets RunInline run a task without s.mu: nil while the stream
	// has a failure to report or is destroyed, else the stop channel a
	// task run now is given. Whatever changes err, destroyed or stop
	// stores it anew (s.mu held: regate).
	gate      atomic.Pointer[inlineGate]
	err       error         // first failure not yet reported by Synchronize
	errSeq    uint64        // the task that failed with err
	abortTo   uint64        // tasks with seq <= abortTo are dropped
	stop      chan struct{} // closed when the running task must give up
	stopErr   error
	waiters   []*progressWaiter
	nwait     atomic.Int32 // len(waiters), for the lock-free end of an inline task
	destroyed bool
	cbs       sync.WaitGroup // non-blocking callbacks still running

	wake chan struct{}
	quit chan struct{}
	done chan struct{}

	report atomic.Pointer[reportThread]
}

// inlineGate is the stop channel of the tasks RunInline runs while the
// gate holds it (Stream.gate).
type inlineGate struct{ stop chan struct{} }

// regate stores the gate that err, destroyed and stop make (s.mu held).
func (s *Stream) regate() {
	if s.err != nil || s.destroyed {
		s.gate.Store(nil)
		return
	}
	if g := s.gate.Load(); g == nil || g.stop != s.stop {
		s.gate.Store(&inlineGate{stop: s.stop})
	}
}

// task is one unit of stream work.
type task struct {
	seq  uint64
	name string
	run  func(stop <-chan struct{}) error
	// inline: the task runs in its caller's goroutine (RunInline).
	inline bool
	// skipped, when set, is told why the task did not run (the stream's
	// failure, or an abort) before the task counts as completed.
	skipped func(err error)
}

type progressWaiter struct {
	target uint64
	ch     chan struct{}
}

func newStream(d *Device) *Stream {
	s := &Stream{
		dev:  d,
		id:   nextStreamID.Add(1),
		tid:  nextThreadID.Add(1),
		stop: make(chan struct{}),
		wake: make(chan struct{}, 1),
		quit: make(chan struct{}),
		done: make(chan struct{}),
	}
	s.gate.Store(&inlineGate{stop: s.stop})
	go s.loop()
	return s
}

// ID returns the stream's id, unique in the process (the stream id of
// exception info).
func (s *Stream) ID() int64 { return s.id }

// Device returns the device the stream belongs to.
func (s *Stream) Device() *Device { return s.dev }

func (s *Stream) errf(op string, code Code, format string, args ...any) *Error {
	return newErr(op, s.dev.id, s.id, code, format, args...)
}

// Launch enqueues fn as a task: the way the layers above run their kernels
// (copies between peers, reductions, notify waits) on a stream. fn must return
// promptly once stop is closed (the stream was aborted or its device closed).
// A non-nil error fails the stream; name says what the task was in errors.
//
// A nil s is an ErrInvalidHandle error (nothing in the call names a device
// whose default stream it could mean: pass Device.DefaultStream), a nil fn an
// ErrInvalidValue error, both at the call.
func (s *Stream) Launch(name string, fn func(stop <-chan struct{}) error) error {
	if s != nil && fn == nil {
		return s.errf(name, ErrInvalidValue, "nil task function")
	}
	_, err := s.enqueue(name, fn)
	return err
}

// orDefault returns s, or, when s is nil, the default stream of d: ACL and
// CUDA take a NULL stream as the current context's default stream, and Go has
// no current context, so d is the device the call's other arguments name (the
// event's, the memory's). A nil s with no such device is an ErrInvalidHandle
// error.
func (s *Stream) orDefault(op string, d *Device) (*Stream, error) {
	if s != nil {
		return s, nil
	}
	if d == nil {
		return nil, newErr(op, -1, -1, ErrInvalidHandle, "nil stream, and nothing else in the call names a device context whose default stream it could mean (pass Device.DefaultStream())")
	}
	ds, err := d.DefaultStream()
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			e.Op = op
		}
		return nil, err
	}
	return ds, nil
}

// ownerOf returns the device context that allocated the memory at p, or nil.
func ownerOf(p Ptr) *Device {
	if a := allocs.find(p, 0); a != nil {
		return a.dev
	}
	return nil
}

// enqueue appends a task and returns its sequence number.
func (s *Stream) enqueue(name string, fn func(stop <-chan struct{}) error) (uint64, error) {
	return s.enqueueTask(task{name: name, run: fn})
}

// enqueueTask appends t, whose seq it sets, and returns its sequence number.
func (s *Stream) enqueueTask(t task) (uint64, error) {
	name := t.name
	if s == nil {
		return 0, newErr(name, -1, -1, ErrInvalidHandle, "nil stream (pass Device.DefaultStream() for the default stream)")
	}
	s.mu.Lock()
	if s.destroyed {
		s.mu.Unlock()
		return 0, s.errf(name, ErrInvalidHandle, "stream is destroyed")
	}
	if s.nall.Load()-s.completed.Load() >= MaxPending {
		s.mu.Unlock()
		s.throttle()
		s.mu.Lock()
		if s.destroyed {
			s.mu.Unlock()
			return 0, s.errf(name, ErrInvalidHandle, "stream is destroyed")
		}
	}
	seq := s.nall.Add(1)
	if len(s.q) == cap(s.q) && s.head > 0 {
		s.compact()
	}
	t.seq = seq
	s.q = append(s.q, t)
	s.nsub.Store(seq)
	ahead := seq - s.completed.Load()
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	if ahead > YieldAhead {
		// Far ahead of the worker: let it run before this caller enqueues
		// more (see YieldAhead).
		runtime.Gosched()
	}
	return seq, nil
}

// RunInline runs fn as the stream's next task in the calling goroutine,
// now, when the stream is idle: no task queued or running and no failure
// that a Synchronize has yet to report. It reports whether it ran fn; when it
// did not (the stream is busy), nothing happened and the caller enqueues the
// work with Launch instead. err is fn's failure, or the stream's: a destroyed
// stream is an ErrInvalidHandle error (ran is false).
//
// A task run inline is a task like any other: it takes the next sequence
// number, so that stream order, an event recorded after it, Query and
// Synchronize see it exactly as if the stream's goroutine had run it; its
// failure fails the stream (Synchronize reports it, the exception callback
// is told) and is returned here as well. Tasks that other goroutines enqueue
// while it runs wait behind it. fn gets the stream's stop channel and must
// return promptly once it closes: Abort, and the device's Close, end an
// inline task as they end a queued one. Destroy waits for it.
//
// What it saves is the hand-off: a caller that would enqueue a short task and
// wait for it (or whose task a peer answers within microseconds) wakes no
// goroutine and waits for none. On an idle stream it takes no lock either:
// the task's sequence number is claimed with one compare-and-swap (about 20
// ns a task on the development VM, BenchmarkRunInline). It is safe for
// concurrent use.
func (s *Stream) RunInline(name string, fn func(stop <-chan struct{}) error) (ran bool, err error) {
	if s == nil {
		return false, newErr(name, -1, -1, ErrInvalidHandle, "nil stream (pass Device.DefaultStream() for the default stream)")
	}
	if fn == nil {
		return false, s.errf(name, ErrInvalidValue, "nil task function")
	}
	// Without s.mu: completed first, then the gate, then the claim, then
	// the gate again. A failing task stores the gate (nil) before it
	// counts as completed, so a claim from a completed count that
	// includes it sees the nil gate; Destroy, Abort and the end of a
	// failure store the gate before they look at nall, so a claim they
	// do not see finds the new gate at its second look. A claim whose
	// second look finds another gate ends as a task that did nothing,
	// and the call goes on under s.mu.
	c := s.completed.Load()
	if g := s.gate.Load(); g != nil && s.nall.CompareAndSwap(c, c+1) {
		var t task // set field by field: a composite literal is built beside and copied (a stalled load)
		t.seq, t.name, t.run, t.inline = c+1, name, fn, true
		if s.gate.Load() == g {
			err = s.runTask(&t, g.stop)
			return true, s.finish(&t, err)
		}
		s.finishInline(&t)
	}
	s.mu.Lock()
	if s.destroyed {
		s.mu.Unlock()
		return false, s.errf(name, ErrInvalidHandle, "stream is destroyed")
	}
	// An inline task in progress counts as submitted and not completed.
	c = s.completed.Load()
	if s.err != nil || !s.nall.CompareAndSwap(c, c+1) {
		s.mu.Unlock()
		return false, nil
	}
	t := task{seq: c + 1, name: name, run: fn, inline: true}
	stop := s.stop
	s.mu.Unlock()
	err = s.runTask(&t, stop)
	return true, s.finish(&t, err)
}

// Pending returns how many tasks of s are enqueued (or running inline) and
// not yet complete: a snapshot, without locking, for a caller choosing
// between RunInline and Launch (one that would wait a moment for a stream
// about to be idle, but not for a long queue). A nil or destroyed stream has
// none. It is safe for concurrent use.
func (s *Stream) Pending() uint64 {
	if s == nil {
		return 0
	}
	c := s.completed.Load()
	n := s.nall.Load()
	if c >= n {
		return 0
	}
	return n - c
}

// MaxPending is how many tasks a stream holds before an enqueue waits for
// the worker (a GPU stream's launch queue is bounded the same way: CUDA's
// holds about a thousand kernels). Without a bound, a caller that enqueues
// much faster than the tasks run — a benchmark issuing thousands of small
// collectives — grows the queue and the Go heap without limit, and the page
// faults and garbage collection that costs take the processor from the
// tasks themselves. An enqueue that finds MaxPending tasks queued waits until
// the queue is down to MaxPending/2, so that a caller far ahead waits once per
// MaxPending/2 tasks, not once per task.
const MaxPending = 1024

// YieldAhead is how far a caller may run ahead of its stream's worker before
// each further enqueue yields the processor (runtime.Gosched). The worker is
// a goroutine of the caller's process, and where the two share a processor
// (GOMAXPROCS 1, as hcomm run gives each rank when ranks fill the host; or
// ranks' streams outnumbering GOMAXPROCS in one process), a caller that
// enqueues runs until it blocks: without the yield, one released from the
// throttle at MaxPending/2 enqueued the next MaxPending/2 tasks in one go,
// and the worker — which may be polling for a peer that answered long ago —
// waited that long (2 processes over tcp, 1 MiB broadcast: 260 µs every
// 40-odd calls). A caller this far ahead loses nothing by yielding: the
// worker has YieldAhead tasks to run. Measured on the 2-core VM, launches
// interleaved, medians of six (µs; before, after): 4 ranks in one process,
// 16 B all-reduce 3.91, 3.69 and 1 MiB all-to-all 205, 193; 4 shm
// processes 1 MiB all-to-all 212, 206; 2 tcp processes 1 MiB broadcast 182,
// 177. Lowering the throttle's release mark to MaxPending−64 instead, which
// bounds the burst too, measured no better than before (3.88, 213, 221,
// 183).
const YieldAhead = 64

// throttleGiveUp bounds one throttle wait without progress. A caller that
// enqueues from inside the stream's own work (a blocking host callback that
// launches on its own stream: allowed, though CUDA forbids it) would wait
// for itself; after this long the enqueue proceeds and the queue grows.
const throttleGiveUp = 100 * time.Millisecond

// throttle waits, while the worker makes progress, until the queue holds at
// most MaxPending/2 tasks.
func (s *Stream) throttle() {
	for {
		s.mu.Lock()
		sub, done := s.nall.Load(), s.destroyed
		s.mu.Unlock()
		c := s.completed.Load()
		if done || sub-c < MaxPending/2+1 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), throttleGiveUp)
		r := s.awaitProgress(sub-MaxPending/2, spin.Default, nil, ctx.Done())
		cancel()
		if r != reached && s.completed.Load() == c {
			return // no task finished for throttleGiveUp: do not wait on
		}
	}
}

// compact moves the queued tasks to the front of s.q, so that a stream that
// is never empty (its caller keeps it busy) reuses its slice instead of
// growing it by every task it ever ran. s.mu is held.
func (s *Stream) compact() {
	n := copy(s.q, s.q[s.head:])
	clear(s.q[n:])
	s.q, s.head = s.q[:n], 0
}

// loop is the stream's worker: it runs the tasks in order.
func (s *Stream) loop() {
	defer close(s.done)
	var popped uint64
	for {
		s.mu.Lock()
		if s.head < len(s.q) && s.q[s.head].seq > s.completed.Load()+1 {
			// The task before the front one is not complete, and this
			// loop runs the queued ones itself: it runs in its caller's
			// goroutine (RunInline). The queued ones wait for its end,
			// which wakes this loop.
			before := s.q[s.head].seq - 1
			s.mu.Unlock()
			if !spin.Until(spin.Default, func() bool { return s.completed.Load() >= before }) {
				<-s.wake
			}
			continue
		}
		if s.head < len(s.q) {
			t := s.q[s.head]
			s.q[s.head] = task{}
			s.head++
			if s.head == len(s.q) {
				s.q, s.head = s.q[:0], 0
			}
			skip := s.err != nil || t.seq <= s.abortTo
			why := s.err
			stop := s.stop
			s.mu.Unlock()
			popped = t.seq
			var err error
			if !skip {
				err = s.runTask(&t, stop)
			} else if t.skipped != nil {
				if why == nil {
					why = s.errf(t.name, ErrStreamAbort, "stream aborted before the task ran")
				}
				t.skipped(why)
			}
			s.finish(&t, err)
			continue
		}
		if s.destroyed {
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		if spin.Until(spin.Default, func() bool { return s.nsub.Load() > popped }) {
			continue
		}
		select {
		case <-s.wake:
		case <-s.quit:
		}
	}
}

// runTask runs t, telling the device's task observers of it (observe.go).
func (s *Stream) runTask(t *task, stop <-chan struct{}) error {
	if o := s.dev.observersOf(); o != nil {
		return s.observed(o, t, stop)
	}
	return s.runGuarded(t, stop)
}

// runGuarded runs t, turning a panic into the task's error.
func (s *Stream) runGuarded(t *task, stop <-chan struct{}) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = s.errf(t.name, ErrInternal, "task panicked: %v", r)
		}
	}()
	return t.run(stop)
}

// finish counts t as completed, failed with err when not nil, and returns
// the error the stream keeps for it.
func (s *Stream) finish(t *task, err error) error {
	if t.inline && err == nil {
		s.finishInline(t)
		return nil
	}
	if err != nil {
		var e *Error
		if !errors.As(err, &e) {
			err = &Error{Op: t.name, Device: s.dev.id, Stream: s.id, Code: CodeOf(err), Err: err}
		}
	}
	s.mu.Lock()
	if err != nil && s.err == nil {
		s.err, s.errSeq = err, t.seq
		s.regate() // before completed counts t (RunInline)
	}
	// The worker waits for the end of an inline task before it starts the
	// tasks queued behind it: wake it when there are some.
	wake := t.inline && s.head < len(s.q)
	s.release(s.completed.Add(1))
	s.mu.Unlock()
	if wake {
		s.wakeWorker()
	}
	if err != nil {
		s.dev.raise(s, t.seq, err)
	}
	return err
}

// finishInline counts the inline task t, which succeeded, as completed
// without taking s.mu (a small collective run inline ends here every call).
// Whoever waits for it registers first and looks at completed second
// (awaitProgress, the worker with a task queued behind t), and this stores
// completed first and looks for them second, all sequentially consistent:
// either they see t completed or this sees them.
func (s *Stream) finishInline(t *task) {
	s.completed.Add(1)
	if s.nwait.Load() > 0 {
		s.mu.Lock()
		s.release(s.completed.Load())
		s.mu.Unlock()
	}
	if s.nsub.Load() > t.seq {
		s.wakeWorker()
	}
}

// release ends the waits for progress up to c (s.mu held).
func (s *Stream) release(c uint64) {
	if len(s.waiters) == 0 {
		return
	}
	keep := s.waiters[:0]
	for _, w := range s.waiters {
		if w.target <= c {
			close(w.ch)
		} else {
			keep = append(keep, w)
		}
	}
	for i := len(keep); i < len(s.waiters); i++ {
		s.waiters[i] = nil
	}
	s.waiters = keep
	s.nwait.Store(int32(len(keep)))
}

// wakeWorker wakes the worker if it sleeps.
func (s *Stream) wakeWorker() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// awaitResult says why awaitProgress returned.
type awaitResult int

const (
	reached awaitResult = iota
	stopped
	expired
)

// awaitProgress blocks until s has completed target tasks, spinning for up to
// spinFor first. It gives up when stop or done closes.
func (s *Stream) awaitProgress(target uint64, spinFor time.Duration, stop, done <-chan struct{}) awaitResult {
	if spin.Until(spinFor, func() bool { return s.completed.Load() >= target }) {
		return reached
	}
	w := &progressWaiter{target: target, ch: make(chan struct{})}
	s.mu.Lock()
	// Registered before completed is looked at: an inline task's lock-free
	// end (finishInline) either is seen here or sees the waiter.
	s.waiters = append(s.waiters, w)
	s.nwait.Store(int32(len(s.waiters)))
	if s.completed.Load() >= target {
		s.waiters = s.waiters[:len(s.waiters)-1]
		s.nwait.Store(int32(len(s.waiters)))
		s.mu.Unlock()
		return reached
	}
	s.mu.Unlock()
	var r awaitResult
	select {
	case <-w.ch:
		return reached
	case <-stop:
		r = stopped
	case <-done:
		r = expired
	}
	s.mu.Lock()
	for i, x := range s.waiters {
		if x == w {
			s.waiters = append(s.waiters[:i], s.waiters[i+1:]...)
			s.nwait.Store(int32(len(s.waiters)))
			break
		}
	}
	s.mu.Unlock()
	select {
	case <-w.ch:
		return reached
	default:
	}
	return r
}

// Synchronize blocks until every task enqueued before the call is complete or
// ctx is done (aclrtSynchronizeStream). It returns the first task failure since
// the previous Synchronize, and clears it so that the stream runs tasks again;
// ErrStreamSyncTimeout (matching context.DeadlineExceeded) when ctx expires.
func (s *Stream) Synchronize(ctx context.Context) error {
	if s == nil {
		return newErr("Stream.Synchronize", -1, -1, ErrInvalidHandle, "nil stream")
	}
	if ctx == nil {
		return s.errf("Stream.Synchronize", ErrInvalidValue, "nil context")
	}
	s.mu.Lock()
	target := s.nall.Load()
	destroyed := s.destroyed
	s.mu.Unlock()
	if destroyed {
		return s.errf("Stream.Synchronize", ErrInvalidHandle, "stream is destroyed")
	}
	if s.completed.Load() < target {
		if ctx.Err() != nil {
			return s.syncTimeout(ctx, target)
		}
		if s.awaitProgress(target, spin.Default, nil, ctx.Done()) != reached {
			return s.syncTimeout(ctx, target)
		}
	}
	s.mu.Lock()
	err := s.err
	s.err, s.errSeq = nil, 0
	s.regate()
	s.mu.Unlock()
	return err
}

// failedBy returns the stream's unreported failure when it happened at or
// before task seq: the work an event captured did not all run.
func (s *Stream) failedBy(seq uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil && s.errSeq <= seq {
		return s.err
	}
	return nil
}

// TakeError returns the stream's first task failure not yet reported by a
// Synchronize, and clears it so that the stream runs tasks again, as
// Synchronize does, but without waiting for the stream's tasks: nil when
// there is none. It is safe for concurrent use, from any goroutine, and from
// a task of another stream (a task that has waited, through an event, for
// the stream's work, and takes its failure to report it as its own).
func (s *Stream) TakeError() error {
	if s == nil {
		return newErr("Stream.TakeError", -1, -1, ErrInvalidHandle, "nil stream")
	}
	s.mu.Lock()
	err := s.err
	s.err, s.errSeq = nil, 0
	s.regate()
	s.mu.Unlock()
	return err
}

// PeekError returns the stream's first task failure not yet reported, as
// TakeError does, but leaves it: the stream goes on skipping its tasks. It
// is safe for concurrent use.
func (s *Stream) PeekError() error {
	if s == nil {
		return newErr("Stream.PeekError", -1, -1, ErrInvalidHandle, "nil stream")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *Stream) syncTimeout(ctx context.Context, target uint64) error {
	e := s.errf("Stream.Synchronize", ErrStreamSyncTimeout, "%d of %d tasks complete", s.completed.Load(), target)
	e.Err = ctx.Err()
	return e
}

// SynchronizeWithTimeout is Synchronize with ACL's timeout convention
// (aclrtSynchronizeStreamWithTimeout): negative waits forever, zero polls once.
func (s *Stream) SynchronizeWithTimeout(timeout time.Duration) error {
	ctx, cancel := timeoutContext(timeout)
	defer cancel()
	return s.Synchronize(ctx)
}

// Query reports whether all the stream's tasks are complete without blocking
// (aclrtStreamQuery / cuStreamQuery): nil when they are, ErrStreamNotComplete
// when some are not.
func (s *Stream) Query() error {
	if s == nil {
		return newErr("Stream.Query", -1, -1, ErrInvalidHandle, "nil stream")
	}
	s.mu.Lock()
	target, destroyed := s.nall.Load(), s.destroyed
	s.mu.Unlock()
	if destroyed {
		return s.errf("Stream.Query", ErrInvalidHandle, "stream is destroyed")
	}
	if s.completed.Load() < target {
		return s.errf("Stream.Query", ErrStreamNotComplete, "%d of %d tasks complete", s.completed.Load(), target)
	}
	return nil
}

// Abort drops the tasks queued on the stream and makes the running one give up
// (aclrtStreamAbort): they fail with ErrStreamAbort, which the next
// Synchronize returns. The stream stays usable.
func (s *Stream) Abort() error {
	if s == nil {
		return newErr("Stream.Abort", -1, -1, ErrInvalidHandle, "nil stream")
	}
	s.abort(ErrStreamAbort, "stream aborted")
	return nil
}

func (s *Stream) abort(code Code, why string) {
	s.mu.Lock()
	close(s.stop)
	s.stop = make(chan struct{})
	s.regate() // before nall is looked at (RunInline)
	s.abortTo = s.nall.Load()
	if c := s.completed.Load(); s.err == nil && c < s.abortTo {
		s.err = s.errf("Stream.Abort", code, "%s with %d tasks pending", why, s.abortTo-c)
		s.regate()
	}
	s.mu.Unlock()
}

// Destroy waits for the tasks already queued to finish, stops the stream's
// goroutine and releases the stream (aclrtDestroyStream). Later calls on the
// stream return ErrInvalidHandle. Destroy is idempotent; on the default stream
// it does nothing (the device's Close destroys it).
func (s *Stream) Destroy() error {
	if s == nil {
		return newErr("Stream.Destroy", -1, -1, ErrInvalidHandle, "nil stream")
	}
	if s.isDefault {
		return nil
	}
	s.destroy()
	return nil
}

func (s *Stream) destroy() {
	s.mu.Lock()
	if s.destroyed {
		s.mu.Unlock()
		<-s.done
		return
	}
	s.destroyed = true
	s.regate() // before nall is looked at (RunInline)
	target := s.nall.Load()
	s.mu.Unlock()
	close(s.quit)
	<-s.done
	// The worker ends with its queue; a task run inline may outlast it.
	s.awaitProgress(target, spin.Default, nil, nil)
	s.cbs.Wait()
	if rt := s.report.Load(); rt != nil {
		rt.drop(s)
	}
	s.dev.forget(s)
}

// stopError turns a closed stop channel into the error the task reports.
func (s *Stream) stopError(op string) error {
	s.mu.Lock()
	s.dev.mu.Lock()
	closed := s.dev.closed
	s.dev.mu.Unlock()
	s.mu.Unlock()
	if closed {
		return s.errf(op, ErrDeviceTaskAbort, "device closed while the task was running")
	}
	return s.errf(op, ErrStreamAbort, "stream aborted while the task was running")
}

// MemcpyAsync enqueues a copy of n bytes from src to dst (aclrtMemcpyAsync).
// Both ranges are checked now; kind must match where they live
// (MemcpyDefault infers it). Neither range may be freed or written by others
// until the copy completes. A nil s is the default stream of the device that
// owns dst (or, when dst is not device memory of this process, src); the
// ranges may be memory of any context of the process (an inter-device copy).
func (s *Stream) MemcpyAsync(dst, src Ptr, n int64, kind MemcpyKind) error {
	const op = "MemcpyAsync"
	if s == nil {
		d := ownerOf(dst)
		if d == nil {
			d = ownerOf(src)
		}
		var err error
		if s, err = s.orDefault(op, d); err != nil {
			return err
		}
	}
	if err := s.usable(op); err != nil {
		return err
	}
	dr, sr, err := checkKind(op, s.dev, s.id, dst, src, n, kind)
	if err != nil {
		return err
	}
	return s.Launch(op, func(<-chan struct{}) error { return s.copyTask(op, dr, sr, nil) })
}

// MemcpyHtoDAsync enqueues a copy of the Go slice src to dst, memory of s's
// device. src must not be modified until the copy completes. A nil s is the
// default stream of dst's device.
func (s *Stream) MemcpyHtoDAsync(dst Ptr, src []byte) error {
	const op = "MemcpyHtoDAsync"
	s, err := s.orDefault(op, ownerOf(dst))
	if err != nil {
		return err
	}
	if err := s.usable(op); err != nil {
		return err
	}
	dr, err := resolveOwn(op, s.dev, s.id, "dst", dst, int64(len(src)))
	if err != nil {
		return err
	}
	return s.Launch(op, func(<-chan struct{}) error { return s.copyTask(op, dr, region{mem: src}, nil) })
}

// MemcpyDtoHAsync enqueues a copy of len(dst) bytes at src, memory of s's
// device, into the Go slice dst, which must not be read until the copy
// completes. A nil s is the default stream of src's device.
func (s *Stream) MemcpyDtoHAsync(dst []byte, src Ptr) error {
	const op = "MemcpyDtoHAsync"
	s, err := s.orDefault(op, ownerOf(src))
	if err != nil {
		return err
	}
	if err := s.usable(op); err != nil {
		return err
	}
	sr, err := resolveOwn(op, s.dev, s.id, "src", src, int64(len(dst)))
	if err != nil {
		return err
	}
	return s.Launch(op, func(<-chan struct{}) error { return s.copyTask(op, region{mem: dst}, sr, nil) })
}

// MemsetAsync enqueues setting n bytes at p, memory of s's device, to value
// (aclrtMemsetAsync). A nil s is the default stream of p's device.
func (s *Stream) MemsetAsync(p Ptr, n int64, value byte) error {
	const op = "MemsetAsync"
	s, err := s.orDefault(op, ownerOf(p))
	if err != nil {
		return err
	}
	if err := s.usable(op); err != nil {
		return err
	}
	r, err := resolveOwn(op, s.dev, s.id, "dst", p, n)
	if err != nil {
		return err
	}
	return s.Launch(op, func(<-chan struct{}) error {
		return s.copyTask(op, r, region{}, func() { fill(r.mem, value) })
	})
}

// usable checks the stream handle and its device.
func (s *Stream) usable(op string) error {
	if s == nil {
		return newErr(op, -1, -1, ErrInvalidHandle, "nil stream")
	}
	if err := s.dev.check(op); err != nil {
		return err
	}
	s.mu.Lock()
	d := s.destroyed
	s.mu.Unlock()
	if d {
		return s.errf(op, ErrInvalidHandle, "stream is destroyed")
	}
	return nil
}

func (s *Stream) String() string { return fmt.Sprintf("stream %d (device %d)", s.id, s.dev.id) }

// copyTask runs a copy (or, with fn, any access) between checked regions,
// holding their allocations so that a concurrent Free waits; memory freed
// before the task ran fails it with ErrInvalidValue.
func (s *Stream) copyTask(op string, dst, src region, fn func()) error {
	if !pin(dst, src) {
		return s.errf(op, ErrInvalidValue, "memory was freed before the task ran")
	}
	defer unpin(dst, src)
	if fn != nil {
		fn()
	} else {
		s.dev.be.copy(dst.mem, src.mem)
	}
	return nil
}
