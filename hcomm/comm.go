package hcomm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/channel/inproc"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/bootstrap"
	"github.com/hcomm-dev/hcomm/internal/procs"
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
	health    *health     // loss watcher of a multi-process communicator; nil for InitAll
	async     *asyncErr   // GetCommAsyncError's record; a sub-communicator's is its parent's
	revoke    *revocation // Revoke's state and its watch on the other ranks' (revoke.go)
	// stopped ends when Abort or Destroy is called (stop): the blocking
	// setups of the communicator (ChannelAcquire, Split) watch it.
	stopped context.Context
	stop    context.CancelFunc

	mu      sync.Mutex
	closed  bool
	aborted bool
	// suspended: Suspend released the channels and the HCCL buffer
	// (suspend.go); buf is 0 until Resume.
	suspended bool
	// unusable is set, under the lock of the field that says why, once the
	// communicator is destroyed, aborted or has lost a rank; usable reads
	// it without a lock and takes the locks only when it is set.
	unusable atomic.Bool
	channels map[chanKey]*Channel
	attempts map[chanKey]int // channel setups started per key: the exchange's call counter
	inflight map[chanKey]*acquireCall
	dialers  map[string]channel.Dialer
	// custom carries every channel when set (InitAllOver, custom.go), and
	// localCost is its clock for local work, when it keeps one; a
	// sub-communicator has its parent's. Set before the communicator is
	// handed out, read without a lock.
	custom    channel.Dialer
	localCost channel.LocalCoster
	threads   []*Thread
	values    map[any]any
	trace     *tracer // the timeline (Config.TraceDir; trace.go), nil when none
	// napping caches naps (wait.go): 0 undecided, 1 yes, 2 no.
	napping atomic.Int32
	ops     opState // BeginOp's counter and what each thread issues (optag.go)
	// notifyWait is SetNotifyWaitTimeOut's value in nanoseconds; 0: unset.
	notifyWait atomic.Int64
	// valueSnap is a copy of values that Value reads without the lock:
	// a list, since a communicator holds a handful and comparing a key
	// with each costs less than hashing it.
	valueSnap atomic.Pointer[[]keyValue]

	// state is GetStatus's and RegCommStateCallback's (state.go).
	state stateMachine
}

// InitAll creates n communicators, one per rank, over devices 0..n-1 of this
// process (HcclCommInitAll). cfg may be nil. On error nothing is left open.
func InitAll(n int, cfg *Config) ([]*Comm, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	c, err := c.resolve()
	if err != nil {
		return nil, noRankErr("InitAll", c.Name, ErrPara, err, "")
	}
	if n <= 0 || n > device.MaxDevices {
		return nil, noRankErr("InitAll", c.Name, ErrPara, nil, "rank count %d is outside [1, %d]", n, device.MaxDevices)
	}
	if c, err = c.resolveNet(); err != nil {
		return nil, noRankErr("InitAll", c.Name, ErrPara, err, "")
	}
	store := bootstrap.NewMemStore()
	me := peerInfo{NRanks: n, Host: hostID(), ShmHost: shmHostID(), Proc: procToken, PID: os.Getpid(), CPUs: runtime.NumCPU(), CPUSet: procs.FormatList(procs.Affinity())}
	me.Hostname, _ = os.Hostname()
	secret, err := bootstrap.NewSecret()
	if err != nil {
		return nil, noRankErr("InitAll", c.Name, ErrSyscall, err, "")
	}
	boot := &bootState{store: store, fabric: inproc.NewFabric(), secret: secret, release: store.Close}
	if c.SocketIfname != "" { // tcp channels (HCOMM_TRANSPORT=tcp) bind to its address
		if boot.iface, err = bootstrap.PickIface(c.SocketIfname); err != nil {
			return nil, noRankErr("InitAll", c.Name, ErrNetwork, err, "")
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
	buf, err := dev.MallocLazy(bufSize) // committed as the collectives touch it
	if err != nil {
		if parent == nil {
			dev.Close()
		}
		return fail(ErrMemory, err)
	}
	cm := &Comm{name: c.Name, rank: rank, size: size, cfg: c, dev: dev, buf: buf, bufSize: bufSize, sharedDev: parent != nil,
		registry: &channel.Registry{}, boot: boot, channels: make(map[chanKey]*Channel), attempts: make(map[chanKey]int), inflight: make(map[chanKey]*acquireCall),
		dialers: make(map[string]channel.Dialer), values: make(map[any]any)}
	cm.stopped, cm.stop = context.WithCancel(context.Background())
	if err := cm.startTrace(); err != nil { // trace.go
		dev.Free(buf)
		if parent == nil {
			dev.Close()
		}
		cm.stop()
		return fail(ErrOpenFile, err)
	}
	cm.registry.Add(channel.Mem{Tag: "hccl buffer", Addr: buf, Size: bufSize})
	if parent != nil {
		cm.async = parent.async
		cm.custom, cm.localCost = parent.custom, parent.localCost
	} else {
		cm.async = &asyncErr{}
		cm.watchAsync() // asyncerr.go
	}
	cm.watchRevoke() // revoke.go
	cm.async.listen(cm, true)
	registerName(cm) // names.go
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
		return nilCommErr(op)
	}
	if !c.unusable.Load() {
		return nil // the data plane's fast path: no lock
	}
	return c.why(op)
}

// why returns the error saying why c cannot be used (destroyed, aborted,
// suspended, a lost rank), nil when it can.
func (c *Comm) why(op string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return c.errorf(op, -1, ErrUnavail, nil, "communicator is destroyed")
	}
	if c.aborted {
		return c.errorf(op, -1, ErrUnavail, ErrAborted, "")
	}
	if c.suspended {
		return c.errorf(op, -1, ErrSuspending, nil, "communicator is suspended: Resume it first")
	}
	if err := c.revokedCheck(op); err != nil {
		return err
	}
	return c.lostCheck(op)
}

