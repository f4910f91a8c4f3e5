// Package inproc is the transport between ranks of one process: a write is one
// copy into the peer's memory, a notify record sets the peer's notify directly.
//
// Ranks meet through a Fabric: the one InitAll makes for its communicators, or
// the process-wide Default fabric that communicators made by InitRootInfo and
// friends share, so that ranks of one multi-process communicator that happen
// to live in one process still talk by plain copies. A Dialer connects over a
// fabric: each end publishes an Endpoint — its device, its registered memory
// and its notifies — under a fresh random token, trades tokens with the peer
// through the channel's Exchange, and looks the peer's endpoint up.
//
// A peer's memory is its own to free at any moment — after an Abort, say,
// while this rank still reads its lent buffer — and one process holds both:
// every copy into or out of it holds the allocation (device.Held) for the
// copy's length, so that the peer's Free waits for the copy in flight and
// the copies after it fail with an error naming the peer, instead of
// faulting the process. The exception is the peer's HCCL buffer, where the
// small collectives' hellos, lines and slots are: copies into and out of it
// are not pinned, for speed (a pin's release waits until the copy's stores
// have drained: 10 % of a 2-rank 4 KiB all-to-all). Each end keeps the
// peer's HCCL buffer mapped instead (device.Held.Keep) from the channel's
// setup to its own Close, and the peer frees it only after closing its end,
// which every copy checks first: a copy that passed that check just as the
// peer closed and freed the buffer lands in memory still mapped (and no
// longer the peer's concern) rather than faulting the process.
package inproc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/memcopy"
	"github.com/hcomm-dev/hcomm/internal/reduce"
	"github.com/hcomm-dev/hcomm/notify"
)

// Endpoint is what one end of a channel shows the other.
type Endpoint struct {
	Rank     int
	Device   *device.Device
	Registry *channel.Registry
	Notifies []*notify.Notify
	HCCLBuf  channel.Mem

	closed atomic.Bool // this end's Transport is closed
}

// Fabric is the meeting place of the ranks of one process: endpoints by token.
// Safe for concurrent use. The zero value is not usable; use NewFabric.
type Fabric struct {
	id   string // tells fabrics apart in the exchanged token
	mu   sync.Mutex
	ends map[string]*Endpoint
}

// NewFabric returns an empty fabric.
func NewFabric() *Fabric {
	return &Fabric{id: randomToken(), ends: make(map[string]*Endpoint)}
}

// Default is the process-wide fabric of communicators not made by InitAll.
var Default = NewFabric()

func randomToken() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("inproc: no randomness: " + err.Error()) // crypto/rand never fails on Linux
	}
	return hex.EncodeToString(b[:])
}

// Len returns the number of endpoints published and not yet collected (a
// channel setup in flight publishes two).
func (f *Fabric) Len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.ends)
}

// Dialer is the inproc channel.Dialer. Safe for concurrent use.
type Dialer struct {
	f *Fabric
}

// NewDialer returns a Dialer over f (Default when f is nil).
func NewDialer(f *Fabric) *Dialer {
	if f == nil {
		f = Default
	}
	return &Dialer{f: f}
}

// Name returns "inproc".
func (d *Dialer) Name() string { return "inproc" }

// Close does nothing: a Dialer holds nothing between channels.
func (d *Dialer) Close() error { return nil }

