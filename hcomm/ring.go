package hcomm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/hcomm-dev/hcomm/internal/bootstrap"
)

// The bootstrap's mailboxes. Rank 0's store serves O(n) messages per
// init, however many ranks there are (internal/bootstrap/spec.md counts
// them): each rank claims its rank, publishes its own description there
// and reads two others' — its ring successor's and its tree parent's —
// and that is all it asks rank 0 for the rendezvous. The rest rides the
// ranks' mailboxes — a small bootstrap store each rank serves from its
// init on, in the manner of NCCL's bootstrap ring:
//
//   - the descriptions go up and down a k-nomial tree of the ranks
//     (treeGather: log_k n hops each way), so every rank learns all n
//     without rank 0 sending the list to each;
//   - the messages that set up a channel between ranks a < b are traded in
//     rank a's mailbox, not rank 0's store (pairStore); rank b connects
//     for the setup and hangs up after it, so that a rank holds O(1)
//     mailbox connections whatever the peers it has channels to;
//   - liveness rides a ring: each rank pings its successor's mailbox,
//     which reports the rank lost when it falls silent for the liveness
//     timeout (and publishes it in rank 0's store, as rank 0's store does
//     for a connection that ends), and watches that connection for the
//     successor's end; rank 0 stuck, whose store cannot publish, is passed
//     around the ring instead. Nobody pings rank 0's store.

// mailbox is a rank's own bootstrap store and its connections to the other
// ranks' mailboxes. Safe for concurrent use.
type mailbox struct {
	srv        *bootstrap.Server
	addr       string
	rank, size int // this rank's claim on the other mailboxes
	secret     bootstrap.Secret

	mu     sync.Mutex
	conns  map[string]*mailConn // by address
	closed bool
	onLost func(rank int, reason string)
	ring   *bootstrap.Client // the connection to the ring successor's mailbox, once made
	succ   int
	lost   chan struct{} // closed at the first loss the store reports
	lostR  int
	lostW  string
}

// mailConn is one connection to another rank's mailbox. It lives while
// someone uses it: the ring's connection to the successor for the
// mailbox's life (dial), the others — to the tree parent during the
// gather, to a lower rank during a channel setup with it — while leased
// (use). So a rank holds O(1) mailbox connections between setups, not one
// to every lower rank it ever set a channel up with (as NCCL's bootstrap
// keeps only its ring: a setup dials, trades, hangs up).
type mailConn struct {
	ready chan struct{} // closed once cli or err is set
	cli   *bootstrap.Client
	err   error
	uses  int  // leases not yet released; guarded by mailbox.mu
	kept  bool // dialled by dial: open until the mailbox closes; guarded by mailbox.mu
}

// startMailbox starts rank's mailbox on ifc: it admits connections that
// prove secret, and reports its ring predecessor (prev) lost when that
// rank's connection falls silent for idle.
func startMailbox(c Config, ifc bootstrap.Iface, secret bootstrap.Secret, rank, size int) (*mailbox, error) {
	m := &mailbox{rank: rank, size: size, secret: secret, conns: make(map[string]*mailConn), lost: make(chan struct{})}
	prev := (rank + size - 1) % size
	srv, err := bootstrap.Listen(net.JoinHostPort(ifc.IP.String(), "0"), secret, bootstrap.ServerOptions{
		Logger: c.bootLogger(), OnLost: m.lostHook, IdleTimeout: c.livenessTimeout(),
		Watched: func(cl bootstrap.Claim) bool { return cl.Rank == prev },
		Open:    true, // a rank dials it anew for each channel setup with this one
	})
	if err != nil {
		return nil, err
	}
	m.srv = srv
	m.addr = net.JoinHostPort(ifc.IP.String(), strconv.Itoa(srv.Addr().(*net.TCPAddr).Port))
	return m, nil
}

// lostHook is the mailbox store's OnLost: a rank connected to it ended
// without a goodbye, or (its ring predecessor) fell silent.
func (m *mailbox) lostHook(_ bootstrap.Store, rank int, reason string) {
	m.mu.Lock()
	select {
	case <-m.lost:
	default:
		m.lostR, m.lostW = rank, reason
		close(m.lost)
	}
	f := m.onLost
	m.mu.Unlock()
	if f != nil {
		f(rank, reason)
	}
}

// setOnLost sets what the mailbox does with a loss its store reports.
func (m *mailbox) setOnLost(f func(rank int, reason string)) {
	m.mu.Lock()
	m.onLost = f
	m.mu.Unlock()
}

