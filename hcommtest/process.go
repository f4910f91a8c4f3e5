package hcommtest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/internal/bootstrap"
)

// Ranks as processes. The parent re-executes the test binary once per rank
// with -test.run selecting the calling test and the launcher variables of
// InitFromEnv set; testEnv names the test, which tells the child's Run that
// it is one rank, not the parent. The child prints a marker line when its
// rank has run (or skipped), so that the parent tells "the rank failed" from
// "the child never reached Run". A rank whose function returned without
// failing says so and waits for the parent to close its stdin, which the
// parent does once every rank has returned or ended: no rank destroys its
// communicator, and rank 0 not its bootstrap store, while another is still
// joining or running, as with ranks as goroutines.

const (
	testEnv    = "HCOMMTEST_RUN"
	ranksEnv   = "HCOMMTEST_RANKS" // n, and this process's rank: whatever Env
	rankEnv    = "HCOMMTEST_RANK"  // did to the launcher's variables
	doneMarker = "HCOMMTEST-RANK-DONE"
	retMarker  = "HCOMMTEST-RANK-RETURNED"
	skipMarker = "HCOMMTEST-RANK-SKIP"
)

// childTest is the test this process runs one rank of, "" in the parent.
func childTest() string { return os.Getenv(testEnv) }

var (
	procRunsMu sync.Mutex
	procRuns   = map[testing.TB]bool{} // tests that made a Processes Run
)

// runProcess runs a Processes Run, in the parent or as one rank in a child;
// it returns false for a Run this process should run as goroutines (a
// goroutine Run inside a child).
func (o Options) runProcess(t testing.TB, n int, tr Transport, fn RankFunc) bool {
	t.Helper()
	if name := childTest(); name != "" {
		if !tr.Processes {
			return false
		}
		if t.Name() != name {
			t.Skipf("hcommtest: this process is a rank of %s, not of %s", name, t.Name())
		}
		o.runChild(t, n, tr, fn)
		return true
	}
	if _, ok := t.(*testing.T); !ok {
		t.Fatalf("hcommtest.Run: %v runs ranks as processes, which only a *testing.T can do", tr)
	}
	procRunsMu.Lock()
	again := procRuns[t]
	procRuns[t] = true
	procRunsMu.Unlock()
	if again {
		t.Fatalf("hcommtest.Run: %s makes a second Run with ranks as processes; make each in its own subtest", t.Name())
	}
	t.Cleanup(func() {
		procRunsMu.Lock()
		delete(procRuns, t)
		procRunsMu.Unlock()
	})
	o.runParent(t, n, tr)
	return true
}

// runChild is one rank of a Processes Run, in its own process.
func (o Options) runChild(t testing.TB, n int, tr Transport, fn RankFunc) {
	t.Helper()
	if ws := os.Getenv(ranksEnv); ws != strconv.Itoa(n) {
		t.Fatalf("hcommtest.Run: this process is one of %s ranks, but the test asks for %d here: the code before Run took another path in this process", ws, n)
	}
	defer o.setProcs()()
	label := strconv.FormatInt(nextLabel.Add(1), 10)
	g := &group{label: label, snap: takeSnapshot()}
	var c *hcomm.Comm
	var err error
	labelled(label, func() { c, err = hcomm.InitFromEnv(o.config(tr)) })
	if err != nil {
		g.snap.release()
		t.Fatalf("hcommtest.Run: rank %s: InitFromEnv: %v", os.Getenv(rankEnv), err)
	}
	g.comms = []*hcomm.Comm{c}
	res := o.each(t, g.comms, label, fn)
	if len(res.order) == 0 && len(res.hung) == 0 {
		fmt.Printf("\n%s %d\n", retMarker, c.Rank())
		// The parent lets a returned rank go at its deadline at the
		// latest, which started before this rank's init: wait longer than
		// that, or a hang of another rank is blamed on this one too when
		// this process's timer fires first on a loaded host. (The parent
		// gone, stdin ends at once.)
		if wait := o.timeout(t) + hangGrace; !waitRelease(wait) {
			t.Errorf("hcommtest: rank %d: the parent did not let the ranks destroy their communicators within %v", c.Rank(), wait)
		}
	}
	cerr := g.close()
	res.report(t)
	if cerr != nil {
		t.Errorf("hcommtest.Run: %v", cerr)
	}
	if t.Failed() {
		t.FailNow()
	}
	if res.skipped != "" {
		fmt.Printf("\n%s %d\n", skipMarker, c.Rank())
		t.Skip(res.skipped)
	}
	fmt.Printf("\n%s %d\n", doneMarker, c.Rank())
	// The code after Run is the parent's: end the test here.
	t.SkipNow()
}

