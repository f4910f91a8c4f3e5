// Package sim is the simulator's transport (`hcomm sim`): the inproc
// transport — real bytes copied between ranks of one process — with a
// virtual clock per rank that each operation advances by what it would cost
// on the network a Profile describes. The collectives run unchanged over it
// (hcomm.InitAllOver with a World's Dialers), so a schedule's predicted time
// is the time its own writes, records and waits take, and its result is
// checked as on any transport. They choose the schedules they run over tcp,
// the network the simulator stands for: the sim's channels take writes into
// memory the peer registers after the channel is made (a receive buffer
// lent for one call: the broadcast's and the 2-rank all-reduce's lent
// pipes), as tcp's do (channel.ReceiverChecker; before stop 31 the
// simulator timed their staged forms).
//
// The model, per rank r with clock now(r), a message of S bytes from r to q
// on level L (intra-host or inter-host). Processor time is charged on the
// rank's host: with Profile.Cores set, on whichever of the host's
// processors is free earliest from the moment the work can start (ranks
// that outnumber the cores take turns); without, on a processor of the
// rank's own, at once.
//
//   - a write or a notify record starts at start = now(r) (between hosts,
//     at the latest when the last message of r's host left its NIC); it
//     takes o(L) + S·β(L) of processor time and holds the link as long;
//     now(r) is when that ends;
//   - it arrives α(L) later, and never before an earlier message on the
//     same channel (records follow the writes before them);
//   - a wait that returns advances the waiter to the arrival of the record
//     it waited for, then charges it o(L) of processor time for the
//     receipt; on a crowded host (more ranks than cores) a wait that
//     blocked — the record arrived after the waiter's clock: it slept —
//     charges Profile.SwitchUs more, and starts Profile.WakeUs after the
//     arrival when one of the host's processors had nothing to run (it
//     halted, and wakes first);
//   - a read is a round trip: 2·α(L), then o(L) + S·β(L) of processor
//     time; a fence waits for the channel's last arrival;
//   - a local copy or reduction of S bytes costs S·γ of processor time, and
//     the reduction at the far end of a write-reduce S·γ of the far host's,
//     before the bytes count as arrived.
//
// In the slowdown model (Profile.OversubExp) no processor is shared and no
// wait pays a switch or a wake-up: every charge above is multiplied by the
// host's Profile.Slowdown instead, and a receipt costs nothing — the
// charges that model was fitted and validated with (stop 27's: with o at
// the receiver too, 2–4 processes fit it as well, but to an exponent 0.05
// higher, which over-predicted 64 processes by up to 62 % where the
// sender's o alone held 8 sizes of 9 within 25 %; BENCHMARKS.md, stop 28).
//
// The clock is one per rank: a rank's streams share it, so work a rank runs
// on two streams at once is charged one after the other. The charges are
// recorded as the ranks' goroutines make them and replayed in virtual-time
// order once the case is over (replay.go), so a host's processors and NIC
// go to the charges that reach them first in virtual time, whatever order
// the goroutines ran in.
package sim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/channel/inproc"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/reduce"
)

// Name is the transport's name.
const Name = "sim"

// cost is a level's profile in seconds.
type cost struct{ alpha, o, beta float64 }

// World is one simulated cluster: the trace of its ranks' charges (replayed
// by Finish) and the fabric their channels meet on. Safe for concurrent use.
type World struct {
	p         Profile
	intra     cost
	inter     cost
	gamma     float64 // seconds per byte
	wake      float64 // seconds a halted processor takes to wake
	switching float64 // seconds of processor time a blocked wait costs on a crowded host
	crowded   bool
	slow      float64 // the slowdown model's factor on every cost (1: none)
	fab       *inproc.Fabric
	tr        trace

	mu   sync.Mutex
	ends map[string]*end // ends being connected, by token
	trs  []*Transport    // every transport made, for Reset

	faultMu sync.Mutex
	fault   *Fault
	counted int    // writes of the fault's rank counted so far
	prev    []byte // the fault's rank's previous counted write
}

// Fault is a fault injected into a World's writes (Inject), for the
// simulator's own tests: they show that a schedule that loses or repeats a
// piece fails the result check instead of being timed.
type Fault struct {
	// Rank is the writing rank; the fault hits its Nth write (from 1) of at
	// least MinBytes bytes after Inject.
	Rank, Nth int
	MinBytes  int
	// Repeat makes the bytes of the rank's previous such write land in
	// place of the Nth's (a piece delivered twice, another never); false
	// drops the Nth write (its record still goes: the receiver reads what
	// the buffer held).
	Repeat bool
}

