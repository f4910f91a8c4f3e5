package hcomm

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/bootstrap"
	"github.com/hcomm-dev/hcomm/internal/spin"
	"github.com/hcomm-dev/hcomm/notify"
)

// Channel notify waits, queued (ChannelNotifyWaitOnThread) or immediate
// (ChannelNotifyWait, CollectiveNotifyWait), share one body: awaitNotify
// times the wait for the metrics, logs a slow one, publishes where this rank
// waits once the wait is slow, and on failure names the notify, the channel
// and the collective.

// slowWait is how long a notify wait may take before it is logged at INFO:
// a peer that late is worth knowing about even when nothing fails.
const slowWait = time.Second

// launchWait enqueues the task of ChannelNotifyWaitOnThread: wait for n (then
// reset it) within timeout (0: forever), timed for the metrics, and on
// failure an error naming the notify, the channel and the collective the
// thread was issuing.
//
// On a channel of mapped memory (inproc, shm) an eager thread polls for the
// record in the calling goroutine first (Thread.LaunchPoll); a record found
// so counts in the metrics as a wait that took no time, as
// ChannelNotifyTryWait's does.
func (c *Comm) launchWait(op string, t *Thread, ch *Channel, idx int, n *notify.Notify, timeout time.Duration) error {
	tag := c.opOf(t)
	wait := func(stop <-chan struct{}) error {
		return c.awaitNotify(op, ch, idx, n, timeout, tag, stop)
	}
	if !ch.quick() || !t.Eager() {
		return c.launch(op, ch.RemoteRank(), t, wait)
	}
	poll := func(d time.Duration, stop <-chan struct{}) bool {
		found := false
		look := func() bool { // ends at the record or an abort
			if found = n.TryReset(); found {
				return true
			}
			select {
			case <-stop:
				return true
			default:
				return false
			}
		}
		if ch.tr.Name() == TransportInproc {
			spin.Until(d, look)
		} else { // the peer may be waiting for this core: yield it between polls
			spin.UntilYield(d, look)
		}
		if found && c.cfg.metrics != nil {
			c.cfg.metrics.ObserveWait(ch.tr.Name(), 0)
		}
		return found
	}
	if err := t.LaunchPoll(op, poll, func(stop <-chan struct{}) error {
		if err := wait(stop); err != nil {
			return c.taskFailed(op, ch.RemoteRank(), err)
		}
		return nil
	}); err != nil {
		return c.errorf(op, ch.RemoteRank(), ResultOf(err), err, "")
	}
	return nil
}

// awaitNotify is the body of a channel notify wait, queued (launchWait) or
// immediate (ChannelNotifyWait); tag is the collective it belongs to.
func (c *Comm) awaitNotify(op string, ch *Channel, idx int, n *notify.Notify, timeout time.Duration, tag opTag, stop <-chan struct{}) error {
	peer := ch.RemoteRank()
	tr := ch.Transport()
	timed := c.cfg.metrics != nil || c.logEnabled(slog.LevelInfo)
	var start time.Time
	if timed {
		start = time.Now()
	}
	var err error
	// A transport whose waiters can receive for themselves (tcp) polls
	// first; its records would otherwise come through the network poller.
	// The poll takes its part of the timeout (it may last while bytes keep
	// arriving), and the sleep the rest.
	if p, ok := ch.tr.(channel.Poller); !ok {
		err = c.waitReporting(n, timeout, stop, tag)
	} else if polled := spin.Mono(); !p.Poll(stop, timeout, n.TryResetFunc()) {
		rest := timeout
		if timeout > 0 {
			rest = max(timeout-(spin.Mono()-polled), time.Nanosecond)
		}
		if c.naps() {
			err = c.napReporting(p, n, rest, stop, tag)
		} else {
			err = c.waitReporting(n, rest, stop, tag)
		}
	}
	if clk, ok := ch.tr.(channel.Clocked); ok && err == nil {
		clk.NotifyWaited(idx) // the simulator's virtual clock (channel/sim)
	}
	if timed {
		d := time.Since(start)
		c.cfg.metrics.ObserveWait(tr, d)
		if err == nil && d >= slowWait {
			c.log(slog.LevelInfo, "slow notify wait", "peer", peer, "notify", idx, "transport", tr,
				"op", tag.op, "seq", tag.seq, "algorithm", tag.algo, "waited", d)
		}
	}
	if err == nil {
		return nil
	}
	msg := fmt.Sprintf("notify %d of the channel to rank %d (%s)", idx, peer, tr)
	if tag.op != "" {
		msg += ", waiting in " + tag.String()
	}
	if timeout > 0 && device.CodeOf(err).Timeout() {
		msg += fmt.Sprintf(": rank %d did not record it within %v", peer, timeout)
		if where := c.whereAreThey(); where != "" {
			msg += "; " + where
			c.log(slog.LevelWarn, "notify wait timed out", "peer", peer, "notify", idx, "op", tag.op, "seq", tag.seq, "ranks", where)
		}
	}
	return c.errorf(op, peer, ResultOf(err), err, "%s", msg)
}

