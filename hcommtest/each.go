package hcommtest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/hcomm"
)

// hangGrace is how long the ranks still running at the timeout get to return
// once their communicators are aborted.
var hangGrace = 10 * time.Second

// result is what the ranks of one each did.
type result struct {
	mu      sync.Mutex
	ranks   []*rankT
	order   []int // failed ranks, first failure first
	hung    []int // ranks running at the timeout
	stuck   []int // ranks still running after the abort and the grace
	timeout time.Duration
	dump    string // every goroutine's stack at the timeout
	skipped string // the skip message, when every rank skipped
	partial string // ranks that skipped while others did not
}

// each runs fn on every rank of comms (see Options.Each); t is nil for Go.
func (o Options) each(t testing.TB, comms []*hcomm.Comm, label string, fn RankFunc) *result {
	defer o.setProcs()()
	res := &result{ranks: make([]*rankT, len(comms)), timeout: o.timeout(t)}
	var abortOnce sync.Once
	abort := func() {
		abortOnce.Do(func() {
			for _, c := range comms {
				c.Abort()
			}
		})
	}
	ctx := pprof.WithLabels(context.Background(), pprof.Labels(labelKey, label))
	done := make(chan int, len(comms))
	for r, c := range comms {
		rt := &rankT{TB: t, rank: c.Rank()}
		res.ranks[r] = rt
		go func() {
			defer func() {
				if v := recover(); v != nil {
					rt.Errorf("panic: %v\n%s", v, debug.Stack())
				}
				if rt.Failed() {
					res.mu.Lock()
					res.order = append(res.order, rt.rank)
					res.mu.Unlock()
					abort() // the others may be waiting for this rank
				}
				done <- r
			}()
			pprof.SetGoroutineLabels(ctx)
			fn(rt, c)
		}()
	}
	running := make([]bool, len(comms))
	for r := range running {
		running[r] = true
	}
	left := len(comms)
	timer := time.NewTimer(res.timeout)
	defer timer.Stop()
	for left > 0 {
		select {
		case r := <-done:
			running[r] = false
			left--
			continue
		case <-timer.C:
		}
		// The timeout: name the ranks, keep the stacks, abort, and give the
		// ranks a grace to return.
		for r, run := range running {
			if run {
				res.hung = append(res.hung, res.ranks[r].rank)
			}
		}
		res.dump = allStacks()
		abort()
		grace := time.NewTimer(hangGrace)
		for left > 0 {
			select {
			case r := <-done:
				running[r] = false
				left--
				continue
			case <-grace.C:
			}
			break
		}
		grace.Stop()
		for r, run := range running {
			if run {
				res.stuck = append(res.stuck, res.ranks[r].rank)
				res.ranks[r].detach() // it may log after the test has ended
			}
		}
		break
	}
	var skipped, ran []int
	for r, rt := range res.ranks {
		if running[r] {
			continue
		}
		if msg, ok := rt.skip(); ok {
			if len(skipped) == 0 {
				res.skipped = fmt.Sprintf("rank %d: %s", rt.rank, msg)
			}
			skipped = append(skipped, rt.rank)
		} else {
			ran = append(ran, rt.rank)
		}
	}
	if len(skipped) > 0 && (len(ran) > 0 || len(res.hung) > 0) {
		res.partial = fmt.Sprintf("ranks %v skipped (%s) while ranks %v did not: every rank should skip alike", skipped, res.skipped, ran)
		res.skipped = ""
	}
	return res
}

// report fails t with what went wrong, and says whether anything did; the
// ranks' own messages are already in t's log.
func (res *result) report(t testing.TB) bool {
	t.Helper()
	if len(res.hung) > 0 {
		t.Errorf("hcommtest: %s", res.hangText())
	}
	if len(res.order) > 0 {
		t.Errorf("hcommtest: %s", res.failText())
	}
	if res.partial != "" {
		t.Errorf("hcommtest: %s", res.partial)
	}
	return len(res.hung) > 0 || len(res.order) > 0 || res.partial != ""
}

func (res *result) hangText() string {
	s := fmt.Sprintf("%s still running after %v; every communicator aborted", ranksText(res.hung), res.timeout)
	if len(res.stuck) > 0 {
		s += fmt.Sprintf("; %s still running %v after the abort", ranksText(res.stuck), hangGrace)
	}
	return s + "; the goroutines at the timeout:\n" + res.dump
}

func (res *result) failText() string {
	s := fmt.Sprintf("rank %d failed", res.order[0])
	if len(res.order) > 1 {
		s += fmt.Sprintf(" first (every communicator aborted then), then %s", ranksText(res.order[1:]))
	}
	return s
}

