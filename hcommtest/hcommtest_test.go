package hcommtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

var small = &hcomm.Config{BufferSize: 1 << 20, ConnectTimeout: 30 * time.Second, ExecTimeout: 60 * time.Second}

// allReduce is a rank's check that the ranks talk: an all-reduce of rank+1
// over 1, 4099 (past the one-shot path) elements.
func allReduce(t testing.TB, c *hcomm.Comm) {
	for _, count := range []int{1, 4099} {
		send := make([]float32, count)
		for i := range send {
			send[i] = float32(c.Rank() + 1)
		}
		recv := make([]float32, count)
		if err := collectives.AllReduceSlice(context.Background(), c, send, recv, hcomm.Sum, nil); err != nil {
			t.Fatal(err)
		}
		for i, v := range recv {
			if want := float32(c.Size() * (c.Size() + 1) / 2); v != want {
				t.Fatalf("count %d: element %d = %v, want %v", count, i, v, want)
			}
		}
	}
}

// Every transport Transports lists runs three ranks, as goroutines and as
// processes, each of which sees its own rank.
func TestRunEveryTransport(t *testing.T) {
	trs := Transports()
	if len(trs) == 0 || trs[0] != Inproc {
		t.Fatalf("Transports() = %v; want inproc first", trs)
	}
	for _, tr := range append(trs, Auto) {
		t.Run(tr.String(), func(t *testing.T) {
			if tr.Processes && testing.Short() {
				t.Skip("-short: no processes")
			}
			var mu sync.Mutex
			seen := map[int]bool{}
			Options{Config: small}.Run(t, 3, tr, func(t testing.TB, c *hcomm.Comm) {
				if c.Size() != 3 {
					t.Fatalf("size %d, want 3", c.Size())
				}
				mu.Lock()
				seen[c.Rank()] = true
				mu.Unlock()
				allReduce(t, c)
			})
			if len(seen) != 3 { // in the parent of a Processes Run, the children saw theirs
				if !tr.Processes {
					t.Errorf("ranks seen: %v", seen)
				}
			}
		})
	}
}

func TestTransportString(t *testing.T) {
	for tr, want := range map[Transport]string{Auto: "auto", Inproc: "inproc", Shm: "shm", TCP: "tcp",
		AutoProcesses: "auto-procs", ShmProcesses: "shm-procs", TCPProcesses: "tcp-procs"} {
		if got := tr.String(); got != want {
			t.Errorf("%#v.String() = %q, want %q", tr, got, want)
		}
	}
}

// fakeTB records what Run, Each and the ranks report, so that the tests can
// check a failure without failing.
type fakeTB struct {
	testing.TB // the real test's: Name, Cleanup, TempDir
	mu         sync.Mutex
	logs       []string
	failed     bool
	skipped    bool
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Log(args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.logs = append(f.logs, fmt.Sprint(args...))
}
func (f *fakeTB) Logf(format string, args ...any)   { f.Log(fmt.Sprintf(format, args...)) }
func (f *fakeTB) Error(args ...any)                 { f.Log(args...); f.Fail() }
func (f *fakeTB) Errorf(format string, args ...any) { f.Logf(format, args...); f.Fail() }
func (f *fakeTB) Fatal(args ...any)                 { f.Log(args...); f.FailNow() }
func (f *fakeTB) Fatalf(format string, args ...any) { f.Logf(format, args...); f.FailNow() }
func (f *fakeTB) Fail() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failed = true
}
func (f *fakeTB) FailNow() { f.Fail(); runtime.Goexit() }
func (f *fakeTB) Failed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failed
}
func (f *fakeTB) Skip(args ...any)                 { f.Log(args...); f.SkipNow() }
func (f *fakeTB) Skipf(format string, args ...any) { f.Logf(format, args...); f.SkipNow() }
func (f *fakeTB) SkipNow() {
	f.mu.Lock()
	f.skipped = true
	f.mu.Unlock()
	runtime.Goexit()
}
func (f *fakeTB) Skipped() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.skipped
}
func (f *fakeTB) text() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.logs, "\n")
}

// capture runs fn with a fakeTB in a goroutine of its own (FailNow and
// SkipNow end it) and returns what it recorded.
func capture(t *testing.T, fn func(tb testing.TB)) *fakeTB {
	f := &fakeTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	<-done
	return f
}

