// Package sim is the simulator's transport (`hcomm sim`): the inproc
// transport — real bytes copied between ranks of one process — with a
// virtual clock per rank that each operation advances by what it would cost
// on the network a Profile describes. The collectives run unchanged over it
// (hcomm.InitAllOver with a World's Dialers), so a schedule's predicted time
// is the time its own writes, records and waits take, and its result is
// checked as on any transport.
//
// The model, per rank r with clock now(r), a message of S bytes from r to q
// on level L (intra-host or inter-host), s the slowdown of r's host (see
// Profile.Slowdown):
//
//   - a write or a notify record starts at start = now(r) (between hosts,
//     at the latest when the last message of r's host left its NIC); r is
//     busy with it, and it holds the link, for (o(L) + S·β(L))·s:
//     now(r) = start + (o(L) + S·β(L))·s;
//   - it arrives at now(r) + α(L)·s, and never before an earlier message on
//     the same channel (records follow the writes before them);
//   - a wait that returns advances the waiter: now(q) = max(now(q), arrival
//     of the record it waited for);
//   - a read is a round trip: now(r) += (2·α(L) + o(L) + S·β(L))·s; a fence waits
//     for the channel's last arrival;
//   - a local copy or reduction of S bytes, and the reduction at the far end
//     of a write-reduce, costs S·γ·s.
//
// The clock is one per rank: a rank's streams share it, so work a rank runs
// on two streams at once is charged one after the other. Messages of one
// host share its NIC in the order the goroutines issue them, which is not
// always the order of their virtual times.
package sim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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

// clock is one rank's virtual time, in seconds.
type clock struct {
	mu  sync.Mutex
	now float64
}

// nic is a host's network interface: when its last message left.
type nic struct {
	mu   sync.Mutex
	free float64
}

// cost is a level's profile in seconds.
type cost struct{ alpha, o, beta float64 }

// World is one simulated cluster: the ranks' clocks, the hosts' NICs and the
// fabric their channels meet on. Safe for concurrent use.
type World struct {
	p      Profile
	intra  cost
	inter  cost
	gamma  float64 // seconds per byte
	slow   float64
	fab    *inproc.Fabric
	clocks []clock
	nics   []nic

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
	return &World{p: p,
		intra:  cost{p.Intra.AlphaUs * 1e-6, p.Intra.OverheadUs * 1e-6, p.Intra.BetaNsPerByte * 1e-9},
		inter:  cost{p.Inter.AlphaUs * 1e-6, p.Inter.OverheadUs * 1e-6, p.Inter.BetaNsPerByte * 1e-9},
		gamma:  p.GammaNsPerByte * 1e-9,
		slow:   p.Slowdown(),
		fab:    inproc.NewFabric(),
		clocks: make([]clock, p.Ranks()),
		nics:   make([]nic, p.Hosts),
		ends:   make(map[string]*end),
	}, nil
}

// Profile returns the world's profile.
func (w *World) Profile() Profile { return w.p }

// Ranks returns the world's rank count.
func (w *World) Ranks() int { return len(w.clocks) }

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

