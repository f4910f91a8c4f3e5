package hcomm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/internal/bootstrap"
)

// Losing a rank. A multi-process communicator learns that one of its ranks
// is lost in two ways: its transports notice (a socket reset, a peer's shm
// goodbye missing, a heartbeat silent) and break the notifies of the channels
// to that rank; and rank 0's bootstrap store notices the rank's store
// connection end without a goodbye (its process died) and publishes the loss.
// Every rank watches for that publication and then breaks the notifies of
// all its channels with an error naming the lost rank and wrapping
// ErrRankLost, so that every pending wait of every rank fails at once —
// not only the waits on the lost rank, and before a neighbour's teardown
// could make the failure look like that neighbour's. Afterwards the
// communicator refuses new work (ErrRemote); Destroy still works.
//
// Liveness rides a ring (ring.go): every rank pings its successor's
// bootstrap mailbox twice a second, and the successor's mailbox reports a
// rank silent for Config.LivenessTimeout (HCOMM_LIVENESS_TIMEOUT, 10 s) —
// stopped, frozen, its network gone — lost the same way, "not responding
// (alive but stuck?)", where a rank whose connection closed is "gone".
// Rank 0's own loss each rank learns from its store connection ending
// without rank 0's goodbye (a store that rank 0 closes on purpose says
// goodbye first); rank 0 stuck, from rank 1, whose mailbox finds it
// silent and passes the word around the ring (rank 0's store, stuck,
// cannot publish it). Nobody pings rank 0's store (the loss watch's
// looks at it grow rare in a quiet job: quietGrace), and neither way
// depends on HCCL_EXEC_TIMEOUT. (A communicator without mailboxes — a
// shrunk one — pings its store and asks rank 0's a question once a
// second instead: watchRoot.)

// keepAliveInterval is how often a rank pings its ring successor's
// mailbox (a shrunk communicator's rank: its store).
const keepAliveInterval = 500 * time.Millisecond

// livenessTimeout is how long rank 0's store waits for a word (a ping) from
// a rank, and a rank for an answer from rank 0's store, before it reports
// the rank lost: Config.LivenessTimeout (HCOMM_LIVENESS_TIMEOUT, 10 s).
func (c Config) livenessTimeout() time.Duration {
	if c.LivenessTimeout <= 0 {
		return DefaultLivenessTimeout
	}
	return c.LivenessTimeout
}

// ErrRankLost is wrapped by the errors of operations that failed because a
// rank of the communicator was lost.
var ErrRankLost = errors.New("rank lost")

// Loss events, under the communicator's prefix "c" of rank 0's store: the
// store numbers them in the counter "event-n" and sets each under
// "event/<n>" (n from 1), so that every rank reads every loss, in order. A
// rank is published once (the counter "lost/<rank>" keeps the first).
const (
	eventCtr = "event-n"   // losses published so far
	eventPfx = "event/"    // + n: JSON lossEvent
	lostPfx  = "lost/"     // + rank: first publisher wins
	ackCtr   = "event-ack" // ranks that applied the first loss
)

type lossEvent struct {
	Rank   int    `json:"rank"`
	Reason string `json:"reason"`
}

// publishLoss is rank 0's store hook: it publishes the loss of rank.
func publishLoss(local bootstrap.Store, rank int, reason string) {
	postLoss(bootstrap.Prefix(local, "c"), rank, reason)
}

// postLoss publishes the loss of rank in s (a communicator's view of its
// store): by the store's hook, or by a rank that fails during its setup.
// It gives up after a second.
func postLoss(s bootstrap.Store, rank int, reason string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if n, err := s.Add(ctx, lostPfx+strconv.Itoa(rank), 1); err != nil || n != 1 {
		return
	}
	n, err := s.Add(ctx, eventCtr, 1)
	if err != nil {
		return
	}
	b, _ := json.Marshal(lossEvent{Rank: rank, Reason: reason})
	s.Set(ctx, eventPfx+strconv.FormatInt(n, 10), b)
}

// health is a communicator's watch on its bootstrap's loss events.
type health struct {
	cancel context.CancelFunc
	done   chan struct{}
	// lostCtx ends when a loss is known: channel setups in flight stop
	// waiting for the peer then.
	lostCtx    context.Context
	lostCancel context.CancelFunc

	looks atomic.Int64 // the watch's looks at the event counter (nextEvent)

	mu      sync.Mutex
	lost    *Error         // the first loss; set once
	lostSet map[int]string // every loss known, with its reason
}