// err is the result as an error, for Go: each failed rank's messages.
func (res *result) err() error {
	var errs []error
	for _, r := range res.order {
		for _, rt := range res.ranks {
			if rt.rank != r {
				continue
			}
			rt.mu.Lock()
			err := rt.err
			rt.mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("rank %d: %w", r, err))
			} else {
				errs = append(errs, fmt.Errorf("rank %d: %s", r, strings.Join(rt.messages(), "; ")))
			}
		}
	}
	if len(res.order) > 1 {
		errs = append(errs, errors.New(res.failText()))
	}
	if len(res.hung) > 0 {
		errs = append(errs, errors.New(res.hangText()))
	}
	if res.partial != "" {
		errs = append(errs, errors.New(res.partial))
	}
	return errors.Join(errs...)
}

func ranksText(rs []int) string {
	if len(rs) == 1 {
		return fmt.Sprintf("rank %d", rs[0])
	}
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = fmt.Sprint(r)
	}
	return "ranks " + strings.Join(s, ", ")
}

// allStacks is every goroutine's stack.
func allStacks() string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return string(buf[:n])
		}
		buf = make([]byte, 2*len(buf))
	}
}

// rankT is the testing.TB of one rank: its messages start with "rank r:",
// and Fatal, FailNow and Skip end the rank's goroutine, not the test's. With
// no TB (Go) it keeps the messages.
type rankT struct {
	testing.TB
	rank int

	mu       sync.Mutex
	failed   bool
	skipped  bool
	skipMsg  string
	msgs     []string
	err      error // Go's: what the rank returned
	detached bool  // the rank outlived its each: drop what it logs
}

// Helper marks rankT's own methods as helpers. A function of the test that
// calls it is not marked (testing marks the caller of TB.Helper, here
// rankT.Helper): its lines show in the messages.
func (r *rankT) Helper() {
	if r.TB != nil {
		r.TB.Helper()
	}
}

func (r *rankT) log(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.detached {
		return
	}
	if r.TB == nil {
		r.msgs = append(r.msgs, s)
		return
	}
	r.TB.Helper()
	r.TB.Logf("rank %d: %s", r.rank, s)
}

func (r *rankT) Log(args ...any) {
	if r.TB != nil {
		r.TB.Helper()
	}
	r.log(strings.TrimSuffix(fmt.Sprintln(args...), "\n"))
}
func (r *rankT) Logf(format string, args ...any) {
	if r.TB != nil {
		r.TB.Helper()
	}
	r.log(fmt.Sprintf(format, args...))
}
func (r *rankT) Error(args ...any) {
	if r.TB != nil {
		r.TB.Helper()
	}
	r.Log(args...)
	r.Fail()
}
func (r *rankT) Errorf(format string, args ...any) {
	if r.TB != nil {
		r.TB.Helper()
	}
	r.Logf(format, args...)
	r.Fail()
}
func (r *rankT) Fatal(args ...any) {
	if r.TB != nil {
		r.TB.Helper()
	}
	r.Log(args...)
	r.FailNow()
}
func (r *rankT) Fatalf(format string, args ...any) {
	if r.TB != nil {
		r.TB.Helper()
	}
	r.Logf(format, args...)
	r.FailNow()
}

// Fail marks the rank, and the test, failed.
func (r *rankT) Fail() {
	r.mu.Lock()
	r.failed = true
	det := r.detached
	r.mu.Unlock()
	if r.TB != nil && !det {
		r.TB.Fail()
	}
}

// FailNow marks the rank failed and ends its goroutine.
func (r *rankT) FailNow() { r.Fail(); runtime.Goexit() }

// Failed reports whether this rank failed.
func (r *rankT) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

func (r *rankT) Skip(args ...any) {
	if r.TB != nil {
		r.TB.Helper()
	}
	r.Log(args...)
	r.skipWith(fmt.Sprint(args...))
}
func (r *rankT) Skipf(format string, args ...any) {
	if r.TB != nil {
		r.TB.Helper()
	}
	r.Logf(format, args...)
	r.skipWith(fmt.Sprintf(format, args...))
}
func (r *rankT) SkipNow() { r.skipWith("skipped") }

func (r *rankT) skipWith(msg string) {
	r.mu.Lock()
	r.skipped, r.skipMsg = true, msg
	r.mu.Unlock()
	runtime.Goexit()
}

// Skipped reports whether this rank skipped.
func (r *rankT) Skipped() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.skipped
}

func (r *rankT) skip() (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.skipMsg, r.skipped && !r.failed
}

func (r *rankT) messages() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.msgs...)
}

func (r *rankT) detach() {
	r.mu.Lock()
	r.detached = true
	r.mu.Unlock()
}
