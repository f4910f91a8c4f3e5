package hcomm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/metrics"
	"github.com/hcomm-dev/hcomm/notify"
	"github.com/hcomm-dev/hcomm/thread"
)

// ChannelDesc describes a channel to acquire (HcclChannelDesc). Start from
// ChannelDescInit.
type ChannelDesc struct {
	RemoteRank int      // the peer; -1 (HCCL's ~0U) until set
	Protocol   Protocol // ProtocolAuto lets hcomm pick
	NotifyNum  int      // local notifies on this channel (the index space of waits)
	// MemHandles is memory of this rank the peer may use (HCCL's memory
	// handles); each must belong to this communicator. Every range
	// registered with CommMemReg is traded anyway (see CommMemReg).
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

// Channel is a channel handle (HCCL's ChannelHandle): this rank's end of a
// connection to one peer. It holds the transport that carries it, the local
// notifies the peer records into, how many notifies the peer's end has, and
// the memory the peer registered when the channel was acquired; the data
// plane checks every call against those (dataplane.go) before the transport
// acts. Safe for concurrent use; the communicator owns it (Destroy closes it).
type Channel struct {
	comm       *Comm
	engine     Engine
	proto      Protocol
	remote     int
	tr         channel.Transport
	notifies   []*notify.Notify // local: the peer records, this end waits
	peerNotify int              // how many notifies the peer's end has
	remoteMems []channel.Mem    // the peer's registered memory at acquire time, HCCL buffer first
	key        chanKey
	destroyed  atomic.Bool // ChannelDestroy released it
	// written and read count the bytes moved over the channel
	// (hcomm_transport_bytes_total's series for its transport), found once
	// when the channel is made; the zero metrics.Bytes without metrics.
	written, read metrics.Bytes
}

// RemoteRank returns the peer's rank.
func (ch *Channel) RemoteRank() int { return ch.remote }

// Protocol returns the protocol the channel was acquired with.
func (ch *Channel) Protocol() Protocol { return ch.proto }

// Transport names the transport that carries the channel: "inproc", "shm"
// or "tcp" (see transport.go for how it is chosen).
func (ch *Channel) Transport() string { return ch.tr.Name() }

// quick reports whether ch's writes, reads and records are stores into and
// loads from mapped memory (inproc, shm), which never wait for the peer:
// an eager thread runs them in the calling goroutine (Thread.LaunchNow).
func (ch *Channel) quick() bool {
	tr := ch.tr.Name()
	return tr == TransportInproc || tr == TransportShm
}

// Flagged reports whether ch's transport stores flagged words into the
// peer's memory (channel.FlagWriter: inproc and shm), so that
// WriteFlaggedNbi works on it. Safe for concurrent use.
func (ch *Channel) Flagged() bool {
	_, ok := ch.tr.(channel.FlagWriter)
	return ok
}

// TakesLent reports whether ch's transport lets its writes target memory
// the peer registered after the channel was made, checked against the
// peer's registered memory as they arrive (channel.ReceiverChecker: tcp,
// and inproc, whose copies look at the peer's registry as they run), so
// that WriteLentWithNotifyNbi works on it. Safe for concurrent use.
func (ch *Channel) TakesLent() bool {
	rc, ok := ch.tr.(channel.ReceiverChecker)
	return ok && rc.ChecksOnReceipt()
}

// ReadsLent reports whether ch reads memory the peer lent for one
// operation (channel.PeerReader: shm where the kernel lets the two
// processes read each other's memory), so that ReadLentNbi works on it. The
// same on both ends. Safe for concurrent use.
func (ch *Channel) ReadsLent() bool {
	pr, ok := ch.tr.(channel.PeerReader)
	return ok && pr.ReadsPeer()
}

// WritesPeerLent reports whether ch writes memory the peer lent for one
// operation through the peer's memory file or the kernel
// (channel.PeerWriter on a pair that reads lent memory: shm where the
// kernel lets the two processes), so that WritePeerLentNbi works on it. The
// same on both ends. Safe for concurrent use.
func (ch *Channel) WritesPeerLent() bool {
	_, ok := ch.tr.(channel.PeerWriter)
	return ok && ch.ReadsLent()
}

// NotifyNum returns the number of local notifies.
func (ch *Channel) NotifyNum() int { return len(ch.notifies) }

// ChannelAcquire gets or creates channels to the peers the descriptors name
// (HcclChannelAcquire). It is collective between the two ends of each channel:
// both must call it (in any order, within ConnectTimeout), and the call returns
// when every channel is connected; the channels of one call are set up
// concurrently, so the two ends may list them in any order. It is idempotent
// per (engine, remote rank, protocol, tag): a second call returns the same
// channel. Each channel's transport follows its protocol and where the peer
// runs (transport.go); a protocol that cannot reach the peer is ErrNotSupport.
//
// ChannelAcquire is ChannelAcquireContext with context.Background().
func (c *Comm) ChannelAcquire(engine Engine, descs []ChannelDesc) ([]*Channel, error) {
	return c.ChannelAcquireContext(context.Background(), engine, descs)
}

// ChannelAcquireContext is ChannelAcquire bounded by ctx as well: the setup
// ends at the first of ctx ending, ConnectTimeout (HCCL_CONNECT_TIMEOUT),
// Abort or Destroy, and a lost rank. A ctx that ends first fails the call
// with an *Error matching ctx's error (context.Canceled: code ErrUnavail;
// context.DeadlineExceeded: code ErrTimeout, Timeout() true); Abort, with one
// wrapping ErrAborted. The channels of the call that were set up stay with
// the communicator: a later call with the same descriptors returns them.
// When one end gives a setup up (timed out, cancelled) while the other has
// not reached it or waits in its exchange, the other end starts over and
// meets the first end's next call (see setupRetrying); when both ends fail,
// both retry. An end that gives up inside the transport's last handshake
// may leave the other end holding a channel whose far end is gone: its
// operations fail (the transport reports the peer lost, or a wait times
// out), and the communicator must be made anew.
func (c *Comm) ChannelAcquireContext(ctx context.Context, engine Engine, descs []ChannelDesc) ([]*Channel, error) {
	const op = "ChannelAcquire"
	if err := c.usable(op); err != nil {
		return nil, err
	}
	if ctx == nil {
		return nil, c.errorf(op, -1, ErrPara, nil, "nil context")
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
	ctx, done := c.setupCtx(ctx) // ConnectTimeout, Abort, Destroy or a lost rank end it too
	defer done()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
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
	if err := c.usable(op); err != nil { // aborted, destroyed, lost a rank
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
	c.mu.Unlock()
	call.ch, call.err = c.setupRetrying(ctx, k, d)
	c.mu.Lock()
	delete(c.inflight, k)
	c.mu.Unlock()
	close(call.done)
	return call.ch, call.err
}

// Each end numbers its setups of a channel (Comm.attempts), and the two ends
// meet on equal numbers: every exchange of setup n is keyed by n. An end
// whose setup fails — timed out, cancelled, aborted — publishes that it
// abandoned setup n; the other end, which may be in setup n or reach it
// later, sees that, drops its setup n and starts setup n+1, where the first
// end's next setup will meet it. Without this, a setup that failed on one
// end only would leave the two ends a number apart for good. What it cannot
// mend is a setup that completed on one end and failed on the other in the
// transport's last message (a party never knows whether its last message
// arrived): the completed end keeps a channel whose far end is gone.

// errPeerAbandoned is the cause of a setup ended by its peer's abandoning it.
var errPeerAbandoned = errors.New("the peer abandoned this setup of the channel")

// setupRetrying runs setups of the channel k until one succeeds or fails
// for a reason other than the peer's abandoning it, or ctx ends.
func (c *Comm) setupRetrying(ctx context.Context, k chanKey, d ChannelDesc) (*Channel, error) {
	for {
		c.mu.Lock()
		attempt := c.attempts[k]
		c.attempts[k]++
		c.mu.Unlock()
		ch, err := c.setupWatched(ctx, k, attempt, d)
		if err == nil || !errors.Is(err, errPeerAbandoned) || ctx.Err() != nil {
			return ch, err
		}
		c.log(slog.LevelInfo, "channel setup abandoned by the peer; starting the next", "peer", d.RemoteRank, "attempt", attempt)
	}
}

// setupWatched runs setup attempt of the channel k while watching for the
// peer's abandoning it (the error then wraps errPeerAbandoned); when the
// setup fails otherwise, it publishes that this end abandoned it.
func (c *Comm) setupWatched(ctx context.Context, k chanKey, attempt int, d ChannelDesc) (*Channel, error) {
	base := c.setupBase(k, attempt)
	me, them := strconv.Itoa(c.rank), strconv.Itoa(d.RemoteRank)
	ps, release, err := c.pairStore(ctx, d.RemoteRank)
	if err != nil {
		return nil, c.errorf("ChannelAcquire", d.RemoteRank, ErrTCPConnect, err, "")
	}
	defer release() // after the exchanges (each holds a use of its own) and the abandonment's word
	actx, cancel := context.WithCancelCause(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		if _, err := ps.Get(actx, base+"/abandoned/r"+them); err == nil {
			cancel(errPeerAbandoned)
		}
	}()
	ch, err := c.setupChannel(actx, k, attempt, d)
	abandoned := context.Cause(actx) == errPeerAbandoned
	cancel(nil)
	<-watched
	switch {
	case err == nil:
		return ch, nil
	case abandoned && ctx.Err() == nil:
		return nil, c.errorf("ChannelAcquire", d.RemoteRank, ErrInternal, fmt.Errorf("%w: %w", errPeerAbandoned, err), "")
	}
	sctx, scancel := context.WithTimeout(context.Background(), time.Second)
	ps.Set(sctx, base+"/abandoned/r"+me, nil) // best effort: the store may be gone
	scancel()
	return nil, err
}

// setupBase is the store key under which setup attempt of the channel k
// trades its messages.
func (c *Comm) setupBase(k chanKey, attempt int) string {
	lo, hi := min(c.rank, k.remote), max(c.rank, k.remote)
	return fmt.Sprintf("ch/%d-%d/%d/%d/%q/%d", lo, hi, k.engine, k.protocol, k.tag, attempt)
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
	t, err := c.pickTransport(d.RemoteRank, d.Protocol)
	if err != nil {
		return nil, c.errorf(op, d.RemoteRank, ErrNotSupport, err, "")
	}
	tname := t.name
	dl, err := c.dialer(t)
	if err != nil {
		return nil, c.errorf(op, d.RemoteRank, ErrInternal, err, "%s transport", tname)
	}
	ex := c.exchanger(c.setupBase(k, attempt), d.RemoteRank)
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
	ch := &Channel{comm: c, engine: engine, proto: d.Protocol, remote: d.RemoteRank, tr: conn.Transport,
		notifies: conn.Notifies, peerNotify: conn.PeerNotifyNum, remoteMems: conn.RemoteMems, key: k}
	ch.written = c.cfg.metrics.BytesOf(conn.Transport.Name(), metrics.Write)
	ch.read = c.cfg.metrics.BytesOf(conn.Transport.Name(), metrics.Read)
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
// (HCCL_CONNECT_TIMEOUT or the caller's deadline), ErrUnavail when it was
// cancelled, a connect error otherwise.
func (c *Comm) connectErr(ctx context.Context, peer int, tname string, err error) *Error {
	code := ErrTCPConnect
	if tname != TransportTCP {
		code = ErrInternal
	}
	code, err = ended(ctx, code, err)
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
	m := ch.remoteMems[0]
	return m.Addr, m.Size, nil
}

// ChannelGetRemoteMems returns the memory the peer had registered when the
// channel was acquired, HCCL buffer first (HcclChannelGetRemoteMems).
func (c *Comm) ChannelGetRemoteMems(ch *Channel) ([]channel.Mem, error) {
	if err := c.checkChannel("ChannelGetRemoteMems", ch); err != nil {
		return nil, err
	}
	return append([]channel.Mem(nil), ch.remoteMems...), nil
}

func (c *Comm) checkChannel(op string, ch *Channel) error {
	if err := c.usable(op); err != nil {
		return err
	}
	if ch == nil || ch.comm != c {
		return c.errorf(op, -1, ErrPtr, nil, "channel is nil or belongs to another communicator")
	}
	if ch.destroyed.Load() {
		return c.errorf(op, ch.remote, ErrPtr, nil, "the channel to rank %d is destroyed (ChannelDestroy)", ch.remote)
	}
	return nil
}

// ChannelQuery returns the channels the descriptors name, as ChannelAcquire
// would return them, without creating any (HcclChannelQuery): a descriptor
// with no channel yet (never acquired, still being set up, or destroyed)
// gets nil, as HCCL's gets handle 0. The descriptors are checked as
// ChannelAcquire checks them. It is local and does not block.
func (c *Comm) ChannelQuery(engine Engine, descs []ChannelDesc) ([]*Channel, error) {
	const op = "ChannelQuery"
	if err := c.usable(op); err != nil {
		return nil, err
	}
	if !engine.supported() {
		return nil, c.errorf(op, -1, ErrNotSupport, nil, "engine %v is not supported: hcomm runs on the host (CPU, CPU_TS)", engine)
	}
	if len(descs) == 0 || len(descs) > 1<<20 {
		return nil, c.errorf(op, -1, ErrPara, nil, "channel count %d is outside (0, %d]", len(descs), 1<<20)
	}
	out := make([]*Channel, len(descs))
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, d := range descs {
		if d.RemoteRank < 0 || d.RemoteRank >= c.size || d.RemoteRank == c.rank {
			return nil, c.errorf(op, d.RemoteRank, ErrPara, nil, "descriptor %d: remote rank %d is outside [0, %d) or this rank", i, d.RemoteRank, c.size)
		}
		out[i] = c.channels[chanKey{engine: engine, remote: d.RemoteRank, protocol: d.Protocol, tag: d.Tag}]
	}
	return out, nil
}

// ChannelDestroy releases channels of this rank (HcclChannelDestroy, which
// HCCL offers for CCU channels only; hcomm destroys any). Each channel's
// transport is closed at once: the peer's end sees the channel closed (its
// waits and later calls fail with an error wrapping channel.ErrPeerClosed
// where the transport can tell, tcp and shm; an inproc peer's calls keep
// working on memory that stays valid), and over shm both ends unmap the
// other's memory, so that memory registered for the channel is no longer
// mapped into the peer's process. Later calls with a destroyed channel fail
// with ErrPtr naming it; tasks already queued that use it fail when they
// run. A later ChannelAcquire with the same descriptor sets up a new
// channel; as any setup it is collective, so the peer must have destroyed
// its end too (or never acquired it).
//
// Every channel is checked (not nil, of this communicator, not destroyed,
// no duplicates) before any is destroyed. Safe for concurrent use; the
// caller makes sure no goroutine is still issuing calls on the channels.
func (c *Comm) ChannelDestroy(chs []*Channel) error {
	const op = "ChannelDestroy"
	if err := c.usable(op); err != nil {
		return err
	}
	seen := make(map[*Channel]bool, len(chs))
	for i, ch := range chs {
		if ch == nil || ch.comm != c {
			return c.errorf(op, -1, ErrPtr, nil, "channel %d is nil or belongs to another communicator", i)
		}
		if ch.destroyed.Load() || seen[ch] {
			return c.errorf(op, ch.remote, ErrPtr, nil, "channel %d (to rank %d) is already destroyed or listed twice", i, ch.remote)
		}
		seen[ch] = true
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return c.errorf(op, -1, ErrUnavail, nil, "communicator is destroyed")
	}
	var gone []*Channel
	for _, ch := range chs {
		if !ch.destroyed.CompareAndSwap(false, true) {
			continue // a concurrent ChannelDestroy took it
		}
		if c.channels[ch.key] == ch {
			delete(c.channels, ch.key)
		}
		gone = append(gone, ch)
	}
	c.mu.Unlock()
	var first error
	for _, ch := range gone {
		if err := ch.tr.Close(); err != nil && first == nil {
			first = c.errorf(op, ch.remote, ErrInternal, err, "closing the channel to rank %d", ch.remote)
		}
		c.log(slog.LevelInfo, "channel destroyed", "peer", ch.remote, "transport", ch.tr.Name(), "tag", ch.key.tag)
	}
	return first
}

type chanKey struct {
	engine   Engine
	remote   int
	protocol Protocol
	tag      string
}
