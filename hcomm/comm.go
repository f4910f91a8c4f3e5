package hcomm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/channel/inproc"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/bootstrap"
	"github.com/hcomm-dev/hcomm/thread"
)

// Comm is one rank's communicator (HcclComm). It owns a device context, the
// HCCL buffer, and the channels and threads acquired through it.
//
// All methods are safe for concurrent use. Destroy and Abort are idempotent.
type Comm struct {
	name string
	rank int
	size int
	cfg  Config
	dev  *device.Device

	buf      device.Ptr
	bufSize  int64
	registry *channel.Registry
	boot     *bootState // rendezvous store, peers, inproc fabric (shared by an InitAll group)
	// sharedDev: the device context is the parent communicator's (a
	// sub-communicator); Destroy frees the HCCL buffer instead of closing it.
	sharedDev bool
	health    *health // loss watcher of a multi-process communicator; nil for InitAll

	mu      sync.Mutex
	closed  bool
	aborted bool
	// unusable is set, under the lock of the field that says why, once the
	// communicator is destroyed, aborted or has lost a rank; usable reads
	// it without a lock and takes the locks only when it is set.
	unusable atomic.Bool
	channels map[chanKey]*Channel
	attempts map[chanKey]int // channel setups started per key: the exchange's call counter
	inflight map[chanKey]*acquireCall
	dialers  map[string]channel.Dialer
	threads  []*Thread
	values   map[any]any
	ops      opState // BeginOp's counter and what each thread issues (metrics.go)
	// valueSnap is a copy of values that Value reads without the lock.
	valueSnap atomic.Pointer[map[any]any]
}

type chanKey struct {
	engine   Engine
	remote   int
	protocol Protocol
	tag      string
}

// Thread is a communication thread (ThreadHandle): a stream and its notifies.
type Thread = thread.Thread

// InitAll creates n communicators, one per rank, over devices 0..n-1 of this
// process (HcclCommInitAll). cfg may be nil. On error nothing is left open.
func InitAll(n int, cfg *Config) ([]*Comm, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	c, err := c.resolve()
	if err != nil {
		return nil, &Error{Op: "InitAll", Comm: c.Name, Rank: -1, Peer: -1, Code: ErrPara, Err: err}
	}
	if n <= 0 || n > device.MaxDevices {
		return nil, &Error{Op: "InitAll", Comm: c.Name, Rank: -1, Peer: -1, Code: ErrPara,
			Msg: fmt.Sprintf("rank count %d is outside [1, %d]", n, device.MaxDevices)}
	}
	if c, err = c.resolveNet(); err != nil {
		return nil, &Error{Op: "InitAll", Comm: c.Name, Rank: -1, Peer: -1, Code: ErrPara, Err: err}
	}
	store := bootstrap.NewMemStore()
	me := peerInfo{NRanks: n, Host: hostID(), ShmHost: shmHostID(), Proc: procToken, PID: os.Getpid()}
	me.Hostname, _ = os.Hostname()
	secret, err := bootstrap.NewSecret()
	if err != nil {
		return nil, &Error{Op: "InitAll", Comm: c.Name, Rank: -1, Peer: -1, Code: ErrSyscall, Err: err}
	}
	boot := &bootState{store: store, fabric: inproc.NewFabric(), secret: secret, release: store.Close}
	if c.SocketIfname != "" { // tcp channels (HCOMM_TRANSPORT=tcp) bind to its address
		if boot.iface, err = bootstrap.PickIface(c.SocketIfname); err != nil {
			return nil, &Error{Op: "InitAll", Comm: c.Name, Rank: -1, Peer: -1, Code: ErrNetwork, Err: err}
		}
	}
	for r := 0; r < n; r++ {
		me.Rank = r
		boot.peers = append(boot.peers, me)
	}
	comms := make([]*Comm, 0, n)
	for r := 0; r < n; r++ {
		cm, err := newComm("InitAll", c, r, n, r, boot)
		if err != nil {
			for _, x := range comms {
				x.Destroy()
			}
			return nil, err
		}
		comms = append(comms, cm)
	}
	return comms, nil
}

