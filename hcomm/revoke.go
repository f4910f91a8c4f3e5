package hcomm

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Revoking a communicator (ULFM's MPIX_Comm_revoke, NCCL's ncclCommRevoke).
// A rank that learns of a failure — an operation that failed naming a lost
// rank, an application's own verdict — revokes the communicator so that
// every rank stops using it, not only the ranks whose operations happened
// to touch the failure: the ranks then agree on who is left (Shrink).
//
// Revoke marks this rank's communicator revoked, breaks the notifies of all
// its channels (every pending wait, queued or immediate, fails at once) and
// ends its channel setups in flight; then it publishes the revocation under
// the key "revoked" of the communicator's bootstrap store. Every rank
// watches that key from the moment its communicator exists, and applies a
// revocation it reads the same way. The store is rank 0's (across
// processes) or the group's memory (InitAll): when rank 0's process is gone
// the publication cannot be made, but every rank then already fails its
// operations with ErrRankLost naming rank 0 (health.go), and Shrink revokes
// each survivor's communicator itself.

// revocation is a communicator's revoked state and its watch on the store.
type revocation struct {
	// ctx ends when the communicator is revoked: setups in flight stop.
	ctx    context.Context
	cancel context.CancelFunc
	// stopWatch ends the watcher; done is closed when it has returned.
	stopWatch context.CancelFunc
	done      chan struct{}
	wg        sync.WaitGroup // Revoke's publication

	mu  sync.Mutex
	err *Error // set once, at revocation
}

// revokeKey is the key under which a revocation is published, in the
// communicator's own view of its bootstrap store. Its value is the decimal
// rank that revoked, then the ranks it knew lost, space-separated.
const revokeKey = "revoked"

// watchRevoke starts c's watch on the other ranks' revocations; Destroy
// stops it (unwatchRevoke).
func (c *Comm) watchRevoke() {
	rctx, rcancel := context.WithCancel(context.Background())
	wctx, wcancel := context.WithCancel(context.Background())
	c.revoke = &revocation{ctx: rctx, cancel: rcancel, stopWatch: wcancel, done: make(chan struct{})}
	go func() {
		defer close(c.revoke.done)
		b, err := c.boot.store.Get(wctx, revokeKey)
		if err != nil {
			return // Destroy, or the store went away (health.go tells a loss)
		}
		f := strings.Fields(string(b))
		by, lost := -1, []int(nil)
		for i, x := range f {
			r, err := strconv.Atoi(x)
			if err != nil || r < 0 || r >= c.size {
				// Only a rank of this communicator writes the key; whatever
				// is there, the communicator is revoked.
				c.cfg.bootLogger().Warn("hcomm: malformed revocation in the bootstrap; revoking anyway", "comm", c.name, "rank", c.rank, "value", string(b))
				by, lost = -1, nil
				break
			}
			if i == 0 {
				by = r
			} else {
				lost = append(lost, r)
			}
		}
		c.revokeLocal(by, lost)
	}()
}

// unwatchRevoke stops the watcher of watchRevoke and waits for it.
func (c *Comm) unwatchRevoke() {
	c.revoke.stopWatch()
	<-c.revoke.done
	c.revoke.wg.Wait()
}

// Revoke revokes the communicator on every rank (MPIX_Comm_revoke,
// ncclCommRevoke): this rank's pending operations on it fail at once, and so
// do its later ones, with an *Error wrapping ErrRevoked (code ErrUnavail);
// the revocation is published to the other ranks, whose pending and later
// operations fail the same way as soon as they read it (within milliseconds
// while rank 0's bootstrap store is up). Destroy, Check, LostRanks and Shrink
// still work on a revoked communicator; nothing else does. A revoked
// communicator is not un-revoked: Shrink makes a new one.
//
// Revoke does not wait for the other ranks and does not fail when the
// store cannot be reached (rank 0 is lost: the other ranks already fail
// naming it). On a destroyed communicator it does nothing. Safe for
// concurrent use; idempotent.
func (c *Comm) Revoke() error {
	if c == nil {
		return nilCommErr("Revoke")
	}
	c.mu.Lock()
	closed := c.closed
	if !closed {
		c.revoke.wg.Add(1) // the publication below; Destroy waits for it
	}
	c.mu.Unlock()
	if closed {
		return nil // destroyed: nothing left to stop, no store to tell
	}
	lost := c.LostRanks()
	if !c.revokeLocal(c.rank, lost) {
		c.revoke.wg.Done()
		return nil
	}
	v := strconv.Itoa(c.rank)
	for _, r := range lost {
		v += " " + strconv.Itoa(r)
	}
	go func() { // a stuck rank 0 must not hold Revoke up
		defer c.revoke.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		unstop := context.AfterFunc(c.stopped, cancel) // Destroy does not wait for the store
		defer unstop()
		if err := c.boot.store.Set(ctx, revokeKey, []byte(v)); err != nil {
			c.log(slog.LevelWarn, "revocation not published: the bootstrap store is unreachable", "err", err)
		}
	}()
	return nil
}

// revokeLocal puts c in the revoked state, by the rank that revoked it (-1:
// unknown) knowing lost lost, fails its pending waits and setups, and
// reports whether it was not revoked before.
func (c *Comm) revokeLocal(by int, lost []int) bool {
	var e *Error
	known := ""
	if len(lost) > 0 {
		known = fmt.Sprintf(" (it knows rank %s lost)", strings.Trim(fmt.Sprint(lost), "[]"))
		if len(lost) > 1 {
			known = fmt.Sprintf(" (it knows ranks %v lost)", lost)
		}
	}
	peer := by
	if len(lost) > 0 {
		peer = lost[0] // the error names the lost rank, as ErrRankLost's do
	}
	switch {
	case by == c.rank:
		e = c.errorf("Revoke", peer, ErrUnavail, ErrRevoked, "this rank revoked the communicator%s", known)
	case by >= 0:
		e = c.errorf("Revoke", peer, ErrUnavail, ErrRevoked, "rank %d revoked the communicator%s", by, known)
	default:
		e = c.errorf("Revoke", -1, ErrUnavail, ErrRevoked, "a rank revoked the communicator")
	}
	c.revoke.mu.Lock()
	if c.revoke.err != nil {
		c.revoke.mu.Unlock()
		return false
	}
	c.revoke.err = e
	c.unusable.Store(true)
	c.revoke.mu.Unlock()
	c.revoke.cancel()
	if l := c.cfg.logger; l != nil {
		l.Warn("hcomm: communicator revoked; failing every pending operation", "comm", c.name, "rank", c.rank, "by", by)
	}
	c.breakChannels(e)
	return true
}

// revokedErr returns c's revocation, or nil.
func (c *Comm) revokedErr() *Error {
	c.revoke.mu.Lock()
	defer c.revoke.mu.Unlock()
	return c.revoke.err
}

// revokedCheck is usable's test for a revocation.
func (c *Comm) revokedCheck(op string) error {
	if e := c.revokedErr(); e != nil {
		return c.errorf(op, e.Peer, ErrUnavail, e, "the communicator is revoked")
	}
	return nil
}
