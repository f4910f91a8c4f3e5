// Package thread provides hcomm's unit of concurrency (HCCL's ThreadHandle):
// one device stream plus the notifies that other threads record into by index.
// Tasks on one thread run in issue order; tasks on different threads run
// concurrently and order with each other only through notifies.
package thread

import (
	"fmt"
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
}

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
	return n.Record(t.stream)
}

// NotifyWait enqueues on t a wait for its own notify idx, which then resets
// (HcommThreadNotifyWaitOnThread). timeout <= 0 waits forever, as HCCL's 0 does.
func (t *Thread) NotifyWait(idx int, timeout time.Duration) error {
	n, err := t.Notify(idx)
	if err != nil {
		return err
	}
	return n.Wait(t.stream, timeout)
}

// Free releases the thread: a stream it created is destroyed (after its queued
// tasks finish); a wrapped stream is left to its owner. Free is idempotent.
func (t *Thread) Free() error {
	if t == nil {
		return nil
	}
	if t.owned {
		return t.stream.Destroy()
	}
	return nil
}
