package tcp

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/reduce"
)

// This file holds the receiving side: a reader per socket that checks each
// frame and applies it, and the reads (Read, ReadReduce) that wait for the
// bytes it brings back.

// errorGrace is how long a reader whose socket ended waits for another
// socket to bring the peer's ERROR frame before it reports the loss.
const errorGrace = 100 * time.Millisecond

// pendingRead is a Read or ReadReduce waiting for its response frames.
type pendingRead struct {
	dst    []byte
	dt     reduce.DataType
	op     reduce.Op
	reduce bool

	// mu is held shared by a receiver copying into dst; the caller takes it
	// exclusively before it gives dst back.
	mu        sync.RWMutex
	cancelled atomic.Bool
	got       atomic.Int64
	done      chan struct{}
}

// Read copies the peer's memory at src into dst. It returns once every byte
// arrived.
func (c *conn) Read(stop <-chan struct{}, dst []byte, src device.Ptr) error {
	return c.read("Read", stop, &pendingRead{dst: dst}, src)
}

// ReadReduce computes dst = dst op peer[src] over count elements, reducing
// each chunk as it arrives.
func (c *conn) ReadReduce(stop <-chan struct{}, dst []byte, src device.Ptr, count int, dt reduce.DataType, op reduce.Op) error {
	if !dt.Valid() || !op.Valid() || count < 0 || count > len(dst)/max(dt.Size(), 1) {
		return c.errorf("ReadReduce", uint64(src), int64(len(dst)), nil, "%d elements of %v (%v) do not fit %d destination bytes", count, dt, op, len(dst))
	}
	return c.read("ReadReduce", stop, &pendingRead{dst: dst[:count*dt.Size()], dt: dt, op: op, reduce: true}, src)
}

func (c *conn) read(op string, stop <-chan struct{}, pr *pendingRead, src device.Ptr) error {
	n := int64(len(pr.dst))
	if err := c.usable(op, stop, uint64(src), n); err != nil || n == 0 {
		return err
	}
	pr.done = make(chan struct{})
	id := c.nextID.Add(1)
	c.rmu.Lock()
	c.reads[id] = pr
	c.rmu.Unlock()
	if err := c.sendSmall(op, stop, frameRead, id, uint64(src), uint64(n), c.vector()); err != nil {
		c.abandon(id, pr, nil)
		return c.wrap(op, uint64(src), n, err)
	}
	select {
	case <-pr.done:
		return nil
	case <-c.dead:
		c.abandon(id, pr, nil)
		select {
		case <-pr.done:
			return nil
		default:
		}
		return c.errorf(op, uint64(src), n, c.failure(), "waiting for the bytes")
	case <-stop:
		err := c.errorf(op, uint64(src), n, aborted(op, "stop closed"), "stopped while waiting for the bytes")
		c.abandon(id, pr, err)
		return err
	}
}

// abandon forgets a read whose caller leaves. Bytes may be on their way into
// dst: when a receiver is copying right now and stopErr is set, the channel
// is killed to end that copy, since dst goes back to the caller.
func (c *conn) abandon(id uint64, pr *pendingRead, stopErr error) {
	c.rmu.Lock()
	delete(c.reads, id)
	c.rmu.Unlock()
	pr.cancelled.Store(true)
	if pr.mu.TryLock() {
		pr.mu.Unlock()
		return
	}
	if stopErr != nil {
		c.fail(stopErr, true)
	}
	pr.mu.Lock()
	pr.mu.Unlock() // the receivers have left; dst is the caller's again
}