// newComm makes rank's communicator on device devID over boot, taking a
// reference on boot (released by Destroy; on error, by newComm itself).
func newComm(op string, c Config, rank, size, devID int, boot *bootState) (*Comm, error) {
	return newCommOn(op, c, rank, size, devID, nil, boot)
}

// newCommOn makes a communicator on device devID, or, when parent is not
// nil, on the parent's device context (a sub-communicator: it shares the
// parent's streams and reports its asynchronous errors with the parent's).
func newCommOn(op string, c Config, rank, size, devID int, parent *Comm, boot *bootState) (*Comm, error) {
	boot.mu.Lock()
	boot.refs++
	boot.mu.Unlock()
	fail := func(code Result, err error) (*Comm, error) {
		boot.unref()
		return nil, &Error{Op: op, Comm: c.Name, Rank: rank, Peer: -1, Code: code, Err: err}
	}
	c, err := c.withMetrics(rank, parent) // log.go
	if err != nil {
		return fail(ErrPara, err)
	}
	var dev *device.Device
	if parent != nil {
		dev = parent.dev
	} else if dev, err = device.Open(devID); err != nil {
		return fail(ErrRuntime, err)
	}
	bufSize := 2 * c.BufferSize
	buf, err := dev.Malloc(bufSize)
	if err != nil {
		if parent == nil {
			dev.Close()
		}
		return fail(ErrMemory, err)
	}
	cm := &Comm{name: c.Name, rank: rank, size: size, cfg: c, dev: dev, buf: buf, bufSize: bufSize, sharedDev: parent != nil,
		registry: &channel.Registry{}, boot: boot, channels: make(map[chanKey]*Channel), attempts: make(map[chanKey]int), inflight: make(map[chanKey]*acquireCall),
		dialers: make(map[string]channel.Dialer), values: make(map[any]any)}
	cm.registry.Add(channel.Mem{Tag: "hccl buffer", Addr: buf, Size: bufSize})
	if parent != nil {
		cm.shareAsync(parent) // asyncerr.go
	} else {
		cm.watchAsync()
	}
	cm.log(slog.LevelInfo, "communicator ready", "op", op, "size", size, "device", dev.ID(), "hccl_buffer_bytes", bufSize)
	return cm, nil
}

// Rank returns the communicator's rank (HcclGetRankId).
func (c *Comm) Rank() int { return c.rank }

// Size returns the number of ranks (HcclGetRankSize).
func (c *Comm) Size() int { return c.size }

// Name returns the communicator's name.
func (c *Comm) Name() string { return c.name }

// Device returns the device context the communicator runs on.
func (c *Comm) Device() *device.Device { return c.dev }

// Config returns the communicator's resolved configuration.
func (c *Comm) Config() Config { return c.cfg }

func (c *Comm) errorf(op string, peer int, code Result, cause error, format string, args ...any) *Error {
	msg := format
	if len(args) > 0 {
		msg = fmt.Sprintf(format, args...)
	}
	return &Error{Op: op, Comm: c.name, Rank: c.rank, Peer: peer, Code: code, Msg: msg, Err: cause}
}

// usable returns an error when the communicator is destroyed or aborted.
func (c *Comm) usable(op string) error {
	if c == nil {
		return &Error{Op: op, Rank: -1, Peer: -1, Code: ErrPtr, Msg: "nil communicator"}
	}
	if !c.unusable.Load() {
		return nil // the data plane's fast path: no lock
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return c.errorf(op, -1, ErrUnavail, nil, "communicator is destroyed")
	}
	if c.aborted {
		return c.errorf(op, -1, ErrUnavail, ErrAborted, "")
	}
	return c.lostCheck(op)
}

