package device

import (
	"slices"
	"sync"
	"time"
)

// TaskSpan is one task a stream ran, as a task observer sees it: which
// stream, its sequence number and name, when it started and ended (wall
// clock, nanoseconds since the Unix epoch, so that the spans of processes of
// one host line up), whether it ran in its caller's goroutine (RunInline)
// and whether it failed.
type TaskSpan struct {
	Stream     int64
	Seq        uint64
	Name       string
	Start, End int64
	Inline     bool
	Failed     bool
}

// observers is a device's task observers, replaced whole on every change so
// that a task reads them with one atomic load.
type observers struct {
	fns []*func(TaskSpan)
}

var observeMu sync.Mutex // serialises ObserveTasks' read-modify-write of a device's list

// ObserveTasks has fn told of every task the device's streams run from now
// on, queued or inline, once it ends: a profiler's or a timeline's feed
// (hcomm's Config.TraceDir). fn runs in the goroutine that ran the task,
// right after it, and must be quick and safe for concurrent use (the
// device's streams run at once). The returned function stops the feed; it
// is idempotent. A device without observers pays one atomic load a task.
func (d *Device) ObserveTasks(fn func(TaskSpan)) (stop func()) {
	if d == nil || fn == nil {
		return func() {}
	}
	p := &fn
	observeMu.Lock()
	old := d.obs.Load()
	next := &observers{}
	if old != nil {
		next.fns = slices.Clone(old.fns)
	}
	next.fns = append(next.fns, p)
	d.obs.Store(next)
	observeMu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			observeMu.Lock()
			defer observeMu.Unlock()
			cur := d.obs.Load()
			if cur == nil {
				return
			}
			fns := slices.DeleteFunc(slices.Clone(cur.fns), func(q *func(TaskSpan)) bool { return q == p })
			if len(fns) == 0 {
				d.obs.Store(nil)
				return
			}
			d.obs.Store(&observers{fns: fns})
		})
	}
}

// observed runs t with its span told to the device's observers (runTask
// calls it only when there are some).
func (s *Stream) observed(o *observers, t *task, stop <-chan struct{}) error {
	start := time.Now().UnixNano()
	err := s.runGuarded(t, stop)
	sp := TaskSpan{Stream: s.id, Seq: t.seq, Name: t.name, Start: start, End: time.Now().UnixNano(), Inline: t.inline, Failed: err != nil}
	for _, fn := range o.fns {
		(*fn)(sp)
	}
	return err
}

// observersOf returns d's observers, nil when there are none.
func (d *Device) observersOf() *observers { return d.obs.Load() }
