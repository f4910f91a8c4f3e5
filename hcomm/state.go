package hcomm

import (
	"context"
	"strconv"
	"sync"
)

// CommStatus is the state of a communicator (HcclCommStatus), which a
// program polls with GetStatus or is told of through RegCommStateCallback:
//
//	Ready ⇄ Suspending → Error → Destroyed
//	  └───────────────────┴────────↗
//
// A communicator starts Ready. Suspend and Resume move it between Ready and
// Suspending. It goes to Error when it can no longer be trusted: Abort was
// called, a rank was lost, the communicator was revoked (Revoke), or an
// asynchronous task failed (what GetCommAsyncError reports). Destroy ends every state in Destroyed. Error
// and Destroyed are never left, except Error for Destroyed.
//
// The values are HCCL's where HCCL has the state: READY (0), SUSPENDING (1)
// and INVALID (254), which hcomm reports for a destroyed communicator. HCCL
// has no error state (its communicator stays READY and the error is left
// to HcclGetCommAsyncError); hcomm's StatusError is 2, a value HCCL does not
// use.
type CommStatus int32

// CommStatus values.
const (
	StatusReady      CommStatus = 0   // HCCL_COMM_STATUS_READY
	StatusSuspending CommStatus = 1   // HCCL_COMM_STATUS_SUSPENDING
	StatusError      CommStatus = 2   // hcomm's: aborted, a rank lost, or an asynchronous error
	StatusDestroyed  CommStatus = 254 // HCCL_COMM_STATUS_INVALID: destroyed
)

// String returns HCCL's name of the status, or hcomm's for StatusError.
func (s CommStatus) String() string {
	switch s {
	case StatusReady:
		return "READY"
	case StatusSuspending:
		return "SUSPENDING"
	case StatusError:
		return "ERROR"
	case StatusDestroyed:
		return "INVALID"
	}
	return "CommStatus(" + strconv.Itoa(int(s)) + ")"
}

// StateCallback is told of one transition of communicator c, from one
// status to another (HcclCommStateCallback).
type StateCallback func(c *Comm, from, to CommStatus)

// stateMachine is a communicator's status and the goroutine that tells the
// callbacks of its transitions. The zero value is a Ready communicator
// with no callbacks and no goroutine.
type stateMachine struct {
	mu      sync.Mutex
	cur     CommStatus
	cbs     []stateReg
	nextID  int
	queue   []transition
	wake    chan struct{} // cap 1: the delivery goroutine has work; nil until the first callback
	done    chan struct{} // closed when the delivery goroutine ends
	closing bool          // Destroy: deliver what is queued, then end
	unloss  func() bool   // stops the loss hook
}

type stateReg struct {
	id int
	fn StateCallback
}

type transition struct{ from, to CommStatus }

// allowedTransition says whether a communicator in status from may go to
// status to.
func allowedTransition(from, to CommStatus) bool {
	switch {
	case from == to, from == StatusDestroyed:
		return false
	case from == StatusError:
		return to == StatusDestroyed
	}
	return to == StatusReady || to == StatusSuspending || to == StatusError || to == StatusDestroyed
}

// setState moves c to status to and queues the transition for the
// callbacks. It reports whether c moved: a transition that the state
// machine does not allow (out of Destroyed, out of Error except to
// Destroyed, to the status c is in) leaves c as it is. Suspend and Resume
// call it with StatusSuspending and StatusReady. Safe for concurrent use;
// it does not wait for the callbacks.
func (c *Comm) setState(to CommStatus) bool {
	m := &c.state
	m.mu.Lock()
	defer m.mu.Unlock()
	if !allowedTransition(m.cur, to) {
		return false
	}
	from := m.cur
	m.cur = to
	if m.wake != nil && !m.closing {
		m.queue = append(m.queue, transition{from, to})
		select {
		case m.wake <- struct{}{}:
		default:
		}
	}
	return true
}

// GetStatus returns the communicator's status (HcclCommGetStatus). It does
// not block. Departure: HCCL looks the communicator up by name; hcomm's is a
// method, since the ranks of an InitAll share one name in one process —
// CommGetHandleWithName(name) then GetStatus is HCCL's form. A nil
// communicator is StatusDestroyed.
func (c *Comm) GetStatus() CommStatus {
	if c == nil {
		return StatusDestroyed
	}
	c.noteFailure()
	c.state.mu.Lock()
	defer c.state.mu.Unlock()
	return c.state.cur
}

