// Package thread provides hcomm's unit of concurrency (HCCL's ThreadHandle):
// one device stream plus the notifies that other threads record into by index.
// Tasks on one thread run in issue order; tasks on different threads run
// concurrently and order with each other only through notifies.
package thread

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/notify"
)

// MaxNotifies bounds notifyNumPerThread, as HcclThreadAcquire does ([0, 65535]).
const MaxNotifies = 65535

// Thread is one stream and its local notifies. It is safe for concurrent use;
// operations enqueued from several goroutines run in the order the calls took
// effect.
type Thread struct {
	name     string
	stream   *device.Stream
	owned    bool
	notifies []*notify.Notify
	owner    any // set once, before the thread is shared (SetOwner)
	freed    atomic.Bool
	eager    atomic.Int64 // SetEager's poll bound in nanoseconds; 0: off
	most     atomic.Int64 // SetEager's bound on the bytes of a task run now

	bmu   sync.Mutex
	batch *batch // the open batch (BeginBatch), or nil
}

// batch is the work a thread caches between BeginBatch and EndBatch.
type batch struct {
	tag   string
	names []string
	fns   []func(stop <-chan struct{}) error
}

// ErrFreed is the error of a call on a thread that Free released.
var ErrFreed = errors.New("thread: freed")

// Acquire creates n threads on dev, each with a new stream and notifyNum
// notifies (HcclThreadAcquire). name prefixes the threads' names in errors.
func Acquire(dev *device.Device, name string, n, notifyNum int) ([]*Thread, error) {
	if n <= 0 {
		return nil, fmt.Errorf("thread: Acquire: thread count %d must be positive", n)
	}
	if notifyNum < 0 || notifyNum > MaxNotifies {
		return nil, fmt.Errorf("thread: Acquire: notifyNumPerThread %d is outside [0, %d]", notifyNum, MaxNotifies)
	}
	ts := make([]*Thread, 0, n)
	for i := 0; i < n; i++ {
		s, err := dev.CreateStream()
		if err != nil {
			for _, t := range ts {
				_ = t.Free()
			}
			return nil, fmt.Errorf("thread: Acquire: %w", err)
		}
		ts = append(ts, newThread(fmt.Sprintf("%s thread %d", name, i), s, true, notifyNum))
	}
	return ts, nil
}

// WithStream wraps a stream the caller owns (HcclThreadAcquireWithStream). Free
// leaves the stream alone; the caller synchronizes and destroys it.
func WithStream(s *device.Stream, name string, notifyNum int) (*Thread, error) {
	if s == nil {
		return nil, fmt.Errorf("thread: WithStream: nil stream")
	}
	if notifyNum < 0 || notifyNum > MaxNotifies {
		return nil, fmt.Errorf("thread: WithStream: notifyNum %d is outside [0, %d]", notifyNum, MaxNotifies)
	}
	return newThread(fmt.Sprintf("%s stream %d", name, s.ID()), s, false, notifyNum), nil
}

func newThread(name string, s *device.Stream, owned bool, notifyNum int) *Thread {
	t := &Thread{name: name, stream: s, owned: owned, notifies: make([]*notify.Notify, notifyNum)}
	for i := range t.notifies {
		t.notifies[i] = notify.New(fmt.Sprintf("%s notify %d", name, i))
	}
	return t
}

// Name returns the thread's name.
func (t *Thread) Name() string { return t.name }

// SetOwner records the library object that acquired the thread (hcomm: its
// communicator), for Owner. Call it once, before the thread is shared.
func (t *Thread) SetOwner(v any) { t.owner = v }

// Owner returns what SetOwner recorded, or nil.
func (t *Thread) Owner() any { return t.owner }

// Owned reports whether the thread created its stream (Acquire), rather
// than wrapping the caller's (WithStream).
func (t *Thread) Owned() bool { return t.owned }

// Freed reports whether Free released the thread. Safe for concurrent use.
func (t *Thread) Freed() bool { return t.freed.Load() }

// Launch enqueues fn on the thread's stream, as Stream.Launch does, or,
// between BeginBatch and EndBatch, adds it to the batch: EndBatch enqueues
// the batch's functions as one task that runs them in order. Every call of
// this package and of hcomm that enqueues on a thread goes through Launch,
// so that a batch keeps them in issue order. A freed thread refuses it
// (ErrFreed).
func (t *Thread) Launch(name string, fn func(stop <-chan struct{}) error) error {
	if t.freed.Load() {
		return fmt.Errorf("thread: %s: %s: %w", t.name, name, ErrFreed)
	}
	t.bmu.Lock()
	if b := t.batch; b != nil {
		b.names = append(b.names, name)
		b.fns = append(b.fns, fn)
		t.bmu.Unlock()
		return nil
	}
	t.bmu.Unlock()
	return t.stream.Launch(name, fn)
}