func (c *conn) readLoop(s *sock) {
	defer c.wg.Done()
	defer c.readers.Done()
	br := bufio.NewReaderSize(s.nc, 64<<10)
	h := make(header, headerLen)
	var scratch []byte
	for {
		if _, err := io.ReadFull(br, h); err != nil {
			if err == io.EOF && c.closing.Load() {
				return
			}
			// A peer that fails the channel sends ERROR on every socket and
			// hangs up; give the other sockets a moment to deliver its reason.
			t := time.NewTimer(errorGrace)
			select {
			case <-c.dead:
			case <-t.C:
			}
			t.Stop()
			c.lost("receive", s, err)
			return
		}
		s.lastRx.Store(time.Now().UnixNano())
		done, err := c.handle(s, br, h, &scratch)
		if err != nil {
			var e *Error
			if errors.As(err, &e) && errors.Is(err, ErrProtocol) {
				c.fail(err, true)
			} else {
				c.lost("receive "+h.typ().String(), s, err)
			}
			return
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
		if done {
			return
		}
	}
}

// protocolErr is a frame that breaks the protocol. It names the frame's
// target range where the frame has one.
func (c *conn) protocolErr(s *sock, h header, format string, args ...any) error {
	var addr uint64
	var size int64
	switch h.typ() {
	case frameWrite, frameWriteReduce:
		addr, size = h.addr(), int64(h.length())
		if h.size() <= uint64(h.length()) {
			size -= int64(h.size()) // the ordering vector
		}
	case frameRead:
		addr, size = h.addr(), int64(min(h.size(), 1<<62))
	}
	return c.errorf("receive "+h.typ().String(), addr, size, ErrProtocol,
		"socket %d: %s", s.idx, fmt.Sprintf(format, args...))
}

// local returns the bytes of this rank's registered memory at [p, p+n), or
// an error when any of it lies outside.
func (c *conn) local(p, n uint64) ([]byte, error) {
	if n > 1<<62 {
		return nil, fmt.Errorf("length %d is too large", n)
	}
	ptr, size := device.Ptr(p), int64(n)
	if _, ok := c.reg.Find(ptr, size); !ok && !c.hccl.Contains(ptr, size) {
		return nil, fmt.Errorf("[%#x, +%d) is outside the memory rank %d registered", p, n, c.rank)
	}
	b, err := c.dev.Bytes(ptr, size)
	if err != nil {
		return nil, fmt.Errorf("[%#x, +%d): %w", p, n, err)
	}
	return b, nil
}

// handle validates and applies one frame whose header is in h; its payload
// is still in br. It reports whether the socket is done (CLOSE).
func (c *conn) handle(s *sock, br *bufio.Reader, h header, scratch *[]byte) (bool, error) {
	if err := h.check(len(c.socks)); err != nil {
		return false, c.protocolErr(s, h, "%v", err)
	}
	n := int(h.length())
	switch h.typ() {
	case frameWrite, frameWriteReduce:
		if err := c.dataOrder(s, br, h); err != nil {
			return false, err
		}
		n -= int(h.size())
	}
	switch h.typ() {
	case frameWrite:
		b, err := c.local(h.addr(), uint64(n))
		if err != nil {
			return false, c.protocolErr(s, h, "refused: %v", err)
		}
		_, err = io.ReadFull(br, b)
		return false, err
	case frameWriteReduce:
		b, err := c.local(h.addr(), uint64(n))
		if err != nil {
			return false, c.protocolErr(s, h, "refused: %v", err)
		}
		p := grow(scratch, n)
		if _, err := io.ReadFull(br, p); err != nil {
			return false, err
		}
		if err := reduce.Reduce(b, p, n/h.dtype().Size(), h.dtype(), h.op()); err != nil {
			return false, c.protocolErr(s, h, "%v", err)
		}
		return false, nil
	case frameReadResp:
		return false, c.readResp(s, br, h, scratch)
	case frameRead, frameNotify, frameFence:
		p := grow(scratch, n)
		if _, err := io.ReadFull(br, p); err != nil {
			return false, err
		}
		o := &ordered{t: h.typ(), id: h.id(), addr: h.addr(), size: h.size(), vec: make([]uint64, len(c.socks))}
		for i := range o.vec {
			o.vec[i] = binary.BigEndian.Uint64(p[8*i:])
		}
		switch o.t {
		case frameNotify:
			if o.id >= uint64(len(c.notifies)) {
				return false, c.protocolErr(s, h, "notify %d does not exist (this end has %d)", o.id, len(c.notifies))
			}
		case frameRead:
			if o.size == 0 {
				return false, c.protocolErr(s, h, "READ of 0 bytes")
			}
			if _, err := c.local(o.addr, o.size); err != nil {
				return false, c.errorf("receive READ", o.addr, int64(o.size), ErrProtocol, "socket %d: refused: %v", s.idx, err)
			}
		}
		return false, c.order(s, h, o)
	case frameFenceAck:
		c.rmu.Lock()
		done, ok := c.fences[h.id()]
		delete(c.fences, h.id())
		c.rmu.Unlock()
		if ok {
			close(done)
		} else if h.id() == 0 || h.id() > c.nextID.Load() {
			return false, c.protocolErr(s, h, "acknowledges fence %d, which was never sent", h.id())
		}
		return false, nil
	case framePing:
		return false, nil
	case frameError:
		p := grow(scratch, n)
		if _, err := io.ReadFull(br, p); err != nil {
			return false, err
		}
		e := c.errorf("receive ERROR", 0, 0, channel.ErrPeerLost, "rank %d failed the channel: %q", c.peer, p)
		c.fail(e, false)
		return true, e
	case frameClose:
		s.closedBy.Store(true)
		all := true
		for _, o := range c.socks {
			all = all && o.closedBy.Load()
		}
		if all {
			c.fail(c.errorf("receive CLOSE", 0, 0, channel.ErrPeerClosed, "rank %d closed the channel", c.peer), false)
		}
		return true, nil
	}
	return false, c.protocolErr(s, h, "unexpected frame")
}

// dataOrder reads the ordering vector a WRITE or WRITE_REDUCE carries (if
// any) and waits until every frame it counts is applied (order.go).
func (c *conn) dataOrder(s *sock, br *bufio.Reader, h header) error {
	if h.size() == 0 {
		return nil
	}
	var raw [8 * maxStreams]byte
	var vec [maxStreams]uint64
	p := raw[:h.size()]
	if _, err := io.ReadFull(br, p); err != nil {
		return err
	}
	v := vec[:len(c.socks)]
	for i := range v {
		v[i] = binary.BigEndian.Uint64(p[8*i:])
	}
	if v[s.idx] > s.applied.Load() {
		return c.protocolErr(s, h, "claims %d earlier frames on socket %d, only %d arrived", v[s.idx], s.idx, s.applied.Load())
	}
	if !c.awaitApplied(v) {
		return c.failure()
	}
	return nil
}

func grow(b *[]byte, n int) []byte {
	if cap(*b) < n {
		*b = make([]byte, n)
	}
	return (*b)[:n]
}

// readResp applies a READ_RESP chunk to the read waiting for it.
func (c *conn) readResp(s *sock, br *bufio.Reader, h header, scratch *[]byte) error {
	n := int64(h.length())
	id, off := h.id(), h.addr()
	c.rmu.Lock()
	pr := c.reads[id]
	c.rmu.Unlock()
	if pr == nil {
		if id == 0 || id > c.nextID.Load() {
			return c.protocolErr(s, h, "answers read %d, which was never sent", id)
		}
		_, err := br.Discard(int(n)) // the caller gave up on this read
		return err
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
		_, err := br.Discard(int(n))
		return err
	}
	var err error
	dst := pr.dst[off : int64(off)+n]
	if pr.reduce {
		p := grow(scratch, int(n))
		if _, err = io.ReadFull(br, p); err == nil {
			err = reduce.Reduce(dst, p, int(n)/pr.dt.Size(), pr.dt, pr.op)
		}
	} else {
		_, err = io.ReadFull(br, dst)
	}
	pr.mu.RUnlock()
	if err != nil {
		return err
	}
	switch got := pr.got.Add(n); {
	case got == total:
		c.rmu.Lock()
		delete(c.reads, id)
		c.rmu.Unlock()
		close(pr.done)
	case got > total:
		return c.protocolErr(s, h, "read %d got %d bytes, more than the %d asked for", id, got, total)
	}
	return nil
}
