package tcp

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/reduce"
	"github.com/hcomm-dev/hcomm/notify"
)

const (
	// minChunk is the smallest chunk a split operation is cut into (unless
	// Options.ChunkSize is smaller): below it, the cost of waking another
	// sender outweighs a second socket.
	minChunk = 256 << 10
	// maxPending bounds the ordered frames (NOTIFY, READ, FENCE) a peer may
	// leave waiting for earlier frames; more is a protocol violation.
	maxPending = 1 << 16
	// closeGrace bounds how long Close waits for the peer to see its CLOSE.
	closeGrace = 2 * time.Second
	// watchDelay is how long a one-frame write runs before its watchdog
	// starts to look at the caller's stop channel (every millisecond).
	watchDelay = 2 * time.Millisecond
	// errorGrace is how long a reader whose socket ended waits for another
	// socket to bring the peer's ERROR frame before it reports the loss.
	errorGrace = 100 * time.Millisecond
)

// sock is one socket of a channel.
type sock struct {
	idx int
	nc  net.Conn

	wmu  sync.Mutex      // serialises frames on the socket
	hdr  [headerLen]byte // under wmu
	hdr2 [headerLen]byte // under wmu: the second frame of writePair
	vec  [4][]byte       // under wmu
	ovec []byte          // under wmu: writePair's ordering vector
	sent atomic.Uint64   // frames written; changes under wmu

	// The watchdog of a one-frame write that may block (writeWatched). wt
	// and wexit are set up and armed under wmu; wdog guards the rest
	// against the watchdog's goroutine.
	wt     *time.Timer
	wexit  chan struct{} // capacity 1: one token per run of the watchdog
	wdog   sync.Mutex
	wstop  <-chan struct{}
	wop    string
	wbusy  bool
	wfired bool

	applied   atomic.Uint64 // frames read and fully applied
	lastRx    atomic.Int64  // unix nanoseconds of the last frame read
	lastTx    atomic.Int64  // unix nanoseconds of the last frame written
	sendSince atomic.Int64  // unix nanoseconds a write began; 0 while idle
	closedBy  atomic.Bool   // the peer sent CLOSE on this socket
}

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

// ordered is a NOTIFY, READ or FENCE waiting until the frames its sender
// wrote before it are applied.
type ordered struct {
	t    frameType
	vec  []uint64
	id   uint64
	addr uint64
	size uint64
}

// task is work for the responder: a READ to answer or a FENCE to acknowledge.
type task struct {
	t    frameType
	id   uint64
	addr uint64
	size uint64
}

// conn is the Transport of one tcp channel.
type conn struct {
	log      *slog.Logger
	rank     int
	peer     int
	name     string
	dev      *device.Device
	reg      *channel.Registry
	hccl     channel.Mem
	notifies []*notify.Notify
	peerNN   int
	chunk    int
	timeout  time.Duration
	socks    []*sock

	rr     atomic.Uint32
	nextID atomic.Uint64

	mu      sync.Mutex
	err     error
	dead    chan struct{}
	closing atomic.Bool

	pmu   sync.Mutex
	pend  []*ordered
	npend atomic.Int32

	rmu    sync.Mutex
	reads  map[uint64]*pendingRead
	fences map[uint64]chan struct{}

	qmu   sync.Mutex
	queue []task
	qsig  chan struct{}

	readers   sync.WaitGroup
	wg        sync.WaitGroup
	closeOnce sync.Once
}

func newConn(d *Dialer, local *channel.Local, name string, notifies []*notify.Notify, peerNN int, ncs []net.Conn) *conn {
	c := &conn{log: d.log, rank: local.Rank, peer: local.Peer, name: name, dev: local.Device, reg: local.Registry,
		hccl: local.HCCLBuf, notifies: notifies, peerNN: peerNN, chunk: d.opts.ChunkSize, timeout: d.opts.PeerTimeout,
		dead: make(chan struct{}), reads: make(map[uint64]*pendingRead), fences: make(map[uint64]chan struct{}),
		qsig: make(chan struct{}, 1)}
	now := time.Now().UnixNano()
	for i, nc := range ncs {
		s := &sock{idx: i, nc: nc}
		s.lastRx.Store(now)
		s.lastTx.Store(now)
		c.socks = append(c.socks, s)
	}
	c.start()
	return c
}

