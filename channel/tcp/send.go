package tcp

import (
	"encoding/binary"
	"net"
	"sync/atomic"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/reduce"
)

// This file holds the sending side: frames onto sockets, large operations
// split over all of them, and the one-sided operations (Write, WriteReduce,
// NotifyRecord, WriteWithNotify).

// minChunk is the smallest chunk a split operation is cut into (unless
// Options.ChunkSize is smaller): below it, the cost of waking another
// sender outweighs a second socket.
const minChunk = 256 << 10

// writeFrame writes one frame; the caller holds s.wmu.
func (s *sock) writeFrame(t frameType, dt reduce.DataType, op reduce.Op, id, addr, size uint64, payload []byte) error {
	return s.writeVec(t, dt, op, id, addr, size, nil, payload)
}

// writeVec writes one frame whose payload is vec followed by payload: a
// WRITE or WRITE_REDUCE with its ordering vector (size is then len(vec)),
// or any frame with vec nil. The caller holds s.wmu.
func (s *sock) writeVec(t frameType, dt reduce.DataType, op reduce.Op, id, addr, size uint64, vec, payload []byte) error {
	pad := 0
	if t == frameWrite {
		pad = dataPad(len(vec), len(payload))
	}
	h := header(s.hdr[:])
	h.encode(t, dt, op, uint32(len(vec)+pad+len(payload)), id, addr, size)
	if pad > 0 {
		h[3] = byte(pad)
	}
	s.wseq.Add(1)
	k := 0
	for _, b := range [4][]byte{h, vec, zeroPad[:pad], payload} {
		if len(b) > 0 {
			s.vec[k] = b
			k++
		}
	}
	err := s.writeOut(s.vec[:k])
	s.vec = [len(s.vec)][]byte{}
	s.wseq.Add(1)
	s.sent.Add(1)
	return err
}

// writePair writes a WRITE frame of payload — the concatenation of parts —
// at addr (with ordering vector wvec when it is not nil) and the NOTIFY
// frame of notify idx that follows it, in one system call; the caller holds
// s.wmu. The notify's ordering vector counts the write (on this socket) and
// the frames already sent on the others, as c.vector would after the
// write. At most maxParts parts.
func (s *sock) writePair(c *conn, addr uint64, wvec []byte, parts [][]byte, idx uint64) error {
	if len(s.ovec) != 8*len(c.socks) {
		s.ovec = make([]byte, 8*len(c.socks))
	}
	for i, o := range c.socks {
		n := o.sent.Load()
		if o == s {
			n++ // the write below
		}
		binary.BigEndian.PutUint64(s.ovec[8*i:], n)
	}
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	pad := dataPad(len(wvec), n)
	h := header(s.hdr[:])
	h.encode(frameWrite, 0, 0, uint32(len(wvec)+pad+n), 0, addr, uint64(len(wvec)))
	h[3] = byte(pad)
	h2 := header(s.hdr2[:])
	h2.encode(frameNotify, 0, 0, uint32(len(s.ovec)), idx, 0, 0)
	s.wseq.Add(1)
	k := 0
	s.vec[k], k = h, k+1
	if wvec != nil {
		s.vec[k], k = wvec, k+1
	}
	if pad > 0 {
		s.vec[k], k = zeroPad[:pad], k+1
	}
	for _, p := range parts {
		s.vec[k], k = p, k+1
	}
	s.vec[k], s.vec[k+1] = h2, s.ovec
	err := s.writeOut(s.vec[:k+2])
	s.vec = [len(s.vec)][]byte{}
	s.wseq.Add(1)
	s.sent.Add(2)
	return err
}

// maxParts is how many pieces of payload writePair takes: its frames' five
// buffers (header, ordering vector, padding; the notify's header and
// vector) and the parts fill sock.vec.
const maxParts = 4

// zeroPad is the padding a WRITE puts before its data (dataPad).
var zeroPad [maxPad]byte

// writeOut writes bufs, in order, as one stream of bytes; the caller holds
// s.wmu. Where it can, with raw writev system calls (rawsys_linux.go), and
// waiting for room in Go's network poller (which honours the socket's
// write deadline); otherwise through the net package.
func (s *sock) writeOut(bufs [][]byte) error {
	if !rawWrites || s.rc == nil {
		s.armLazy() // a blocking write: watched from the start
		b := net.Buffers(bufs)
		_, err := b.WriteTo(s.nc)
		return err
	}
	s.wq, s.werr = bufs, nil
	var err error
	if s.wlStop != nil {
		// A watched write: one attempt that cannot wait first, and the
		// watchdog only for what the kernel did not take.
		s.wdone = false
		if err = s.rc.Control(s.tryFn); err == nil && !s.wdone {
			s.armLazy()
			err = s.rc.Write(s.writeFn)
		}
	} else {
		err = s.rc.Write(s.writeFn)
	}
	s.wq = nil
	if err == nil {
		err = s.werr
	}
	s.werr = nil
	return err
}