// local is the mailbox's store seen from this rank.
func (m *mailbox) local() bootstrap.Store { return m.srv.Local() }

// dial returns the connection to the mailbox at addr, connecting on first
// use (bounded by ctx; a mailbox that refuses is gone: no retry), and
// keeps it open until the mailbox closes: the ring's. Callers share the
// connection; a failed dial is forgotten, so the next call tries again.
func (m *mailbox) dial(ctx context.Context, addr string) (*bootstrap.Client, error) {
	cli, release, err := m.use(ctx, addr)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	if mc := m.conns[addr]; mc != nil && mc.cli == cli {
		mc.kept = true
	}
	m.mu.Unlock()
	release()
	return cli, nil
}

// use returns the connection to the mailbox at addr, connecting on first
// use as dial does, and a release function that the caller calls once it
// is done with it (exactly once; the connection must not be used after):
// the last release of a connection that dial did not keep says goodbye to
// that mailbox and hangs up. Safe for concurrent use; callers share the
// connection while any holds it.
func (m *mailbox) use(ctx context.Context, addr string) (*bootstrap.Client, func(), error) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, nil, fmt.Errorf("bootstrap mailbox of rank %d: %w", m.rank, bootstrap.ErrClosed)
	}
	mc, ok := m.conns[addr]
	if !ok {
		mc = &mailConn{ready: make(chan struct{})}
		m.conns[addr] = mc
	}
	mc.uses++
	m.mu.Unlock()
	if !ok {
		cli, err := bootstrap.DialUp(ctx, addr, m.secret, bootstrap.Claim{Rank: m.rank, NRanks: m.size})
		m.mu.Lock()
		mc.cli, mc.err = cli, err
		if mc.err != nil {
			delete(m.conns, addr)
		} else if m.closed { // close ran meanwhile and missed this one
			mc.cli.Close()
			mc.cli, mc.err = nil, fmt.Errorf("bootstrap mailbox of rank %d: %w", m.rank, bootstrap.ErrClosed)
		}
		close(mc.ready)
		m.mu.Unlock()
	} else {
		select {
		case <-mc.ready:
		case <-ctx.Done():
			m.mu.Lock()
			mc.uses-- // the dialling caller holds a use of its own: it releases
			m.mu.Unlock()
			return nil, nil, ctx.Err()
		}
	}
	if mc.err != nil {
		return nil, nil, mc.err
	}
	var once sync.Once
	return mc.cli, func() { once.Do(func() { m.release(addr, mc) }) }, nil
}

// release ends a use of mc, the connection to addr: the last use of a
// connection that is not kept hangs up (with a goodbye: the mailbox
// reports no loss).
func (m *mailbox) release(addr string, mc *mailConn) {
	m.mu.Lock()
	mc.uses--
	last := mc.uses == 0 && !mc.kept && m.conns[addr] == mc
	if last {
		delete(m.conns, addr)
	}
	m.mu.Unlock()
	if last {
		mc.cli.Close()
	}
}

// close says goodbye to every mailbox this rank connected to, then stops
// its own store. Idempotent; nil-safe.
func (m *mailbox) close() {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.closed = true
	var clis []*bootstrap.Client
	for _, mc := range m.conns {
		select {
		case <-mc.ready:
			if mc.cli != nil {
				clis = append(clis, mc.cli)
			}
		default: // dial in flight: it closes its client when it ends
		}
	}
	m.mu.Unlock()
	for _, cl := range clis {
		cl.Close()
	}
	m.srv.Close()
}

// The gather's tree is the k-nomial tree of radix treeRadix rooted at
// rank 0: a rank's parent is the rank with its lowest nonzero base-k digit
// cleared; rank r's subtree is the ranks [r, r+lowPlace(r)) (rank 0's:
// all n). Its depth is log_k n — 2 at 64 ranks, 4 at 4096 — and a rank
// has at most (k-1)·depth children: a few hops and a small fan-in, where
// a ring takes n-1 hops and a binomial tree 2·log2 n.
const treeRadix = 8

// lowPlace returns the place value (a power of treeRadix) of r's lowest
// nonzero base-treeRadix digit; 0 for r = 0.
func lowPlace(r int) int {
	if r == 0 {
		return 0
	}
	p := 1
	for r%(p*treeRadix) == 0 {
		p *= treeRadix
	}
	return p
}

