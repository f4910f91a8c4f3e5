package hcomm

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hcomm-dev/hcomm/device"
)

// Timelines.
//
// With Config.TraceDir (HCOMM_TRACE) set, a communicator keeps a timeline:
// a span for every collective it runs (from its first stream task to its
// last: the op, the algorithm, its number) and for every task its device's
// streams run (device.Device.ObserveTasks: the handshakes, each piece of a
// pipe, each notify wait, copies, reductions). Destroy writes it as
// TraceDir/NAME-rankR-PID.json in the Chrome trace event format, which
// Perfetto (ui.perfetto.dev) and chrome://tracing open: a process per rank,
// a track per stream. Comm.WriteTrace writes it at any time. Times are the
// wall clock, so that the files of the processes of one host line up (merge
// them with jq -s '{traceEvents: map(.traceEvents) | add}' DIR/*.json); across
// hosts they are as far apart as the hosts' clocks.
//
// It is what tells where a call's time goes: which rank waited for which
// handshake, how long each piece of a pipe took to write, whether a
// receiver kept up with its sender (BENCHMARKS.md, stop 34, has one read
// this way). A communicator keeps the latest traceSpans spans and counts
// those it let go; recording one costs two clock reads and a lock.

// traceSpans is how many spans a communicator keeps (the latest).
const traceSpans = 1 << 17

// traceEpoch is the trace's time origin: its times are microseconds since
// then, which a float64 (what the viewers parse) holds to a few
// nanoseconds for centuries, where microseconds since 1970 would not.
var traceEpoch = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()

// span categories.
const (
	spanTask = iota
	spanCollective
)

// traceSpan is one recorded span.
type traceSpan struct {
	name       string
	algo       string // collectives: the algorithm
	cat        uint8
	inline     bool // tasks: ran in the caller's goroutine
	failed     bool // tasks: returned an error
	stream     int64
	seq        uint64 // tasks: the stream's sequence number; collectives: the communicator's
	start, end int64  // ns since the Unix epoch
}

// tracer is a communicator's timeline: the latest cap spans.
type tracer struct {
	mu    sync.Mutex
	cap   int
	spans []traceSpan // a ring once full: the oldest at next
	next  int
	total uint64 // spans recorded so far
	stop  func() // ends the device's feed
}

func newTracer(capacity int) *tracer { return &tracer{cap: capacity} }

func (tr *tracer) add(s traceSpan) {
	tr.mu.Lock()
	if len(tr.spans) < tr.cap {
		tr.spans = append(tr.spans, s)
	} else {
		tr.spans[tr.next] = s
		tr.next = (tr.next + 1) % tr.cap
	}
	tr.total++
	tr.mu.Unlock()
}

// snapshot returns the kept spans, oldest first, and how many were let go.
func (tr *tracer) snapshot() ([]traceSpan, uint64) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	out := make([]traceSpan, 0, len(tr.spans))
	out = append(out, tr.spans[tr.next:]...)
	out = append(out, tr.spans[:tr.next]...)
	return out, tr.total - uint64(len(out))
}

// startTrace sets up c's timeline when Config.TraceDir says so: the
// directory is made if missing (an unusable one fails the communicator's
// creation, naming it), and the device's tasks feed the timeline.
func (c *Comm) startTrace() error {
	if c.cfg.TraceDir == "" {
		return nil
	}
	if err := os.MkdirAll(c.cfg.TraceDir, 0o755); err != nil {
		return fmt.Errorf("trace directory (Config.TraceDir, HCOMM_TRACE): %w", err)
	}
	tr := newTracer(traceSpans)
	tr.stop = c.dev.ObserveTasks(func(s device.TaskSpan) {
		tr.add(traceSpan{name: s.Name, cat: spanTask, inline: s.Inline, failed: s.Failed, stream: s.Stream, seq: s.Seq, start: s.Start, end: s.End})
	})
	c.trace = tr
	return nil
}

// traceCollective records a collective's span (BeginOp's end task).
func (c *Comm) traceCollective(op, algo string, stream int64, seq uint64, start, end time.Time) {
	if c.trace != nil {
		c.trace.add(traceSpan{name: op, algo: algo, cat: spanCollective, stream: stream, seq: seq, start: start.UnixNano(), end: end.UnixNano()})
	}
}

// TracePath returns the file Destroy writes the timeline to, "" when the
// communicator keeps none (Config.TraceDir unset).
func (c *Comm) TracePath() string {
	if c == nil || c.trace == nil {
		return ""
	}
	return filepath.Join(c.cfg.TraceDir, fmt.Sprintf("%s-rank%d-%d.json", fileSafe(c.name), c.rank, os.Getpid()))
}

