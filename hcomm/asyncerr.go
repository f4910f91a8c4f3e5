package hcomm

import (
	"sync"

	"github.com/hcomm-dev/hcomm/device"
)

// asyncErr is the first error a communicator met in the background. A
// sub-communicator shares its parent's: they share a device context, whose
// exception callback is the parent's.
type asyncErr struct {
	mu  sync.Mutex
	err error
	// comms are the communicators that report err, moved to StatusError
	// when it is first set (state.go).
	comms map[*Comm]struct{}
}

// watchAsync installs the device exception callback through which every
// failed task of the communicator's device context (a timed-out wait, a lost
// peer, a collective's mismatch, a copy out of bounds) reaches
// GetCommAsyncError.
func (c *Comm) watchAsync() {
	a := c.async
	c.dev.SetExceptionInfoCallback(func(info *device.ExceptionInfo) {
		if info != nil && info.Err != nil {
			a.note(info.Err)
		}
	})
}

func (a *asyncErr) note(err error) {
	a.mu.Lock()
	var failed []*Comm
	if a.err == nil {
		a.err = err
		for c := range a.comms {
			failed = append(failed, c)
		}
	}
	a.mu.Unlock()
	for _, c := range failed {
		c.setState(StatusError)
	}
}

// listen makes c go to StatusError at the first error; Destroy undoes it.
func (a *asyncErr) listen(c *Comm, on bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !on {
		delete(a.comms, c)
		return
	}
	if a.comms == nil {
		a.comms = make(map[*Comm]struct{})
	}
	a.comms[c] = struct{}{}
}

// GetCommAsyncError returns the first error the communicator met in the
// background — an asynchronous task of one of its streams that failed: a
// notify wait that timed out, a peer that was lost, a collective whose ranks
// disagreed — or nil (HcclGetCommAsyncError). The error stays; it is not
// reset by reading it, nor by Destroy. The stream that ran the failed task
// also reports it at its next Synchronize.
//
// hcomm receives these errors through the device context's exception
// callback: a callback set with Device().SetExceptionInfoCallback replaces
// hcomm's, and then GetCommAsyncError no longer sees them.
func (c *Comm) GetCommAsyncError() error {
	if c == nil {
		return nilCommErr("GetCommAsyncError")
	}
	c.async.mu.Lock()
	defer c.async.mu.Unlock()
	return c.async.err
}