// start launches the channel's goroutines: a reader per socket, the
// responder and the liveness monitor. Close stops and waits for all of them.
func (c *conn) start() {
	for _, s := range c.socks {
		c.readers.Add(1)
		c.wg.Add(1)
		go c.readLoop(s)
	}
	c.wg.Add(2)
	go c.respond()
	go c.monitor()
}

// Name returns "tcp".
func (c *conn) Name() string { return "tcp" }

func (c *conn) errorf(op string, addr uint64, size int64, err error, format string, args ...any) *Error {
	return &Error{Op: op, Rank: c.rank, Peer: c.peer, Addr: addr, Size: size, Msg: fmt.Sprintf(format, args...), Err: err}
}

// aborted is the cause of a call that stop ended: a device error with the
// stream-abort code, as a stream task reports it.
func aborted(op, why string) error {
	return &device.Error{Op: "tcp." + op, Device: -1, Stream: -1, Code: device.ErrStreamAbort, Msg: why}
}

// failure returns the error that killed the channel, or nil.
func (c *conn) failure() error {
	select {
	case <-c.dead:
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.err
	default:
		return nil
	}
}

// usable checks, before an operation starts, that the channel is alive and
// the caller has not been stopped.
func (c *conn) usable(op string, stop <-chan struct{}, addr uint64, size int64) error {
	if err := c.failure(); err != nil {
		return c.errorf(op, addr, size, err, "channel is down")
	}
	select {
	case <-stop:
		return c.errorf(op, addr, size, aborted(op, "stop closed"), "stopped before it started")
	default:
		return nil
	}
}

// fail kills the channel with err (the first error wins): every socket is
// closed, every local notify is broken, every waiting call returns. With tell
// set it first tries to send the peer an ERROR frame saying why.
func (c *conn) fail(err error, tell bool) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	close(c.dead)
	c.mu.Unlock()
	if c.closing.Load() {
		c.log.Debug("tcp: channel closed", "channel", c.name, "rank", c.rank, "peer", c.peer)
	} else {
		c.log.Warn("tcp: channel failed", "channel", c.name, "rank", c.rank, "peer", c.peer, "err", err)
	}
	if tell {
		c.tellPeer(err.Error())
	}
	for _, s := range c.socks {
		s.nc.Close()
	}
	for _, n := range c.notifies {
		n.Break(err)
	}
}

// tellPeer sends an ERROR frame on every socket free at once (so that each
// of the peer's readers meets it before the end of its stream), with a short
// deadline; it gives up quietly.
func (c *conn) tellPeer(msg string) {
	if len(msg) > maxErrorText {
		msg = msg[:maxErrorText]
	}
	deadline := time.Now().Add(200 * time.Millisecond)
	for _, s := range c.socks {
		if !s.wmu.TryLock() {
			continue
		}
		s.nc.SetWriteDeadline(deadline)
		s.writeFrame(frameError, 0, 0, 0, 0, 0, []byte(msg))
		s.wmu.Unlock()
	}
}

// --- sending ---

// writeFrame writes one frame; the caller holds s.wmu.
func (s *sock) writeFrame(t frameType, dt reduce.DataType, op reduce.Op, id, addr, size uint64, payload []byte) error {
	h := header(s.hdr[:])
	h.encode(t, dt, op, uint32(len(payload)), id, addr, size)
	now := time.Now().UnixNano()
	s.sendSince.Store(now)
	var err error
	if len(payload) == 0 {
		_, err = s.nc.Write(h)
	} else {
		s.vec[0], s.vec[1] = h, payload
		bufs := net.Buffers(s.vec[:2])
		_, err = bufs.WriteTo(s.nc)
		s.vec[1] = nil
	}
	s.sendSince.Store(0)
	s.lastTx.Store(now)
	s.sent.Add(1)
	return err
}

// writePair writes a WRITE frame of payload at addr and the NOTIFY frame of
// notify idx that follows it, in one system call; the caller holds s.wmu.
// The notify's ordering vector counts the write (on this socket) and the
// frames already sent on the others, as c.vector would after the write.
func (s *sock) writePair(c *conn, addr uint64, payload []byte, idx uint64) error {
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
	h := header(s.hdr[:])
	h.encode(frameWrite, 0, 0, uint32(len(payload)), 0, addr, 0)
	h2 := header(s.hdr2[:])
	h2.encode(frameNotify, 0, 0, uint32(len(s.ovec)), idx, 0, 0)
	now := time.Now().UnixNano()
	s.sendSince.Store(now)
	s.vec = [4][]byte{h, payload, h2, s.ovec}
	bufs := net.Buffers(s.vec[:])
	_, err := bufs.WriteTo(s.nc)
	s.vec = [4][]byte{}
	s.sendSince.Store(0)
	s.lastTx.Store(now)
	s.sent.Add(2)
	return err
}

