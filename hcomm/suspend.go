package hcomm

import (
	"errors"
	"log/slog"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
)

// Suspend releases what an idle communicator holds for its peers
// (HcclCommSuspend): its channels (sockets, shared mappings of the peers'
// buffers, notify slots), their listeners, and its HCCL buffer; and it drops
// the per-communicator state of the libraries built on it (Value: a value
// with a Close method is closed), so that the collectives set themselves up
// afresh after Resume. The communicator keeps its rank, size, bootstrap,
// threads and registered memory (CommMemReg). Until Resume, every call that
// needs what was released fails with ErrSuspending (HCCL_E_SUSPENDING)
// saying the communicator is suspended; Channel handles acquired before are closed for good.
//
// Suspend is collective in effect: a peer's channel to this rank breaks, so
// every rank suspends, each once its work on the communicator has completed
// and has been waited for on every rank (after a Barrier, say). It refuses
// with ErrAgain (try again once the work is done), releasing nothing, while a thread of the communicator has
// work queued or a channel setup is in progress. It must not run
// concurrently with other calls on c. Suspending a suspended communicator
// does nothing.
func (c *Comm) Suspend() error {
	const op = "Suspend"
	if c == nil {
		return nilCommErr(op)
	}
	c.mu.Lock()
	if c.suspended && !c.closed && !c.aborted {
		c.mu.Unlock()
		return nil
	}
	c.mu.Unlock()
	if err := c.usable(op); err != nil {
		return err
	}
	c.mu.Lock()
	if len(c.inflight) > 0 {
		c.mu.Unlock()
		return c.errorf(op, -1, ErrAgain, nil, "%d channel setups are in progress", len(c.inflight))
	}
	for i, t := range c.threads {
		if err := t.Stream().Query(); errors.Is(err, device.ErrStreamNotComplete) {
			c.mu.Unlock()
			return c.errorf(op, -1, ErrAgain, err, "thread %d has work queued: synchronize its stream first", i)
		}
	}
	c.suspended = true
	c.unusable.Store(true)
	chs, vals, dls := c.channels, c.values, c.dialers
	c.channels, c.values, c.dialers = make(map[chanKey]*Channel), make(map[any]any), make(map[string]channel.Dialer)
	c.valueSnap.Store(nil)
	buf := c.buf
	c.buf = 0
	c.mu.Unlock()
	for _, v := range vals {
		if cl, ok := v.(interface{ Close() error }); ok {
			cl.Close()
		}
	}
	for _, ch := range chs {
		ch.destroyed.Store(true) // a handle kept across Resume is refused by name
		ch.tr.Close()
	}
	for _, d := range dls {
		d.Close()
	}
	c.registry.Remove(buf, "hccl buffer")
	err := c.dev.Free(buf)
	c.log(slog.LevelInfo, "communicator suspended", "channels", len(chs), "hccl_buffer_bytes", c.bufSize)
	c.setState(StatusSuspending) // state.go
	if err != nil {
		return c.errorf(op, -1, ErrRuntime, err, "freeing the HCCL buffer")
	}
	return nil
}

// Resume restores a communicator that Suspend released (HcclCommResume): it
// reserves the HCCL buffer again (its address may differ) and makes the
// communicator usable. Resume is local and does not block: the channels come
// back at the next ChannelAcquire, which meets the peer as always (the
// collectives acquire theirs at their first call after Resume, so every rank
// resumes before its next collective). Resuming a communicator that is not
// suspended does nothing. Errors: a destroyed or aborted communicator, one
// that lost a rank, and a buffer that cannot be reserved (ErrMemory: the
// communicator stays suspended). Not to be called concurrently with other
// calls on c.
//
// Departure: HCCL's HcclCommResume takes no context and neither does
// Resume: nothing in it waits for a peer.
func (c *Comm) Resume() error {
	const op = "Resume"
	if c == nil {
		return nilCommErr(op)
	}
	c.mu.Lock()
	switch {
	case c.closed:
		c.mu.Unlock()
		return c.errorf(op, -1, ErrUnavail, nil, "communicator is destroyed")
	case c.aborted:
		c.mu.Unlock()
		return c.errorf(op, -1, ErrUnavail, ErrAborted, "")
	case !c.suspended:
		c.mu.Unlock()
		return nil
	}
	buf, err := c.dev.MallocLazy(c.bufSize)
	if err != nil {
		c.mu.Unlock()
		return c.errorf(op, -1, ErrMemory, err, "reserving the HCCL buffer of %d bytes", c.bufSize)
	}
	c.buf = buf
	c.registry.Add(channel.Mem{Tag: "hccl buffer", Addr: buf, Size: c.bufSize})
	c.suspended = false
	c.mu.Unlock()
	// Usable again unless something else says not: a loss or a revocation
	// may have come while suspended, or come now — it records itself before
	// it sets unusable, so the check after the store below sees it, and the
	// flag is put back.
	c.unusable.Store(false)
	if err := c.why(op); err != nil {
		c.unusable.Store(true)
		return err // the buffer is back; the communicator stays unusable
	}
	c.log(slog.LevelInfo, "communicator resumed", "hccl_buffer_bytes", c.bufSize)
	c.setState(StatusReady) // state.go
	return nil
}

// Suspended reports whether the communicator is suspended (Suspend called,
// Resume not yet). Safe for concurrent use.
func (c *Comm) Suspended() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.suspended
}