// Connect publishes local's endpoint under a fresh token, trades tokens with
// the peer through ex, and connects to the peer's endpoint, which must be on
// the same fabric. A second exchange confirms that both ends have found each
// other, after which both tokens are withdrawn from the fabric.
func (d *Dialer) Connect(ctx context.Context, local *channel.Local, ex channel.Exchange) (*channel.Conn, error) {
	if ctx == nil || local == nil || ex == nil {
		return nil, errors.New("inproc connect: nil context, local or exchange")
	}
	notifies := make([]*notify.Notify, local.NotifyNum)
	for i := range notifies {
		notifies[i] = notify.New(fmt.Sprintf("%s notify %d", local.Name, i))
	}
	ep := &Endpoint{Rank: local.Rank, Device: local.Device, Registry: local.Registry, Notifies: notifies, HCCLBuf: local.HCCLBuf}
	tok := d.f.id + "/" + randomToken()
	d.f.mu.Lock()
	d.f.ends[tok] = ep
	d.f.mu.Unlock()
	defer func() {
		d.f.mu.Lock()
		delete(d.f.ends, tok)
		d.f.mu.Unlock()
	}()
	theirs, err := ex(ctx, []byte(tok))
	if err != nil {
		return nil, fmt.Errorf("inproc: rank %d exchanging endpoints with rank %d: %w", local.Rank, local.Peer, err)
	}
	d.f.mu.Lock()
	peer := d.f.ends[string(theirs)]
	d.f.mu.Unlock()
	found := byte(1)
	if peer == nil || peer.Rank != local.Peer {
		found = 0
	}
	// Withdraw only once both ends hold their peer's endpoint.
	ack, err := ex(ctx, []byte{found})
	if err != nil {
		return nil, fmt.Errorf("inproc: rank %d confirming the channel with rank %d: %w", local.Rank, local.Peer, err)
	}
	if found == 0 {
		return nil, fmt.Errorf("inproc: rank %d's endpoint (token %.40q) is not in this process's fabric: rank %d is in another process or communicator group", local.Peer, theirs, local.Rank)
	}
	if len(ack) != 1 || ack[0] != 1 {
		return nil, fmt.Errorf("inproc: rank %d could not find rank %d's endpoint in its fabric", local.Peer, local.Rank)
	}
	remote := []channel.Mem{peer.HCCLBuf}
	for _, m := range peer.Registry.List() {
		if m.Addr != peer.HCCLBuf.Addr {
			remote = append(remote, m)
		}
	}
	t := &Transport{local: ep, peer: peer}
	if m := peer.HCCLBuf; m.Addr != 0 && m.Size > 0 {
		// Kept mapped until this end's Close: the unpinned copies (keptBytes).
		if h, err := peer.Device.Hold(m.Addr, m.Size); err == nil && h.Keep() {
			t.buf, t.kept = h, true
		}
	}
	return &channel.Conn{Transport: t, Notifies: notifies,
		PeerNotifyNum: len(peer.Notifies), RemoteMems: remote}, nil
}

// Transport is the inproc transport to one peer. Its Close is seen by the
// peer at once: the peer's waits on the channel fail with
// channel.ErrPeerClosed, and so do its later calls.
type Transport struct {
	local     *Endpoint
	peer      *Endpoint
	closeOnce sync.Once
	// buf is the peer's HCCL buffer, kept mapped (device.Held.Keep) from
	// Connect to Close when kept: a copy into it need not pin it (keptBytes).
	buf  device.Held
	kept bool
}

// Name returns "inproc".
func (t *Transport) Name() string { return "inproc" }

// usable fails an operation once either end is closed.
func (t *Transport) usable() error {
	if t.local.closed.Load() {
		return fmt.Errorf("inproc: rank %d's end of the channel to rank %d: %w", t.local.Rank, t.peer.Rank, channel.ErrClosed)
	}
	if t.peer.closed.Load() {
		return fmt.Errorf("inproc: rank %d closed its end of the channel: %w", t.peer.Rank, channel.ErrPeerClosed)
	}
	return nil
}

// peerHeld is the far end's check: the range must be memory the peer
// registered, and live.
func (t *Transport) peerHeld(p device.Ptr, n int64) (device.Held, error) {
	if err := t.usable(); err != nil {
		return device.Held{}, err
	}
	if _, ok := t.peer.Registry.Find(p, n); !ok {
		return device.Held{}, fmt.Errorf("rank %d refuses range [%#x, +%d): not in its registered memory", t.peer.Rank, uintptr(p), n)
	}
	h, err := t.peer.Device.Hold(p, n)
	if err != nil {
		return device.Held{}, fmt.Errorf("rank %d: %w", t.peer.Rank, err)
	}
	return h, nil
}