// A rank that fails is named, and the ranks waiting for it in a collective
// are released by the abort instead of hanging: waiting in the collective's
// channel setup, or, connected, in its notify waits.
func TestRunNamesFailingRank(t *testing.T) {
	for _, connected := range []bool{false, true} {
		start := time.Now()
		f := capture(t, func(tb testing.TB) {
			Options{Config: small}.Run(tb, 3, Inproc, func(t testing.TB, c *hcomm.Comm) {
				if connected {
					allReduce(t, c)
				}
				if c.Rank() == 1 {
					t.Fatalf("boom")
				}
				allReduce(t, c) // waits for rank 1 until the abort
				t.Errorf("rank %d's all-reduce returned without rank 1", c.Rank())
			})
		})
		out := f.text()
		if !f.failed || !strings.Contains(out, "rank 1: boom") || !strings.Contains(out, "rank 1 failed first") {
			t.Errorf("connected %v: failed %v; output:\n%s", connected, f.failed, out)
		}
		if strings.Contains(out, "returned without rank 1") || strings.Contains(out, "still running") {
			t.Errorf("connected %v: the other ranks were not released by the abort:\n%s", connected, out)
		}
		if d := time.Since(start); d > 20*time.Second {
			t.Errorf("connected %v: Run took %v", connected, d)
		}
	}
}

// A rank that panics is named with its stack; the test binary survives.
func TestRunNamesPanickingRank(t *testing.T) {
	f := capture(t, func(tb testing.TB) {
		Options{Config: small}.Run(tb, 3, Inproc, func(t testing.TB, c *hcomm.Comm) {
			if c.Rank() == 2 {
				var m map[string]int
				m["x"]++
			}
		})
	})
	out := f.text()
	if !f.failed || !strings.Contains(out, "rank 2: panic: assignment to entry in nil map") || !strings.Contains(out, "hcommtest_test.go") {
		t.Errorf("failed %v; output:\n%s", f.failed, out)
	}
}

// A hang is bounded by the timeout: the rank still running is named, the
// goroutines' stacks are logged, and the abort releases it.
func TestRunHangIsBounded(t *testing.T) {
	cfg := *small
	cfg.ExecTimeout = 10 * time.Minute
	start := time.Now()
	f := capture(t, func(tb testing.TB) {
		Options{Config: &cfg, Timeout: 5 * time.Second}.Run(tb, 2, Inproc, func(t testing.TB, c *hcomm.Comm) {
			if err := collectives.BarrierContext(context.Background(), c); err != nil { // connect
				t.Fatal(err)
			}
			if c.Rank() == 0 {
				if err := collectives.BarrierContext(context.Background(), c); err == nil {
					t.Error("the barrier returned without rank 1")
				}
			} // rank 1 never comes
		})
	})
	out := f.text()
	if !f.failed || !strings.Contains(out, "rank 0 still running after 5s") || !strings.Contains(out, "goroutine ") ||
		!strings.Contains(out, "BarrierContext") {
		t.Errorf("failed %v; output:\n%s", f.failed, out)
	}
	if strings.Contains(out, "after the abort") {
		t.Errorf("the abort did not release rank 0:\n%s", out)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("Run took %v", d)
	}
}

// A rank the abort cannot release is reported as such after the grace, and
// Run still returns.
func TestRunStuckRankIsReported(t *testing.T) {
	defer func(g time.Duration) { hangGrace = g }(hangGrace)
	defer func(w time.Duration) { leakWait = w }(leakWait)
	hangGrace, leakWait = 100*time.Millisecond, 100*time.Millisecond
	release := make(chan struct{})
	left := make(chan struct{})
	f := capture(t, func(tb testing.TB) {
		Options{Config: small, Timeout: 200 * time.Millisecond}.Run(tb, 2, Inproc, func(t testing.TB, c *hcomm.Comm) {
			if c.Rank() == 1 {
				<-release
				t.Log("late") // dropped: the rank outlived its Run
				close(left)
			}
		})
	})
	close(release)
	<-left
	out := f.text()
	if !f.failed || !strings.Contains(out, "rank 1 still running after 200ms") || !strings.Contains(out, "rank 1 still running 100ms after the abort") {
		t.Errorf("failed %v; output:\n%s", f.failed, out)
	}
	if strings.Contains(out, "late") {
		t.Errorf("a detached rank's message reached the test:\n%s", out)
	}
}