// treeParent is rank r's parent in the gather's tree; 0 for rank 0 (the
// root).
func treeParent(r int) int {
	p := lowPlace(r)
	if p == 0 {
		return 0
	}
	return r - (r/p%treeRadix)*p
}

// treeChildren returns rank r's children in the gather's tree of n ranks,
// in rank order (their subtrees follow one another).
func treeChildren(r, n int) []int {
	var out []int
	lim := lowPlace(r)
	for p := 1; r+p < n && (r == 0 || p < lim); p *= treeRadix {
		for j := 1; j < treeRadix && r+j*p < n; j++ {
			out = append(out, r+j*p)
		}
	}
	return out
}

// treeSpan is the number of ranks in rank r's subtree of n ranks.
func treeSpan(r, n int) int {
	if r == 0 {
		return n
	}
	return min(lowPlace(r), n-r)
}

// Keys of the gather in the mailboxes.
const (
	gatherUp      = "boot/up/"      // + child rank: its subtree's descriptions, in the parent's mailbox
	gatherAll     = "boot/all"      // every description, in each parent's mailbox
	gatherRead    = "boot/read"     // counter: children that read gatherAll
	gatherReadAll = "boot/read-all" // set by the child that read it last
)

// treeGather is the rendezvous's all-gather of the ranks' descriptions, up
// and down the gather's tree rooted at rank 0 (treeParent), over the ranks'
// mailboxes: this rank (m.rank of m.size) takes its children's subtrees
// from its mailbox, hands its own subtree to its parent's (parent: the
// connection to it; nil on rank 0), reads every description back from
// there, and serves it to its children, returning once every child has
// read it — so that a rank may close its mailbox the moment its init
// returns. 2·log_k(n) hops; rank 0's store sees none of it. It returns the
// n descriptions, by rank.
//
// It ends early when ctx does — the rendezvous runs it under watchGather,
// whose verdict (a rank lost, the job failed) it returns as its error — or
// this rank's parent refuses: it names the parent lost.
func treeGather(ctx context.Context, m *mailbox, parent *bootstrap.Client, mine []byte) ([][]byte, error) {
	n, r := m.size, m.rank
	if n == 1 {
		return [][]byte{mine}, nil
	}
	// why returns the cause of a failure: the watch's verdict when it
	// ended ctx, else err, said of the call (doing, to peer; -1: this
	// rank's own mailbox) that failed.
	why := func(err error, peer int, doing string) error {
		if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
			return cause
		}
		if peer < 0 {
			return fmt.Errorf("rank %d %s: %w", r, doing, err)
		}
		if errors.Is(err, bootstrap.ErrClosed) && ctx.Err() == nil {
			// The parent's mailbox went: its process died (no goodbye), or
			// it failed its init and closed — the job failed (rank 0's
			// store says why to every rank), or it published its own
			// loss: the watch's verdict says so, in a moment.
			what := "it is gone: its bootstrap mailbox went away without a goodbye"
			if !parent.Lost() {
				if v := awaitVerdict(ctx, verdictWait); v != nil {
					return v
				}
				what = "its bootstrap mailbox closed (it failed during its setup)"
			}
			return fmt.Errorf("rank %d %s rank %d: rank %d is lost: %s: %w", r, doing, peer, peer, what, ErrRankLost)
		}
		return fmt.Errorf("rank %d %s rank %d: %w", r, doing, peer, err)
	}
	local := m.local()
	kids := treeChildren(r, n)
	if gatherHook != nil {
		gatherHook(r, 0)
	}
	sub := []json.RawMessage{mine}
	for _, k := range kids {
		v, err := local.Get(ctx, gatherUp+strconv.Itoa(k))
		if err != nil {
			return nil, why(err, -1, fmt.Sprintf("waiting for the descriptions of rank %d's subtree", k))
		}
		var part []json.RawMessage
		if err := json.Unmarshal(v, &part); err != nil || len(part) != treeSpan(k, n) {
			return nil, fmt.Errorf("rank %d: rank %d sent %d malformed descriptions of its subtree (want %d)", r, k, len(part), treeSpan(k, n))
		}
		sub = append(sub, part...)
		local.Delete(ctx, gatherUp+strconv.Itoa(k))
	}
	all, _ := json.Marshal(sub)
	if r != 0 {
		p := treeParent(r)
		if err := parent.Set(ctx, gatherUp+strconv.Itoa(r), all); err != nil {
			return nil, why(err, p, "handing its subtree's descriptions to")
		}
		if gatherHook != nil {
			gatherHook(r, 1)
		}
		v, err := parent.Get(ctx, gatherAll)
		if err != nil && errors.Is(context.Cause(ctx), ErrRankLost) {
			// A loss elsewhere may have come just after the parent had
			// every description (a rank that failed right after its init):
			// take them if they are there — the communicator learns of the
			// loss from its watch.
			tctx, tcancel := context.WithTimeout(context.Background(), time.Second)
			if b, ok, terr := parent.TryGet(tctx, gatherAll); terr == nil && ok {
				v, err = b, nil
			}
			tcancel()
		}
		if err != nil {
			return nil, why(err, p, "waiting for every rank's description from")
		}
		all = v
		// This rank has every description: telling the parent is for the
		// parent's sake (it may close its mailbox once its children have
		// read), and a failure here — the parent, or the job, failing
		// meanwhile — is no failure of this rank's init: its
		// communicator learns of the loss from its watch.
		if k, err := parent.Add(ctx, gatherRead, 1); err == nil && k == int64(len(treeChildren(p, n))) {
			parent.Set(ctx, gatherReadAll, []byte{1})
		}
	}
	if len(kids) > 0 {
		if err := local.Set(ctx, gatherAll, all); err != nil {
			return nil, why(err, -1, "serving every description to its children")
		}
		if _, err := local.Get(ctx, gatherReadAll); err != nil {
			// A loss meanwhile (the watch's verdict) is no failure of this
			// rank's init, which has every description: its communicator
			// learns of it from its watch.
			if cause := context.Cause(ctx); cause == nil || !errors.Is(cause, ErrRankLost) {
				return nil, why(err, -1, "waiting for its children to read every description")
			}
		}
	}
	var out []json.RawMessage
	if err := json.Unmarshal(all, &out); err != nil || len(out) != n {
		return nil, fmt.Errorf("rank %d: the descriptions of every rank are malformed (%d of %d)", r, len(out), n)
	}
	res := make([][]byte, n)
	for i, b := range out {
		res[i] = b
	}
	return res, nil
}