// GetHcclBuffer returns the communicator's HCCL buffer (HcclGetHcclBuffer):
// device memory owned by the communicator, 2 × BufferSize bytes, never to be
// freed by the caller. Peers may write into it through channels at any time a
// handshake allows.
func (c *Comm) GetHcclBuffer() (device.Ptr, int64, error) {
	if err := c.usable("GetHcclBuffer"); err != nil {
		return 0, 0, err
	}
	return c.buf, c.bufSize, nil
}

// MemHandle is memory registered with CommMemReg.
type MemHandle struct {
	comm *Comm
	mem  channel.Mem
}

// Mem returns the registered range.
func (h *MemHandle) Mem() channel.Mem { return h.mem }

// CommMemReg registers device memory so that peers may read and write it
// through channels (HcclCommMemReg). Channels acquired afterwards with the
// handle in ChannelDesc.MemHandles report it in ChannelGetRemoteMems; on
// transports that map memory (inproc) a registered range is reachable at once.
func (c *Comm) CommMemReg(tag string, p device.Ptr, size int64) (*MemHandle, error) {
	const op = "CommMemReg"
	if err := c.usable(op); err != nil {
		return nil, err
	}
	if len(tag) > 255 {
		return nil, c.errorf(op, -1, ErrPara, nil, "tag is %d bytes; at most 255", len(tag))
	}
	if _, err := c.dev.Bytes(p, size); err != nil || size <= 0 {
		return nil, c.errorf(op, -1, ErrPara, err, "range [%#x, +%d) is not live device memory of this rank", uintptr(p), size)
	}
	m := channel.Mem{Tag: tag, Addr: p, Size: size}
	c.registry.Add(m)
	return &MemHandle{comm: c, mem: m}, nil
}

// CommMemDereg undoes CommMemReg. Peers must have stopped using the memory.
func (c *Comm) CommMemDereg(h *MemHandle) error {
	if h == nil || h.comm != c {
		return c.errorf("CommMemDereg", -1, ErrPtr, nil, "handle does not belong to this communicator")
	}
	if !c.registry.Remove(h.mem.Addr, h.mem.Tag) {
		return c.errorf("CommMemDereg", -1, ErrNotFound, nil, "range [%#x, +%d) is not registered", uintptr(h.mem.Addr), h.mem.Size)
	}
	return nil
}

// ChannelDesc describes a channel to acquire (HcclChannelDesc). Start from
// ChannelDescInit.
type ChannelDesc struct {
	RemoteRank int      // the peer; -1 (HCCL's ~0U) until set
	Protocol   Protocol // ProtocolAuto lets hcomm pick
	NotifyNum  int      // local notifies on this channel (the index space of waits)
	MemHandles []*MemHandle
	// Tag separates channels to the same peer with the same protocol: HCCL keys
	// channels by (engine, remote rank, protocol); hcomm adds this tag so that
	// a library (the collectives) can keep channels of its own.
	Tag string
}

// ChannelDescInit returns n descriptors with HcclChannelDescInit's defaults:
// no remote rank, protocol unset (ProtocolAuto), no notifies, no memory.
func ChannelDescInit(n int) []ChannelDesc {
	d := make([]ChannelDesc, n)
	for i := range d {
		d[i] = ChannelDesc{RemoteRank: -1, Protocol: ProtocolAuto}
	}
	return d
}

// Channel is a channel handle: this rank's end of a connection to one peer.
type Channel struct {
	comm   *Comm
	engine Engine
	proto  Protocol
	ch     *channel.Channel
	remote []channel.Mem
}

// RemoteRank returns the peer's rank.
func (ch *Channel) RemoteRank() int { return ch.ch.Remote }

// Protocol returns the protocol the channel was acquired with.
func (ch *Channel) Protocol() Protocol { return ch.proto }

// Transport names the transport that carries the channel: "inproc", "shm"
// or "tcp" (see transport.go for how it is chosen).
func (ch *Channel) Transport() string { return ch.ch.Transport().Name() }

