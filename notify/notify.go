// Package notify provides the one-shot signal that hcomm's handshakes are made
// of (aclrtNotify): a stream task records it, a task on another stream waits for
// it and resets it (aclrtWaitAndResetNotify).
//
// Why not an event: an event wait waits for what the event captured when the
// wait was enqueued, and an event never recorded counts as complete; a notify
// wait must instead wait for a record that may be enqueued later, by another
// stream or another rank. So a notify is a flag with waiters, and its record and
// wait are ordinary stream tasks (device.Stream.Launch), ordered with the copies
// around them exactly as event records and waits are.
//
// Waits spin briefly and then sleep; a wait that outlives its timeout fails
// its stream with device.ErrWaitTimeout, naming the notify. How they spin
// depends on who records: a New notify's wait yields to this process's
// goroutines (the recorder is one of them) for 50 µs — or not at all after
// SetSpin(0), for records that arrive through Go's network poller (tcp); a
// shared notify's wait yields the core to other processes (the recorder is
// one of them, perhaps waiting for this core) on every poll.
//
// Two backings: New keeps the state in this process and sleeps on Go
// primitives (cheap hand-offs between goroutines); NewShared keeps it in a
// 32-bit word of memory shared with another process (the shared-memory
// transport), which that process records with Signal and local waits sleep
// on with a futex. Both behave the same to their callers.
package notify

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/spin"
)

// Notify is a one-shot signal. Records collapse: two records with no wait in
// between set it once. The zero value is not usable; use New.
// All methods are safe for concurrent use.
type Notify struct {
	name string

	set     atomic.Uint32
	mu      sync.Mutex
	waiters []chan struct{}
	broken  error // set once by Break; guarded by mu
	// sleepers counts the waits between their registration in waiters
	// and their wake, and isBroken mirrors broken != nil: a record and a
	// poll read them instead of taking mu, whose cache line the other
	// side would otherwise take on every record and every poll.
	sleepers atomic.Int32
	isBroken atomic.Bool

	sh *sharedWord // NewShared's backing; nil for New's

	// spinFor is how long a wait polls before it sleeps; spinSet says
	// SetSpin chose it (otherwise spin.Default).
	spinFor time.Duration
	spinSet bool

	tryFn func() bool // TryReset as a func value, made once (TryResetFunc)
}

// New returns a notify in the reset state. name says whose it is ("rank 0
// channel to 1 notify 2"); it appears in every error about the notify.
func New(name string) *Notify { return made(&Notify{name: name}) }

// made finishes a new notify: its TryReset func value.
func made(n *Notify) *Notify {
	n.tryFn = n.TryReset
	return n
}

// TryResetFunc returns n.TryReset as a func value made when n was, for a
// caller that hands it to a poll on every wait (channel.Poller) without
// allocating a closure each time.
func (n *Notify) TryResetFunc() func() bool {
	if n.tryFn == nil {
		return n.TryReset // a Notify not made by New or NewShared
	}
	return n.tryFn
}

// SetSpin sets how long a wait for n polls before it sleeps (spin.Default,
// 50 µs, unless set). Call it before the notify is used. A transport whose
// records arrive through Go's network poller (tcp) sets it to zero: a
// waiter that polls with runtime.Gosched keeps the scheduler busy, and a
// busy scheduler polls the network only every few milliseconds (sysmon),
// so the goroutine that would read the record stays parked until the
// spin gives up. Sleeping at once lets the scheduler poll the network and
// run that goroutine.
func (n *Notify) SetSpin(d time.Duration) { n.spinFor, n.spinSet = d, true }

// Name returns the name given to New.
func (n *Notify) Name() string { return n.name }