// gatherHook, when set (by tests, before any communicator exists), runs in
// every joining rank at two points of its tree gather: step 0 before it
// takes its children's descriptions, step 1 (not on rank 0) after it
// handed its subtree's to its parent, before it reads every description
// back. A test makes a rank die there.
var gatherHook func(rank, step int)

// verdictWait bounds how long a rank whose peer closed its mailbox during
// the rendezvous waits for the word on why (awaitVerdict).
const verdictWait = time.Second

// awaitVerdict waits, at most d, for the watch (watchGather) to end ctx
// with its verdict, and returns it; nil when none came (or ctx ended
// otherwise).
func awaitVerdict(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) && !errors.Is(cause, context.DeadlineExceeded) {
		return cause
	}
	return nil
}

// watchGather cancels ctx (with the reason as cause) when the tree gather
// cannot end: a rank lost, the job failed. It returns a function that stops
// the watch and waits for it.
func watchGather(ctx context.Context, cancel context.CancelCauseFunc, m *mailbox, root *bootstrap.Client) (stop func()) {
	wctx, wcancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // a loss rank 0's store publishes, anywhere on the ring
		defer wg.Done()
		b, err := root.Get(wctx, "c/"+eventPfx+"1")
		if err != nil {
			return // the watch stopped, or the store went: the next case tells which
		}
		var ev lossEvent
		if json.Unmarshal(b, &ev) != nil {
			cancel(fmt.Errorf("rank %d gathering the ranks' descriptions: a rank was lost (malformed event %q): %w", m.rank, b, ErrRankLost))
			return
		}
		cancel(fmt.Errorf("rank %d gathering the ranks' descriptions: rank %d is lost: %s: %w", m.rank, ev.Rank, ev.Reason, ErrRankLost))
	}()
	go func() { // this rank's predecessor lost; rank 0's store failing the job or lost
		defer wg.Done()
		select {
		case <-wctx.Done():
		case <-m.lost:
			m.mu.Lock()
			rank, why := m.lostR, m.lostW
			m.mu.Unlock()
			cancel(fmt.Errorf("rank %d gathering the ranks' descriptions: rank %d is lost: %s: %w", m.rank, rank, why, ErrRankLost))
		case <-root.Done():
			switch err := root.Err(); {
			case errors.Is(err, bootstrap.ErrJobFailed):
				cancel(err)
			case root.Lost():
				cancel(fmt.Errorf("rank %d gathering the ranks' descriptions: rank 0 is lost: its bootstrap store went away without a goodbye: %w", m.rank, ErrRankLost))
			}
			// The store closed with a goodbye: rank 0's init returned,
			// and this rank no longer needs rank 0 to finish the gather
			// (its parent, if rank 0, gave it every description).
		}
	}()
	return func() {
		wcancel()
		wg.Wait()
	}
}

