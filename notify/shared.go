package notify

import (
	"sync/atomic"
	"time"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/spin"
)

// The shared word. A notify made by NewShared keeps its whole state in one
// 32-bit word that two processes map; both sides change it only with atomic
// read-modify-writes, and every change keeps the bits it does not own:
//
//	bit 0      set: recorded and not yet waited for
//	bit 1      sleepers: a waiter is (or is about to be) asleep on the futex
//	bits 8-31  kick counter: bumped by the waiting side to wake its own
//	           sleepers (Break, stream abort); its value means nothing
//
// A record (Signal) sets bit 0, clears bit 1 and, when bit 1 was set, wakes
// every sleeper with FUTEX_WAKE. A waiter spins on bit 0 first; before it
// sleeps it sets bit 1 and sleeps with FUTEX_WAIT on the value it saw, so a
// record (or kick) between its look and its sleep changes the word and the
// sleep returns at once: no wake-up is lost. Recording costs one atomic and,
// only when someone sleeps, one system call.
//
// Memory order: Signal's compare-and-swap is sequentially consistent, so it
// is a release of every write before it; the wait's compare-and-swap that
// clears bit 0 is an acquire. Bytes written before a record are visible to
// the process whose wait consumed it, as with New's notifies.
const (
	bitSet   = 1 << 0
	bitSleep = 1 << 1
	kickUnit = 1 << 8
)

// sharedWord is the backing of a NewShared notify.
type sharedWord struct {
	word *uint32
	// detached: the notify no longer looks at the word for its state
	// (Detach). Nothing waits for the calls already past this check: the
	// word stays addressable as long as the notify is reachable (see
	// NewShared), so a call that raced with Detach touches it once more,
	// harmlessly. A lock here would cost every poll two atomics more.
	detached atomic.Bool
	// local says the recorder is a goroutine of this process (SetLocal).
	local bool
}

// do runs fn on the word unless the notify is detached.
func (sh *sharedWord) do(fn func(*uint32)) {
	if !sh.detached.Load() {
		fn(sh.word)
	}
}

// NewShared returns a notify whose state is the 32-bit word at word, which
// lives in memory shared with another process (a page both have mapped).
// That process records it with Signal; this one waits on it, and may also
// Set, Reset, Break it like any notify. The word must be zero (reset) or a
// state a previous notify left there, 4-byte aligned, and stay addressable
// for as long as the notify is reachable: after Detach the notify no longer
// looks at it, but a call that was already in progress may touch it once
// more, so the owner of the memory does not unmap it at Detach — it
// replaces it with private memory and unmaps that once the notifies are
// gone (channel/shm's retire). name says whose notify it is, as for New.
// Giving each word a cache line of its own keeps waits on one notify from
// slowing the records of its neighbours.
func NewShared(name string, word *uint32) *Notify {
	return made(&Notify{name: name, sh: &sharedWord{word: word}})
}

// SetLocal says that the shared notify's recorder runs in this process (a
// channel between two ranks of one process that shares memory, as tests
// force): its waits then yield to this process's goroutines on every poll,
// since the recorder is one of them, instead of to other processes. Call it
// before the notify is waited for. A notify from New ignores it.
func (n *Notify) SetLocal(local bool) {
	if n.sh != nil {
		n.sh.local = local
	}
}

// Shared reports whether the notify was made by NewShared.
func (n *Notify) Shared() bool { return n.sh != nil }

// Detach breaks the notify with err (see Break) and, for a shared notify,
// stops it looking at its word: from then on it behaves as a broken notify
// that is never recorded again. Its waits end (Break wakes them) without
// being waited for here, so the word must stay addressable until the notify
// is unreachable (NewShared). The transport that owns the shared memory
// calls it when it closes. Idempotent; on a notify from New it is Break.
func (n *Notify) Detach(err error) {
	n.Break(err)
	if n.sh != nil {
		n.sh.detached.Store(true)
	}
}

// Signal records the shared notify whose word is at word (a NewShared
// notify, possibly of another process): it sets the word and wakes the
// notify's sleeping waiters. It is a release: writes the caller made before
// it are visible to the wait that consumes the record. word must be mapped
// and 4-byte aligned. Safe for concurrent use.
func Signal(word *uint32) {
	for {
		v := atomic.LoadUint32(word)
		// Always write, even when the notify is already set: the wait that
		// consumes the set must read this write to see the bytes before it.
		if atomic.CompareAndSwapUint32(word, v, (v|bitSet)&^bitSleep) {
			if v&bitSleep != 0 {
				futexWake(word)
			}
			return
		}
	}
}

