package tcp

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/notify"
)

// This file holds the channel itself: its sockets, its state, how it starts,
// fails and closes. send.go, recv.go, order.go and liveness.go hold the rest
// of the transport (spec.md §2-4).

// closeGrace bounds how long Close waits for the peer to see its CLOSE.
const closeGrace = 2 * time.Second

// sock is one socket of a channel.
type sock struct {
	idx int
	nc  net.Conn

	wmu  sync.Mutex           // serialises frames on the socket
	hdr  [headerLen]byte      // under wmu
	hdr2 [headerLen]byte      // under wmu: the second frame of writePair
	vec  [maxParts + 5][]byte // under wmu
	ovec []byte               // under wmu: writePair's ordering vector
	sent atomic.Uint64        // frames written; changes under wmu

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

	applied atomic.Uint64 // frames read and fully applied
	// Liveness counts, not clocks: the monitor (liveness.go) notes when
	// they last moved, so a frame costs no read of the clock.
	wseq     atomic.Uint64 // frame writes begun and ended: odd while one is under way
	closedBy atomic.Bool   // the peer sent CLOSE on this socket

	// The receiving side (rx.go, progress.go). rtok is the receive token:
	// its holder alone reads the socket and uses rx, rp, rn and rerr.
	rtok    sync.Mutex
	rx      rx
	rc      syscall.RawConn       // the descriptor, read without the network poller (nil: read nc, blocking)
	readFn  func(fd uintptr)      // rawRead of rp into rn, rerr: made once, so a read allocates nothing
	peekFn  func(fd uintptr) bool // rawReadable: the background reader's wait
	rp      []byte
	readvFn func(fd uintptr) // rawReadv of rv into rn, rerr (readSomeV)
	rv      [3][]byte
	riov    riovecs
	rn      int
	rerr    error
	got     atomic.Uint64 // reads that brought bytes: a poller's sign of progress (progress.go), the monitor's of life

	// The sending side's raw writes (rawsys_linux.go), under wmu: what is
	// left to write, the writev vector, the error, and the function given
	// to rc.Write (made once, so a write allocates nothing).
	wq      [][]byte
	iov     iovecs
	werr    error
	writeFn func(fd uintptr) bool
	tryFn   func(fd uintptr) // writeRaw once, without waiting: wdone says whether all went
	wdone   bool

	// The watched write under way (watchLazy), under wmu: the watchdog is
	// armed (wlArmed) only once the write has to wait for the kernel.
	wlConn  *conn
	wlOp    string
	wlStop  <-chan struct{}
	wlArmed bool
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
	spin     time.Duration // Options.Spin: how long Poll reads the sockets before it gives up
	nap      bool          // Options.Nap: a Read or Fence whose poll gave up naps (awaitNapping)
	yield    bool          // Options.Yield: Poll yields to other processes too
	tight    time.Duration // Options.Tight: how long Poll looks before it yields to other processes
	lostGap  time.Duration // lostProcessor (tests: 0, Poll never takes a gap for a busy host)
	rest     atomic.Bool   // a look of Poll found bytes on sockets past the first: the next looks read them all (progress.go)
	socks    []*sock

	rr     atomic.Uint32
	nextID atomic.Uint64

	mu      sync.Mutex
	err     error
	dead    chan struct{}
	closing atomic.Bool

	pmu      sync.Mutex
	pend     []*ordered
	npend    atomic.Int32
	amu      sync.Mutex   // pcond's lock (not pmu: fail, which wakes the readers, may run under pmu)
	pcond    *sync.Cond   // a reader blocked on an ordered data frame (awaitApplied)
	nblocked atomic.Int32 // readers blocked in awaitApplied

	dmu   sync.Mutex // the data log of order.go, sent data frames not yet ordered
	drecs [][]drec   // per socket: data frames sent on it, oldest first
	dover []drec     // per socket: the bounding range of records merged away (hi == 0: none)
	dsync [][]uint64 // dsync[s][t]: frames on socket s after its latest ordered data frame follow the first dsync[s][t] frames of socket t

	rmu    sync.Mutex
	reads  map[uint64]*pendingRead
	fences map[uint64]chan struct{}

	qmu   sync.Mutex
	queue []task
	qsig  chan struct{}

	steers [maxSteers]steer // steer.go
	nsteer atomic.Int32     // steers armed (the receive engine looks only when some are)

	readers   sync.WaitGroup
	wg        sync.WaitGroup
	closeOnce sync.Once
}

func newConn(d *Dialer, local *channel.Local, name string, notifies []*notify.Notify, peerNN int, ncs []net.Conn) *conn {
	c := &conn{log: d.log, rank: local.Rank, peer: local.Peer, name: name, dev: local.Device, reg: local.Registry,
		hccl: local.HCCLBuf, notifies: notifies, peerNN: peerNN, chunk: d.opts.ChunkSize, timeout: d.opts.PeerTimeout, spin: d.opts.Spin, yield: d.opts.Yield, tight: d.opts.Tight, nap: d.opts.Nap, lostGap: lostProcessor,
		dead: make(chan struct{}), reads: make(map[uint64]*pendingRead), fences: make(map[uint64]chan struct{}),
		qsig: make(chan struct{}, 1)}
	c.pcond = sync.NewCond(&c.amu)
	for i := range c.steers {
		c.steers[i].owner = c
	}
	c.drecs, c.dover, c.dsync = make([][]drec, len(ncs)), make([]drec, len(ncs)), make([][]uint64, len(ncs))
	for i := range c.dsync {
		c.dsync[i] = make([]uint64, len(ncs))
	}
	for i, nc := range ncs {
		s := &sock{idx: i, nc: nc, rc: rawConn(nc)}
		s.rx.buf = make([]byte, rxBufSize)
		s.readFn = func(fd uintptr) { s.rn, s.rerr = rawRead(int(fd), s.rp) }
		s.readvFn = func(fd uintptr) { s.rn, s.rerr = rawReadv(int(fd), &s.riov, &s.rv) }
		s.peekFn = func(fd uintptr) bool { return rawReadable(int(fd)) }
		s.writeFn = func(fd uintptr) bool { return s.writeRaw(int(fd)) }
		s.tryFn = func(fd uintptr) { s.wdone = s.writeRaw(int(fd)) }
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
	c.amu.Lock()
	c.pcond.Broadcast() // readers in awaitApplied
	c.amu.Unlock()
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

// wrap returns err when it already is an *Error, else wraps it.
func (c *conn) wrap(op string, addr uint64, size int64, err error) error {
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	return c.errorf(op, addr, size, err, "")
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