// lockSock returns a locked socket for a one-frame operation: the first one
// nobody is writing on, so that a lone thread's small frames share one socket
// (and one reader at the peer), while concurrent threads spread.
func (c *conn) lockSock() *sock {
	for _, s := range c.socks {
		if s.wmu.TryLock() {
			return s
		}
	}
	s := c.socks[int(c.rr.Add(1))%len(c.socks)]
	s.wmu.Lock()
	return s
}

// sendSmall writes one frame on some socket; see writeWatched for stop.
func (c *conn) sendSmall(op string, stop <-chan struct{}, t frameType, id, addr, size uint64, payload []byte) error {
	s := c.lockSock()
	fired, err := s.writeWatched(c, op, stop, t, 0, 0, id, addr, size, nil, payload)
	s.wmu.Unlock()
	if fired {
		return c.errorf(op, addr, size64(size, payload), aborted(op, "stop closed"), "stopped while sending")
	}
	if err != nil {
		return c.lost(op, s, err)
	}
	return nil
}

func size64(size uint64, payload []byte) int64 {
	if size != 0 {
		return int64(min(size, 1<<62))
	}
	return int64(len(payload))
}

// job is one operation's payload split into chunks over the sockets.
type job struct {
	t     frameType
	dt    reduce.DataType
	op    reduce.Op
	id    uint64
	base  uint64 // addr of chunk 0: remote dst, or offset 0 of a READ_RESP
	src   []byte
	cs    int
	n     int
	next  atomic.Int64
	err   atomic.Pointer[error]
	left  atomic.Int32  // participants still running
	done  chan struct{} // closed by the last participant
	owner *conn
	name  string
}

func (j *job) run(s *sock) {
	defer func() {
		if j.left.Add(-1) == 0 {
			close(j.done)
		}
	}()
	for {
		i := int(j.next.Add(1) - 1)
		if i >= j.n {
			return
		}
		off := i * j.cs
		p := j.src[off:min(off+j.cs, len(j.src))]
		addr := j.base + uint64(off)
		s.wmu.Lock()
		var vec []byte
		if j.t != frameReadResp {
			vec = j.owner.dataVector(s, addr, len(p))
		}
		err := s.writeVec(j.t, j.dt, j.op, j.id, addr, uint64(len(vec)), vec, p)
		if err == nil && j.t != frameReadResp {
			j.owner.noteData(s, s.sent.Load(), addr, len(p), vec)
		}
		s.wmu.Unlock()
		if err != nil {
			err = j.owner.lost(j.name, s, err)
			j.err.CompareAndSwap(nil, &err)
			return
		}
	}
}

// chunkSize picks the chunk size for n bytes: big enough to keep syscalls
// few, small enough that every socket gets a share.
func (c *conn) chunkSize(n int) int {
	per := (n + len(c.socks) - 1) / len(c.socks)
	per = (per + 4095) &^ 4095
	return min(c.chunk, max(per, minChunk))
}

// sendData sends src as frames of type t (WRITE, WRITE_REDUCE, READ_RESP),
// split over the sockets when it is large. It returns once every byte is
// handed to the kernel. A stop that closes while bytes are still going out
// kills the channel: half a frame cannot be taken back.
func (c *conn) sendData(op string, stop <-chan struct{}, t frameType, dt reduce.DataType, rop reduce.Op, id, base uint64, src []byte) error {
	cs := c.chunkSize(len(src))
	if len(src) <= cs {
		s := c.lockSock()
		var vec []byte
		if t != frameReadResp {
			vec = c.dataVector(s, base, len(src))
		}
		fired, err := s.writeWatched(c, op, stop, t, dt, rop, id, base, uint64(len(vec)), vec, src)
		if err == nil && !fired && t != frameReadResp {
			c.noteData(s, s.sent.Load(), base, len(src), vec)
		}
		s.wmu.Unlock()
		if fired {
			return c.errorf(op, base, int64(len(src)), aborted(op, "stop closed"), "stopped while sending")
		}
		if err != nil {
			return c.lost(op, s, err)
		}
		return nil
	}
	j := &job{t: t, dt: dt, op: rop, id: id, base: base, src: src, cs: cs, n: (len(src) + cs - 1) / cs,
		owner: c, name: op, done: make(chan struct{})}
	k := min(j.n, len(c.socks))
	start := int(c.rr.Add(1))
	j.left.Store(int32(k))
	for i := 0; i < k; i++ {
		go j.run(c.socks[(start+i)%len(c.socks)])
	}
	done := j.done
	select {
	case <-done:
	case <-stop:
		select {
		case <-done: // finished anyway
		default:
			c.fail(c.errorf(op, base, int64(len(src)), aborted(op, "stop closed"),
				"stopped while its bytes were going out; a half-sent frame cannot be recalled, so the channel is closed"), true)
			<-done
			return c.errorf(op, base, int64(len(src)), aborted(op, "stop closed"), "stopped while sending")
		}
	}
	if p := j.err.Load(); p != nil {
		return *p
	}
	return nil
}

