package hcomm

import (
	"sync"

	"github.com/hcomm-dev/hcomm/device"
)

// asyncErr is the first error a communicator met in the background.
type asyncErr struct {
	mu  sync.Mutex
	err error
}

var asyncErrs sync.Map // *Comm -> *asyncErr

// watchAsync installs the device exception callback through which every
// failed task of the communicator's device context (a timed-out wait, a lost
// peer, a collective's mismatch, a copy out of bounds) reaches
// GetCommAsyncError.
func (c *Comm) watchAsync() {
	a := &asyncErr{}
	asyncErrs.Store(c, a)
	c.dev.SetExceptionInfoCallback(func(info *device.ExceptionInfo) {
		if info != nil && info.Err != nil {
			a.note(info.Err)
		}
	})
}

// shareAsync makes a sub-communicator report through its parent's record:
// they share a device context, whose exception callback is the parent's.
func (c *Comm) shareAsync(parent *Comm) {
	if v, ok := asyncErrs.Load(parent); ok {
		asyncErrs.Store(c, v)
	}
}

func (a *asyncErr) note(err error) {
	a.mu.Lock()
	if a.err == nil {
		a.err = err
	}
	a.mu.Unlock()
}

// GetCommAsyncError returns the first error the communicator met in the
// background — an asynchronous task of one of its streams that failed: a
// notify wait that timed out, a peer that was lost, a collective whose ranks
// disagreed — or nil (HcclGetCommAsyncError). The error stays; it is not
// reset by reading it. The stream that ran the failed task also reports it
// at its next Synchronize.
//
// hcomm receives these errors through the device context's exception
// callback: a callback set with Device().SetExceptionInfoCallback replaces
// hcomm's, and then GetCommAsyncError no longer sees them.
func (c *Comm) GetCommAsyncError() error {
	if c == nil {
		return &Error{Op: "GetCommAsyncError", Rank: -1, Peer: -1, Code: ErrPtr, Msg: "nil communicator"}
	}
	v, ok := asyncErrs.Load(c)
	if !ok {
		return nil
	}
	a := v.(*asyncErr)
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.err
}

// forgetAsync drops the record (Destroy).
func (c *Comm) forgetAsync() { asyncErrs.Delete(c) }