// Hang diagnosis. A wait that times out can say that its peer did not
// record in time, but not why: the peer may be stuck in another collective,
// behind in the same one, or not calling hcomm at all. So a rank whose notify
// wait has lasted slowWait publishes where it waits — the operation and its
// sequence number — in its own bootstrap mailbox (ring.go; in the
// communicator's store where there are no mailboxes), and withdraws it when
// the wait ends well (a failed wait leaves it: that rank stays stuck there,
// and the sequence number tells a later reader how old it is). A rank whose
// wait then times out reads every peer's entry and names each peer's
// position in its error and log:
//
//	rank 1 waits in AllReduce #7 (ring); rank 2 waits in AllGather #7 (direct);
//	rank 3 reports no wait (busy outside hcomm, not calling this collective, or lost)
//
// Only slow waits touch a store, so the fast path pays nothing.

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

// A waiter that has stopped polling its sockets (channel.Poller) sleeps
// until the channel's background reader applies the record, which it does
// once Go's network poller reports the socket readable — and the runtime
// polls the network only when a processor has nothing else to run, or
// every 10 ms. In a process whose other goroutines keep its processors busy
// (a caller issuing collectives far ahead of its stream, on the processor a
// bound rank has), the sleeper stayed asleep for milliseconds after its
// bytes had come: 2 processes over tcp, 1 MiB broadcast, 1–2.5 % of the
// calls took 0.4–2.8 ms against a median of 0.13–0.2, 10–20 µs of a mean
// of 160–220 (hcomm trace, BENCHMARKS.md stop 34); a test with one busy
// goroutine saw 7–12 ms. So the sleep is cut into naps, each ended by a
// timer — which the scheduler runs between any two goroutines, busy or not
// — and followed by one look at the sockets (PollOnce). The naps double
// from napFirst to napMost: a sleep that the network poller ends anyway (a
// processor is idle) costs a few wake-ups more, and a long one (a peer late
// by seconds) about one every napMost.
const (
	napFirst = 50 * time.Microsecond
	napMost  = 10 * time.Millisecond
	// overslept is how much later than asked a nap may end before the
	// waiter takes it that its processor went idle (an idle processor's
	// timers are late by up to the network poller's millisecond).
	overslept = 300 * time.Microsecond
)

// naps reports whether the communicator's sleeping tcp waits nap
// (napReporting): where this host holds at most napsPerProcessor of the
// communicator's processes a processor. More crowded, a processor that a
// waiter's process leaves idle is soon another process's, the network
// poller runs, and every extra wake-up is a switch the others wait for.
// tcp, launches interleaved, naps against none (medians): 2 processes on 2
// cores, 1 MiB broadcast 164.9 against 169.6 µs (6 launches); 4, 64 KiB
// all-to-all 52.4 against 54.2 and all-gather 50.4 against 51.6 (6); 8,
// 1 KiB and 64 KiB all-reduce alike (5); 16, 64 KiB all-reduce 693 against
// 654 (10). Decided once.
func (c *Comm) naps() bool {
	switch c.napping.Load() {
	case 1:
		return true
	case 2:
		return false
	}
	v := int32(2)
	if c.procsHere() <= napsPerProcessor*c.HostProcessors() {
		v = 1
	}
	c.napping.Store(v)
	return v == 1
}

// napsPerProcessor is how many of the communicator's processes a processor
// of the host may hold for its tcp waits to nap (naps).
const napsPerProcessor = 2

