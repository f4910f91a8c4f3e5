package hcomm

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Op tagging: the collective a thread's work belongs to, so that a wait
// that times out says which one, the TRACE log follows collectives, and the
// metrics time them.

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
	st := &c.ops
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.last.op, st.last.seq
}

// opOf returns the collective t is issuing ("" op when none).
func (c *Comm) opOf(t *Thread) opTag {
	st := &c.ops
	st.mu.Lock()
	defer st.mu.Unlock()
	if sl := st.cur[t]; sl != nil {
		return sl.tag
	}
	return opTag{}
}

// CountOp numbers a collective as BeginOp does (LastOp reports it), for a
// library that issues it without the thread-tagged data plane: a call that
// runs its own stream task and names itself in its waits
// (CollectiveNotifyWait), such as the small all-reduce's lane of package
// collectives. When metrics or TRACE logging are on, which BeginOp serves
// with tasks of its own, it numbers nothing and reports false: the caller
// uses BeginOp. Safe for concurrent use.
func (c *Comm) CountOp(op, algo string) (seq uint64, ok bool) {
	if c.TimesOps() {
		return 0, false
	}
	st := &c.ops
	st.mu.Lock()
	st.seq++
	// Field by field: a literal is built beside and copied, a load of
	// what was just stored in pieces, which waits (every lane call).
	st.last.op, st.last.algo, st.last.seq = op, algo, st.seq
	seq = st.seq
	st.mu.Unlock()
	return seq, true
}

// TimesOps reports whether metrics, TRACE logging or a timeline
// (Config.TraceDir) are on, so that a collective must be opened with
// BeginOp (CountOp would number nothing): a
// library that numbers its collectives with CountOp asks first, and may then
// number a call once its first message is out, while it waits anyway.
func (c *Comm) TimesOps() bool {
	return c.cfg.metrics != nil || c.logEnabled(LevelTrace) || c.trace != nil
}

// BeginOp tells the communicator that the work enqueued on t from now until
// end is called is one collective, op (e.g. "AllReduce") with algorithm algo:
// it numbers it (seq counts the collectives begun on the communicator, from
// 1; ranks that issue their collectives in the same order agree on it), names
// it in the error of a wait that times out, logs it at TRACE, and when
// metrics or a timeline are on, times it: from now when t's stream is idle,
// else from a task that notes when the stream reaches it. end closes it —
// observing it at once when the stream is idle by then, else with a task
// behind the collective's — and must be called exactly once, once the
// collective's schedule is issued. For the libraries built on hcomm
// (package collectives); safe for concurrent use.
func (c *Comm) BeginOp(t *Thread, op, algo string) (seq uint64, end func() error) {
	st := &c.ops
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
	if c.cfg.metrics == nil && !trace && c.trace == nil {
		return tag.seq, clear
	}
	// On an idle stream the collective starts now, in the calling
	// goroutine: the clock is read here, with no task. On a busy one a
	// task notes when the stream reaches it.
	tm := opTimers.Get().(*opTimer)
	tm.c, tm.t, tm.op, tm.algo, tm.seq, tm.clear, tm.names = c, t, op, algo, tag.seq, clear, taskNames(op)
	if t.Stream().Pending() == 0 {
		tm.start = time.Now()
	} else if err := t.Launch(tm.names[0], tm.beginFn); err != nil {
		tm.release()
		return tag.seq, clear
	}
	return tag.seq, tm.endFn
}

// opTimer times one collective for BeginOp: the collective's start —
// BeginOp's clock reading on an idle stream, else its begin task's, when
// the stream reaches it — and its end, observed by end at once when the
// stream is idle by then (the collective ran in its caller's goroutine),
// else by a task behind the collective's. The tasks run on the
// collective's stream, in order, so start needs no lock. opTimers keeps
// them, each with its functions bound once: a timed call allocates
// nothing for its timing. (A 16-byte all-reduce between 2 ranks of one
// process with metrics on: 0.72–0.83 µs, against 1.03–1.08 when two inline
// tasks timed it and its timer was allocated, and 0.37–0.43 without
// metrics; stop 35.)
type opTimer struct {
	c     *Comm
	t     *Thread
	op    string
	algo  string
	seq   uint64
	start time.Time
	clear func() error
	names *[2]string // the begin and end tasks' names (taskNames)

	beginFn, observeFn func(<-chan struct{}) error // bound once (opTimers)
	endFn              func() error
}

var opTimers sync.Pool

func init() { // not in opTimers' declaration: observe, which New binds, refers to opTimers
	opTimers.New = func() any {
		m := &opTimer{}
		m.beginFn, m.observeFn, m.endFn = m.begin, m.observe, m.end
		return m
	}
}

// release gives m back to opTimers, holding nothing of its collective.
func (m *opTimer) release() {
	m.c, m.t, m.op, m.algo, m.seq, m.start, m.clear, m.names = nil, nil, "", "", 0, time.Time{}, nil, nil
	opTimers.Put(m)
}

func (m *opTimer) begin(<-chan struct{}) error {
	m.start = time.Now()
	return nil
}

// end is BeginOp's end (called once): it closes the collective's slot and
// observes the collective — now when its stream is idle, else by a task
// behind it.
func (m *opTimer) end() error {
	m.clear()
	if m.t.Stream().Pending() == 0 {
		return m.observe(nil)
	}
	if err := m.t.Launch(m.names[1], m.observeFn); err != nil {
		return err // the stream is unusable: m is not released (the task never runs)
	}
	return nil
}

// observe records the collective (metrics, timeline, TRACE log) and
// releases m.
func (m *opTimer) observe(<-chan struct{}) error {
	now := time.Now()
	d := now.Sub(m.start)
	m.c.traceCollective(m.op, m.algo, m.t.Stream().ID(), m.seq, m.start, now) // trace.go
	m.c.cfg.metrics.ObserveCollective(m.op, m.algo, d)
	if m.c.logEnabled(LevelTrace) { // the arguments would allocate whether it logs or not
		m.c.log(LevelTrace, "collective done", "op", m.op, "seq", m.seq, "algorithm", m.algo, "duration", d)
	}
	m.release()
	return nil
}

// opNames caches the begin and end tasks' names of each op BeginOp has
// seen (op+" begin", op+" end"), so that a timed collective does not build
// two strings per call. At most opNamesMax ops are kept; others build theirs.
var (
	opNames   sync.Map // op → *[2]string
	opNamesN  atomic.Int32
	opNamesMu sync.Mutex
)

const opNamesMax = 64

func taskNames(op string) *[2]string {
	if v, ok := opNames.Load(op); ok {
		return v.(*[2]string)
	}
	n := &[2]string{op + " begin", op + " end"}
	if opNamesN.Load() < opNamesMax {
		opNamesMu.Lock()
		if v, loaded := opNames.LoadOrStore(op, n); loaded {
			n = v.(*[2]string)
		} else {
			opNamesN.Add(1)
		}
		opNamesMu.Unlock()
	}
	return n
}