// kick changes the word without recording it and wakes its sleepers, so that
// they look at their notify's broken state and their stop channel again.
func kick(word *uint32) {
	atomic.AddUint32(word, kickUnit)
	futexWake(word)
}

func tryResetWord(w *uint32) bool {
	for {
		v := atomic.LoadUint32(w)
		if v&bitSet == 0 {
			return false
		}
		if atomic.CompareAndSwapUint32(w, v, v&^bitSet) {
			return true
		}
	}
}

// awaitShared is await for a shared notify: spin on the word, then sleep on
// it with a futex until a record, Break, stop or the timeout.
func (n *Notify) awaitShared(s *device.Stream, timeout time.Duration, stop <-chan struct{}) error {
	sh := n.sh
	w := sh.word
	if sh.detached.Load() {
		return n.failErr(s, n.Broken())
	}
	if spinShared(w, sh.local) {
		return nil
	}
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	// The kicker wakes this wait's futex sleep when stop closes. It starts
	// with the first sleep and is stopped and waited for when the wait
	// ends. A wait that Detach (Break) ends sees the broken state at its next
	// look: a sleep on a word that has been retired meanwhile returns at
	// once, since private memory does not hold the value it slept on.
	var kickerDone, kickerExited chan struct{}
	defer func() {
		if kickerDone != nil {
			close(kickerDone)
			<-kickerExited
		}
	}()
	for {
		v := atomic.LoadUint32(w)
		if v&bitSet != 0 {
			if atomic.CompareAndSwapUint32(w, v, v&^bitSet) {
				return nil
			}
			continue
		}
		if afterLook != nil {
			afterLook()
		}
		if b := n.Broken(); b != nil {
			// A record made before the break (a peer that recorded and
			// then closed its end) is still this wait's: the look above
			// may have come just before it.
			if tryResetWord(w) {
				return nil
			}
			return n.failErr(s, b)
		}
		select {
		case <-stop:
			return n.fail(s, device.ErrStreamAbort, "wait for %s abandoned: stream aborted or device closed", n.name)
		default:
		}
		var left time.Duration
		if !deadline.IsZero() {
			if left = time.Until(deadline); left <= 0 {
				return n.fail(s, device.ErrWaitTimeout, "wait for %s timed out after %v", n.name, timeout)
			}
		}
		if v&bitSleep == 0 {
			if !atomic.CompareAndSwapUint32(w, v, v|bitSleep) {
				continue
			}
			v |= bitSleep
		}
		if stop != nil && kickerDone == nil {
			kickerDone, kickerExited = make(chan struct{}), make(chan struct{})
			go func(done, exited chan struct{}) {
				defer close(exited)
				select {
				case <-stop:
					kick(w)
				case <-done:
				}
			}(kickerDone, kickerExited)
		}
		futexWait(w, v, left)
	}
}

// afterLook, when set (by a test), runs in awaitShared between its look at
// the word and its look at the broken state.
var afterLook func()

// spinShared polls the word for spin.Default before the wait sleeps
// (spin.UntilYield): first a few hundred times in a row, then yielding
// between polls. The recorder is another process, which may be waiting for
// this core when ranks outnumber cores (four processes on two cores): so
// every poll yields the core to other processes (sched_yield), and only
// every 64th to this process's goroutines (runtime.Gosched). Yielding to the
// goroutines on every poll, as a wait for an in-process notify does,
// measured slower (the 8-byte all-reduce of four processes on two cores:
// 7–9 µs against 5–6), because the goroutine that then runs is the caller
// issuing work far ahead, not the peer this wait needs; the occasional
// Gosched keeps a recorder in this process (a shared notify between ranks in
// one process, as tests use) from waiting for the sleep; a notify whose
// recorder is known to be in this process (SetLocal) polls as a New
// notify's wait does (spin.Until).
func spinShared(w *uint32, local bool) bool {
	reset := func() bool { return tryResetWord(w) }
	if local {
		return spin.Until(spin.Default, reset)
	}
	return spin.UntilYield(spin.Default, reset)
}
