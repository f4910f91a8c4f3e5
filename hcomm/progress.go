package hcomm

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/notify"
)

// Hang diagnosis. A wait that times out can say that its peer did not
// record in time, but not why: the peer may be stuck in another collective,
// behind in the same one, or not calling hcomm at all. So a rank whose notify
// wait has lasted slowWait publishes where it waits — the operation and its
// sequence number — in the communicator's bootstrap store, and withdraws it
// when the wait ends well (a failed wait leaves it: that rank stays stuck
// there, and the sequence number tells a later reader how old it is). A rank whose wait then times out reads every peer's
// entry and names each peer's position in its error and log:
//
//	rank 1 waits in AllReduce #7 (ring); rank 2 waits in AllGather #7 (direct);
//	rank 3 reports no wait (busy outside hcomm, not calling this collective, or lost)
//
// Only slow waits touch the store, so the fast path pays nothing.

func progressKey(rank int) string { return "progress/r" + strconv.Itoa(rank) }

// waitReporting waits for n within timeout (0: forever) or until stop closes,
// publishing this rank's position once the wait has lasted slowWait.
func (c *Comm) waitReporting(n *notify.Notify, timeout time.Duration, stop <-chan struct{}, tag opTag) error {
	if timeout > 0 && timeout <= slowWait {
		return n.Await(stop, timeout)
	}
	err := n.Await(stop, slowWait)
	if err == nil || !device.CodeOf(err).Timeout() {
		return err
	}
	c.setProgress(tag.String())
	var rest time.Duration // 0: forever
	if timeout > 0 {
		rest = timeout - slowWait
	}
	err = n.Await(stop, rest)
	if err == nil {
		c.setProgress("") // a wait that fails leaves its entry: the rank stays stuck there
	}
	return err
}

// setProgress publishes (or, for "", withdraws) this rank's position.
func (c *Comm) setProgress(where string) {
	if c.boot == nil || c.boot.store == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if where == "" {
		c.boot.store.Delete(ctx, progressKey(c.rank))
		return
	}
	c.boot.store.Set(ctx, progressKey(c.rank), []byte(where))
}

// whereAreThey reads every peer's published position (without waiting: a
// peer without an entry is not waiting in hcomm, and a wait that timed out
// returns on time) and describes them.
func (c *Comm) whereAreThey() string {
	if c.boot == nil || c.boot.store == nil || c.size < 2 {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond) // round trips to rank 0's store
	defer cancel()
	var parts []string
	for p := 0; p < c.size; p++ {
		if p == c.rank {
			continue
		}
		v, ok, err := c.boot.store.TryGet(ctx, progressKey(p))
		if err != nil || !ok || len(v) == 0 {
			parts = append(parts, fmt.Sprintf("rank %d reports no wait (busy outside hcomm, not calling this collective, or lost)", p))
			continue
		}
		parts = append(parts, fmt.Sprintf("rank %d waits in %s", p, v))
	}
	return "where the other ranks are: " + strings.Join(parts, "; ")
}