// waitRelease waits up to d for stdin to end (the parent closes it).
func waitRelease(d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// procRank is one rank process.
type procRank struct {
	rank  int
	cmd   *exec.Cmd
	stdin io.Closer
	out   syncBuf
	err   error
	end   time.Time
}

// runParent starts n processes for the calling test and waits for them.
func (o Options) runParent(t testing.TB, n int, tr Transport) {
	t.Helper()
	bin, err := os.Executable()
	if err != nil {
		t.Fatalf("hcommtest.Run: the test binary: %v", err)
	}
	port, err := freePort()
	if err != nil {
		t.Fatalf("hcommtest.Run: a port for rank 0's bootstrap store: %v", err)
	}
	secret := make([]byte, 16)
	rand.Read(secret)
	timeout := o.timeout(t)
	args := []string{"-test.run=" + runPattern(t.Name()), "-test.v", "-test.count=1",
		"-test.timeout=" + (timeout + hangGrace + time.Minute).String()}
	if testing.Short() {
		args = append(args, "-test.short")
	}
	env := append(os.Environ(),
		testEnv+"="+t.Name(), ranksEnv+"="+strconv.Itoa(n),
		"WORLD_SIZE="+strconv.Itoa(n), "LOCAL_WORLD_SIZE="+strconv.Itoa(n),
		"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port),
		"HCOMM_MASTER_ADDR=", // it would win over MASTER_ADDR
		"HCOMM_SECRET="+hex.EncodeToString(secret),
		"HCOMM_TRANSPORT="+tr.Name, // Config.Transport forces it too; empty: hcomm chooses
	)
	if o.GOMAXPROCS > 0 {
		env = append(env, "GOMAXPROCS="+strconv.Itoa(o.GOMAXPROCS))
	}
	procs := make([]*procRank, n)
	done := make(chan *procRank, n)
	returned := make(chan struct{}, n) // a rank's function returned
	for r := range procs {
		p := &procRank{rank: r, cmd: exec.Command(bin, args...)}
		p.cmd.Env = append(env[:len(env):len(env)], rankEnv+"="+strconv.Itoa(r), "RANK="+strconv.Itoa(r), "LOCAL_RANK="+strconv.Itoa(r))
		if o.Env != nil {
			p.cmd.Env = append(p.cmd.Env, o.Env(r, port)...)
		}
		p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
		p.cmd.WaitDelay = 5 * time.Second
		p.out.marker, p.out.seen = []byte("\n"+retMarker+" "+strconv.Itoa(r)+"\n"), returned
		if p.stdin, err = p.cmd.StdinPipe(); err == nil {
			err = p.cmd.Start()
		}
		if err != nil {
			for _, q := range procs[:r] {
				q.cmd.Process.Kill()
			}
			for range procs[:r] {
				<-done
			}
			t.Fatalf("hcommtest.Run: starting rank %d: %v", r, err)
		}
		procs[r] = p
		go func() {
			p.err = p.cmd.Wait()
			p.end = time.Now()
			done <- p
		}()
	}

	// Wait: for all, until the timeout; once a rank failed, the others get
	// hangGrace to notice. Then the ranks still running are sent SIGQUIT (the
	// Go runtime prints every goroutine and exits), and after hangGrace more,
	// SIGKILL.
	left := n
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	var graceC, killC <-chan time.Time
	var hung []int
	var why string
	ended := make([]bool, n)
	var order []*procRank
	quit := func(reason string) {
		if why != "" {
			return
		}
		why = reason
		for r, p := range procs {
			switch {
			case ended[r]:
			case p.out.returned(): // waiting for the others: let it end
				p.stdin.Close()
			default:
				hung = append(hung, r)
				p.cmd.Process.Signal(syscall.SIGQUIT)
			}
		}
		killC = time.After(hangGrace)
	}
	graceWhy := ""
	nReturned, released := 0, false
	release := func() { // every rank returned or ended: let them destroy
		if !released && nReturned+len(order) >= n {
			released = true
			for _, p := range procs {
				p.stdin.Close()
			}
		}
	}
	for left > 0 {
		select {
		case <-returned:
			nReturned++
			release()
		case p := <-done:
			left--
			ended[p.rank] = true
			order = append(order, p)
			if p.out.returned() {
				nReturned-- // counted once, as ended
			}
			release()
			if p.err != nil && graceC == nil && why == "" {
				graceC = time.After(hangGrace)
				graceWhy = fmt.Sprintf("%v after rank %d failed", hangGrace, p.rank)
			}
		case <-deadline.C:
			quit(fmt.Sprintf("after %v", timeout))
		case <-graceC:
			graceC = nil
			quit(graceWhy)
		case <-killC:
			killC = nil
			for r, p := range procs {
				if !ended[r] {
					p.cmd.Process.Kill()
				}
			}
		}
	}

	var skipped, failed []int
	for _, p := range order {
		out := p.out.String()
		switch {
		case isHung(hung, p.rank):
			t.Errorf("hcommtest: rank %d (pid %d) still running %s; its output, with the goroutines SIGQUIT made it print:\n%s",
				p.rank, p.cmd.Process.Pid, why, out)
			failed = append(failed, p.rank)
		case p.err != nil:
			t.Errorf("hcommtest: rank %d (pid %d): %v; its output:\n%s", p.rank, p.cmd.Process.Pid, p.err, out)
			failed = append(failed, p.rank)
		case hasMarker(out, skipMarker, p.rank):
			skipped = append(skipped, p.rank)
		case !hasMarker(out, doneMarker, p.rank):
			t.Errorf("hcommtest: rank %d (pid %d) ended without running its rank: the test took another path in that process "+
				"(code before Run must be the same in every process; only a leaf test may run ranks as processes); its output:\n%s",
				p.rank, p.cmd.Process.Pid, out)
			failed = append(failed, p.rank)
		}
	}
	switch {
	case len(hung) > 0:
		t.Errorf("hcommtest: %s still running %s", ranksText(hung), why)
	case len(failed) > 0:
		t.Errorf("hcommtest: %s failed (in the order their processes ended)", ranksText(failed))
	case len(skipped) == n:
		t.Skipf("hcommtest: every rank skipped")
	case len(skipped) > 0:
		t.Errorf("hcommtest: %s skipped while the others did not: every rank should skip alike", ranksText(skipped))
	}
}

func isHung(hung []int, r int) bool {
	for _, h := range hung {
		if h == r {
			return true
		}
	}
	return false
}

func hasMarker(out, marker string, rank int) bool {
	return strings.Contains(out, "\n"+marker+" "+strconv.Itoa(rank)+"\n")
}

// runPattern is a -test.run pattern that matches the test named name and
// no other: each level anchored and quoted.
func runPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

// freePort is a loopback TCP port free at the time of the call, outside
// the kernel's ephemeral range (bootstrap.FreePort).
func freePort() (int, error) { return bootstrap.FreePort("127.0.0.1") }

// syncBuf is a buffer safe for concurrent writers (a process's stdout and
// stderr) that sends on seen once marker has been written.
type syncBuf struct {
	mu     sync.Mutex
	b      bytes.Buffer
	marker []byte
	seen   chan<- struct{}
	found  bool
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, err := s.b.Write(p)
	if s.marker != nil && !s.found && bytes.Contains(s.b.Bytes(), s.marker) {
		s.found = true
		s.seen <- struct{}{} // buffered for every rank
	}
	return n, err
}

// returned reports whether the marker was written.
func (s *syncBuf) returned() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.found
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