// Set records the notify now, from the calling goroutine: what a Record task
// does when it runs, and what a transport does when a peer's record arrives.
func (n *Notify) Set() {
	if n.sh != nil {
		n.sh.do(Signal)
		return
	}
	if n.set.Swap(1) == 1 {
		return
	}
	// A wait stores sleepers before it looks at set for the last time,
	// and a record stores set before it loads sleepers (both sequentially
	// consistent): either the wait sees the record or the record sees the
	// wait, so no wake is lost.
	if n.sleepers.Load() == 0 {
		return
	}
	n.mu.Lock()
	ws := n.waiters
	n.waiters = nil
	n.mu.Unlock()
	for _, w := range ws {
		close(w)
	}
}

// Break makes every pending and future wait on the notify fail at once with an
// error wrapping err (unless the notify is already recorded, which a wait still
// consumes first). A transport calls it on the notifies of a channel whose
// peer is lost, so that no wait sits out its timeout for a record that cannot
// come. The first Break wins; later ones are ignored.
func (n *Notify) Break(err error) {
	n.mu.Lock()
	if n.broken == nil {
		n.broken = err
		n.isBroken.Store(true)
	}
	ws := n.waiters
	n.waiters = nil
	n.mu.Unlock()
	for _, w := range ws {
		close(w)
	}
	if n.sh != nil {
		n.sh.do(kick)
	}
}

// Broken returns the error given to Break, or nil.
func (n *Notify) Broken() error {
	if !n.isBroken.Load() {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.broken
}

// TryReset resets a recorded notify and reports whether it was recorded.
func (n *Notify) TryReset() bool {
	if n.sh != nil {
		var ok bool
		n.sh.do(func(w *uint32) { ok = tryResetWord(w) })
		return ok
	}
	// A look before the swap: a poll that finds nothing leaves the cache
	// line shared with the recorder instead of taking it.
	return n.set.Load() == 1 && n.set.CompareAndSwap(1, 0)
}

// IsSet reports whether the notify is recorded and not yet waited for.
func (n *Notify) IsSet() bool {
	if n.sh != nil {
		var ok bool
		n.sh.do(func(w *uint32) { ok = atomic.LoadUint32(w)&bitSet != 0 })
		return ok
	}
	return n.set.Load() == 1
}

// Reset returns the notify to the reset state (the end of a failed handshake).
func (n *Notify) Reset() {
	if n.sh != nil {
		n.sh.do(func(w *uint32) { atomic.AndUint32(w, ^uint32(bitSet)) })
		return
	}
	n.set.Store(0)
}

// Record enqueues on s a task that records the notify (aclrtRecordNotify).
func (n *Notify) Record(s *device.Stream) error {
	return s.Launch("Notify.Record", func(<-chan struct{}) error {
		n.Set()
		return nil
	})
}

// Wait enqueues on s a task that waits until the notify is recorded and then
// resets it (aclrtWaitAndResetNotify). A timeout <= 0 waits forever (ACL's and
// HCCL's 0); otherwise the task fails with device.ErrWaitTimeout after timeout.
func (n *Notify) Wait(s *device.Stream, timeout time.Duration) error {
	return s.Launch("Notify.Wait", func(stop <-chan struct{}) error {
		return n.await(s, timeout, stop)
	})
}

// WaitNow blocks the calling goroutine until the notify is recorded, then
// resets it: Wait's task body, for transports and tests. When ctx ends first it
// returns device.ErrWaitTimeout (deadline) or device.ErrStreamAbort (cancel).
func (n *Notify) WaitNow(ctx context.Context) error {
	if ctx == nil {
		return &device.Error{Op: "Notify.WaitNow", Device: -1, Stream: -1, Code: device.ErrInvalidValue, Msg: "nil context"}
	}
	err := n.await(nil, 0, ctx.Done())
	if err != nil && ctx.Err() == context.DeadlineExceeded {
		return n.fail(nil, device.ErrWaitTimeout, "wait for %s timed out: %v", n.name, ctx.Err())
	}
	return err
}

// Await blocks the calling goroutine until the notify is recorded (then
// resets it), until timeout passes (timeout <= 0: never; the error is then
// device.ErrWaitTimeout and matches context.DeadlineExceeded), or until stop
// closes (device.ErrStreamAbort): Wait's task body, for callers that launch
// their own task around the wait. A broken notify fails at once.
func (n *Notify) Await(stop <-chan struct{}, timeout time.Duration) error {
	return n.await(nil, timeout, stop)
}

// Nap is Await without the polling first: it sleeps at once, until n is
// recorded, stop closes or timeout passes, for a waiter that has just
// polled (hcomm's tcp waits between their looks at the sockets). A notify
// of shared memory polls as Await does.
func (n *Notify) Nap(stop <-chan struct{}, timeout time.Duration) error {
	if n.sh != nil {
		return n.awaitShared(nil, timeout, stop)
	}
	return n.sleep(nil, timeout, stop)
}

func (n *Notify) await(s *device.Stream, timeout time.Duration, stop <-chan struct{}) error {
	if n.sh != nil {
		return n.awaitShared(s, timeout, stop)
	}
	d := spin.Default
	if n.spinSet {
		d = n.spinFor
	}
	if spin.Until(d, n.TryReset) {
		return nil
	}
	return n.sleep(s, timeout, stop)
}

// sleep is await's sleeping part.
func (n *Notify) sleep(s *device.Stream, timeout time.Duration, stop <-chan struct{}) error {
	var expire <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expire = t.C
	}
	for {
		ch := make(chan struct{})
		n.mu.Lock()
		n.sleepers.Add(1)
		if n.TryReset() {
			n.sleepers.Add(-1)
			n.mu.Unlock()
			return nil
		}
		if b := n.broken; b != nil {
			n.sleepers.Add(-1)
			n.mu.Unlock()
			return n.failErr(s, b)
		}
		n.waiters = append(n.waiters, ch)
		n.mu.Unlock()
		select {
		case <-ch:
			n.sleepers.Add(-1)
			if n.TryReset() {
				return nil
			}
			continue // another waiter took it
		case <-stop:
			n.forget(ch)
			return n.fail(s, device.ErrStreamAbort, "wait for %s abandoned: stream aborted or device closed", n.name)
		case <-expire:
			n.forget(ch)
			if n.TryReset() {
				return nil
			}
			return n.fail(s, device.ErrWaitTimeout, "wait for %s timed out after %v", n.name, timeout)
		}
	}
}