// Inject arms f: it hits once. Safe for concurrent use.
func (w *World) Inject(f Fault) {
	w.faultMu.Lock()
	w.fault, w.counted, w.prev = &f, 0, nil
	w.faultMu.Unlock()
}

// faulty returns what a write of src by rank must put in the peer's memory
// instead of src: nil to drop it, src itself when no fault hits.
func (w *World) faulty(rank int, src []byte) (out []byte, drop bool) {
	w.faultMu.Lock()
	defer w.faultMu.Unlock()
	f := w.fault
	if f == nil || f.Rank != rank || len(src) < f.MinBytes {
		return src, false
	}
	w.counted++
	if w.counted < f.Nth {
		w.prev = append(w.prev[:0], src...)
		return src, false
	}
	w.fault = nil
	if !f.Repeat || w.prev == nil {
		return nil, true
	}
	out = append([]byte(nil), src...)
	copy(out, w.prev)
	return out, false
}

// NewWorld returns the world of p, every clock at 0. It fails with p's
// Validate error.
func NewWorld(p Profile) (*World, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	w := &World{p: p,
		intra: cost{p.Intra.AlphaUs * 1e-6, p.Intra.OverheadUs * 1e-6, p.Intra.BetaNsPerByte * 1e-9},
		inter: cost{p.Inter.AlphaUs * 1e-6, p.Inter.OverheadUs * 1e-6, p.Inter.BetaNsPerByte * 1e-9},
		gamma: p.GammaNsPerByte * 1e-9,
		fab:   inproc.NewFabric(),
		ends:  make(map[string]*end),
	}
	w.slow = p.Slowdown()
	if p.Crowded() && p.OversubExp == 0 {
		w.crowded = true
		w.wake = p.WakeUs * 1e-6
		w.switching = p.SwitchUs * 1e-6
	}
	w.tr.reset(p.Ranks())
	return w, nil
}

// Profile returns the world's profile.
func (w *World) Profile() Profile { return w.p }

// Ranks returns the world's rank count.
func (w *World) Ranks() int { return w.p.Ranks() }

// Host returns the host of rank r.
func (w *World) Host(r int) int { return r / w.p.RanksPerHost }

// Hosts returns each rank's host name ("h0", "h1", …), for
// hcomm.InitAllOver.
func (w *World) Hosts() []string {
	hs := make([]string, w.Ranks())
	for r := range hs {
		hs[r] = "h" + strconv.Itoa(w.Host(r))
	}
	return hs
}

// Reset empties the trace: the next case's clocks start at 0. Call it only
// while no rank has work in flight (every stream synchronized).
func (w *World) Reset() {
	w.tr.reset(w.Ranks())
	w.mu.Lock()
	trs := w.trs
	w.mu.Unlock()
	for _, t := range trs {
		t.mu.Lock()
		t.last = -1
		t.mu.Unlock()
		t.mine.mu.Lock()
		clear(t.mine.pending)
		t.mine.mu.Unlock()
	}
}

// Dialers returns a Dialer for each rank, in rank order, for
// hcomm.InitAllOver.
func (w *World) Dialers() []channel.Dialer {
	ds := make([]channel.Dialer, w.Ranks())
	for r := range ds {
		ds[r] = &Dialer{w: w, rank: r, inner: inproc.NewDialer(w.fab)}
	}
	return ds
}

// Dialer is the sim channel.Dialer of one rank of a World; it is also the
// channel.LocalCoster that charges the rank's local copies. Safe for
// concurrent use.
type Dialer struct {
	w     *World
	rank  int
	inner *inproc.Dialer
}

// Name returns "sim".
func (d *Dialer) Name() string { return Name }

// Close does nothing: the World holds the state.
func (d *Dialer) Close() error { return nil }

// LocalWork charges the rank S·γ for a local copy or reduction of n bytes.
func (d *Dialer) LocalWork(n int64) {
	d.w.tr.record(d.rank, charge{kind: opWork, d: float64(n) * d.w.gamma * d.w.slow})
}

// end is one end of a channel: the records on each of its notifies that no
// wait has returned for yet (messages of the trace).
type end struct {
	rank    int
	mu      sync.Mutex
	pending [][]int32
}