// noteFailure moves c to StatusError when it has failed in a way that has
// not been reported yet (a loss or an asynchronous error that raced with
// the hooks' registration).
func (c *Comm) noteFailure() {
	c.mu.Lock()
	failed := c.aborted && !c.closed
	c.mu.Unlock()
	if failed || c.lostErr() != nil || c.revokedErr() != nil || c.GetCommAsyncError() != nil {
		c.setState(StatusError)
	}
}

// RegCommStateCallback registers fn to be told of every later transition of
// the communicator's status (HcclCommRegCommStateCallback), and returns a
// function that unregisters it. fn runs on a goroutine the communicator
// owns, one transition at a time, in the order they happened, for each
// callback in the order they were registered; a slow fn delays the next
// transitions but never the communicator. The last transition delivered is
// the one to StatusDestroyed: Destroy waits for it and for fn to return, then
// stops the goroutine, so fn must not call Destroy on its own communicator
// (it may call Abort). Safe for concurrent use.
//
// Departure: HCCL's callback is registered once per process under a name
// and is told of phases (before and after HcclCommDestroy, before and after
// HcclCommResume) of every communicator; hcomm's is per communicator and is
// told of status transitions, which include those phases' outcomes.
// Errors: ErrPara for a nil fn; ErrUnavail on a destroyed communicator.
func (c *Comm) RegCommStateCallback(fn StateCallback) (unregister func(), err error) {
	const op = "RegCommStateCallback"
	if c == nil {
		return nil, nilCommErr(op)
	}
	if fn == nil {
		return nil, c.errorf(op, -1, ErrPara, nil, "nil callback")
	}
	m := &c.state
	m.mu.Lock()
	if m.cur == StatusDestroyed || m.closing {
		m.mu.Unlock()
		return nil, c.errorf(op, -1, ErrUnavail, nil, "communicator is destroyed")
	}
	m.nextID++
	id := m.nextID
	m.cbs = append(m.cbs, stateReg{id, fn})
	start := m.wake == nil
	if start {
		m.wake = make(chan struct{}, 1)
		m.done = make(chan struct{})
		unloss := c.stopOnLoss(func() { c.setState(StatusError) })
		unrevoke := context.AfterFunc(c.revoke.ctx, func() { c.setState(StatusError) })
		m.unloss = func() bool { unrevoke(); return unloss() }
		go c.deliverStates()
	}
	m.mu.Unlock()
	c.noteFailure() // a failure before the hooks were in place
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		for i, r := range m.cbs {
			if r.id == id {
				m.cbs = append(m.cbs[:i:i], m.cbs[i+1:]...)
				return
			}
		}
	}, nil
}

// deliverStates is the goroutine of RegCommStateCallback: it calls the
// callbacks with each queued transition until Destroy closes the machine
// and the queue is empty.
func (c *Comm) deliverStates() {
	m := &c.state
	defer close(m.done)
	for {
		m.mu.Lock()
		for len(m.queue) == 0 && !m.closing {
			m.mu.Unlock()
			<-m.wake
			m.mu.Lock()
		}
		q, cbs, last := m.queue, append([]stateReg(nil), m.cbs...), m.closing
		m.queue = nil
		m.mu.Unlock()
		for _, t := range q {
			for _, r := range cbs {
				r.fn(c, t.from, t.to)
			}
		}
		if last {
			m.mu.Lock()
			empty := len(m.queue) == 0
			m.mu.Unlock()
			if empty {
				return
			}
		}
	}
}

// finishStates runs at the end of Destroy: the communicator is Destroyed,
// the callbacks are told so, and their goroutine ends before Destroy
// returns.
func (c *Comm) finishStates() {
	c.async.listen(c, false)
	c.setState(StatusDestroyed)
	m := &c.state
	m.mu.Lock()
	m.closing = true
	done, unloss := m.done, m.unloss
	if m.wake != nil {
		select {
		case m.wake <- struct{}{}:
		default:
		}
	}
	m.mu.Unlock()
	if unloss != nil {
		unloss()
	}
	if done != nil {
		<-done
	}
}
