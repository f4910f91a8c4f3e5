package tcp

import (
	"encoding/binary"
	"errors"
	"io"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/internal/reduce"
)

// This file holds the receive engine: how the bytes of a socket become
// applied frames. It is a state machine fed with whatever bytes a read
// brought, so that a frame may arrive over many reads, by different
// goroutines: the socket's background reader (readLoop, progress.go) or a
// caller that polls the channel while it waits (Poll). Whoever holds the
// socket's receive token (sock.rtok) owns its rx; a frame half-received by
// one holder is finished by the next.

// rxBufSize is the buffer each socket reads into. A payload that still
// lacks at least directRead bytes is read straight into its destination,
// and a read into the buffer asks for no more than the frame in hand and
// one header and directRead bytes beyond, so that a long payload is copied
// once, by the kernel, all but its first directRead bytes.
const (
	rxBufSize  = 64 << 10
	directRead = 16 << 10
)

// rxPhase is what the receive state machine waits for.
type rxPhase uint8

const (
	rxHeader rxPhase = iota // the next frame's header
	rxVector                // the ordering vector at the head of a WRITE or WRITE_REDUCE
	rxBody                  // the payload (or the data after the vector)
)

// rx is the receive state of one socket. Only the holder of sock.rtok uses it.
type rx struct {
	buf      []byte // read buffer; buf[pos:end] is not consumed yet
	pos, end int

	phase rxPhase
	h     [headerLen]byte
	hn    int // header bytes received
	vec   [8*maxStreams + maxPad]byte
	vn    int // vector (and padding) bytes received
	vlen  int // vector and padding bytes expected

	sink  []byte       // where the payload goes: memory, a read's buffer, or scratch (nil: discard)
	steer *steer       // a WRITE the caller steered (steer.go): its bytes past keep go to steer.to
	pre   *steer       // the steer whose write readSteered found next: the next WRITE takes it
	need  int          // payload bytes expected
	got   int          // payload bytes received
	dst   []byte       // WRITE_REDUCE and read-reduce: the memory the payload is reduced into
	pr    *pendingRead // READ_RESP: the read (its mu held shared until the chunk is in)

	scratch []byte
	ord     ordered            // the ordered frame being applied (apply), unless parked
	ordVec  [maxStreams]uint64 // its ordering vector
	done    bool               // CLOSE or ERROR applied: the socket carries nothing more
	err     error              // sticky: the error that ended receiving on this socket
}

// consume applies what r.buf[r.pos:r.end] holds: whole frames, and the start
// of the next one. It reports whether the socket is done (CLOSE, ERROR).
func (c *conn) consume(s *sock) (bool, error) {
	r := &s.rx
	for r.pos < r.end && !r.done {
		var err error
		switch in := r.buf[r.pos:r.end]; r.phase {
		case rxHeader:
			k := copy(r.h[r.hn:], in)
			r.hn += k
			r.pos += k
			if r.hn == headerLen {
				r.hn = 0
				err = c.begin(s)
			}
		case rxVector:
			k := copy(r.vec[r.vn:r.vlen], in)
			r.vn += k
			r.pos += k
			if r.vn == r.vlen {
				err = c.vectorIn(s)
			}
		case rxBody:
			k := min(r.need-r.got, len(in))
			r.put(in[:k]) // steer.go
			r.got += k
			r.pos += k
			if r.got == r.need {
				err = c.finish(s)
			}
		}
		if err != nil {
			return false, err
		}
	}
	return r.done, nil
}

// body makes the state machine expect n payload bytes into sink (nil:
// discard them); a frame without payload is finished at once.
func (c *conn) body(s *sock, sink []byte, n int) error {
	r := &s.rx
	r.phase, r.sink, r.need, r.got = rxBody, sink, n, 0
	if n == 0 {
		return c.finish(s)
	}
	return nil
}