// watch starts the watcher of c; Destroy stops it (unwatch). It reads the
// loss events one after the other for the communicator's life: an event
// that does not parse, or names no rank of the communicator, is logged and
// skipped — no message ends the watch.
func (c *Comm) watch() {
	ctx, cancel := context.WithCancel(context.Background())
	lctx, lcancel := context.WithCancel(context.Background())
	c.health = &health{cancel: cancel, done: make(chan struct{}), lostCtx: lctx, lostCancel: lcancel, lostSet: make(map[int]string)}
	var wg sync.WaitGroup
	if c.boot.mail != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.watchSucc(ctx)
		}()
	}
	switch {
	case c.rank != 0 && c.boot.mail != nil:
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.watchRingLost0(ctx)
		}()
	case c.rank != 0 && c.boot.client != nil:
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.watchRoot(ctx)
		}()
	}
	go func() {
		defer close(c.health.done)
		defer wg.Wait()
		for i := 1; ; i++ {
			b, err := c.nextEvent(ctx, i)
			if err == errNoEvent {
				continue
			}
			if err != nil {
				// Destroy; or rank 0 closed its store (it said goodbye); or
				// the store went away without one: rank 0 is lost.
				if cl := c.boot.client; ctx.Err() == nil && cl != nil && c.rank != 0 {
					select {
					case <-cl.Done():
						if cl.Lost() {
							c.rankLost(0, "it is gone: its bootstrap store went away without a goodbye (its process died or its network failed)")
						}
					case <-ctx.Done():
					}
				}
				return
			}
			var ev lossEvent
			if err := json.Unmarshal(b, &ev); err != nil || ev.Rank < 0 || ev.Rank >= c.size {
				c.cfg.bootLogger().Warn("hcomm: malformed loss event in the bootstrap; ignored", "comm", c.name, "rank", c.rank, "event", string(b))
				continue
			}
			if c.rankLost(ev.Rank, ev.Reason) {
				actx, acancel := context.WithTimeout(ctx, time.Second)
				c.boot.store.Add(actx, ackCtr, 1)
				acancel()
			}
		}
	}()
}