// peerBytes is peerHeld, pinned: the peer's memory cannot be freed until
// the caller's h.Unpin (every copy into or out of a peer's memory holds it
// so, or a peer's Free racing with the copy — after its Abort, say —
// would unmap the memory under it and fault the whole process). A range in
// the peer's HCCL buffer is not pinned (keptBytes): h is then the zero
// Held, whose Unpin does nothing.
func (t *Transport) peerBytes(p device.Ptr, n int64) (device.Held, []byte, error) {
	if b, ok := t.keptBytes(p, n); ok {
		return device.Held{}, b, t.usable()
	}
	h, err := t.peerHeld(p, n)
	if err != nil {
		return h, nil, err
	}
	b, err := t.pin(h, p)
	return h, b, err
}

// keptBytes returns the n bytes at p when they lie in the peer's HCCL
// buffer, which this end keeps mapped from Connect to its Close (t.buf):
// a copy into or out of them needs no pin. The buffer is registered
// memory for the whole life of the channel, and is freed only after the
// peer closed its end (Destroy, Suspend), which the caller checks first
// (usable); a copy that passed that check as the peer closed and freed it
// touches memory this end still maps. A pin costs more than its two atomic
// operations: its release is a read-modify-write, which waits until the
// copy's stores into the peer's lines have drained — 9–10 % of a 2-rank
// 4 KiB all-to-all in one process, whose hellos carry the data into the
// peer's HCCL buffer (the same reason the lines are not pinned, linePut).
func (t *Transport) keptBytes(p device.Ptr, n int64) ([]byte, bool) {
	m := t.peer.HCCLBuf
	if !t.kept || n < 0 || p < m.Addr || n > m.Size || int64(p-m.Addr) > m.Size-n {
		return nil, false
	}
	b, _ := t.buf.Bytes()
	off := int64(p - m.Addr)
	return b[off : off+n : off+n], true
}

// pin pins h, the peer's memory at p, or says that the peer freed it.
func (t *Transport) pin(h device.Held, p device.Ptr) ([]byte, error) {
	b, ok := h.Pin()
	if !ok {
		return nil, fmt.Errorf("rank %d freed its memory at %#x", t.peer.Rank, uintptr(p))
	}
	return b, nil
}

// ChecksOnReceipt reports that every write (and read) is checked against
// the peer's registered memory as it is when the copy runs — the peer's
// registry itself, in this process — so that a write may target a range the
// peer registered after the channel was made (channel.ReceiverChecker).
func (t *Transport) ChecksOnReceipt() bool { return true }

// Write copies src into the peer's memory at dst.
func (t *Transport) Write(_ <-chan struct{}, dst device.Ptr, src []byte) error {
	h, b, err := t.peerBytes(dst, int64(len(src)))
	if err != nil {
		return err
	}
	defer h.Unpin()
	copy(b, src)
	return nil
}

var _ channel.StreamWriter = (*Transport)(nil)

// WriteStream copies src into the peer's memory at dst with streaming
// stores (channel.StreamWriter): for a collective's output.
func (t *Transport) WriteStream(_ <-chan struct{}, dst device.Ptr, src []byte) error {
	h, b, err := t.peerBytes(dst, int64(len(src)))
	if err != nil {
		return err
	}
	defer h.Unpin()
	memcopy.Stream(b, src)
	return nil
}

var _ channel.FlagWriter = (*Transport)(nil)

// WriteFlagged stores src into the peer's memory at dst as flagged words
// (channel.FlagWriter): atomic 8-byte stores into the peer's device memory,
// which this process holds.
func (t *Transport) WriteFlagged(_ <-chan struct{}, dst device.Ptr, src []byte, flag uint32) error {
	if err := channel.CheckFlagged(dst, len(src)); err != nil {
		return err
	}
	h, b, err := t.peerBytes(dst, int64(channel.FlaggedLen(len(src))))
	if err != nil {
		return err
	}
	defer h.Unpin()
	if !channel.Aligned8(b) {
		return fmt.Errorf("rank %d's memory at %#x is not 8-byte aligned in this process", t.peer.Rank, uintptr(dst))
	}
	channel.PutFlagged(b, src, flag)
	return nil
}