// setRing records the connection to the ring successor's mailbox; this
// rank pings it (the successor watches this rank's liveness) and watches
// it in turn (watchSucc).
func (m *mailbox) setRing(succ int, cli *bootstrap.Client) {
	m.mu.Lock()
	m.ring, m.succ = cli, succ
	m.mu.Unlock()
	cli.KeepAlive(keepAliveInterval)
}

// watchSucc runs on each rank of a communicator with a ring for its life
// (until ctx ends): when the connection to its ring successor's mailbox
// ends without the successor's goodbye, the successor's process died (or
// the network between failed), and c learns it is lost — without rank 0's
// store, which may be gone with it.
func (c *Comm) watchSucc(ctx context.Context) {
	m := c.boot.mail
	m.mu.Lock()
	cli, succ := m.ring, m.succ
	m.mu.Unlock()
	if cli == nil {
		return
	}
	select {
	case <-ctx.Done():
	case <-cli.Done():
		if cli.Lost() && ctx.Err() == nil {
			c.rankLost(succ, "it is gone: its bootstrap mailbox went away without a goodbye (its process died or its network failed)")
		}
	}
}

// ringLost0 is the key, in every rank's mailbox, under which the ring
// passes on that rank 0 is lost when its own store cannot say so (rank 0 is
// stuck: its store answers nothing).
const ringLost0 = "ring/lost0"

// watchRingLost0 runs on each rank but 0 of a communicator with a ring for
// its life (until ctx ends): when its mailbox learns that rank 0 is lost,
// it tells c and passes the word to its successor, unless that is rank 0.
func (c *Comm) watchRingLost0(ctx context.Context) {
	m := c.boot.mail
	b, err := m.local().Get(ctx, ringLost0)
	if err != nil {
		return
	}
	c.rankLost(0, string(b))
	if next := (c.rank + 1) % c.size; next != 0 {
		if cli, err := m.dial(ctx, c.boot.peers[next].Mailbox); err == nil {
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			cli.Set(sctx, ringLost0, b)
			cancel()
		}
	}
}

// mailLost is the mailbox's loss hook once a communicator runs on it: it
// publishes the loss of rank in rank 0's store, as rank 0's store does for
// a connection that ends; rank 0 itself it passes around the ring, which
// is how the others learn that rank 0 is stuck (its store cannot publish).
func (b *bootState) mailLost(rank int, reason string) {
	if rank == 0 && b.mail.rank != 0 {
		if _, ok, _ := b.mail.local().TryGet(context.Background(), ringLost0); ok {
			return
		}
		b.mail.local().Set(context.Background(), ringLost0, []byte(reason))
		return
	}
	postLoss(b.store, rank, reason)
}

// pairStore is the store in which this rank and peer trade the messages of
// a channel setup: with a ring, the mailbox of the lower rank of the two
// (connecting to it, bounded by ctx); otherwise the communicator's store.
// The caller calls release once the setup is over, whichever way it
// ended: the connection to the peer's mailbox closes when no setup with
// that peer uses it (mailbox.use).
func (c *Comm) pairStore(ctx context.Context, peer int) (st bootstrap.Store, release func(), err error) {
	m := c.boot.mail
	if m == nil || c.boot.ns == "" {
		return c.boot.store, func() {}, nil
	}
	host := min(c.rank, peer)
	if host == c.rank {
		return bootstrap.Prefix(m.local(), c.boot.ns), func() {}, nil
	}
	addr := c.boot.peers[host].Mailbox
	if addr == "" {
		return c.boot.store, func() {}, nil
	}
	cli, release, err := m.use(ctx, addr)
	if err != nil {
		return nil, nil, fmt.Errorf("connecting to rank %d's bootstrap mailbox %s: %w", host, addr, err)
	}
	return bootstrap.Prefix(cli, c.boot.ns), release, nil
}