// Go returns the ranks' errors, the first failure named first.
func TestGoReturnsErrors(t *testing.T) {
	comms := Options{Config: small}.New(t, 3, Inproc)
	errBad := errors.New("bad input")
	err := Go(comms, func(c *hcomm.Comm) error {
		if c.Rank() == 2 {
			return fmt.Errorf("rank-local check: %w", errBad)
		}
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "rank 2: rank-local check: bad input") || !errors.Is(err, errBad) {
		t.Fatalf("Go: %v (errors.Is(err, errBad) = %v)", err, errors.Is(err, errBad))
	}
	// The communicators were aborted: a later collective fails at once.
	if err := Go(comms, func(c *hcomm.Comm) error {
		return collectives.BarrierContext(context.Background(), c)
	}); err == nil {
		t.Error("a collective on aborted communicators succeeded")
	}
	if err := Go(comms[:1], func(c *hcomm.Comm) error { return nil }); err != nil {
		t.Errorf("Go of one rank: %v", err)
	}
}

// InitRanks joins ranks that must init at once (here from one root info)
// and hands them back in rank order, destroyed when the test ends; an init
// that fails, or a communicator of another rank, is named by its rank, and
// the communicators that were made are destroyed all the same.
func TestInitRanks(t *testing.T) {
	var comms []*hcomm.Comm
	t.Run("rootinfo", func(t *testing.T) {
		root, err := hcomm.GetRootInfo(small)
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		comms = InitRanks(t, 3, func(r int) (*hcomm.Comm, error) { return hcomm.InitRootInfo(3, root, r, small) })
		Each(t, comms, allReduce)
	})
	for r, c := range comms {
		if st := c.GetStatus(); st != hcomm.StatusDestroyed {
			t.Errorf("rank %d after its test: %v, want destroyed", r, st)
		}
	}

	var made []*hcomm.Comm
	for _, tc := range []struct {
		name string
		init func(r int) (*hcomm.Comm, error)
		want string
	}{
		{"failing", func(r int) (*hcomm.Comm, error) {
			if r == 0 {
				return nil, errors.New("boom")
			}
			cs, err := hcomm.InitAll(1, small)
			if err != nil {
				return nil, err
			}
			made = append(made, cs...)
			return cs[0], nil
		}, "rank 0: boom"},
		{"another rank", func() func(r int) (*hcomm.Comm, error) {
			cs, err := hcomm.InitAll(2, small)
			if err != nil {
				t.Fatal(err)
			}
			made = append(made, cs...)
			return func(r int) (*hcomm.Comm, error) { return cs[1-r], nil }
		}(), "rank 0: comm says rank 1 of 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := capture(t, func(tb testing.TB) { InitRanks(tb, 2, tc.init) })
			if !f.failed || !strings.Contains(f.text(), tc.want) {
				t.Errorf("failed %v; output:\n%s\nwant %q", f.failed, f.text(), tc.want)
			}
		})
	}
	for _, c := range made {
		if st := c.GetStatus(); st != hcomm.StatusDestroyed {
			t.Errorf("a communicator InitRanks had after its test: %v, want destroyed", st)
		}
	}
}

// New's ranks run many cases with Each; a skip on every rank skips; a skip
// on some ranks only is an error.
func TestEachAndSkips(t *testing.T) {
	comms := Options{Config: small}.New(t, 3, TCP)
	for i := 0; i < 3; i++ {
		Each(t, comms, allReduce)
	}
	f := capture(t, func(tb testing.TB) {
		Each(tb, comms, func(t testing.TB, c *hcomm.Comm) { t.Skip("not here") })
	})
	if !f.skipped || f.failed || !strings.Contains(f.text(), "rank 0: not here") {
		t.Errorf("every rank skipped: skipped %v failed %v\n%s", f.skipped, f.failed, f.text())
	}
	f = capture(t, func(tb testing.TB) {
		Each(tb, comms, func(t testing.TB, c *hcomm.Comm) {
			if c.Rank() == 1 {
				t.Skip("not here")
			}
		})
	})
	if f.skipped || !f.failed || !strings.Contains(f.text(), "ranks [1] skipped") {
		t.Errorf("rank 1 skipped: skipped %v failed %v\n%s", f.skipped, f.failed, f.text())
	}
	Each(t, comms, allReduce) // still usable: nothing failed

	// An earlier failure of the test is not this Each's: it returns.
	f = capture(t, func(tb testing.TB) {
		tb.Error("an earlier check")
		Each(tb, comms, allReduce)
		tb.Log("after Each")
	})
	if !strings.Contains(f.text(), "after Each") {
		t.Errorf("Each stopped a test that had failed before it:\n%s", f.text())
	}
}