// begin acts on a header just received: it validates it and sets up where
// the payload goes. Nothing is written before the frame passed every check.
func (c *conn) begin(s *sock) error {
	r := &s.rx
	h := header(r.h[:])
	if err := h.check(len(c.socks)); err != nil {
		return c.protocolErr(s, h, "%v", err)
	}
	n := int(h.length())
	switch h.typ() {
	case frameWrite, frameWriteReduce:
		if v := int(h.size() + h.pad()); v > 0 {
			r.phase, r.vn, r.vlen = rxVector, 0, v
			return nil
		}
		return c.beginData(s, n)
	case frameReadResp:
		return c.beginReadResp(s, h)
	}
	return c.body(s, grow(&r.scratch, n), n)
}

// vectorIn acts on the ordering vector of a data frame (order.go): the frame
// is applied only once every frame the vector counts is, and the reader
// waits for that here. A WRITE's padding, read with it, is dropped.
func (c *conn) vectorIn(s *sock) error {
	r := &s.rx
	h := header(r.h[:])
	if h.size() > 0 {
		var vec [maxStreams]uint64
		v := vec[:len(c.socks)]
		for i := range v {
			v[i] = binary.BigEndian.Uint64(r.vec[8*i:])
		}
		if v[s.idx] > s.applied.Load() {
			return c.protocolErr(s, h, "claims %d earlier frames on socket %d, only %d arrived", v[s.idx], s.idx, s.applied.Load())
		}
		if !c.awaitApplied(v) {
			return c.failure()
		}
	}
	return c.beginData(s, int(h.length())-r.vlen)
}

// beginData sets up the n data bytes of a WRITE or WRITE_REDUCE.
func (c *conn) beginData(s *sock, n int) error {
	r := &s.rx
	h := header(r.h[:])
	b, err := c.local(h.addr(), uint64(n))
	if err != nil {
		return c.protocolErr(s, h, "refused: %v", err)
	}
	if h.typ() == frameWrite {
		if t := r.pre; t != nil {
			r.pre = nil
			r.steer = t // readSteered checked that this is its write
		} else {
			r.steer = c.take(h.addr(), n) // steer.go
		}
		return c.body(s, b, n)
	}
	r.dst = b
	return c.body(s, grow(&r.scratch, n), n)
}

// beginReadResp sets up a READ_RESP chunk: into the read waiting for it, or
// discarded when its caller gave up.
func (c *conn) beginReadResp(s *sock, h header) error {
	r := &s.rx
	n := int64(h.length())
	id, off := h.id(), h.addr()
	c.rmu.Lock()
	pr := c.reads[id]
	c.rmu.Unlock()
	if pr == nil {
		if id == 0 || id > c.nextID.Load() {
			return c.protocolErr(s, h, "answers read %d, which was never sent", id)
		}
		return c.body(s, nil, int(n)) // the caller gave up on this read
	}
	total := int64(len(pr.dst))
	if n == 0 || off > uint64(total) || n > total-int64(off) {
		return c.protocolErr(s, h, "chunk [%d, +%d) lies outside the %d bytes read %d asked for", off, n, total, id)
	}
	if pr.reduce && (off%uint64(pr.dt.Size()) != 0 || n%int64(pr.dt.Size()) != 0) {
		return c.protocolErr(s, h, "chunk [%d, +%d) splits a %v element", off, n, pr.dt)
	}
	pr.mu.RLock()
	if pr.cancelled.Load() {
		pr.mu.RUnlock()
		return c.body(s, nil, int(n))
	}
	r.pr = pr
	dst := pr.dst[off : int64(off)+n]
	if pr.reduce {
		r.dst = dst
		return c.body(s, grow(&r.scratch, int(n)), int(n))
	}
	return c.body(s, dst, int(n))
}