// TimedOut returns the error of a wait for n that timed out after timeout,
// as Await returns it: for a caller that waits in parts (a nap at a time)
// and gives up when the parts add up to its timeout.
func (n *Notify) TimedOut(timeout time.Duration) error {
	return n.fail(nil, device.ErrWaitTimeout, "wait for %s timed out after %v", n.name, timeout)
}

func (n *Notify) forget(ch chan struct{}) {
	n.mu.Lock()
	for i, w := range n.waiters {
		if w == ch {
			n.waiters = append(n.waiters[:i], n.waiters[i+1:]...)
			break
		}
	}
	n.sleepers.Add(-1) // registered until now, whether or not a wake took it out of waiters
	n.mu.Unlock()
}

// failErr is the error of a wait on a broken notify: ErrStreamAbort-coded,
// wrapping the cause given to Break.
func (n *Notify) failErr(s *device.Stream, cause error) error {
	e := n.fail(s, device.ErrStreamAbort, "wait for %s failed: %v", n.name, cause).(*device.Error)
	e.Err = cause
	return e
}

func (n *Notify) fail(s *device.Stream, code device.Code, format string, args ...any) error {
	e := &device.Error{Op: "Notify.Wait", Device: -1, Stream: -1, Code: code, Msg: fmt.Sprintf(format, args...)}
	if s != nil {
		e.Device, e.Stream = s.Device().ID(), s.ID()
	}
	if code == device.ErrWaitTimeout {
		e.Err = context.DeadlineExceeded
	}
	return e
}