// NotifyNum returns the number of local notifies.
func (ch *Channel) NotifyNum() int { return ch.ch.NotifyNum() }

// ChannelAcquire gets or creates channels to the peers the descriptors name
// (HcclChannelAcquire). It is collective between the two ends of each channel:
// both must call it (in any order, within ConnectTimeout), and the call returns
// when every channel is connected; the channels of one call are set up
// concurrently, so the two ends may list them in any order. It is idempotent
// per (engine, remote rank, protocol, tag): a second call returns the same
// channel. Each channel's transport follows its protocol and where the peer
// runs (transport.go); a protocol that cannot reach the peer is ErrNotSupport.
func (c *Comm) ChannelAcquire(engine Engine, descs []ChannelDesc) ([]*Channel, error) {
	const op = "ChannelAcquire"
	if err := c.usable(op); err != nil {
		return nil, err
	}
	if !engine.supported() {
		return nil, c.errorf(op, -1, ErrNotSupport, nil, "engine %v is not supported: hcomm runs on the host (CPU, CPU_TS)", engine)
	}
	if len(descs) == 0 || len(descs) > 1<<20 {
		return nil, c.errorf(op, -1, ErrPara, nil, "channel count %d is outside (0, %d]", len(descs), 1<<20)
	}
	for i, d := range descs {
		switch {
		case d.RemoteRank < 0 || d.RemoteRank >= c.size:
			return nil, c.errorf(op, d.RemoteRank, ErrPara, nil, "descriptor %d: remote rank %d is outside [0, %d)", i, d.RemoteRank, c.size)
		case d.RemoteRank == c.rank:
			return nil, c.errorf(op, d.RemoteRank, ErrPara, nil, "descriptor %d: a channel to oneself", i)
		case d.NotifyNum < 0 || d.NotifyNum > thread.MaxNotifies:
			return nil, c.errorf(op, d.RemoteRank, ErrPara, nil, "descriptor %d: notify count %d is outside [0, %d]", i, d.NotifyNum, thread.MaxNotifies)
		}
		switch d.Protocol {
		case ProtocolAuto, ProtocolHCCS, ProtocolSIO, ProtocolHCCSOnly, ProtocolPCIE,
			ProtocolROCE, ProtocolUBCCTP, ProtocolUBCTP, ProtocolUBMem, ProtocolUBOE:
			if _, err := c.pickTransport(d.RemoteRank, d.Protocol); err != nil {
				return nil, c.errorf(op, d.RemoteRank, ErrNotSupport, err, "descriptor %d", i)
			}
		default:
			return nil, c.errorf(op, d.RemoteRank, ErrPara, nil, "descriptor %d: unknown protocol %d", i, int32(d.Protocol))
		}
		for _, h := range d.MemHandles {
			if h == nil || h.comm != c {
				return nil, c.errorf(op, d.RemoteRank, ErrPtr, nil, "descriptor %d: a memory handle of another communicator", i)
			}
		}
	}
	out := make([]*Channel, len(descs))
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.ConnectTimeout)
	defer cancel()
	defer c.stopOnLoss(cancel)() // a lost rank ends the setup at once
	// The channels are set up concurrently (at most acquireParallel at once),
	// so that no order of descriptors on the two ends can deadlock.
	errs := make([]error, len(descs))
	sem := make(chan struct{}, acquireParallel)
	var wg sync.WaitGroup
	for i, d := range descs {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			out[i], errs[i] = c.acquireOne(ctx, engine, d)
			if errs[i] != nil {
				cancel() // one failure fails the call: stop waiting for the rest
			}
		}()
	}
	wg.Wait()
	if err := c.lostCheck(op); err != nil {
		for _, e := range errs {
			if e != nil {
				return nil, err
			}
		}
	}
	for _, err := range errs { // the first failure, not one it caused
		if err != nil && !errors.Is(err, context.Canceled) {
			return nil, err
		}
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// acquireParallel bounds the channel setups one ChannelAcquire runs at once.
const acquireParallel = 1024

// acquireCall is a channel setup in flight; a concurrent acquire of the same
// key waits for it instead of starting a second one the peer would not match.
type acquireCall struct {
	done chan struct{}
	ch   *Channel
	err  error
}

func (c *Comm) acquireOne(ctx context.Context, engine Engine, d ChannelDesc) (*Channel, error) {
	k := chanKey{engine: engine, remote: d.RemoteRank, protocol: d.Protocol, tag: d.Tag}
	c.mu.Lock()
	if ch, ok := c.channels[k]; ok {
		c.mu.Unlock()
		return ch, nil
	}
	if call, ok := c.inflight[k]; ok {
		c.mu.Unlock()
		select {
		case <-call.done:
			return call.ch, call.err
		case <-ctx.Done():
			return nil, c.connectErr(ctx, d.RemoteRank, "", ctx.Err())
		}
	}
	call := &acquireCall{done: make(chan struct{})}
	c.inflight[k] = call
	attempt := c.attempts[k]
	c.attempts[k]++
	c.mu.Unlock()
	call.ch, call.err = c.setupChannel(ctx, k, attempt, d)
	c.mu.Lock()
	delete(c.inflight, k)
	c.mu.Unlock()
	close(call.done)
	return call.ch, call.err
}

// setupChannel runs one setup of the channel k (attempt: how many came before).
func (c *Comm) setupChannel(ctx context.Context, k chanKey, attempt int, d ChannelDesc) (*Channel, error) {
	const op = "ChannelAcquire"
	engine := k.engine
	name := fmt.Sprintf("comm %s rank %d channel to rank %d (%v", c.name, c.rank, d.RemoteRank, d.Protocol)
	if d.Tag != "" {
		name += ", " + d.Tag
	}
	name += ")"
	tname, err := c.pickTransport(d.RemoteRank, d.Protocol)
	if err != nil {
		return nil, c.errorf(op, d.RemoteRank, ErrNotSupport, err, "")
	}
	dl, err := c.dialer(tname)
	if err != nil {
		return nil, c.errorf(op, d.RemoteRank, ErrInternal, err, "%s transport", tname)
	}
	lo, hi := min(c.rank, d.RemoteRank), max(c.rank, d.RemoteRank)
	base := fmt.Sprintf("ch/%d-%d/%d/%d/%q/%d", lo, hi, engine, d.Protocol, d.Tag, attempt)
	ex := c.exchanger(base, d.RemoteRank)
	if err := handshake(ctx, ex, c.rank, d.RemoteRank, tname); err != nil {
		return nil, c.connectErr(ctx, d.RemoteRank, tname, err)
	}
	local := &channel.Local{Comm: c.name, Rank: c.rank, Peer: d.RemoteRank, Device: c.dev, Registry: c.registry,
		HCCLBuf: channel.Mem{Tag: "hccl buffer", Addr: c.buf, Size: c.bufSize}, NotifyNum: d.NotifyNum, Name: name}
	conn, err := dl.Connect(ctx, local, ex)
	if err != nil {
		return nil, c.connectErr(ctx, d.RemoteRank, tname, err)
	}
	if conn == nil || conn.Transport == nil || len(conn.Notifies) != d.NotifyNum || len(conn.RemoteMems) == 0 {
		if conn != nil && conn.Transport != nil {
			conn.Transport.Close()
		}
		return nil, c.errorf(op, d.RemoteRank, ErrInternal, nil, "%s transport returned an incomplete connection", tname)
	}
	ch := &Channel{comm: c, engine: engine, proto: d.Protocol,
		ch: channel.New(name, c.rank, d.RemoteRank, int32(d.Protocol), conn.Notifies, conn.PeerNotifyNum, conn.RemoteMems, conn.Transport)}
	ch.remote = conn.RemoteMems
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		conn.Transport.Close()
		return nil, c.errorf(op, d.RemoteRank, ErrUnavail, nil, "communicator destroyed during channel setup")
	}
	c.channels[k] = ch
	c.mu.Unlock()
	c.log(slog.LevelInfo, "channel up", "peer", d.RemoteRank, "transport", tname, "protocol", d.Protocol.String(), "notifies", d.NotifyNum, "tag", d.Tag)
	return ch, nil
}