// Eager issuing. A task enqueued on an idle stream is run by the stream's
// goroutine, which the enqueue must wake: a hand-off between goroutines
// that costs a microsecond or more, several per call when a schedule is a
// chain of short tasks, and far more when goroutines outnumber processors.
// While a thread is eager (SetEager), a task that cannot block — a copy, a
// reduction, a write into mapped memory, a record — runs in the calling
// goroutine instead whenever the stream is idle (LaunchNow), and a wait
// first polls there for up to the eager bound (LaunchPoll). A task run so
// is a stream task like any other (device.Stream.RunInline): stream order,
// events, Query and Synchronize see no difference, and a failure is the
// stream's, reported by its Synchronize, as a queued task's would be. Once
// the stream is busy (a wait that polled in vain, and everything behind
// it) the calls enqueue as Launch does. Eagerness only moves work from the
// stream's goroutine to the caller's, never earlier than the stream would
// have run it: an eager call may take longer to return, by the task's
// work or the bound, and the work is done when it returns.

// SetEager turns eager issuing on with poll as the bound of a wait's poll
// in the calling goroutine and most as the bytes a task run now may move
// (a larger one is enqueued: the caller would otherwise work where the
// stream's goroutine could, beside it), or off (poll <= 0). A caller
// issuing a chain of short tasks that it, or its peers, will wait for
// anyway sets it around the chain (the collectives do, around each call
// they issue). Safe for concurrent use.
func (t *Thread) SetEager(poll time.Duration, most int64) {
	t.most.Store(most)
	t.eager.Store(int64(max(poll, 0)))
}

// eagerNow reports the eager bound when a task may run inline now: the
// thread is eager, not freed, and no batch is open.
func (t *Thread) eagerNow() time.Duration {
	d := time.Duration(t.eager.Load())
	if d <= 0 || t.freed.Load() || t.Batching() {
		return 0
	}
	return d
}

// Eager reports whether a LaunchNow or LaunchPoll would run in the calling
// goroutine now: the thread is eager and its stream idle. A snapshot, for a
// caller that would otherwise prepare the inline form for nothing.
func (t *Thread) Eager() bool { return t.eagerNow() > 0 && t.stream.Pending() == 0 }

// LaunchNow is Launch for a task that runs to its end without waiting for
// another goroutine or process, moving n bytes: while the thread is eager,
// n is within its bound and the stream idle, fn runs now in the calling
// goroutine, as the stream's next task; otherwise it is enqueued. A
// failure of fn run now is the stream's, as a queued task's would be:
// LaunchNow returns nil for it.
func (t *Thread) LaunchNow(name string, n int64, fn func(stop <-chan struct{}) error) error {
	if t.eagerNow() > 0 && n <= t.most.Load() {
		if ran, err := t.stream.RunInline(name, fn); ran || err != nil {
			if !ran {
				return fmt.Errorf("thread: %s: %s: %w", t.name, name, err)
			}
			return nil
		}
	}
	return t.Launch(name, fn)
}

// LaunchPoll is Launch for a wait, fn, whose condition poll tests (and
// takes, when it holds: a notify's record) for up to the bound it is given,
// or until stop (the stream's: Abort) closes:
// while the thread is eager and its stream idle, poll runs now in the
// calling goroutine, as the stream's next task, for up to the eager bound,
// and when it succeeds the wait is over and nothing is enqueued; otherwise
// fn is enqueued, as Launch does.
func (t *Thread) LaunchPoll(name string, poll func(d time.Duration, stop <-chan struct{}) bool, fn func(stop <-chan struct{}) error) error {
	if d := t.eagerNow(); d > 0 {
		p := eagerPoll{poll: poll, d: d}
		ran, err := t.stream.RunInline(name, p.run)
		if !ran && err != nil {
			return fmt.Errorf("thread: %s: %s: %w", t.name, name, err)
		}
		if p.found {
			return nil
		}
	}
	return t.Launch(name, fn)
}

// eagerPoll is LaunchPoll's inline task.
type eagerPoll struct {
	poll  func(d time.Duration, stop <-chan struct{}) bool
	d     time.Duration
	found bool
}

func (p *eagerPoll) run(stop <-chan struct{}) error {
	p.found = p.poll(p.d, stop)
	return nil
}

