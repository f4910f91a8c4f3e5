package tcp

import (
	"encoding/binary"
	"slices"
)

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
	// Parked: a copy of its own (o is the socket's scratch, apply's).
	o = &ordered{t: o.t, id: o.id, addr: o.addr, size: o.size, vec: slices.Clone(o.vec)}
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
	c.awaitNapping(stop, done)
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

// Ordered data frames (spec.md §3). Two data frames of one thread that
// touch the same bytes must be applied in the order they were sent, but on
// different sockets nothing orders them. The sender keeps a log of the data
// frames it sent on each socket (their ranges and counts); a data frame
// whose range overlaps a frame of another socket that is not yet known to
// be ordered before it carries the ordering vector, and the receiver's
// reader applies it only once every frame the vector counts is applied. A
// reader that applied an ordered data frame has applied everything before
// it on the other sockets, so later frames on its socket need no vector
// for those: dsync records that, and the log forgets frames every other
// socket has ordered itself after. The common path pays nothing: a write
// that overlaps nothing unsettled (a collective's step after its notify
// handshake usually finds its earlier writes settled by an ordered frame
// already, or carries a vector the receiver finds satisfied at once) and
// every write on a one-socket channel goes out as before.
//
// Why the reader waits instead of parking the frame as NOTIFY does: parking
// would hold up to 16 MiB of payload per frame; waiting cannot deadlock,
// since a frame's vector counts only frames sent before it, which are in
// the kernel's hands already, and the earliest unapplied frame of all the
// sockets never waits.

// drec is a data frame in the sender's log: frame seq-1 of its socket,
// covering [lo, hi) of the peer's memory.
type drec struct {
	seq    uint64
	lo, hi uint64
}

// maxDrecs bounds the log of one socket; beyond it the oldest half is
// merged into one bounding range (which may order more than it must).
const maxDrecs = 32

// dataVector returns the ordering vector a data frame of n bytes at addr
// must carry on socket s, or nil when it overlaps no unsettled frame of
// another socket. The caller holds s.wmu.
func (c *conn) dataVector(s *sock, addr uint64, n int) []byte {
	if len(c.socks) == 1 || n == 0 {
		return nil
	}
	lo, hi := addr, addr+uint64(n)
	c.dmu.Lock()
	defer c.dmu.Unlock()
	for t := range c.socks {
		if t == s.idx {
			continue
		}
		floor := c.dsync[s.idx][t]
		if o := c.dover[t]; o.hi != 0 && o.seq > floor && o.lo < hi && lo < o.hi {
			return c.vector()
		}
		recs := c.drecs[t]
		for i := len(recs) - 1; i >= 0 && recs[i].seq > floor; i-- {
			if r := recs[i]; r.lo < hi && lo < r.hi {
				return c.vector()
			}
		}
	}
	return nil
}

// noteData logs a data frame of n bytes at addr that went out on s as its
// frame seq-1, with the ordering vector vec (nil: none). The caller holds
// s.wmu, so a socket's records are in the order of its frames.
func (c *conn) noteData(s *sock, seq, addr uint64, n int, vec []byte) {
	if len(c.socks) == 1 || n == 0 {
		return
	}
	c.dmu.Lock()
	defer c.dmu.Unlock()
	if vec != nil {
		row := c.dsync[s.idx]
		for t := range row {
			row[t] = max(row[t], binary.BigEndian.Uint64(vec[8*t:]))
		}
		c.pruneData()
	}
	recs := append(c.drecs[s.idx], drec{seq: seq, lo: addr, hi: addr + uint64(n)})
	if len(recs) > maxDrecs {
		o := &c.dover[s.idx]
		for _, r := range recs[:maxDrecs/2] {
			if o.hi == 0 {
				*o = r
				continue
			}
			o.lo, o.hi, o.seq = min(o.lo, r.lo), max(o.hi, r.hi), r.seq
		}
		recs = recs[:copy(recs, recs[maxDrecs/2:])]
	}
	c.drecs[s.idx] = recs
}

// pruneData forgets the data frames every other socket has ordered itself
// after. The caller holds c.dmu.
func (c *conn) pruneData() {
	for t := range c.socks {
		floor := ^uint64(0)
		for s := range c.socks {
			if s != t {
				floor = min(floor, c.dsync[s][t])
			}
		}
		recs := c.drecs[t]
		k := 0
		for k < len(recs) && recs[k].seq <= floor {
			k++
		}
		c.drecs[t] = recs[:copy(recs, recs[k:])]
		if c.dover[t].seq <= floor {
			c.dover[t] = drec{}
		}
	}
}

// awaitApplied blocks a reader until every frame vec counts is applied, and
// reports false if the channel failed first.
func (c *conn) awaitApplied(vec []uint64) bool {
	if c.satisfied(vec) {
		return true
	}
	c.amu.Lock()
	defer c.amu.Unlock()
	c.nblocked.Add(1)
	defer c.nblocked.Add(-1)
	for !c.satisfied(vec) {
		if c.failure() != nil {
			return false
		}
		c.pcond.Wait()
	}
	return true
}