// GetHcclBuffer returns the communicator's HCCL buffer (HcclGetHcclBuffer):
// device memory owned by the communicator, 2 × BufferSize bytes, never to be
// freed by the caller. Its pages are committed as they are first touched
// (device.MallocLazy): the collectives use the slots of the peers they talk
// to, and the rest costs address space only. Peers may write into it through channels at any time a
// handshake allows.
func (c *Comm) GetHcclBuffer() (device.Ptr, int64, error) {
	if err := c.usable("GetHcclBuffer"); err != nil {
		return 0, 0, err
	}
	return c.buf, c.bufSize, nil
}

// keyValue is one of Value's pairs.
type keyValue struct{ k, v any }

// Value returns the value stored under key, calling init to create it on
// first use: per-communicator state for the libraries built on hcomm (the
// collectives keep their schedules' counters here). Values are dropped by
// Destroy; a value with a Close() method is closed then. key must be
// comparable.
func (c *Comm) Value(key any, init func() any) any {
	// Every collective looks its state up here: the common case reads a
	// snapshot without a lock; storing a value copies the map.
	if m := c.valueSnap.Load(); m != nil {
		for _, kv := range *m {
			if kv.k == key {
				return kv.v
			}
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
		m := make([]keyValue, 0, len(c.values))
		for k, x := range c.values {
			m = append(m, keyValue{k, x})
		}
		c.valueSnap.Store(&m)
	}
	return v
}

// Abort makes every pending operation of the communicator fail promptly: the
// streams of its threads are aborted (pending waits end with an error wrapping
// ErrAborted and device.ErrStreamAbort), a ChannelAcquire or Split waiting
// for its peers returns such an error, and later calls fail with ErrUnavail.
// It does not wait for peers. Destroy is still needed afterwards. Idempotent.
func (c *Comm) Abort() error {
	if c == nil {
		return nilCommErr("Abort")
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
	c.setState(StatusError)
	c.stop()
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
		return nilCommErr("Destroy")
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.unusable.Store(true)
	unregisterName(c)      // names.go
	defer c.finishStates() // state.go: StatusDestroyed, once everything is freed
	c.stop()               // a setup still waiting for its peers ends
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
	c.unwatchRevoke()
	for _, ch := range chs {
		ch.tr.Close()
	}
	for _, d := range dls {
		d.Close()
	}
	c.boot.unref()
	// The timeline ends after the threads' last tasks (trace.go).
	traced := c.flushTrace()
	if c.sharedDev { // a sub-communicator: the device context is its parent's
		if c.buf == 0 { // suspended: freed then
			return traced
		}
		return errors.Join(traced, c.dev.Free(c.buf))
	}
	return errors.Join(traced, c.dev.Close())
}

// setupCtx bounds a blocking setup call of c (ChannelAcquire, Split): it
// ends with ctx, after Config.ConnectTimeout (HCCL_CONNECT_TIMEOUT), at Abort
// or Destroy, when c learns of a lost rank, and when c is revoked. Call done
// when the setup is over.
func (c *Comm) setupCtx(ctx context.Context) (_ context.Context, done func()) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ConnectTimeout)
	unstop := context.AfterFunc(c.stopped, cancel)
	unloss := c.stopOnLoss(cancel)
	unrevoke := context.AfterFunc(c.revoke.ctx, cancel)
	return ctx, func() {
		unstop()
		unloss()
		unrevoke()
		cancel()
	}
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