// BeginBatch opens a batch on the thread (HcommBatchModeStart): until
// EndBatch, Launch caches work instead of enqueueing it. tag names the
// batch ("" for an unnamed one); a thread has at most one open batch, so a
// second BeginBatch before EndBatch fails.
func (t *Thread) BeginBatch(tag string) error {
	if t.freed.Load() {
		return fmt.Errorf("thread: %s: BeginBatch: %w", t.name, ErrFreed)
	}
	t.bmu.Lock()
	defer t.bmu.Unlock()
	if t.batch != nil {
		return fmt.Errorf("thread: %s: BeginBatch %q: batch %q is still open", t.name, tag, t.batch.tag)
	}
	t.batch = &batch{tag: tag}
	return nil
}

// EndBatch closes the batch BeginBatch opened with the same tag
// (HcommBatchModeEnd) and enqueues its work as one stream task that runs
// it in order; the first failure ends the task, and the rest of the batch
// does not run (as a failed task makes the stream skip the tasks after it).
// An empty batch enqueues nothing. It fails when no batch is open or its
// tag differs; the batch then stays open.
func (t *Thread) EndBatch(tag string) error {
	t.bmu.Lock()
	b := t.batch
	if b == nil || b.tag != tag {
		t.bmu.Unlock()
		if b == nil {
			return fmt.Errorf("thread: %s: EndBatch %q: no batch is open", t.name, tag)
		}
		return fmt.Errorf("thread: %s: EndBatch %q: the open batch is %q", t.name, tag, b.tag)
	}
	t.batch = nil
	t.bmu.Unlock()
	if len(b.fns) == 0 {
		return nil
	}
	if t.freed.Load() {
		return fmt.Errorf("thread: %s: EndBatch: %w", t.name, ErrFreed)
	}
	return t.stream.Launch("Batch "+tag, func(stop <-chan struct{}) error {
		for i, fn := range b.fns {
			if err := fn(stop); err != nil {
				return fmt.Errorf("batch %q, call %d (%s): %w", tag, i, b.names[i], err)
			}
		}
		return nil
	})
}

// Batching reports whether a batch is open on the thread.
func (t *Thread) Batching() bool {
	t.bmu.Lock()
	defer t.bmu.Unlock()
	return t.batch != nil
}

// Stream returns the thread's stream (HcclThreadResGetInfo with
// THREAD_RES_TYPE_STREAM).
func (t *Thread) Stream() *device.Stream { return t.stream }

// NotifyNum returns how many local notifies the thread has.
func (t *Thread) NotifyNum() int { return len(t.notifies) }

// Notify returns local notify idx.
func (t *Thread) Notify(idx int) (*notify.Notify, error) {
	if t == nil {
		return nil, fmt.Errorf("thread: nil thread")
	}
	if idx < 0 || idx >= len(t.notifies) {
		return nil, fmt.Errorf("thread: %s: notify index %d is outside [0, %d)", t.name, idx, len(t.notifies))
	}
	return t.notifies[idx], nil
}

// NotifyRecord enqueues on t a record of dst's notify idx
// (HcommThreadNotifyRecordOnThread(t, dst, idx)).
func (t *Thread) NotifyRecord(dst *Thread, idx int) error {
	if t == nil || dst == nil {
		return fmt.Errorf("thread: NotifyRecord: nil thread")
	}
	n, err := dst.Notify(idx)
	if err != nil {
		return err
	}
	if t.Batching() {
		return t.Launch("Notify.Record", func(<-chan struct{}) error {
			n.Set()
			return nil
		})
	}
	if t.freed.Load() {
		return fmt.Errorf("thread: %s: NotifyRecord: %w", t.name, ErrFreed)
	}
	return n.Record(t.stream)
}

// NotifyWait enqueues on t a wait for its own notify idx, which then resets
// (HcommThreadNotifyWaitOnThread). timeout <= 0 waits forever, as HCCL's 0 does.
func (t *Thread) NotifyWait(idx int, timeout time.Duration) error {
	n, err := t.Notify(idx)
	if err != nil {
		return err
	}
	if t.Batching() {
		return t.Launch("Notify.Wait", func(stop <-chan struct{}) error {
			return n.Await(stop, timeout)
		})
	}
	if t.freed.Load() {
		return fmt.Errorf("thread: %s: NotifyWait: %w", t.name, ErrFreed)
	}
	return n.Wait(t.stream, timeout)
}

// Free releases the thread: a stream it created is destroyed (after its queued
// tasks finish); a wrapped stream is left to its owner. Later calls on the
// thread fail with ErrFreed; an open batch is dropped. Free is idempotent.
func (t *Thread) Free() error {
	if t == nil {
		return nil
	}
	t.freed.Store(true)
	t.bmu.Lock()
	t.batch = nil
	t.bmu.Unlock()
	if t.owned {
		return t.stream.Destroy()
	}
	return nil
}
