package hcomm

import (
	"context"
	"fmt"
	"time"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/thread"
)

// Thread is a communication thread (ThreadHandle): a stream and its notifies.
type Thread = thread.Thread

// ThreadAcquire creates n threads, each a new stream with notifyNumPerThread
// notifies (HcclThreadAcquire). The communicator owns them: Destroy frees them.
func (c *Comm) ThreadAcquire(engine Engine, n, notifyNumPerThread int) ([]*Thread, error) {
	const op = "ThreadAcquire"
	if err := c.usable(op); err != nil {
		return nil, err
	}
	if !engine.supported() {
		return nil, c.errorf(op, -1, ErrNotSupport, nil, "engine %v is not supported: hcomm runs on the host (CPU, CPU_TS)", engine)
	}
	ts, err := thread.Acquire(c.dev, fmt.Sprintf("comm %s rank %d", c.name, c.rank), n, notifyNumPerThread)
	if err != nil {
		return nil, c.errorf(op, -1, ErrPara, err, "")
	}
	for _, t := range ts {
		t.SetOwner(c)
	}
	c.mu.Lock()
	c.threads = append(c.threads, ts...)
	c.mu.Unlock()
	return ts, nil
}

// ThreadAcquireWithStream wraps a stream the caller owns, which must belong to
// the communicator's device (HcclThreadAcquireWithStream). The caller
// synchronizes and destroys the stream.
func (c *Comm) ThreadAcquireWithStream(engine Engine, s *device.Stream, notifyNum int) (*Thread, error) {
	const op = "ThreadAcquireWithStream"
	if err := c.usable(op); err != nil {
		return nil, err
	}
	if !engine.supported() {
		return nil, c.errorf(op, -1, ErrNotSupport, nil, "engine %v is not supported: hcomm runs on the host (CPU, CPU_TS)", engine)
	}
	if s == nil || s.Device() != c.dev {
		return nil, c.errorf(op, -1, ErrPtr, nil, "stream is nil or belongs to another device context")
	}
	t, err := thread.WithStream(s, fmt.Sprintf("comm %s rank %d", c.name, c.rank), notifyNum)
	if err != nil {
		return nil, c.errorf(op, -1, ErrPara, err, "")
	}
	t.SetOwner(c)
	c.mu.Lock()
	c.threads = append(c.threads, t)
	c.mu.Unlock()
	return t, nil
}

// ThreadFree releases threads of this communicator before Destroy does
// (HcommThreadFree; HCCL's HcclThreadAcquire threads have no release call).
// A thread with work still queued is drained first: ThreadFree waits until
// that work has run (bounded by its own timeouts, as Synchronize is) and
// returns its first failure, if any, after releasing the thread anyway. A
// thread of ThreadAcquire loses its stream; one of ThreadAcquireWithStream
// leaves the caller's stream alone (and neither drains nor synchronizes
// it). Every call with a freed thread then fails with ErrPtr naming it, a
// second ThreadFree included. Every thread is checked (not nil, of this
// communicator, not freed, no duplicates) before any is freed.
func (c *Comm) ThreadFree(ts []*Thread) error {
	const op = "ThreadFree"
	if err := c.usable(op); err != nil {
		return err
	}
	seen := make(map[*Thread]bool, len(ts))
	for i, t := range ts {
		if t == nil || t.Owner() != c {
			return c.errorf(op, -1, ErrPtr, nil, "thread %d is nil or belongs to another communicator", i)
		}
		if t.Freed() || seen[t] {
			return c.errorf(op, -1, ErrPtr, nil, "thread %d (%s) is already freed or listed twice", i, t.Name())
		}
		seen[t] = true
	}
	c.mu.Lock()
	kept := c.threads[:0]
	for _, t := range c.threads {
		if !seen[t] {
			kept = append(kept, t)
		}
	}
	clear(c.threads[len(kept):])
	c.threads = kept
	c.mu.Unlock()
	c.ops.mu.Lock()
	for t := range seen {
		delete(c.ops.cur, t)
	}
	c.ops.mu.Unlock()
	var first error
	for _, t := range ts {
		var err error
		if t.Owned() {
			err = t.Stream().Synchronize(context.Background())
		}
		t.Free()
		if err != nil && first == nil {
			first = c.errorf(op, -1, ResultOf(err), err, "work queued on thread %s", t.Name())
		}
	}
	return first
}