// connectErr wraps a failed channel setup: a timeout when ctx ran out
// (HCCL_CONNECT_TIMEOUT), a connect error otherwise.
func (c *Comm) connectErr(ctx context.Context, peer int, tname string, err error) *Error {
	code := ErrTCPConnect
	switch {
	case ctx.Err() == context.DeadlineExceeded:
		code = ErrTimeout
	case tname != TransportTCP:
		code = ErrInternal
	}
	if tname == "" {
		tname = "a"
	}
	return c.errorf("ChannelAcquire", peer, code, err, "setting up %s channel to rank %d within HCCL_CONNECT_TIMEOUT %v", tname, peer, c.cfg.ConnectTimeout)
}

// ChannelGetHcclBuffer returns the peer's HCCL buffer as this channel knows
// it (HcclChannelGetHcclBuffer).
func (c *Comm) ChannelGetHcclBuffer(ch *Channel) (device.Ptr, int64, error) {
	if err := c.checkChannel("ChannelGetHcclBuffer", ch); err != nil {
		return 0, 0, err
	}
	m := ch.remote[0]
	return m.Addr, m.Size, nil
}

// ChannelGetRemoteMems returns the memory the peer had registered when the
// channel was acquired, HCCL buffer first (HcclChannelGetRemoteMems).
func (c *Comm) ChannelGetRemoteMems(ch *Channel) ([]channel.Mem, error) {
	if err := c.checkChannel("ChannelGetRemoteMems", ch); err != nil {
		return nil, err
	}
	return append([]channel.Mem(nil), ch.remote...), nil
}