// Write copies src into the peer's memory at dst. It returns once the bytes
// are handed to the kernel; ordering with later operations is kept by the
// ordering vector (see the package doc).
func (c *conn) Write(stop <-chan struct{}, dst device.Ptr, src []byte) error {
	if err := c.usable("Write", stop, uint64(dst), int64(len(src))); err != nil || len(src) == 0 {
		return err
	}
	if err := c.sendData("Write", stop, frameWrite, 0, 0, 0, uint64(dst), src); err != nil {
		return c.wrap("Write", uint64(dst), int64(len(src)), err)
	}
	return nil
}

// WriteReduce computes peer[dst] = peer[dst] op src over count elements; the
// peer applies it chunk by chunk as the bytes arrive.
func (c *conn) WriteReduce(stop <-chan struct{}, dst device.Ptr, src []byte, count int, dt reduce.DataType, op reduce.Op) error {
	const name = "WriteReduce"
	if err := c.usable(name, stop, uint64(dst), int64(len(src))); err != nil {
		return err
	}
	if !dt.Valid() || !op.Valid() || count < 0 || count > len(src)/max(dt.Size(), 1) {
		return c.errorf(name, uint64(dst), int64(len(src)), nil, "%d elements of %v (%v) do not fit %d source bytes", count, dt, op, len(src))
	}
	src = src[:count*dt.Size()]
	if len(src) == 0 {
		return nil
	}
	if err := c.sendData(name, stop, frameWriteReduce, dt, op, 0, uint64(dst), src); err != nil {
		return c.wrap(name, uint64(dst), int64(len(src)), err)
	}
	return nil
}

// NotifyRecord records the peer's notify idx. It returns once the frame is
// handed to the kernel; the peer sets the notify only after it applied every
// frame written on the channel before it.
func (c *conn) NotifyRecord(stop <-chan struct{}, idx int) error {
	if err := c.usable("NotifyRecord", stop, 0, 0); err != nil {
		return err
	}
	if idx < 0 || idx >= c.peerNN {
		return c.errorf("NotifyRecord", 0, 0, nil, "rank %d has no notify %d on this channel (it has %d)", c.peer, idx, c.peerNN)
	}
	if err := c.sendSmall("NotifyRecord", stop, frameNotify, uint64(idx), 0, 0, c.vector()); err != nil {
		return c.wrap("NotifyRecord", 0, 0, err)
	}
	return nil
}

// WriteWithNotify copies src into the peer's memory at dst and then records
// the peer's notify idx (channel.WriteNotifier). A write that fits one frame
// goes out with its NOTIFY in one system call on one socket, so that the peer
// reads both with one wake-up; a larger one is Write, then NotifyRecord. The
// frames are the same either way (spec.md).
func (c *conn) WriteWithNotify(stop <-chan struct{}, dst device.Ptr, src []byte, idx int) error {
	return c.writeWithNotify("WriteWithNotify", stop, dst, [][]byte{src}, len(src), idx)
}

// ChecksOnReceipt reports that this end's peer checks every write against
// the memory it has registered when the write arrives (recv.go's local), so
// that a write may target a range registered after the channel was made
// (channel.ReceiverChecker).
func (c *conn) ChecksOnReceipt() bool { return true }

// WriteVWithNotify copies the concatenation of srcs into the peer's memory
// from dst on and then records the peer's notify idx
// (channel.WriteVNotifier): as WriteWithNotify, one WRITE frame and its
// NOTIFY in one system call when they fit a frame, the pieces gathered by
// writev instead of copied together first.
func (c *conn) WriteVWithNotify(stop <-chan struct{}, dst device.Ptr, srcs [][]byte, idx int) error {
	total := 0
	for _, b := range srcs {
		total += len(b)
	}
	return c.writeWithNotify("WriteVWithNotify", stop, dst, srcs, total, idx)
}

func (c *conn) writeWithNotify(op string, stop <-chan struct{}, dst device.Ptr, srcs [][]byte, total, idx int) error {
	if total == 0 || total > c.chunkSize(total) || len(srcs) > maxParts {
		at := dst
		for _, b := range srcs {
			if err := c.Write(stop, at, b); err != nil {
				return err
			}
			at = at.Add(int64(len(b)))
		}
		return c.NotifyRecord(stop, idx)
	}
	if err := c.usable(op, stop, uint64(dst), int64(total)); err != nil {
		return err
	}
	if idx < 0 || idx >= c.peerNN {
		return c.errorf(op, 0, 0, nil, "rank %d has no notify %d on this channel (it has %d)", c.peer, idx, c.peerNN)
	}
	s := c.lockSock()
	vec := c.dataVector(s, uint64(dst), total)
	s.watchLazy(c, op, stop)
	err := s.writePair(c, uint64(dst), vec, srcs, uint64(idx))
	fired := s.watchDone()
	if err == nil && !fired {
		c.noteData(s, s.sent.Load()-1, uint64(dst), total, vec) // the WRITE, before its NOTIFY
	}
	s.wmu.Unlock()
	if fired {
		return c.errorf(op, uint64(dst), int64(total), aborted(op, "stop closed"), "stopped while sending")
	}
	if err != nil {
		return c.wrap(op, uint64(dst), int64(total), c.lost(op, s, err))
	}
	return nil
}