// fileSafe keeps the letters, digits, '.', '_' and '-' of s and turns every
// other byte into '_' (a sub-communicator's name may hold a '/').
func fileSafe(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			return r
		}
		return '_'
	}, s)
}

// WriteTrace writes the communicator's timeline so far to w in the Chrome
// trace event format (see Config.TraceDir). It fails when the communicator
// keeps none. Safe to call while collectives run: it writes what has ended.
func (c *Comm) WriteTrace(w io.Writer) error {
	if c == nil {
		return nilCommErr("WriteTrace")
	}
	if c.trace == nil {
		return c.errorf("WriteTrace", -1, ErrPara, nil, "the communicator keeps no timeline: set Config.TraceDir or HCOMM_TRACE")
	}
	spans, dropped := c.trace.snapshot()
	return writeTrace(w, c.name, c.rank, spans, dropped)
}

// flushTrace ends c's timeline and writes it to TracePath (Destroy).
func (c *Comm) flushTrace() error {
	tr := c.trace
	if tr == nil {
		return nil
	}
	tr.stop()
	path := c.TracePath()
	f, err := os.Create(path)
	if err == nil {
		spans, dropped := tr.snapshot()
		err = errors.Join(writeTrace(f, c.name, c.rank, spans, dropped), f.Close())
	}
	if err != nil {
		return c.errorf("Destroy", -1, ErrOpenFile, err, "writing the timeline to %s", path)
	}
	c.log(slog.LevelInfo, "timeline written", "path", path)
	return nil
}

// traceEvent is one event of the Chrome trace event format: "X" a span,
// "M" a name.
type traceEvent struct {
	Name string          `json:"name"`
	Cat  string          `json:"cat,omitempty"`
	Ph   string          `json:"ph"`
	Ts   json.RawMessage `json:"ts,omitempty"`
	Dur  json.RawMessage `json:"dur,omitempty"`
	Pid  int             `json:"pid"`
	Tid  int64           `json:"tid"`
	Args map[string]any  `json:"args,omitempty"`
}

// micros formats ns nanoseconds as microseconds with three decimals, exactly.
func micros(ns int64) json.RawMessage {
	neg := ns < 0
	if neg {
		ns = -ns
	}
	s := strconv.FormatInt(ns/1000, 10) + "." + fmt.Sprintf("%03d", ns%1000)
	if neg {
		s = "-" + s
	}
	return json.RawMessage(s)
}

func writeTrace(w io.Writer, name string, rank int, spans []traceSpan, dropped uint64) error {
	bw := bufio.NewWriter(w)
	pid := rank
	first := true
	emit := func(e traceEvent) error {
		sep := ",\n"
		if first {
			sep, first = "\n", false
		}
		if _, err := bw.WriteString(sep); err != nil {
			return err
		}
		b, err := json.Marshal(e)
		if err != nil {
			return err
		}
		_, err = bw.Write(b)
		return err
	}
	if _, err := bw.WriteString(`{"traceEvents":[`); err != nil {
		return err
	}
	if err := emit(traceEvent{Name: "process_name", Ph: "M", Pid: pid, Args: map[string]any{"name": fmt.Sprintf("%s rank %d (pid %d)", name, rank, os.Getpid())}}); err != nil {
		return err
	}
	if err := emit(traceEvent{Name: "process_sort_index", Ph: "M", Pid: pid, Args: map[string]any{"sort_index": rank}}); err != nil {
		return err
	}
	streams := map[int64]bool{}
	for _, s := range spans {
		streams[s.stream] = true
	}
	ids := make([]int64, 0, len(streams))
	for id := range streams {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		if err := emit(traceEvent{Name: "thread_name", Ph: "M", Pid: pid, Tid: id, Args: map[string]any{"name": fmt.Sprintf("stream %d", id)}}); err != nil {
			return err
		}
	}
	for _, s := range spans {
		e := traceEvent{Name: s.name, Ph: "X", Ts: micros(s.start - traceEpoch), Dur: micros(max(s.end-s.start, 0)), Pid: pid, Tid: s.stream}
		if s.cat == spanCollective {
			e.Cat, e.Args = "collective", map[string]any{"seq": s.seq, "algorithm": s.algo}
		} else {
			e.Cat, e.Args = "task", map[string]any{"seq": s.seq}
			if s.inline {
				e.Args["inline"] = true
			}
			if s.failed {
				e.Args["failed"] = true
			}
		}
		if err := emit(e); err != nil {
			return err
		}
	}
	other, err := json.Marshal(map[string]any{"comm": name, "rank": rank, "spans_dropped": dropped,
		"clock": "wall clock; ts in microseconds since 2020-01-01T00:00:00Z"})
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(bw, "\n],\"displayTimeUnit\":\"ns\",\"otherData\":%s}\n", other); err != nil {
		return err
	}
	return bw.Flush()
}
