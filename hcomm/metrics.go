package hcomm

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/notify"
)

// Observability glue of the data plane: bytes moved, notify waits, task
// failures (Config.Metrics, Config.Logger / HCOMM_DEBUG), and the collective
// a thread's work belongs to, so that a wait that times out says which one.

// opTag names the collective a thread's work belongs to.
type opTag struct {
	op, algo string
	seq      uint64
}

func (g opTag) String() string {
	if g.op == "" {
		return ""
	}
	return fmt.Sprintf("%s #%d (%s)", g.op, g.seq, g.algo)
}

// opState is a communicator's collective counter and the collective each of
// its threads is issuing.
type opState struct {
	mu   sync.Mutex
	seq  uint64
	last opTag
	cur  map[*Thread]*opSlot
}

// opSlot is what a thread is issuing; end (made once per thread, so that a
// collective allocates nothing here) clears it once every collective begun
// on the thread has ended — the tag is the newest begun until then. A slot
// lives as long as the communicator (one per thread).
type opSlot struct {
	tag  opTag
	open int // BeginOps not yet ended (more than one only if a library overlaps them)
	end  func() error
}

// LastOp returns the last collective begun on the communicator (BeginOp)
// and its number, "" and 0 before the first. Ranks that issue their
// collectives in the same order agree on the numbers, so comparing LastOp
// across ranks shows which ranks have not reached a collective another rank
// waits in. Safe for concurrent use.
func (c *Comm) LastOp() (op string, seq uint64) {
	st := c.opState()
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.last.op, st.last.seq
}

func (c *Comm) opState() *opState { return &c.ops }

// opOf returns the collective t is issuing ("" op when none).
func (c *Comm) opOf(t *Thread) opTag {
	st := c.opState()
	st.mu.Lock()
	defer st.mu.Unlock()
	if sl := st.cur[t]; sl != nil {
		return sl.tag
	}
	return opTag{}
}

// BeginOp tells the communicator that the work enqueued on t from now until
// end is called is one collective, op (e.g. "AllReduce") with algorithm algo:
// it numbers it (seq counts the collectives begun on the communicator, from
// 1; ranks that issue their collectives in the same order agree on it), names
// it in the error of a wait that times out, logs it at TRACE, and when
// metrics are on, enqueues on t the tasks that time it. end enqueues the
// closing task; call it once the collective's schedule is issued. For the
// libraries built on hcomm (package collectives); safe for concurrent use.
func (c *Comm) BeginOp(t *Thread, op, algo string) (seq uint64, end func() error) {
	st := c.opState()
	if t == nil {
		return 0, func() error { return nil }
	}
	st.mu.Lock()
	st.seq++
	tag := opTag{op: op, algo: algo, seq: st.seq}
	sl := st.cur[t]
	if sl == nil {
		if st.cur == nil {
			st.cur = make(map[*Thread]*opSlot)
		}
		sl = &opSlot{}
		sl.end = func() error {
			st.mu.Lock()
			if sl.open--; sl.open <= 0 {
				sl.open, sl.tag = 0, opTag{}
			}
			st.mu.Unlock()
			return nil
		}
		st.cur[t] = sl
	}
	sl.tag = tag
	sl.open++
	st.last = tag
	st.mu.Unlock()
	clear := sl.end
	trace := c.logEnabled(LevelTrace)
	if trace {
		c.log(LevelTrace, "collective issued", "op", op, "seq", tag.seq, "algorithm", algo, "stream", t.Stream().ID())
	}
	if c.cfg.metrics == nil && !trace {
		return tag.seq, clear
	}
	var start time.Time // written and read by tasks of one stream, in order
	if err := t.Stream().Launch(op+" begin", func(<-chan struct{}) error {
		start = time.Now()
		return nil
	}); err != nil {
		return tag.seq, clear
	}
	return tag.seq, func() error {
		clear()
		return t.Stream().Launch(op+" end", func(<-chan struct{}) error {
			d := time.Since(start)
			c.cfg.metrics.ObserveCollective(op, algo, d)
			c.log(LevelTrace, "collective done", "op", op, "seq", tag.seq, "algorithm", algo, "duration", d)
			return nil
		})
	}
}

// moved counts n bytes moved over ch in direction dir when err is nil, and
// returns err.
func (c *Comm) moved(ch *Channel, dir string, n int64, err error) error {
	if err == nil && c.cfg.metrics != nil {
		c.cfg.metrics.AddBytes(ch.Transport(), dir, n)
	}
	return err
}

// resultLabel is the errors_total label of r: its name in snake case.
func resultLabel(r Result) string {
	if r >= 0 && int(r) < len(resultNames) {
		return strings.ReplaceAll(resultNames[r], " ", "_")
	}
	return "unknown"
}

// taskFailed turns the error of a data-plane task into an *Error with the
// communicator's context, counts it and logs it.
func (c *Comm) taskFailed(op string, peer int, err error) error {
	var he *Error
	if !errors.As(err, &he) {
		code := ErrRuntime
		var de *device.Error
		if errors.As(err, &de) {
			code = fromDevice(de)
		}
		he = c.errorf(op, peer, code, err, "")
		err = he
	}
	c.cfg.metrics.CountError(resultLabel(he.Code))
	c.log(slog.LevelWarn, "task failed", "op", op, "peer", peer, "code", resultLabel(he.Code), "err", err)
	return err
}

// slowWait is how long a notify wait may take before it is logged at INFO:
// a peer that late is worth knowing about even when nothing fails.
const slowWait = time.Second

// launchWait enqueues the task of ChannelNotifyWaitOnThread: wait for n (then
// reset it) within timeout (0: forever), timed for the metrics, and on
// failure an error naming the notify, the channel and the collective the
// thread was issuing.
func (c *Comm) launchWait(op string, t *Thread, ch *Channel, idx int, n *notify.Notify, timeout time.Duration) error {
	tag := c.opOf(t)
	return c.launch(op, ch.RemoteRank(), t, func(stop <-chan struct{}) error {
		return c.awaitNotify(op, ch, idx, n, timeout, tag, stop)
	})
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
	err := c.waitReporting(n, timeout, stop, tag)
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