// Connect connects an inproc channel over the world's fabric, then trades
// the two ends' world ranks and arrival tables with the peer through ex (its
// Local.Rank and Peer may be a sub-communicator's ranks).
func (d *Dialer) Connect(ctx context.Context, local *channel.Local, ex channel.Exchange) (*channel.Conn, error) {
	if ctx == nil || local == nil || ex == nil {
		return nil, errors.New("sim connect: nil context, local or exchange")
	}
	conn, err := d.inner.Connect(ctx, local, ex)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*channel.Conn, error) {
		conn.Transport.Close()
		return nil, err
	}
	mine := &end{rank: d.rank, pending: make([][]int32, local.NotifyNum)}
	var b [16]byte
	rand.Read(b[:])
	tok := hex.EncodeToString(b[:])
	d.w.mu.Lock()
	d.w.ends[tok] = mine
	d.w.mu.Unlock()
	defer func() {
		d.w.mu.Lock()
		delete(d.w.ends, tok)
		d.w.mu.Unlock()
	}()
	theirs, err := ex(ctx, []byte(tok))
	if err != nil {
		return fail(fmt.Errorf("sim: rank %d trading clocks with rank %d: %w", d.rank, local.Peer, err))
	}
	d.w.mu.Lock()
	peer := d.w.ends[string(theirs)]
	d.w.mu.Unlock()
	found := byte(0)
	if peer != nil {
		found = 1
	}
	ack, err := ex(ctx, []byte{found}) // withdraw only once both ends found each other
	if err != nil {
		return fail(fmt.Errorf("sim: rank %d confirming the channel with rank %d: %w", d.rank, local.Peer, err))
	}
	if peer == nil || len(ack) != 1 || ack[0] != 1 {
		return fail(fmt.Errorf("sim: rank %d and rank %d are not in one simulated world", d.rank, local.Peer))
	}
	c := d.w.intra
	inter := d.w.Host(d.rank) != d.w.Host(peer.rank)
	if inter {
		c = d.w.inter
	}
	t := &Transport{inner: conn.Transport, w: d.w, me: d.rank, peer: peer.rank, c: c, inter: inter, mine: mine, theirs: peer, last: -1}
	d.w.mu.Lock()
	d.w.trs = append(d.w.trs, t)
	d.w.mu.Unlock()
	conn.Transport = t
	return conn, nil
}

// Transport is the sim transport of one end of a channel: inproc's moves
// with the clock charges of the package doc. Its methods are called in the
// order of the stream tasks that make them, as every transport's are.
type Transport struct {
	inner  channel.Transport
	w      *World
	me     int
	peer   int
	c      cost
	inter  bool
	mine   *end
	theirs *end

	mu   sync.Mutex
	last int32 // the channel's latest message in the trace, or -1
}

// Name returns "sim".
func (t *Transport) Name() string { return Name }

// send traces a message of n bytes (far: processor time at the far end
// before the bytes count as there) and returns it.
func (t *Transport) send(n int, far float64) int32 {
	w := t.w
	m := w.tr.message()
	t.mu.Lock()
	prev := t.last
	t.last = m
	t.mu.Unlock()
	w.tr.record(t.me, charge{kind: opSend, nic: t.inter, farHost: int32(w.Host(t.peer)), ev: m, prev: prev,
		d: (t.c.o + float64(n)*t.c.beta) * w.slow, lat: t.c.alpha * w.slow, far: far * w.slow})
	return m
}

// Write copies src into the peer's memory at dst.
func (t *Transport) Write(stop <-chan struct{}, dst device.Ptr, src []byte) error {
	t.send(len(src), 0)
	src, drop := t.w.faulty(t.me, src)
	if drop {
		return nil
	}
	return t.inner.Write(stop, dst, src)
}

// Read copies the peer's memory at src into dst: a round trip.
func (t *Transport) Read(stop <-chan struct{}, dst []byte, src device.Ptr) error {
	s := t.w.slow
	t.w.tr.record(t.me, charge{kind: opWork, lat: 2 * t.c.alpha * s, d: (t.c.o + float64(len(dst))*t.c.beta) * s})
	return t.inner.Read(stop, dst, src)
}

