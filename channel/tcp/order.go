package tcp

import "encoding/binary"

// This file holds the ordering of frames across sockets (spec.md §3): the
// ordering vector, the frames parked until the frames before them are applied,
// the responder that answers READ and FENCE, and Fence.

// maxPending bounds the ordered frames (NOTIFY, READ, FENCE) a peer may
// leave waiting for earlier frames; more is a protocol violation.
const maxPending = 1 << 16

// ordered is a NOTIFY, READ or FENCE waiting until the frames its sender
// wrote before it are applied.
type ordered struct {
	t    frameType
	vec  []uint64
	id   uint64
	addr uint64
	size uint64
}

// vector is the ordering vector: how many frames went out on each socket so
// far. A receiver applies an ordered frame carrying it only once it applied
// that many frames from every socket.
func (c *conn) vector() []byte {
	b := make([]byte, 8*len(c.socks))
	for i, s := range c.socks {
		binary.BigEndian.PutUint64(b[8*i:], s.sent.Load())
	}
	return b
}

// satisfied reports whether every frame counted in vec has been applied.
func (c *conn) satisfied(vec []uint64) bool {
	for i, s := range c.socks {
		if s.applied.Load() < vec[i] {
			return false
		}
	}
	return true
}

// order runs o now if the frames before it are applied, or parks it until
// they are.
func (c *conn) order(s *sock, h header, o *ordered) error {
	// The frame's own socket is in order by construction; its count includes
	// the frames before this one, and applied lags by exactly this frame.
	if o.vec[s.idx] > s.applied.Load() {
		return c.protocolErr(s, h, "claims %d earlier frames on socket %d, only %d arrived", o.vec[s.idx], s.idx, s.applied.Load())
	}
	if c.satisfied(o.vec) {
		c.fire(o)
		return nil
	}
	c.pmu.Lock()
	if len(c.pend) >= maxPending {
		c.pmu.Unlock()
		return c.protocolErr(s, h, "more than %d ordered frames wait for earlier frames", maxPending)
	}
	c.pend = append(c.pend, o)
	c.npend.Add(1)
	c.pmu.Unlock()
	c.runPending() // an earlier frame may have landed in between
	return nil
}

// runPending fires every parked frame whose earlier frames are applied.
func (c *conn) runPending() {
	c.pmu.Lock()
	kept := c.pend[:0]
	for _, o := range c.pend {
		if c.satisfied(o.vec) {
			c.fire(o)
			c.npend.Add(-1)
		} else {
			kept = append(kept, o)
		}
	}
	clear(c.pend[len(kept):])
	c.pend = kept
	c.pmu.Unlock()
}

// fire applies an ordered frame whose turn has come.
func (c *conn) fire(o *ordered) {
	switch o.t {
	case frameNotify:
		c.notifies[o.id].Set()
	case frameRead, frameFence:
		c.qmu.Lock()
		if len(c.queue) >= maxPending {
			c.qmu.Unlock()
			c.fail(c.errorf("receive "+o.t.String(), o.addr, int64(o.size), ErrProtocol,
				"more than %d requests wait for an answer: rank %d asks faster than it reads", maxPending, c.peer), true)
			return
		}
		c.queue = append(c.queue, task{t: o.t, id: o.id, addr: o.addr, size: o.size})
		c.qmu.Unlock()
		select {
		case c.qsig <- struct{}{}:
		default:
		}
	}
}

// task is work for the responder: a READ to answer or a FENCE to acknowledge.
type task struct {
	t    frameType
	id   uint64
	addr uint64
	size uint64
}

// respond answers READs and FENCEs in the order they became due. It runs on
// its own goroutine so that a reader never blocks on a send: two ends whose
// readers both wrote large answers could otherwise wait on each other.
func (c *conn) respond() {
	defer c.wg.Done()
	for {
		select {
		case <-c.qsig:
		case <-c.dead:
			return
		}
		for {
			c.qmu.Lock()
			if len(c.queue) == 0 {
				c.qmu.Unlock()
				break
			}
			t := c.queue[0]
			c.queue[0] = task{}
			c.queue = c.queue[1:]
			c.qmu.Unlock()
			switch t.t {
			case frameFence:
				if c.sendSmall("answer FENCE", nil, frameFenceAck, t.id, 0, 0, nil) != nil {
					return
				}
			case frameRead:
				b, err := c.local(t.addr, t.size)
				if err != nil {
					c.fail(c.errorf("answer READ", t.addr, int64(t.size), ErrProtocol, "%v", err), true)
					return
				}
				if c.sendData("answer READ", c.dead, frameReadResp, 0, 0, t.id, 0, b) != nil {
					return
				}
			}
		}
	}
}

// Fence returns once every operation issued on the channel before it is
// applied at the peer.
func (c *conn) Fence(stop <-chan struct{}) error {
	if err := c.usable("Fence", stop, 0, 0); err != nil {
		return err
	}
	id := c.nextID.Add(1)
	done := make(chan struct{})
	c.rmu.Lock()
	c.fences[id] = done
	c.rmu.Unlock()
	forget := func() {
		c.rmu.Lock()
		delete(c.fences, id)
		c.rmu.Unlock()
	}
	if err := c.sendSmall("Fence", stop, frameFence, id, 0, 0, c.vector()); err != nil {
		forget()
		return c.wrap("Fence", 0, 0, err)
	}
	select {
	case <-done:
		return nil
	case <-c.dead:
		forget()
		return c.errorf("Fence", 0, 0, c.failure(), "waiting for the acknowledgement")
	case <-stop:
		forget()
		return c.errorf("Fence", 0, 0, aborted("Fence", "stop closed"), "stopped while waiting for the acknowledgement")
	}
}
