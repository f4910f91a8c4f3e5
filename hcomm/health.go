package hcomm

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
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
// Every rank pings the store twice a second; a rank silent for half of
// HCCL_EXEC_TIMEOUT (within [5 s, 30 s]) — its network went away, its host
// froze — is reported lost the same way, before the waits on it time out.
// Rank 0's own loss each rank learns from its store connection ending
// without rank 0's goodbye (a store that rank 0 closes on purpose says
// goodbye first). What it does not see: rank 0's network going silent while
// its process lives — the transports' heartbeats and HCCL_EXEC_TIMEOUT end
// those waits, naming the channel's peer.

// keepAliveInterval is how often a rank pings rank 0's store.
const keepAliveInterval = 500 * time.Millisecond

// livenessTimeout is how long rank 0's store waits for a word (a ping) from
// a rank before it reports the rank lost: half of HCCL_EXEC_TIMEOUT, so that
// a rank whose network went away is named before the waits on it time out,
// within [5 s, 30 s] so that a loaded machine (a stalled process, a slow
// scheduler) does not lose live ranks.
func (c Config) livenessTimeout() time.Duration {
	t := c.ExecTimeout / 2
	if c.ExecTimeout < 0 || t > 30*time.Second {
		t = 30 * time.Second
	}
	return max(t, 5*time.Second)
}

// ErrRankLost is wrapped by the errors of operations that failed because a
// rank of the communicator was lost.
var ErrRankLost = errors.New("rank lost")

const (
	eventKey = "c/event"   // first loss, JSON lossEvent
	eventCtr = "c/event-n" // first writer wins
	ackCtr   = "event-ack" // (under the comm prefix) ranks that applied the loss
)

type lossEvent struct {
	Rank   int    `json:"rank"`
	Reason string `json:"reason"`
}

// publishLoss is rank 0's store hook: it publishes the first loss.
func publishLoss(local bootstrap.Store, rank int, reason string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if n, err := local.Add(ctx, eventCtr, 1); err != nil || n != 1 {
		return
	}
	b, _ := json.Marshal(lossEvent{Rank: rank, Reason: reason})
	local.Set(ctx, eventKey, b)
}

// health is a communicator's watch on its bootstrap's loss events.
type health struct {
	cancel context.CancelFunc
	done   chan struct{}
	// lostCtx ends when a loss is known: channel setups in flight stop
	// waiting for the peer then.
	lostCtx    context.Context
	lostCancel context.CancelFunc

	mu   sync.Mutex
	lost *Error // set once
}

// watch starts the watcher of c; Destroy stops it (unwatch).
func (c *Comm) watch() {
	ctx, cancel := context.WithCancel(context.Background())
	lctx, lcancel := context.WithCancel(context.Background())
	c.health = &health{cancel: cancel, done: make(chan struct{}), lostCtx: lctx, lostCancel: lcancel}
	go func() {
		defer close(c.health.done)
		b, err := c.boot.store.Get(ctx, "event")
		if err != nil {
			// Destroy; or rank 0 closed its store (it said goodbye); or the
			// store went away without one: rank 0 is lost.
			if cl := c.boot.client; ctx.Err() == nil && cl != nil && c.rank != 0 {
				select {
				case <-cl.Done():
					if cl.Lost() {
						c.rankLost(0, "its bootstrap store went away without a goodbye (its process died or its network failed)")
					}
				case <-ctx.Done():
				}
			}
			return
		}
		var ev lossEvent
		if err := json.Unmarshal(b, &ev); err != nil || ev.Rank < 0 || ev.Rank >= c.size {
			c.cfg.bootLogger().Warn("hcomm: malformed loss event in the bootstrap", "comm", c.name, "rank", c.rank, "event", string(b))
			return
		}
		c.rankLost(ev.Rank, ev.Reason)
		actx, acancel := context.WithTimeout(ctx, time.Second)
		c.boot.store.Add(actx, ackCtr, 1)
		acancel()
	}()
}

// rankLost puts c in the failed state and breaks every channel's notifies.
func (c *Comm) rankLost(rank int, reason string) {
	e := c.errorf("RankLost", rank, ErrRemote, ErrRankLost, "rank %d is lost: %s", rank, reason)
	c.health.mu.Lock()
	if c.health.lost != nil {
		c.health.mu.Unlock()
		return
	}
	c.health.lost = e
	c.unusable.Store(true)
	c.health.mu.Unlock()
	c.health.lostCancel()
	if l := c.cfg.logger; l != nil {
		l.Warn("hcomm: rank lost; failing every pending operation", "comm", c.name, "rank", c.rank, "lost", rank, "reason", reason)
	}
	c.mu.Lock()
	chs := make([]*Channel, 0, len(c.channels))
	for _, ch := range c.channels {
		chs = append(chs, ch)
	}
	c.mu.Unlock()
	for _, ch := range chs {
		for _, n := range ch.notifies {
			n.Break(e)
		}
	}
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
			// A peer that closed the channel in order (ChannelDestroy) is
			// no failure.
			if err := n.Broken(); err != nil && !errors.Is(err, channel.ErrPeerClosed) {
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
		_, err := c.boot.store.Get(ctx, "event")
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