// What a rank leaves behind fails the Run: a goroutine, a descriptor.
func TestRunReportsLeaks(t *testing.T) {
	defer func(w time.Duration) { leakWait = w }(leakWait)
	leakWait = 200 * time.Millisecond
	stop := make(chan struct{})
	stopped := make(chan struct{})
	f := capture(t, func(tb testing.TB) {
		Options{Config: small}.Run(tb, 2, Inproc, func(t testing.TB, c *hcomm.Comm) {
			if c.Rank() == 1 {
				go func() { <-stop; close(stopped) }()
			}
		})
	})
	close(stop)
	<-stopped
	if out := f.text(); !f.failed || !strings.Contains(out, "goroutines started under the ranks outlive them") || !strings.Contains(out, "TestRunReportsLeaks") {
		t.Errorf("failed %v; output:\n%s", f.failed, out)
	}

	var ln net.Listener
	f = capture(t, func(tb testing.TB) {
		Options{Config: small}.Run(tb, 2, Inproc, func(t testing.TB, c *hcomm.Comm) {
			if c.Rank() == 0 {
				var err error
				if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
					t.Fatal(err)
				}
			}
		})
	})
	if ln != nil {
		ln.Close()
	}
	if out := f.text(); !f.failed || !strings.Contains(out, "descriptors opened under the ranks outlive them") || !strings.Contains(out, "socket:") {
		t.Errorf("failed %v; output:\n%s", f.failed, out)
	}
}

// New refuses processes; Run refuses a second Processes Run in one test.
func TestMisuse(t *testing.T) {
	f := capture(t, func(tb testing.TB) { New(tb, 2, TCPProcesses) })
	if !f.failed || !strings.Contains(f.text(), "use Run") {
		t.Errorf("New with processes: %s", f.text())
	}
	f = capture(t, func(tb testing.TB) { New(tb, 0, Inproc) })
	if !f.failed || !strings.Contains(f.text(), "0 ranks") {
		t.Errorf("New of 0 ranks: %s", f.text())
	}
	f = capture(t, func(tb testing.TB) { Run(tb, 2, TCPProcesses, func(testing.TB, *hcomm.Comm) {}) })
	if !f.failed || !strings.Contains(f.text(), "only a *testing.T") {
		t.Errorf("Run with processes on a TB: %s", f.text())
	}
}

func TestRunPattern(t *testing.T) {
	for name, want := range map[string]string{
		"TestX":           "^TestX$",
		"TestX/tcp-procs": "^TestX$/^tcp-procs$",
		"TestX/a.b(c)#01": `^TestX$/^a\.b\(c\)#01$`,
	} {
		if got := runPattern(name); got != want {
			t.Errorf("runPattern(%q) = %q, want %q", name, got, want)
		}
	}
}

const selfTestEnv = "HCOMMTEST_SELFTEST"

// TestHelperFailingProcesses is run by TestProcessesNameFailingRank in a
// process of its own: ranks as processes, rank 1 failing, rank 2 hanging.
func TestHelperFailingProcesses(t *testing.T) {
	if os.Getenv(selfTestEnv) == "" {
		t.Skip("run by TestProcessesNameFailingRank")
	}
	cfg := *small
	cfg.ExecTimeout = 10 * time.Minute
	if os.Getenv(selfTestEnv) == "hang" { // no rank fails; rank 1 never returns
		Options{Config: &cfg, Timeout: 5 * time.Second}.Run(t, 2, TCPProcesses, func(t testing.TB, c *hcomm.Comm) {
			if c.Rank() == 1 {
				select {}
			}
		})
		return
	}
	tr := TCPProcesses
	if os.Getenv(selfTestEnv) == "shm" {
		tr = ShmProcesses
	}
	Options{Config: &cfg, Timeout: 20 * time.Second}.Run(t, 3, tr, func(t testing.TB, c *hcomm.Comm) {
		switch c.Rank() {
		case 1:
			t.Fatalf("boom in process %d", os.Getpid())
		case 2:
			select {} // not even the abort ends this
		}
		collectives.BarrierContext(context.Background(), c)
	})
}