// napReporting is waitReporting for a waiter of a channel that receives
// for its waiters (p): it sleeps in naps and looks at p's sockets between
// them, and publishes where it waits once it has waited slowWait.
func (c *Comm) napReporting(p channel.Poller, n *notify.Notify, timeout time.Duration, stop <-chan struct{}, tag opTag) error {
	start := spin.Mono()
	published := false
	done := func(err error) error {
		if err == nil && published {
			c.setProgress("") // a wait that fails leaves its entry: the rank stays stuck there
		}
		return err
	}
	for nap := napFirst; ; nap = min(2*nap, napMost) {
		d := nap
		if timeout > 0 {
			d = min(d, max(timeout-(spin.Mono()-start), time.Nanosecond))
		}
		var err error
		began := spin.Mono()
		if nap == napFirst {
			err = n.Await(stop, d) // polls a moment first, as a sleeping wait always has
		} else {
			err = n.Nap(stop, d)
		}
		if err == nil || !device.CodeOf(err).Timeout() {
			return done(err)
		}
		if p.PollOnce(); n.TryReset() {
			return done(nil)
		}
		now := spin.Mono()
		waited := now - start
		if timeout > 0 && waited >= timeout {
			return n.TimedOut(timeout)
		}
		if now-began > d+spin.Default+overslept {
			// The timer was late: the processor went idle, and an idle
			// processor waits in the network poller, which wakes the
			// readers. Sleep on in one piece: more naps would only cost
			// wake-ups.
			rest := time.Duration(0)
			if timeout > 0 {
				rest = max(timeout-waited, time.Nanosecond)
			}
			if published {
				return done(n.Await(stop, rest))
			}
			return c.waitReporting(n, rest, stop, tag)
		}
		if !published && waited >= slowWait {
			c.setProgress(tag.String())
			published = true
		}
	}
}

// setProgress publishes (or, for "", withdraws) this rank's position.
func (c *Comm) setProgress(where string) {
	st, release := c.progressStore(context.Background(), c.rank)
	defer release()
	if st == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if where == "" {
		st.Delete(ctx, progressKey(c.rank))
		return
	}
	st.Set(ctx, progressKey(c.rank), []byte(where))
}

// progressStore is the store that holds rank's position: with mailboxes,
// that rank's own mailbox (a rank publishes without a network round trip,
// and a slow wait at 64 ranks costs rank 0's store nothing), else the
// communicator's store. Nil when there is none or the mailbox cannot be
// reached within ctx. The caller calls release when done with it (a
// connection to another rank's mailbox then closes).
func (c *Comm) progressStore(ctx context.Context, rank int) (_ bootstrap.Store, release func()) {
	none := func() {}
	b := c.boot
	if b == nil {
		return nil, none
	}
	if b.mail == nil || b.ns == "" || rank >= len(b.peers) || b.peers[rank].Mailbox == "" {
		if b.store == nil {
			return nil, none
		}
		return b.store, none
	}
	if rank == c.rank {
		return bootstrap.Prefix(b.mail.local(), b.ns), none
	}
	cli, release, err := b.mail.use(ctx, b.peers[rank].Mailbox)
	if err != nil {
		return nil, none
	}
	return bootstrap.Prefix(cli, b.ns), release
}

// whereAreThey reads every peer's published position (without waiting: a
// peer without an entry is not waiting in hcomm, and a wait that timed out
// returns on time) and describes them. The peers are asked at once, within
// one bound shared by all.
func (c *Comm) whereAreThey() string {
	if c.boot == nil || c.size < 2 {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond) // a connection and a round trip per peer's mailbox
	defer cancel()
	parts := make([]string, c.size)
	var wg sync.WaitGroup
	for p := 0; p < c.size; p++ {
		if p == c.rank {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var v []byte
			ok := false
			if st, release := c.progressStore(ctx, p); st != nil {
				var err error
				v, ok, err = st.TryGet(ctx, progressKey(p))
				ok = ok && err == nil && len(v) > 0
				release()
			}
			if !ok {
				parts[p] = fmt.Sprintf("rank %d reports no wait (busy outside hcomm, not calling this collective, or lost)", p)
				return
			}
			parts[p] = fmt.Sprintf("rank %d waits in %s", p, v)
		}()
	}
	wg.Wait()
	parts = slices.DeleteFunc(parts, func(s string) bool { return s == "" })
	return "where the other ranks are: " + strings.Join(parts, "; ")
}