// WriteReduce computes peer[dst] = peer[dst] op src; the reduction is
// charged at the far end, before the bytes count as arrived.
func (t *Transport) WriteReduce(stop <-chan struct{}, dst device.Ptr, src []byte, count int, dt reduce.DataType, op reduce.Op) error {
	t.send(len(src), float64(len(src))*t.w.gamma)
	return t.inner.WriteReduce(stop, dst, src, count, dt, op)
}

// ReadReduce computes dst = dst op peer[src]: a read, then a local reduction.
func (t *Transport) ReadReduce(stop <-chan struct{}, dst []byte, src device.Ptr, count int, dt reduce.DataType, op reduce.Op) error {
	n := float64(len(dst))
	s := t.w.slow
	t.w.tr.record(t.me, charge{kind: opWork, lat: 2 * t.c.alpha * s, d: (t.c.o + n*t.c.beta + n*t.w.gamma) * s})
	return t.inner.ReadReduce(stop, dst, src, count, dt, op)
}

// NotifyRecord records the peer's notify idx, which arrives after every
// earlier message of the channel.
func (t *Transport) NotifyRecord(stop <-chan struct{}, idx int) error {
	m := t.send(0, 0)
	if idx >= 0 && idx < len(t.theirs.pending) {
		// Before the record itself: the peer's wait must find it.
		t.theirs.mu.Lock()
		t.theirs.pending[idx] = append(t.theirs.pending[idx], m)
		t.theirs.mu.Unlock()
	}
	return t.inner.NotifyRecord(stop, idx)
}

// NotifyWaited advances this rank's clock to the arrival of the record its
// wait on notify idx returned for (channel.Clocked).
func (t *Transport) NotifyWaited(idx int) {
	if idx < 0 || idx >= len(t.mine.pending) {
		return
	}
	t.mine.mu.Lock()
	ms := t.mine.pending[idx]
	t.mine.pending[idx] = nil
	t.mine.mu.Unlock()
	o := t.c.o
	if t.w.p.OversubExp > 0 {
		o = 0 // the slowdown model charges the sender alone (package doc)
	}
	t.w.tr.record(t.me, charge{kind: opWait, after: ms, d: o})
}

// ChecksOnReceipt reports what the inproc channel underneath does: its
// copies check the peer's registry as they run (channel.ReceiverChecker).
// So the collectives lend receive buffers over the sim transport as they do
// over tcp, the network it stands for, and the simulator times the lent
// pipes that tcp runs, not the staged path.
func (t *Transport) ChecksOnReceipt() bool {
	rc, ok := t.inner.(channel.ReceiverChecker)
	return ok && rc.ChecksOnReceipt()
}

// Fence returns once every earlier operation is complete at the peer: the
// clock moves to the channel's last arrival.
func (t *Transport) Fence(stop <-chan struct{}) error {
	t.mu.Lock()
	last := t.last
	t.mu.Unlock()
	if last >= 0 {
		t.w.tr.record(t.me, charge{kind: opWork, after: []int32{last}})
	}
	return t.inner.Fence(stop)
}

// Close closes the inproc channel underneath. Idempotent.
func (t *Transport) Close() error {
	t.w.mu.Lock()
	if i := slices.Index(t.w.trs, t); i >= 0 {
		t.w.trs = slices.Delete(t.w.trs, i, i+1)
	}
	t.w.mu.Unlock()
	return t.inner.Close()
}

// ChecksOnReceipt says it of every channel the Dialer makes, before any is
// made (channel.ReceiverChecker): their Transports are inproc's, whose
// copies check the peer's registry as they run. So the collectives choose
// the schedules they run over tcp, the network the simulator stands for.
func (d *Dialer) ChecksOnReceipt() bool { return true }

var (
	_ channel.Clocked         = (*Transport)(nil)
	_ channel.ReceiverChecker = (*Transport)(nil)
	_ channel.ReceiverChecker = (*Dialer)(nil)
	_ channel.LocalCoster     = (*Dialer)(nil)
)

// HostProcessors returns the profile's cores (channel.HostProcessors): the
// simulated ranks of a crowded host run the schedules real ranks of one run
// (hcomm.Comm.Crowded).
func (d *Dialer) HostProcessors() int {
	if d.w.p.OversubExp > 0 {
		return 0 // the slowdown model times uncrowded ranks' schedules
	}
	return d.w.p.Cores
}

var _ channel.HostProcessors = (*Dialer)(nil)