// writeWatched writes one frame like writeFrame, for a caller that may be
// stopped: a write still going out after watchDelay (the peer stopped
// reading and the kernel buffers are full) is watched, and when stop closes
// the channel is killed, which ends the write; half a frame cannot be taken
// back. It reports whether that happened. The caller holds s.wmu.
//
// Why a timer and not a goroutine per write: almost every write is done in
// microseconds, and a reused timer costs no allocation.
func (s *sock) writeWatched(c *conn, op string, stop <-chan struct{}, t frameType, dt reduce.DataType, rop reduce.Op, id, addr, size uint64, payload []byte) (bool, error) {
	if stop == nil {
		return false, s.writeFrame(t, dt, rop, id, addr, size, payload)
	}
	s.watchStart(c, op, stop)
	err := s.writeFrame(t, dt, rop, id, addr, size, payload)
	return s.watchEnd(), err
}

// watchStart arms the watchdog of a write that stop may end; watchEnd
// disarms it and reports whether it fired. The caller holds s.wmu.
func (s *sock) watchStart(c *conn, op string, stop <-chan struct{}) {
	if s.wt == nil {
		s.wexit = make(chan struct{}, 1)
		s.wt = time.AfterFunc(time.Hour, func() { s.watchdog(c) })
		s.wt.Stop()
	}
	s.wdog.Lock()
	s.wstop, s.wop, s.wbusy, s.wfired = stop, op, true, false
	s.wdog.Unlock()
	s.wt.Reset(watchDelay)
}

func (s *sock) watchEnd() bool {
	s.wdog.Lock()
	s.wbusy = false
	s.wdog.Unlock()
	if !s.wt.Stop() {
		<-s.wexit // the watchdog ran: wait until it is gone
	}
	s.wdog.Lock()
	fired := s.wfired
	s.wstop = nil
	s.wdog.Unlock()
	return fired
}

// watchdog runs on the timer's goroutine while a watched write is slow: it
// polls the writer's stop channel until the write ends.
func (s *sock) watchdog(c *conn) {
	defer func() { s.wexit <- struct{}{} }()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		s.wdog.Lock()
		busy, stop, op := s.wbusy, s.wstop, s.wop
		s.wdog.Unlock()
		if !busy {
			return
		}
		select {
		case <-stop:
			s.wdog.Lock()
			fired := s.wbusy
			s.wfired = fired
			s.wdog.Unlock()
			if fired {
				c.fail(c.errorf(op, 0, 0, aborted(op, "stop closed"),
					"stopped while a frame was going out on socket %d; half a frame cannot be recalled, so the channel is closed", s.idx), true)
			}
			return
		case <-tick.C:
		}
	}
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