// WriteLine stores src into the line at the peer's dst (channel.PutLine):
// plain stores of the data, then one release store of the flag word.
func (t *Transport) WriteLine(_ <-chan struct{}, dst device.Ptr, src []byte, flag uint32) error {
	h, err := t.lineHeld(dst, len(src))
	if err != nil {
		return err
	}
	b, err := t.pin(h, dst)
	if err != nil {
		return err
	}
	channel.PutLine(b, src, flag)
	h.Unpin()
	return nil
}

// PrepareLine checks the line at the peer's dst once (channel.FlagWriter).
func (t *Transport) PrepareLine(dst device.Ptr) (channel.LinePut, error) {
	h, err := t.lineHeld(dst, 0)
	if err != nil {
		return nil, err
	}
	_, inBuf := t.keptBytes(dst, channel.LineSize)
	return &linePut{t: t, h: h, at: dst, pinned: !inBuf}, nil
}

// lineHeld checks a line write of n bytes to dst and returns the line.
func (t *Transport) lineHeld(dst device.Ptr, n int) (device.Held, error) {
	if err := channel.CheckLine(dst, n); err != nil {
		return device.Held{}, err
	}
	h, err := t.peerHeld(dst, channel.LineSize)
	if err != nil {
		return device.Held{}, err
	}
	b, err := t.pin(h, dst)
	if err != nil {
		return device.Held{}, err
	}
	h.Unpin()
	if !channel.Aligned8(b) {
		return device.Held{}, fmt.Errorf("rank %d's memory at %#x is not 8-byte aligned in this process", t.peer.Rank, uintptr(dst))
	}
	return h, nil
}

// linePut is a line of the peer's memory, checked once. A Put into the
// peer's HCCL buffer (the small collectives' lines) does not pin it: the
// line's flag is a release store so that the writer goes on while the line
// travels, and a pin's release is an atomic read-modify-write, which waits
// for the line first — one cache-line transfer per Put, 5–8 % of a 4-rank
// 16 B all-reduce in one process. The HCCL buffer is freed only after the
// channel is closed (Destroy, Suspend), which a Put checks first, and a Put
// that passed the check as the peer closed and freed it stores into memory
// this end keeps mapped until its own Close (Transport.buf). A line
// anywhere else (a window the peer may free) is pinned.
type linePut struct {
	t      *Transport
	h      device.Held
	at     device.Ptr
	pinned bool
}

func (l *linePut) Put(src []byte, flag uint32) error {
	if err := l.t.usable(); err != nil {
		return err
	}
	if len(src) > channel.LineData {
		return fmt.Errorf("line write of %d bytes: a line carries at most %d", len(src), channel.LineData)
	}
	if l.pinned {
		b, err := l.t.pin(l.h, l.at)
		if err != nil {
			return err
		}
		channel.PutLine(b, src, flag)
		l.h.Unpin()
		return nil
	}
	b, _ := l.h.Bytes()
	channel.PutLine(b, src, flag)
	return nil
}

var _ channel.Poster = (*Transport)(nil)

// PreparePost checks the range and the notify once (channel.Poster).
func (t *Transport) PreparePost(dst device.Ptr, n int64, idx int) (channel.Post, error) {
	h, err := t.peerHeld(dst, n)
	if err != nil {
		return nil, err
	}
	if idx < 0 || idx >= len(t.peer.Notifies) {
		return nil, fmt.Errorf("rank %d has no notify %d on this channel (it has %d)", t.peer.Rank, idx, len(t.peer.Notifies))
	}
	kept, _ := t.keptBytes(dst, n)
	return &post{t: t, h: h, at: dst, kept: kept, n: t.peer.Notifies[idx]}, nil
}

// post is a prepared write into the peer's memory and record of its
// notify, the memory pinned at each Post — unless it lies in the peer's
// HCCL buffer (kept: keptBytes).
type post struct {
	t    *Transport
	h    device.Held
	at   device.Ptr
	kept []byte
	n    *notify.Notify
}

func (p *post) Post(src []byte) error {
	if err := p.t.usable(); err != nil {
		return err
	}
	b, h := p.kept, device.Held{} // the zero Held's Unpin does nothing
	if b == nil {
		var err error
		if b, err = p.t.pin(p.h, p.at); err != nil {
			return err
		}
		h = p.h
	}
	if len(src) > len(b) {
		h.Unpin()
		return fmt.Errorf("post of %d bytes into a range of %d", len(src), len(b))
	}
	copy(b, src)
	h.Unpin()
	p.n.Set()
	return nil
}