// GetNotifyNumInThread returns how many notifies t has
// (HcclGetNotifyNumInThread): the index space of its thread notify waits.
func (c *Comm) GetNotifyNumInThread(t *Thread) (int, error) {
	const op = "GetNotifyNumInThread"
	if err := c.usable(op); err != nil {
		return 0, err
	}
	if err := threadErr(op, t); err != nil {
		return 0, err
	}
	if t.Owner() != c {
		return 0, c.errorf(op, -1, ErrPtr, nil, "thread %s belongs to another communicator", t.Name())
	}
	return t.NotifyNum(), nil
}

// ThreadSynchronize blocks until the work queued on t has run and returns
// its first failure since the thread's last synchronization
// (HcommThreadSynchronize). ThreadSynchronize is ThreadSynchronizeContext
// with context.Background(): the wait is bounded by the tasks' own timeouts
// (a notify wait's is HCCL_EXEC_TIMEOUT).
func ThreadSynchronize(t *Thread) error {
	return ThreadSynchronizeContext(context.Background(), t)
}

// ThreadSynchronizeContext is ThreadSynchronize bounded by ctx as well: when
// ctx ends first it returns an *Error matching ctx's error (ErrTimeout for a
// deadline) and the work stays queued. A thread in batch mode is refused:
// its cached work is not submitted until BatchModeEnd.
func ThreadSynchronizeContext(ctx context.Context, t *Thread) error {
	const op = "ThreadSynchronize"
	c, err := threadComm(op, t)
	if err != nil {
		return err
	}
	if ctx == nil {
		return c.errorf(op, -1, ErrPara, nil, "nil context")
	}
	if t.Batching() {
		return c.errorf(op, -1, ErrPara, nil, "thread %s is in batch mode: call BatchModeEnd first", t.Name())
	}
	return c.threadSync(ctx, op, t)
}

// threadSync synchronizes t's stream within ctx, the error wrapped for op.
func (c *Comm) threadSync(ctx context.Context, op string, t *Thread) error {
	err := t.Stream().Synchronize(ctx)
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		code, cause := ended(ctx, ErrTimeout, err)
		return c.errorf(op, -1, code, cause, "thread %s", t.Name())
	}
	return c.errorf(op, -1, ResultOf(err), err, "thread %s", t.Name())
}

// SetNotifyWaitTimeOut sets the timeout of the communicator's
// …WithDefaultTimeout waits (HcommSetNotifyWaitTimeOut). Departures: HCCL's
// is process-wide and in seconds (a float); hcomm's is per communicator and
// a time.Duration. d > 0 sets it; d == 0 returns to the default,
// HCCL_EXEC_TIMEOUT (Config.ExecTimeout); d < 0 waits forever. Waits
// already queued keep the timeout they were issued with. Safe for
// concurrent use.
func (c *Comm) SetNotifyWaitTimeOut(d time.Duration) error {
	if err := c.usable("SetNotifyWaitTimeOut"); err != nil {
		return err
	}
	c.notifyWait.Store(int64(d))
	return nil
}

// notifyWaitTimeout is the timeout of a …WithDefaultTimeout wait: the one
// SetNotifyWaitTimeOut set, else the communicator's ExecTimeout; 0 means
// forever.
func (c *Comm) notifyWaitTimeout() time.Duration {
	switch d := time.Duration(c.notifyWait.Load()); {
	case d > 0:
		return d
	case d < 0:
		return 0
	}
	return c.execTimeout(0)
}