// finish applies a frame whose payload is all in, counts it as applied and
// lets the frames parked behind it go.
func (c *conn) finish(s *sock) error {
	r := &s.rx
	if r.steer != nil {
		r.steer.landed()
		r.steer = nil
	}
	err := c.apply(s, header(r.h[:]))
	r.phase, r.sink, r.need, r.got, r.dst = rxHeader, nil, 0, 0, nil
	if err != nil {
		return err
	}
	s.applied.Add(1)
	if c.npend.Load() > 0 {
		c.runPending()
	}
	if c.nblocked.Load() > 0 {
		c.amu.Lock()
		c.pcond.Broadcast()
		c.amu.Unlock()
	}
	return nil
}

// apply does what a frame asks, its payload in (spec.md §2.1).
func (c *conn) apply(s *sock, h header) error {
	r := &s.rx
	switch h.typ() {
	case frameWrite:
		return nil
	case frameWriteReduce:
		if err := reduce.Reduce(r.dst, r.sink, len(r.sink)/h.dtype().Size(), h.dtype(), h.op()); err != nil {
			return c.protocolErr(s, h, "%v", err)
		}
		return nil
	case frameReadResp:
		return c.readRespIn(s, h)
	case frameRead, frameNotify, frameFence:
		p := r.sink
		// The socket's scratch frame: order copies it only to park it.
		o := &r.ord
		*o = ordered{t: h.typ(), id: h.id(), addr: h.addr(), size: h.size(), vec: r.ordVec[:len(c.socks)]}
		for i := range o.vec {
			o.vec[i] = binary.BigEndian.Uint64(p[8*i:])
		}
		switch o.t {
		case frameNotify:
			if o.id >= uint64(len(c.notifies)) {
				return c.protocolErr(s, h, "notify %d does not exist (this end has %d)", o.id, len(c.notifies))
			}
		case frameRead:
			if o.size == 0 {
				return c.protocolErr(s, h, "READ of 0 bytes")
			}
			if _, err := c.local(o.addr, o.size); err != nil {
				return c.errorf("receive READ", o.addr, int64(o.size), ErrProtocol, "socket %d: refused: %v", s.idx, err)
			}
		}
		return c.order(s, h, o)
	case frameFenceAck:
		c.rmu.Lock()
		done, ok := c.fences[h.id()]
		delete(c.fences, h.id())
		c.rmu.Unlock()
		if ok {
			close(done)
		} else if h.id() == 0 || h.id() > c.nextID.Load() {
			return c.protocolErr(s, h, "acknowledges fence %d, which was never sent", h.id())
		}
		return nil
	case framePing:
		return nil
	case frameError:
		c.fail(c.errorf("receive ERROR", 0, 0, channel.ErrPeerLost, "rank %d failed the channel: %q", c.peer, r.sink), false)
		r.done = true
		return nil
	case frameClose:
		s.closedBy.Store(true)
		all := true
		for _, o := range c.socks {
			all = all && o.closedBy.Load()
		}
		if all {
			c.fail(c.errorf("receive CLOSE", 0, 0, channel.ErrPeerClosed, "rank %d closed the channel", c.peer), false)
		}
		r.done = true
		return nil
	}
	return c.protocolErr(s, h, "unexpected frame")
}

// readRespIn completes a READ_RESP chunk: reduced into the read's buffer for
// a read-reduce, counted, and the read finished when it was the last.
func (c *conn) readRespIn(s *sock, h header) error {
	r := &s.rx
	pr := r.pr
	if pr == nil {
		return nil // discarded
	}
	var err error
	if pr.reduce {
		err = reduce.Reduce(r.dst, r.sink, len(r.sink)/pr.dt.Size(), pr.dt, pr.op)
	}
	r.pr = nil
	pr.mu.RUnlock()
	if err != nil {
		return c.protocolErr(s, h, "%v", err)
	}
	total := int64(len(pr.dst))
	switch got := pr.got.Add(int64(h.length())); {
	case got == total:
		c.rmu.Lock()
		delete(c.reads, h.id())
		c.rmu.Unlock()
		close(pr.done)
	case got > total:
		return c.protocolErr(s, h, "read %d got %d bytes, more than the %d asked for", h.id(), got, total)
	}
	return nil
}

