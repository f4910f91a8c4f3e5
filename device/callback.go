package device

import (
	"context"
	"sync"
	"time"
)

// CallbackBlockType says whether a host callback holds the stream's later
// tasks (aclrtCallbackBlockType, with ACL's values).
type CallbackBlockType int32

const (
	CallbackNoBlock CallbackBlockType = 0 // ACL_CALLBACK_NO_BLOCK: later tasks run while the callback does
	CallbackBlock   CallbackBlockType = 1 // ACL_CALLBACK_BLOCK: later tasks wait until it returns
)

// LaunchCallback enqueues a host function on s (aclrtLaunchCallback). It runs
// when every task before it is complete. With CallbackBlock the tasks after it
// wait until it returns.
//
// Who runs it: when a report goroutine subscribed to s (SubscribeReport), that
// goroutine does, from ProcessReport, as in ACL. Otherwise — the plain Go
// default, a departure from ACL, which requires the subscription — the stream
// runs a blocking callback itself and a non-blocking one on a new goroutine
// that Destroy waits for. A callback that panics fails the stream with
// ErrInternal. A callback must not synchronize its own stream (it would wait for
// itself).
func (s *Stream) LaunchCallback(fn func(), block CallbackBlockType) error {
	const op = "LaunchCallback"
	if err := s.usable(op); err != nil {
		return err
	}
	if fn == nil {
		return s.errf(op, ErrInvalidValue, "nil callback")
	}
	if block != CallbackBlock && block != CallbackNoBlock {
		return s.errf(op, ErrInvalidValue, "unknown block type %d", int32(block))
	}
	return s.Launch(op, func(stop <-chan struct{}) error {
		if rt := s.report.Load(); rt != nil {
			item := &reportItem{s: s, fn: fn, done: make(chan error, 1)}
			if !rt.push(item) {
				return s.errf(op, ErrThreadSubscribe, "report thread %d is gone", rt.id)
			}
			if block == CallbackNoBlock {
				return nil
			}
			select {
			case err := <-item.done:
				return err
			case <-stop:
				return s.stopError(op)
			}
		}
		if block == CallbackBlock {
			return callSafely(s, fn)
		}
		s.cbs.Add(1)
		go func() {
			defer s.cbs.Done()
			if err := callSafely(s, fn); err != nil {
				s.dev.raise(s, 0, err)
			}
		}()
		return nil
	})
}

func callSafely(s *Stream, fn func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = s.errf("LaunchCallback", ErrInternal, "callback panicked: %v", r)
		}
	}()
	fn()
	return nil
}

// reportThread is one subscriber of ACL's report model: the goroutine the user
// names by threadID, which calls ProcessReport to run the callbacks of the
// streams it subscribed to.
type reportThread struct {
	id uint64

	mu      sync.Mutex
	items   []*reportItem
	streams map[*Stream]struct{}
	signal  chan struct{}
}

type reportItem struct {
	s    *Stream
	fn   func()
	done chan error
}

var reports = struct {
	sync.Mutex
	byID map[uint64]*reportThread
}{byID: make(map[uint64]*reportThread)}

func (rt *reportThread) push(it *reportItem) bool {
	rt.mu.Lock()
	if _, ok := rt.streams[it.s]; !ok {
		rt.mu.Unlock()
		return false
	}
	rt.items = append(rt.items, it)
	rt.mu.Unlock()
	select {
	case rt.signal <- struct{}{}:
	default:
	}
	return true
}

func (rt *reportThread) pop() *reportItem {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if len(rt.items) == 0 {
		return nil
	}
	it := rt.items[0]
	rt.items = rt.items[1:]
	return it
}

// drop forgets s; its callbacks still queued fail with ErrThreadSubscribe.
func (rt *reportThread) drop(s *Stream) {
	rt.mu.Lock()
	delete(rt.streams, s)
	keep := rt.items[:0]
	var gone []*reportItem
	for _, it := range rt.items {
		if it.s == s {
			gone = append(gone, it)
		} else {
			keep = append(keep, it)
		}
	}
	rt.items = keep
	empty := len(rt.streams) == 0
	rt.mu.Unlock()
	for _, it := range gone {
		it.done <- s.errf("LaunchCallback", ErrThreadSubscribe, "stream unsubscribed from report thread %d before its callback ran", rt.id)
	}
	s.report.CompareAndSwap(rt, nil)
	if empty {
		reports.Lock()
		if reports.byID[rt.id] == rt {
			delete(reports.byID, rt.id)
		}
		reports.Unlock()
	}
}

// SubscribeReport names threadID as the goroutine that runs s's callbacks
// (aclrtSubscribeReport). Go has no thread ids: the caller picks any number and
// passes the same to ProcessReport. A stream has at most one subscriber
// (ErrStreamSubscribe otherwise); one threadID may serve several streams.
func SubscribeReport(threadID uint64, s *Stream) error {
	const op = "SubscribeReport"
	if err := s.usable(op); err != nil {
		return err
	}
	reports.Lock()
	defer reports.Unlock()
	rt := reports.byID[threadID]
	if rt == nil {
		rt = &reportThread{id: threadID, streams: make(map[*Stream]struct{}), signal: make(chan struct{}, 1)}
		reports.byID[threadID] = rt
	}
	if !s.report.CompareAndSwap(nil, rt) {
		return s.errf(op, ErrStreamSubscribe, "stream is already subscribed to report thread %d", s.report.Load().id)
	}
	rt.mu.Lock()
	rt.streams[s] = struct{}{}
	rt.mu.Unlock()
	return nil
}

// UnsubscribeReport ends threadID's subscription to s (aclrtUnSubscribeReport);
// s's callbacks then run the plain Go way. Callbacks of s still queued for the
// thread fail with ErrThreadSubscribe: synchronize s first.
func UnsubscribeReport(threadID uint64, s *Stream) error {
	const op = "UnsubscribeReport"
	if err := s.usable(op); err != nil {
		return err
	}
	rt := s.report.Load()
	if rt == nil || rt.id != threadID {
		return s.errf(op, ErrThreadSubscribe, "stream is not subscribed to report thread %d", threadID)
	}
	rt.drop(s)
	return nil
}

// ProcessReport runs the callbacks waiting for threadID (aclrtProcessReport):
// it waits up to timeout for at least one (a negative timeout waits forever),
// runs it and any others already queued, and returns. ErrReportTimeout (which
// matches context.DeadlineExceeded) when none came in time;
// ErrThreadSubscribe when threadID has no subscription.
func ProcessReport(threadID uint64, timeout time.Duration) error {
	const op = "ProcessReport"
	reports.Lock()
	rt := reports.byID[threadID]
	reports.Unlock()
	if rt == nil {
		return newErr(op, -1, -1, ErrThreadSubscribe, "report thread %d has no subscribed stream", threadID)
	}
	it := rt.pop()
	if it == nil {
		ctx, cancel := timeoutContext(timeout)
		defer cancel()
		for it == nil {
			select {
			case <-rt.signal:
			case <-ctx.Done():
				if it = rt.pop(); it != nil {
					break
				}
				e := newErr(op, -1, -1, ErrReportTimeout, "no callback for report thread %d within %v", threadID, timeout)
				e.Err = context.DeadlineExceeded
				return e
			}
			it = rt.pop()
		}
	}
	for ; it != nil; it = rt.pop() {
		it.done <- callSafely(it.s, it.fn)
	}
	return nil
}