var _ channel.PeerReader = (*Transport)(nil)

// ReadsPeer reports that every pair in one process reads memory the peer
// lends (channel.PeerReader).
func (t *Transport) ReadsPeer() bool { return true }

// ReadPeer copies the peer's memory at src into dst: memory the peer lent
// for one operation, registered or not, which must be live device memory
// of the peer's (checked as the copy starts, and held while it runs; file
// is not needed here).
func (t *Transport) ReadPeer(_ <-chan struct{}, dst []byte, src device.Ptr, _ channel.PeerFile) error {
	if err := t.usable(); err != nil {
		return err
	}
	h, err := t.peer.Device.Hold(src, int64(len(dst)))
	if err != nil {
		return fmt.Errorf("rank %d: %w", t.peer.Rank, err)
	}
	b, err := t.pin(h, src)
	if err != nil {
		return err
	}
	defer h.Unpin()
	memcopy.Read(dst, b)
	return nil
}

// Read copies the peer's memory at src into dst.
func (t *Transport) Read(_ <-chan struct{}, dst []byte, src device.Ptr) error {
	h, b, err := t.peerBytes(src, int64(len(dst)))
	if err != nil {
		return err
	}
	defer h.Unpin()
	// What is read is usually a collective's output, not read again soon:
	// stream it past the cache (see internal/memcopy).
	memcopy.Stream(dst, b)
	return nil
}

// WriteReduce computes peer[dst] = peer[dst] op src.
func (t *Transport) WriteReduce(_ <-chan struct{}, dst device.Ptr, src []byte, count int, dt reduce.DataType, op reduce.Op) error {
	h, b, err := t.peerBytes(dst, int64(len(src)))
	if err != nil {
		return err
	}
	defer h.Unpin()
	return reduce.Reduce(b, src, count, dt, op)
}

// ReadReduce computes dst = dst op peer[src].
func (t *Transport) ReadReduce(_ <-chan struct{}, dst []byte, src device.Ptr, count int, dt reduce.DataType, op reduce.Op) error {
	h, b, err := t.peerBytes(src, int64(len(dst)))
	if err != nil {
		return err
	}
	defer h.Unpin()
	return reduce.Reduce(dst, b, count, dt, op)
}

// NotifyRecord sets the peer's notify idx.
func (t *Transport) NotifyRecord(_ <-chan struct{}, idx int) error {
	if err := t.usable(); err != nil {
		return err
	}
	if idx < 0 || idx >= len(t.peer.Notifies) {
		return fmt.Errorf("rank %d has no notify %d on this channel (it has %d)", t.peer.Rank, idx, len(t.peer.Notifies))
	}
	t.peer.Notifies[idx].Set()
	return nil
}

// Fence returns at once: an inproc write is complete when it returns.
func (t *Transport) Fence(<-chan struct{}) error { return t.usable() }

// Close ends this end of the channel: its later calls fail with
// channel.ErrClosed, waits on its notifies fail at once with
// channel.ErrClosed, and the peer's with channel.ErrPeerClosed; and it
// releases the peer's HCCL buffer it kept mapped (unmapped now if the peer
// freed it meanwhile). A call racing with Close on the same end is the
// caller's error, as with any transport. Idempotent.
func (t *Transport) Close() error {
	t.closeOnce.Do(func() {
		t.local.closed.Store(true)
		if t.kept {
			t.buf.Release() // the last keep of a buffer its owner freed unmaps it
		}
		mine := fmt.Errorf("inproc: rank %d closed its end of the channel to rank %d: %w", t.local.Rank, t.peer.Rank, channel.ErrClosed)
		for _, n := range t.local.Notifies {
			n.Break(mine)
		}
		theirs := fmt.Errorf("inproc: rank %d closed its end of the channel: %w", t.local.Rank, channel.ErrPeerClosed)
		for _, n := range t.peer.Notifies {
			n.Break(theirs)
		}
	})
	return nil
}