// rxAbandon gives back what a frame cut short holds: the read whose chunk
// was coming in. The caller holds s.rtok; the socket receives nothing more.
func (s *sock) rxAbandon() {
	if t := s.rx.steer; t != nil {
		s.rx.steer = nil
		t.cut()
	}
	if pr := s.rx.pr; pr != nil {
		s.rx.pr = nil
		pr.mu.RUnlock()
	}
}

func grow(b *[]byte, n int) []byte {
	if cap(*b) < n {
		*b = make([]byte, n)
	}
	return (*b)[:n]
}

// errWouldBlock is what a socket read returns when no bytes are there now.
var errWouldBlock = errors.New("tcp: no bytes to read now")

// drain reads the socket and applies its frames until it has no bytes for
// now (false, nil), the peer's CLOSE or ERROR ended it (true, nil), or an
// error (sticky: every later drain returns it). The caller holds s.rtok.
func (c *conn) drain(s *sock) (bool, error) {
	r := &s.rx
	short := false
	for {
		if r.done {
			return true, nil
		}
		if r.err != nil {
			return false, r.err
		}
		if err := c.failure(); err != nil {
			return false, err
		}
		if r.pos < r.end {
			done, err := c.consume(s)
			if err != nil {
				r.err = err
				return false, err
			}
			if done {
				return true, nil
			}
		}
		if short {
			return false, nil
		}
		// The buffer is empty: read more, straight into a long payload's
		// destination when it has one.
		p, direct := r.buf, false
		var held *steer
		if r.phase == rxBody && r.sink != nil && r.need-r.got >= directRead {
			switch t := r.steer; {
			case t == nil:
				p, direct = r.sink[r.got:r.need], true
			case r.got >= t.keep && s.rc != nil: // a read that does not block
				if !t.hold() {
					r.steer, r.sink = nil, nil // given up on: dropped
					continue
				}
				p, direct, held = t.to[r.got-t.keep:r.need-t.keep], true, t
			}
		}
		if !direct {
			// What the frame in hand still lacks and one more frame of
			// a payload below directRead, at most: a long payload whose
			// header this read brings then lands mostly where it goes,
			// by the next reads, instead of here and again in its
			// destination, and a short frame still comes whole.
			want := headerLen + 8*maxStreams + directRead
			if r.phase == rxBody {
				want += r.need - r.got
			}
			p = p[:min(len(p), want)]
		}
		r.pos, r.end = 0, 0
		if t := c.peekable(s, direct); t != nil { // steer.go
			n, asked, err := c.readSteered(s, t)
			if n > 0 {
				s.got.Add(1)
				if err != nil {
					r.err = err
					return false, err
				}
				short = n < asked && s.rc != nil
				continue
			}
			if err == errWouldBlock {
				return false, nil
			}
			if err == nil {
				err = io.EOF
			}
			r.err = err
			return false, err
		}
		n, err := s.readSome(p)
		if held != nil {
			held.let()
		}
		if n > 0 {
			s.got.Add(1)
		}
		switch {
		case n > 0 && direct:
			r.got += n
			if r.got == r.need {
				if err := c.finish(s); err != nil {
					r.err = err
					return false, err
				}
			}
		case n > 0:
			r.end = n
			// A short read took all the kernel held: what arrives next
			// raises the network poller's edge after it, so the
			// background reader will see it (progress.go). Apply what
			// came and stop: a message that came whole is one read, not
			// a second one to hear EAGAIN. (Stopping only at a frame's
			// end, and reading on within a long payload, measured the
			// same at 1 MiB.)
			short = n < len(p) && s.rc != nil
		case err == errWouldBlock:
			return false, nil
		case err == nil:
			r.err = io.EOF
			return false, io.EOF
		default:
			r.err = err
			return false, err
		}
	}
}