// sendSmall writes one frame on some socket; see writeWatched for stop.
func (c *conn) sendSmall(op string, stop <-chan struct{}, t frameType, id, addr, size uint64, payload []byte) error {
	s := c.lockSock()
	fired, err := s.writeWatched(c, op, stop, t, 0, 0, id, addr, size, payload)
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

// lost turns a socket error into the channel's failure and returns it.
func (c *conn) lost(op string, s *sock, err error) error {
	if e := c.failure(); e != nil {
		return e
	}
	var cause error = channel.ErrPeerLost
	if c.closing.Load() {
		cause = channel.ErrClosed
	}
	e := c.errorf(op, 0, 0, cause, "socket %d (%v -> %v): %v", s.idx, s.nc.LocalAddr(), s.nc.RemoteAddr(), err)
	c.fail(e, false)
	return c.failure()
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
		s.wmu.Lock()
		err := s.writeFrame(j.t, j.dt, j.op, j.id, j.base+uint64(off), 0, p)
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
		fired, err := s.writeWatched(c, op, stop, t, dt, rop, id, base, 0, src)
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

// wrap returns err when it already is an *Error, else wraps it.
func (c *conn) wrap(op string, addr uint64, size int64, err error) error {
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	return c.errorf(op, addr, size, err, "")
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
	if len(src) == 0 || len(src) > c.chunkSize(len(src)) {
		if err := c.Write(stop, dst, src); err != nil {
			return err
		}
		return c.NotifyRecord(stop, idx)
	}
	const op = "WriteWithNotify"
	if err := c.usable(op, stop, uint64(dst), int64(len(src))); err != nil {
		return err
	}
	if idx < 0 || idx >= c.peerNN {
		return c.errorf(op, 0, 0, nil, "rank %d has no notify %d on this channel (it has %d)", c.peer, idx, c.peerNN)
	}
	s := c.lockSock()
	var err error
	fired := false
	if stop == nil {
		err = s.writePair(c, uint64(dst), src, uint64(idx))
	} else {
		s.watchStart(c, op, stop)
		err = s.writePair(c, uint64(dst), src, uint64(idx))
		fired = s.watchEnd()
	}
	s.wmu.Unlock()
	if fired {
		return c.errorf(op, uint64(dst), int64(len(src)), aborted(op, "stop closed"), "stopped while sending")
	}
	if err != nil {
		return c.wrap(op, uint64(dst), int64(len(src)), c.lost(op, s, err))
	}
	return nil
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

// Close tells the peer the channel ends (a CLOSE frame on every socket, after
// everything sent before), waits briefly for the peer to close its side,
// then closes the sockets and waits for the channel's goroutines. Waits on
// the channel's notifies fail with channel.ErrClosed. Idempotent.
func (c *conn) Close() error {
	c.closeOnce.Do(func() {
		c.closing.Store(true)
		if c.failure() == nil {
			deadline := time.Now().Add(closeGrace)
			for _, s := range c.socks {
				s.nc.SetWriteDeadline(deadline) // a writer stuck on a full buffer gives up
				s.wmu.Lock()
				s.writeFrame(frameClose, 0, 0, 0, 0, 0, nil)
				s.wmu.Unlock()
				if tc, ok := s.nc.(*net.TCPConn); ok {
					tc.CloseWrite()
				}
			}
			readersDone := make(chan struct{})
			c.wg.Add(1)
			go func() {
				defer c.wg.Done()
				c.readers.Wait()
				close(readersDone)
			}()
			t := time.NewTimer(closeGrace)
			select {
			case <-readersDone:
			case <-t.C:
			}
			t.Stop()
		}
		c.fail(c.errorf("Close", 0, 0, channel.ErrClosed, "channel closed by rank %d", c.rank), false)
		c.wg.Wait()
	})
	return nil
}

// --- receiving ---

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

// monitor sends heartbeats on idle sockets and fails the channel when the
// peer has been silent, or a send stuck, for longer than the peer timeout.
func (c *conn) monitor() {
	defer c.wg.Done()
	tick := time.NewTicker(max(c.timeout/4, time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-c.dead:
			return
		case <-tick.C:
		}
		now := time.Now()
		for _, s := range c.socks {
			if rx := time.Unix(0, s.lastRx.Load()); now.Sub(rx) > c.timeout && !s.closedBy.Load() {
				c.fail(c.errorf("heartbeat", 0, 0, channel.ErrPeerLost, "socket %d heard nothing from rank %d for %v (peer timeout %v)",
					s.idx, c.peer, now.Sub(rx).Round(time.Millisecond), c.timeout), true)
				return
			}
			if since := s.sendSince.Load(); since != 0 && now.Sub(time.Unix(0, since)) > c.timeout {
				c.fail(c.errorf("heartbeat", 0, 0, channel.ErrPeerLost, "a send on socket %d has been stuck for more than %v: rank %d stopped reading",
					s.idx, c.timeout, c.peer), false)
				return
			}
			if now.Sub(time.Unix(0, s.lastTx.Load())) >= c.timeout/4 && s.wmu.TryLock() {
				s.nc.SetWriteDeadline(now.Add(c.timeout))
				err := s.writeFrame(framePing, 0, 0, 0, 0, 0, nil)
				s.nc.SetWriteDeadline(time.Time{})
				s.wmu.Unlock()
				if err != nil {
					c.lost("heartbeat", s, err)
					return
				}
			}
		}
	}
}