// watchRoot asks rank 0's store a question once a second until ctx ends or
// the store goes: a store that gives no answer within the liveness timeout
// means rank 0 is stuck (stopped, frozen: its sockets stay open, so no
// connection ends to say so), and c learns rank 0 is lost.
func (c *Comm) watchRoot(ctx context.Context) {
	lt := c.cfg.livenessTimeout()
	for {
		tctx, tcancel := context.WithTimeout(ctx, lt)
		_, _, err := c.boot.store.TryGet(tctx, "alive")
		stuck := err != nil && ctx.Err() == nil && tctx.Err() != nil
		tcancel()
		if stuck {
			c.rankLost(0, fmt.Sprintf("it is not responding (alive but stuck?): its bootstrap store answered nothing for %v", lt))
			return
		}
		if err != nil {
			return // Destroy, or the store went (watch tells a loss)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// errNoEvent is nextEvent's verdict on a numbered event never set.
var errNoEvent = errors.New("hcomm: loss event numbered but never set")

// eventGrace is how long an event numbered in the counter may stay unset
// before the watch skips it: a publisher that died (or timed out) between
// numbering its event and setting it must not stop the watch. The watch
// looks at the counter once per grace, at least a second and at most the
// liveness timeout: every rank's look is a request to rank 0's store, so
// the grace grows with the rank count (a 10th of a second per rank). While
// no event comes, the looks grow apart (quietGrace).
func (c *Comm) eventGrace() time.Duration {
	return min(max(time.Second, time.Duration(c.size)*100*time.Millisecond), c.cfg.livenessTimeout())
}

// quietGrace is how far apart a quiet job's looks at the counter grow, in
// graces: each empty look doubles the wait for the next, up to this many
// graces, and an event brings it back to one. A look costs rank 0's store
// three messages per rank (the wait's cancellation, the look, the next
// wait), so a quiet job of n ranks costs it 3n per 16 graces instead of 3n
// per grace; the price is that a loss published behind an event that was
// numbered and never set (its publisher died between the two) reaches the
// watch up to 16 graces late — two faults in a row, and each rank sees its
// own channels' losses at once anyway.
const quietGrace = 16

// nextEvent waits for loss event i. It waits in slices of grace (doubling
// while nothing comes, see quietGrace); after one in which the counter
// shows later events while event i is still missing, it gives up on i
// (errNoEvent).
func (c *Comm) nextEvent(ctx context.Context, i int) ([]byte, error) {
	base := c.eventGrace()
	grace := base
	for {
		gctx, gcancel := context.WithTimeout(ctx, grace)
		b, err := c.boot.store.Get(gctx, eventPfx+strconv.Itoa(i))
		timedOut := err != nil && ctx.Err() == nil && gctx.Err() != nil
		gcancel()
		if !timedOut {
			return b, err
		}
		c.health.looks.Add(1)
		grace = min(2*grace, quietGrace*base)
		n, err := c.boot.store.Add(ctx, eventCtr, 0)
		if err != nil {
			return nil, err
		}
		if n > int64(i) {
			if b, ok, err := c.boot.store.TryGet(ctx, eventPfx+strconv.Itoa(i)); err != nil || ok {
				return b, err
			}
			c.cfg.bootLogger().Warn("hcomm: loss event numbered but never set; skipped", "comm", c.name, "rank", c.rank, "event", i)
			return nil, errNoEvent
		}
	}
}

// rankLost records the loss of rank; at the first loss it puts c in the
// failed state and breaks every channel's notifies, and reports true.
func (c *Comm) rankLost(rank int, reason string) bool {
	e := c.errorf("RankLost", rank, ErrRemote, ErrRankLost, "rank %d is lost: %s", rank, reason)
	c.health.mu.Lock()
	if _, ok := c.health.lostSet[rank]; !ok {
		c.health.lostSet[rank] = reason
	}
	if c.health.lost != nil {
		c.health.mu.Unlock()
		return false
	}
	c.health.lost = e
	c.unusable.Store(true)
	c.health.mu.Unlock()
	c.health.lostCancel()
	if l := c.cfg.logger; l != nil {
		l.Warn("hcomm: rank lost; failing every pending operation", "comm", c.name, "rank", c.rank, "lost", rank, "reason", reason)
	}
	c.breakChannels(e)
	return true
}

// breakChannels fails every pending and later wait on the notifies of c's
// channels with err (a lost rank, a revocation).
func (c *Comm) breakChannels(err error) {
	c.mu.Lock()
	chs := make([]*Channel, 0, len(c.channels))
	for _, ch := range c.channels {
		chs = append(chs, ch)
	}
	c.mu.Unlock()
	for _, ch := range chs {
		for _, n := range ch.notifies {
			n.Break(err)
		}
	}
}

// LostRanks returns the ranks this rank knows to be lost, sorted: those its
// bootstrap reported (a process that died, a rank silent past the liveness
// timeout, a rank that failed during its setup, rank 0's store gone) and
// the peers of its channels whose transport saw them go (channel.ErrPeerLost:
// a reset connection, a missing shm goodbye, a silent heartbeat). A rank
// that closed its channels in order is not lost. nil when none is known.
// Safe for concurrent use; valid on a destroyed communicator (then: what
// it knew).
func (c *Comm) LostRanks() []int {
	if c == nil {
		return nil
	}
	set := make(map[int]bool)
	if c.health != nil {
		c.health.mu.Lock()
		for r := range c.health.lostSet {
			set[r] = true
		}
		c.health.mu.Unlock()
	}
	c.mu.Lock()
	for k, ch := range c.channels {
		for _, n := range ch.notifies {
			if err := n.Broken(); err != nil && errors.Is(err, channel.ErrPeerLost) {
				set[k.remote] = true
				break
			}
		}
	}
	c.mu.Unlock()
	if len(set) == 0 {
		return nil
	}
	out := make([]int, 0, len(set))
	for r := range set {
		out = append(out, r)
	}
	slices.Sort(out)
	return out
}

// lostErr returns the loss c knows of, or nil.
func (c *Comm) lostErr() *Error {
	if c.health == nil {
		return nil
	}
	c.health.mu.Lock()
	defer c.health.mu.Unlock()
	return c.health.lost
}

// unwatch runs at Destroy. When c is failing (it knows of a loss, or one of
// its channels was broken by a transport) it first waits, at most a second,
// until the other live ranks have applied the published loss: closing this
// rank's channels before would make their pending waits fail naming this
// rank instead of the lost one. Then it stops the watcher.
func (c *Comm) unwatch(chs map[chanKey]*Channel) {
	if c.health == nil {
		return
	}
	failing := c.lostErr() != nil
	for _, ch := range chs {
		for _, n := range ch.notifies {
			// A peer that closed the channel in order (ChannelDestroy) is no
			// failure, and a revocation publishes no loss.
			if err := n.Broken(); err != nil && !errors.Is(err, channel.ErrPeerClosed) && !errors.Is(err, ErrRevoked) {
				failing = true
				break
			}
		}
	}
	if failing && c.size > 2 {
		deadline := time.Now().Add(time.Second)
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		// Was the loss published? (The store may notice a moment after the
		// transport did.) If not — rank 0 lost, a network loss — nobody acks.
		_, err := c.boot.store.Get(ctx, eventPfx+"1")
		for err == nil && time.Now().Before(deadline) {
			n, err := c.boot.store.Add(ctx, ackCtr, 0)
			if err != nil || n >= int64(c.size-1) {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
	}
	c.health.cancel()
	<-c.health.done
	c.health.lostCancel()
}

// stopOnLoss makes ctx end when c learns of a lost rank; call the returned
// function when done with ctx.
func (c *Comm) stopOnLoss(cancel context.CancelFunc) (stop func() bool) {
	if c.health == nil {
		return func() bool { return true }
	}
	return context.AfterFunc(c.health.lostCtx, cancel)
}

// lostCheck is usable's test for a loss.
func (c *Comm) lostCheck(op string) error {
	if e := c.lostErr(); e != nil {
		return c.errorf(op, e.Peer, ErrRemote, e, "the communicator lost rank %d", e.Peer)
	}
	return nil
}