func (c *Comm) checkChannel(op string, ch *Channel) error {
	if err := c.usable(op); err != nil {
		return err
	}
	if ch == nil || ch.comm != c {
		return c.errorf(op, -1, ErrPtr, nil, "channel is nil or belongs to another communicator")
	}
	return nil
}

// ThreadAcquire creates n threads, each a new stream with notifyNumPerThread
// notifies (HcclThreadAcquire). The communicator owns them: Destroy frees them.
func (c *Comm) ThreadAcquire(engine Engine, n, notifyNumPerThread int) ([]*Thread, error) {
	const op = "ThreadAcquire"
	if err := c.usable(op); err != nil {
		return nil, err
	}
	if !engine.supported() {
		return nil, c.errorf(op, -1, ErrNotSupport, nil, "engine %v is not supported: hcomm runs on the host (CPU, CPU_TS)", engine)
	}
	ts, err := thread.Acquire(c.dev, fmt.Sprintf("comm %s rank %d", c.name, c.rank), n, notifyNumPerThread)
	if err != nil {
		return nil, c.errorf(op, -1, ErrPara, err, "")
	}
	c.mu.Lock()
	c.threads = append(c.threads, ts...)
	c.mu.Unlock()
	return ts, nil
}

// ThreadAcquireWithStream wraps a stream the caller owns, which must belong to
// the communicator's device (HcclThreadAcquireWithStream). The caller
// synchronizes and destroys the stream.
func (c *Comm) ThreadAcquireWithStream(engine Engine, s *device.Stream, notifyNum int) (*Thread, error) {
	const op = "ThreadAcquireWithStream"
	if err := c.usable(op); err != nil {
		return nil, err
	}
	if !engine.supported() {
		return nil, c.errorf(op, -1, ErrNotSupport, nil, "engine %v is not supported: hcomm runs on the host (CPU, CPU_TS)", engine)
	}
	if s == nil || s.Device() != c.dev {
		return nil, c.errorf(op, -1, ErrPtr, nil, "stream is nil or belongs to another device context")
	}
	t, err := thread.WithStream(s, fmt.Sprintf("comm %s rank %d", c.name, c.rank), notifyNum)
	if err != nil {
		return nil, c.errorf(op, -1, ErrPara, err, "")
	}
	c.mu.Lock()
	c.threads = append(c.threads, t)
	c.mu.Unlock()
	return t, nil
}