// Now returns rank r's clock, in seconds.
func (w *World) Now(r int) float64 {
	c := &w.clocks[r]
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Reset sets every clock and NIC to 0. Call it only while no rank has work
// in flight (every stream synchronized): a record on its way would keep its
// old arrival time.
func (w *World) Reset() {
	for i := range w.clocks {
		w.clocks[i].mu.Lock()
		w.clocks[i].now = 0
		w.clocks[i].mu.Unlock()
	}
	for i := range w.nics {
		w.nics[i].mu.Lock()
		w.nics[i].free = 0
		w.nics[i].mu.Unlock()
	}
	w.mu.Lock()
	trs := w.trs
	w.mu.Unlock()
	for _, t := range trs {
		t.mu.Lock()
		t.last = 0
		t.mu.Unlock()
		t.mine.mu.Lock()
		clear(t.mine.arrive)
		t.mine.mu.Unlock()
	}
}

// advance adds d to rank r's clock.
func (w *World) advance(r int, d float64) {
	c := &w.clocks[r]
	c.mu.Lock()
	c.now += d
	c.mu.Unlock()
}

// reach moves rank r's clock to t when it is behind.
func (w *World) reach(r int, t float64) {
	c := &w.clocks[r]
	c.mu.Lock()
	c.now = max(c.now, t)
	c.mu.Unlock()
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
func (d *Dialer) LocalWork(n int64) { d.w.advance(d.rank, float64(n)*d.w.gamma*d.w.slow) }

// end is one end of a channel: when the records on each of its notifies
// arrive.
type end struct {
	rank   int
	mu     sync.Mutex
	arrive []float64
}

// Connect connects an inproc channel over the world's fabric, then trades
// the two ends' world ranks and arrival tables with the peer through ex (its
// Local.Rank and Peer may be a sub-communicator's ranks).
func (d *Dialer) Connect(ctx context.Context, local *channel.Local, ex channel.Exchange) (*channel.Conn, error) {
	conn, err := d.inner.Connect(ctx, local, ex)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*channel.Conn, error) {
		conn.Transport.Close()
		return nil, err
	}
	mine := &end{rank: d.rank, arrive: make([]float64, local.NotifyNum)}
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
	t := &Transport{inner: conn.Transport, w: d.w, me: d.rank, peer: peer.rank, c: c, inter: inter, mine: mine, theirs: peer}
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
	last float64 // when the channel's latest message arrives
}

// Name returns "sim".
func (t *Transport) Name() string { return Name }

// send charges the sender for a message of n bytes and returns when it
// arrives (extra: work at the far end before the bytes count as there).
func (t *Transport) send(n int, extra float64) float64 {
	w := t.w
	clk := &w.clocks[t.me]
	clk.mu.Lock()
	start := clk.now
	ser := (t.c.o + float64(n)*t.c.beta) * w.slow
	if t.inter {
		h := &w.nics[w.Host(t.me)]
		h.mu.Lock()
		start = max(start, h.free)
		h.free = start + ser
		h.mu.Unlock()
	}
	clk.now = start + ser
	arrival := clk.now + t.c.alpha*w.slow + extra
	clk.mu.Unlock()
	t.mu.Lock()
	arrival = max(arrival, t.last)
	t.last = arrival
	t.mu.Unlock()
	return arrival
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
	t.w.advance(t.me, (2*t.c.alpha+t.c.o+float64(len(dst))*t.c.beta)*t.w.slow)
	return t.inner.Read(stop, dst, src)
}

// WriteReduce computes peer[dst] = peer[dst] op src; the reduction is
// charged at the far end, before the bytes count as arrived.
func (t *Transport) WriteReduce(stop <-chan struct{}, dst device.Ptr, src []byte, count int, dt reduce.DataType, op reduce.Op) error {
	t.send(len(src), float64(len(src))*t.w.gamma*t.w.slow)
	return t.inner.WriteReduce(stop, dst, src, count, dt, op)
}

// ReadReduce computes dst = dst op peer[src]: a read, then a local reduction.
func (t *Transport) ReadReduce(stop <-chan struct{}, dst []byte, src device.Ptr, count int, dt reduce.DataType, op reduce.Op) error {
	n := float64(len(dst))
	t.w.advance(t.me, (2*t.c.alpha+t.c.o+n*t.c.beta+n*t.w.gamma)*t.w.slow)
	return t.inner.ReadReduce(stop, dst, src, count, dt, op)
}

// NotifyRecord records the peer's notify idx, which arrives after every
// earlier message of the channel.
func (t *Transport) NotifyRecord(stop <-chan struct{}, idx int) error {
	at := t.send(0, 0)
	if idx >= 0 && idx < len(t.theirs.arrive) {
		// Before the record itself: the peer's wait must find it.
		t.theirs.mu.Lock()
		t.theirs.arrive[idx] = max(t.theirs.arrive[idx], at)
		t.theirs.mu.Unlock()
	}
	return t.inner.NotifyRecord(stop, idx)
}

// NotifyWaited advances this rank's clock to the arrival of the record its
// wait on notify idx returned for (channel.Clocked).
func (t *Transport) NotifyWaited(idx int) {
	if idx < 0 || idx >= len(t.mine.arrive) {
		return
	}
	t.mine.mu.Lock()
	at := t.mine.arrive[idx]
	t.mine.arrive[idx] = 0
	t.mine.mu.Unlock()
	t.w.reach(t.me, at)
}

// Fence returns once every earlier operation is complete at the peer: the
// clock moves to the channel's last arrival.
func (t *Transport) Fence(stop <-chan struct{}) error {
	t.mu.Lock()
	last := t.last
	t.mu.Unlock()
	t.w.reach(t.me, last)
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

var (
	_ channel.Clocked     = (*Transport)(nil)
	_ channel.LocalCoster = (*Dialer)(nil)
)