// With ranks as processes, a failing rank and a hanging one are named, with
// their output and the hanging one's goroutines, and the Run ends.
func TestProcessesNameFailingRank(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-test.run=^TestHelperFailingProcesses$", "-test.v")
	cmd.Env = append(os.Environ(), selfTestEnv+"=tcp")
	out, err := cmd.CombinedOutput()
	s := string(out)
	if err == nil || !strings.Contains(s, "--- FAIL: TestHelperFailingProcesses") {
		t.Fatalf("the helper did not fail: %v\n%s", err, s)
	}
	for _, want := range []string{
		"rank 1: boom in process",               // the rank's own message
		"hcommtest: rank 1 (pid ",               // named by the parent
		"hcommtest: rank 2 (pid ",               // the hanging one
		"still running 10s after rank 1 failed", // why it was stopped
		"SIGQUIT",                               // its goroutine dump
		"hcommtest_test.go",                     // the dump shows where it hangs
	} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
}

// Options.Env reaches the rank processes after hcommtest's variables: here
// the ranks join as under mpirun, with torchrun's variables cleared.
func TestProcessesEnv(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	o := Options{Config: small, Env: func(r, port int) []string {
		return []string{"RANK=", "WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT=",
			"OMPI_COMM_WORLD_RANK=" + strconv.Itoa(r), "OMPI_COMM_WORLD_SIZE=2", "HCOMM_MASTER_ADDR=127.0.0.1:" + strconv.Itoa(port)}
	}}
	o.Run(t, 2, TCPProcesses, func(t testing.TB, c *hcomm.Comm) {
		if os.Getenv("RANK") != "" || os.Getenv("OMPI_COMM_WORLD_RANK") != strconv.Itoa(c.Rank()) {
			t.Errorf("RANK=%q OMPI_COMM_WORLD_RANK=%q in rank %d's process", os.Getenv("RANK"), os.Getenv("OMPI_COMM_WORLD_RANK"), c.Rank())
		}
		if v, _ := hcomm.Launched(nil); v != "OMPI_COMM_WORLD_SIZE" {
			t.Errorf("Launched: %q", v)
		}
		allReduce(t, c)
	})
}

// With ranks as processes, a hang is bounded by the timeout: the rank is
// named, with the goroutines SIGQUIT made its process print. The rank that
// returned is not blamed, also when the parent is late to its deadline
// (stopped from 1 s to 7 s: the returned rank's own wait must outlast it).
func TestProcessesHangIsBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, late := range []bool{false, true} {
		t.Run(map[bool]string{false: "prompt", true: "late-parent"}[late], func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			start := time.Now()
			cmd := exec.CommandContext(ctx, bin, "-test.run=^TestHelperFailingProcesses$", "-test.v")
			cmd.Env = append(os.Environ(), selfTestEnv+"=hang")
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			if late {
				time.Sleep(time.Second)
				cmd.Process.Signal(syscall.SIGSTOP)
				time.Sleep(6 * time.Second)
				cmd.Process.Signal(syscall.SIGCONT)
			}
			err := cmd.Wait()
			s := out.String()
			if err == nil || !strings.Contains(s, "--- FAIL: TestHelperFailingProcesses") {
				t.Fatalf("the helper did not fail: %v\n%s", err, s)
			}
			for _, want := range []string{"hcommtest: rank 1 (pid ", "still running after 5s", "SIGQUIT", "hcommtest_test.go"} {
				if !strings.Contains(s, want) {
					t.Errorf("output lacks %q:\n%s", want, s)
				}
			}
			if strings.Contains(s, "hcommtest: rank 0 (pid ") {
				t.Errorf("rank 0, which returned, is reported:\n%s", s)
			}
			if d := time.Since(start); d > time.Minute {
				t.Errorf("the run took %v; its timeout is 5s", d)
			}
		})
	}
}

// With ranks as processes, no rank destroys its communicator while another
// still runs, as with goroutines: here rank 0's bootstrap store is still up
// for rank 1 a second after rank 0 returned.
func TestProcessesDestroyAfterEveryRank(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	Options{Config: small}.Run(t, 2, TCPProcesses, func(t testing.TB, c *hcomm.Comm) {
		if c.Rank() == 0 {
			return
		}
		time.Sleep(time.Second)
		conn, err := net.DialTimeout("tcp", net.JoinHostPort(os.Getenv("MASTER_ADDR"), os.Getenv("MASTER_PORT")), 5*time.Second)
		if err != nil {
			t.Fatalf("rank 0's store went before rank 1 returned: %v", err)
		}
		conn.Close()
	})
}
