package tcp

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

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
	c.awaitNapping(stop, pr.done)
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

// protocolErr is a frame that breaks the protocol. It names the frame's
// target range where the frame has one.
func (c *conn) protocolErr(s *sock, h header, format string, args ...any) error {
	var addr uint64
	var size int64
	switch h.typ() {
	case frameWrite, frameWriteReduce:
		addr, size = h.addr(), int64(h.length())
		if v := h.size() + h.pad(); v <= uint64(h.length()) {
			size -= int64(v) // the ordering vector and a WRITE's padding
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