// Value returns the value stored under key, calling init to create it on
// first use: per-communicator state for the libraries built on hcomm (the
// collectives keep their schedules' counters here). Values are dropped by
// Destroy; a value with a Close() method is closed then.
func (c *Comm) Value(key any, init func() any) any {
	// Every collective looks its state up here: the common case reads a
	// snapshot without a lock; storing a value copies the map.
	if m := c.valueSnap.Load(); m != nil {
		if v, ok := (*m)[key]; ok {
			return v
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.values == nil { // destroyed
		return nil
	}
	v, ok := c.values[key]
	if !ok && init != nil {
		v = init()
		c.values[key] = v
		m := make(map[any]any, len(c.values))
		for k, x := range c.values {
			m[k] = x
		}
		c.valueSnap.Store(&m)
	}
	return v
}

// Abort makes every pending operation of the communicator fail promptly: the
// streams of its threads are aborted (pending waits end with an error wrapping
// ErrAborted and device.ErrStreamAbort), and later calls fail with ErrUnavail.
// It does not wait for peers. Destroy is still needed afterwards. Idempotent.
func (c *Comm) Abort() error {
	if c == nil {
		return &Error{Op: "Abort", Rank: -1, Peer: -1, Code: ErrPtr, Msg: "nil communicator"}
	}
	c.mu.Lock()
	if c.aborted || c.closed {
		c.mu.Unlock()
		return nil
	}
	c.aborted = true
	c.unusable.Store(true)
	ts := append([]*Thread(nil), c.threads...)
	c.mu.Unlock()
	for _, t := range ts {
		t.Stream().Abort()
	}
	return nil
}

// Destroy waits for the work queued on the communicator's threads, frees its
// threads, channels and HCCL buffer, and closes its device context
// (HcclCommDestroy). To stop at once, Abort first. Idempotent.
func (c *Comm) Destroy() error {
	if c == nil {
		return &Error{Op: "Destroy", Rank: -1, Peer: -1, Code: ErrPtr, Msg: "nil communicator"}
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.unusable.Store(true)
	c.log(slog.LevelInfo, "destroying communicator", "channels", len(c.channels), "threads", len(c.threads))
	ts := c.threads
	chs := c.channels
	vals := c.values
	dls := c.dialers
	c.threads, c.channels, c.values, c.dialers = nil, nil, nil, nil
	c.valueSnap.Store(nil)
	c.mu.Unlock()
	for _, v := range vals {
		if cl, ok := v.(interface{ Close() error }); ok {
			cl.Close()
		}
	}
	for _, t := range ts {
		t.Free()
	}
	c.unwatch(chs)
	for _, ch := range chs {
		ch.ch.Close()
	}
	for _, d := range dls {
		d.Close()
	}
	c.boot.unref()
	c.forgetAsync()  // asyncerr.go
	if c.sharedDev { // a sub-communicator: the device context is its parent's
		return c.dev.Free(c.buf)
	}
	return c.dev.Close()
}

// execTimeout turns a wait's timeout into the one to use: <= 0 means the
// communicator's ExecTimeout; a negative ExecTimeout means forever (0 for notify).
func (c *Comm) execTimeout(t time.Duration) time.Duration {
	if t > 0 {
		return t
	}
	if c.cfg.ExecTimeout < 0 {
		return 0
	}
	return c.cfg.ExecTimeout
}

// Check returns nil when the communicator can be used, else an error saying
// why (destroyed, aborted).
func (c *Comm) Check() error { return c.usable("Check") }
