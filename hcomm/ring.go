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

// The bootstrap ring. Rank 0's store serves O(n) messages per init, however
// many ranks there are (internal/bootstrap/spec.md counts them): each rank
// claims its rank, publishes its own description there and reads its ring
// successor's, and that is all it asks rank 0 for the rendezvous. The rest
// rides the ranks' own mailboxes — a small bootstrap store each rank serves
// from its init on, in the manner of NCCL's bootstrap ring:
//
//   - the descriptions go around the ring (rank r hands rank r+1 what it
//     has, n-1 steps), so every rank learns all n without rank 0 sending
//     the list to each;
//   - the messages that set up a channel between ranks a < b are traded in
//     rank a's mailbox, not rank 0's store;
//   - liveness: each rank pings its successor's mailbox, which reports the
//     rank lost when it falls silent for the liveness timeout (and publishes
//     it in rank 0's store, as rank 0's store does for a connection that
//     ends); rank 0 stuck, whose store cannot publish, is passed around the
//     ring instead. Nobody polls rank 0's store.

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
	lost   chan struct{} // closed at the first loss the store reports
	lostR  int
	lostW  string
}

// mailConn is one connection to another rank's mailbox, dialled once.
type mailConn struct {
	ready chan struct{} // closed once cli or err is set
	cli   *bootstrap.Client
	err   error
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
// use (bounded by ctx; a mailbox that refuses is gone: no retry). Callers
// share the connection; a failed dial is forgotten, so the next call tries
// again.
func (m *mailbox) dial(ctx context.Context, addr string) (*bootstrap.Client, error) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, fmt.Errorf("bootstrap mailbox of rank %d: %w", m.rank, bootstrap.ErrClosed)
	}
	mc, ok := m.conns[addr]
	if !ok {
		mc = &mailConn{ready: make(chan struct{})}
		m.conns[addr] = mc
		m.mu.Unlock()
		mc.cli, mc.err = bootstrap.DialUp(ctx, addr, m.secret, bootstrap.Claim{Rank: m.rank, NRanks: m.size})
		m.mu.Lock()
		if mc.err != nil {
			delete(m.conns, addr)
		} else if m.closed { // close ran meanwhile and missed this one
			mc.cli.Close()
			mc.cli, mc.err = nil, fmt.Errorf("bootstrap mailbox of rank %d: %w", m.rank, bootstrap.ErrClosed)
		}
		close(mc.ready)
		m.mu.Unlock()
		return mc.cli, mc.err
	}
	m.mu.Unlock()
	select {
	case <-mc.ready:
		return mc.cli, mc.err
	case <-ctx.Done():
		return nil, ctx.Err()
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

// ringGather is the rendezvous's ring all-gather: this rank (r of n) hands
// its successor, whose mailbox next is connected to, the description it
// holds, and takes its predecessor's from its own mailbox, n-1 times; it
// returns the n descriptions, by rank. Every rank talks to its two
// neighbours only; rank 0's store sees none of it. It ends early when the
// ring cannot go on: a neighbour lost (this rank's mailbox reports its
// predecessor, the successor's refuses a hand-over), a loss rank 0's store
// publishes (watch: a rank elsewhere on the ring), rank 0's store failing
// the job or going away without a goodbye, or ctx.
func ringGather(ctx context.Context, m *mailbox, next *bootstrap.Client, root *bootstrap.Client, mine []byte) ([][]byte, error) {
	n, r := m.size, m.rank
	all := make([][]byte, n)
	all[r] = mine
	if n == 1 {
		return all, nil
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := watchRing(ctx, cancel, m, root)
	defer stop()
	succ, pred := (r+1)%n, (r+n-1)%n
	local := m.local()
	for s := 0; s < n-1; s++ {
		if ringHook != nil {
			ringHook(r, s)
		}
		key := "boot/ring/" + strconv.Itoa(s)
		if err := next.Set(ctx, key, all[(r-s+n)%n]); err != nil {
			if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
				return nil, cause
			}
			if errors.Is(err, bootstrap.ErrClosed) && ctx.Err() == nil {
				// The successor's mailbox went: its process died (no
				// goodbye), or it failed its init and closed (its own
				// loss event says why).
				why := "its bootstrap mailbox closed (it failed during its setup)"
				if next.Lost() {
					why = "it is gone: its bootstrap mailbox went away without a goodbye"
				}
				return nil, fmt.Errorf("rank %d handing the ranks' descriptions to rank %d: rank %d is lost: %s: %w", r, succ, succ, why, ErrRankLost)
			}
			return nil, fmt.Errorf("rank %d handing the ranks' descriptions to rank %d: %w", r, succ, err)
		}
		v, err := local.Get(ctx, key)
		if err != nil {
			if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
				return nil, cause
			}
			return nil, fmt.Errorf("rank %d waiting for the ranks' descriptions from rank %d: %w", r, pred, err)
		}
		local.Delete(ctx, key)
		all[(r-1-s+n)%n] = v
	}
	return all, nil
}

// ringHook, when set (by tests, before any communicator exists), runs in
// every joining rank before each step s of its ring gather: a test makes a
// rank die there.
var ringHook func(rank, step int)

// watchRing cancels ctx (with the reason as cause) when the ring gather
// cannot end: a rank lost, the job failed. It returns a function that stops
// the watch and waits for it.
func watchRing(ctx context.Context, cancel context.CancelCauseFunc, m *mailbox, root *bootstrap.Client) (stop func()) {
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
			cancel(fmt.Errorf("rank %d passing the ranks' descriptions around the ring: a rank was lost (malformed event %q): %w", m.rank, b, ErrRankLost))
			return
		}
		cancel(fmt.Errorf("rank %d passing the ranks' descriptions around the ring: rank %d is lost: %s: %w", m.rank, ev.Rank, ev.Reason, ErrRankLost))
	}()
	go func() { // this rank's predecessor lost; rank 0's store failing the job or lost
		defer wg.Done()
		select {
		case <-wctx.Done():
		case <-m.lost:
			m.mu.Lock()
			rank, why := m.lostR, m.lostW
			m.mu.Unlock()
			cancel(fmt.Errorf("rank %d passing the ranks' descriptions around the ring: rank %d is lost: %s: %w", m.rank, rank, why, ErrRankLost))
		case <-root.Done():
			switch err := root.Err(); {
			case errors.Is(err, bootstrap.ErrJobFailed):
				cancel(err)
			case root.Lost():
				cancel(fmt.Errorf("rank %d passing the ranks' descriptions around the ring: rank 0 is lost: its bootstrap store went away without a goodbye: %w", m.rank, ErrRankLost))
			}
			// The store closed with a goodbye: rank 0 has every
			// description and no longer needs the ring; neither does this
			// rank need rank 0's store to finish it.
		}
	}()
	return func() {
		wcancel()
		wg.Wait()
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
// (connecting to it on first use, bounded by ctx); otherwise the
// communicator's store.
func (c *Comm) pairStore(ctx context.Context, peer int) (bootstrap.Store, error) {
	m := c.boot.mail
	if m == nil || c.boot.ns == "" {
		return c.boot.store, nil
	}
	host := min(c.rank, peer)
	if host == c.rank {
		return bootstrap.Prefix(m.local(), c.boot.ns), nil
	}
	addr := c.boot.peers[host].Mailbox
	if addr == "" {
		return c.boot.store, nil
	}
	cli, err := m.dial(ctx, addr)
	if err != nil {
		return nil, fmt.Errorf("connecting to rank %d's bootstrap mailbox %s: %w", host, addr, err)
	}
	return bootstrap.Prefix(cli, c.boot.ns), nil
}
