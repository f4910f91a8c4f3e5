package hcomm_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
)

// Multi-process tests re-execute this test binary once per rank, with the
// launcher variables InitFromEnv reads and HCOMM_TEST_ROLE naming what the
// rank does (TestHelperRank).

const roleEnv = "HCOMM_TEST_ROLE"

// TestHelperRank is one rank of a multi-process test; run by itself it skips.
func TestHelperRank(t *testing.T) {
	role := os.Getenv(roleEnv)
	if role == "" {
		t.Skip("a rank of the multi-process tests; runs only when they start it")
	}
	if role == "fault" {
		faultRank(t) // fault_test.go: it joins by itself, to count what it leaves behind
		return
	}
	if role == "scale" {
		scaleRank(t) // scale_netns_test.go: it joins by itself, to time its init
		return
	}
	if role == "stateloss" {
		stateLossRank(t) // stateloss_test.go
		return
	}
	if role == "polldeath" {
		pollDeathRank(t) // polldeath_test.go
		return
	}
	if role == "die-before-list" { // rank 1 dies after joining, before it reads the list of ranks
		hcomm.SetPeersHook(func(rank int) {
			if rank == 1 {
				os.Exit(3)
			}
		})
	}
	if role == "die-mid-gather" { // rank 8 dies after it handed its subtree up, before it reads every description
		hcomm.SetGatherHook(func(rank, step int) {
			if rank == 8 && step == 1 {
				os.Exit(3)
			}
		})
	}
	var c *hcomm.Comm
	var err error
	if rs := os.Getenv("HCOMM_TEST_ROOT"); rs != "" { // InitRootInfo with a root info from another process
		root, perr := hcomm.ParseRootInfo(rs)
		if perr != nil {
			t.Fatal(perr)
		}
		rank, _ := strconv.Atoi(os.Getenv("RANK"))
		size, _ := strconv.Atoi(os.Getenv("WORLD_SIZE"))
		c, err = hcomm.InitRootInfo(size, root, rank, nil)
	} else if role == "hier" {
		c, err = hcomm.InitFromEnv(&hcomm.Config{Metrics: hierRegistry})
	} else {
		c, err = hcomm.InitFromEnv(nil)
	}
	if err != nil {
		t.Fatalf("init: %v", err)
	}
	defer func() {
		start := time.Now()
		if err := c.Destroy(); err != nil {
			t.Errorf("Destroy: %v", err)
		}
		fmt.Printf("DESTROYED %d\n", time.Since(start).Milliseconds())
	}()
	switch role {
	case "empty", "die-before-list": // init, then destroy at once
	case "die-mid-gather":
		// A rank whose gather ended before rank 8 died learns of the loss
		// at its first collective.
		v := []float32{1}
		err := collectives.AllReduceSlice(context.Background(), c, v, v, hcomm.Sum, nil)
		if err == nil {
			t.Fatal("all-reduce after rank 8 died: no error")
		}
		fmt.Printf("OPERROR %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
		c.Abort()
	case "work":
		if err := rankWork(c, "", sizes); err != nil { // the transport is hcomm's choice
			t.Fatal(err)
		}
	case "loop":
		// Allreduce until an operation fails (a peer is lost), then report the
		// error; the parent checks it names the lost rank.
		ctx := context.Background()
		count, _ := strconv.Atoi(os.Getenv("HCOMM_TEST_COUNT"))
		send := make([]float32, max(count, 4096))
		for i := range send {
			send[i] = float32(c.Rank() + 1)
		}
		want := float32(c.Size() * (c.Size() + 1) / 2)
		recv := make([]float32, len(send))
		for i := 0; ; i++ {
			if err := collectives.AllReduceSlice(ctx, c, send, recv, hcomm.Sum, nil); err != nil {
				fmt.Printf("OPERROR %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
				c.Abort()
				return
			}
			for j, v := range recv {
				if v != want {
					t.Fatalf("allreduce #%d: element %d = %v, want %v", i, j, v, want)
				}
			}
			if i == 0 {
				fmt.Println("READY")
			}
			if i > 200000 {
				t.Fatal("no failure after many allreduces")
			}
		}
	case "hier":
		if err := hierWork(c); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("unknown %s=%q", roleEnv, role)
	}
}

// lineLog collects a process's output and reports marker lines.
type lineLog struct {
	mu    sync.Mutex
	b     bytes.Buffer
	lines chan markLine
	part  []byte
}

// markLine is a marker line and when it arrived.
type markLine struct {
	text string
	at   time.Time
}

func newLineLog() *lineLog { return &lineLog{lines: make(chan markLine, 1024)} }

func (l *lineLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.Write(p)
	l.part = append(l.part, p...)
	for {
		i := bytes.IndexByte(l.part, '\n')
		if i < 0 {
			break
		}
		line := string(l.part[:i])
		l.part = l.part[i+1:]
		if strings.HasPrefix(line, "READY") || strings.HasPrefix(line, "OPERROR") || strings.HasPrefix(line, "DESTROYED") || strings.HasPrefix(line, "TCPBYTES") ||
			strings.HasPrefix(line, "SHRUNK") || strings.HasPrefix(line, "DECIDING") || strings.HasPrefix(line, "STATE") || strings.HasPrefix(line, "POLL") {
			select {
			case l.lines <- markLine{line, time.Now()}:
			default:
			}
		}
	}
	return len(p), nil
}

func (l *lineLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type rankProc struct {
	rank int
	cmd  *exec.Cmd
	log  *lineLog
	done chan error
}

// launchRanks starts n ranks of role; prefix (may be nil) wraps each command
// (ip netns exec NAME), env adds per-rank variables; a rank whose env is nil
// is not started (its entry is nil: the test runs it itself).
func launchRanks(t *testing.T, ctx context.Context, n int, role string, prefix func(rank int) []string, env func(rank int) []string) []*rankProc {
	t.Helper()
	secret := make([]byte, 16)
	rand.Read(secret)
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	procs := make([]*rankProc, n)
	for r := 0; r < n; r++ {
		extra := env(r)
		if extra == nil {
			continue
		}
		args := []string{bin, "-test.run=^TestHelperRank$", "-test.v", "-test.timeout=120s"}
		if prefix != nil {
			args = append(prefix(r), args...)
		}
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		cmd.Env = append(os.Environ(),
			roleEnv+"="+role,
			"RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(n), "LOCAL_RANK="+strconv.Itoa(r),
			"HCOMM_SECRET="+hex.EncodeToString(secret),
			"HCCL_BUFFSIZE=1", "HCCL_CONNECT_TIMEOUT=30",
		)
		cmd.Env = append(cmd.Env, extra...)
		p := &rankProc{rank: r, cmd: cmd, log: newLineLog(), done: make(chan error, 1)}
		cmd.Stdout, cmd.Stderr = p.log, p.log
		cmd.WaitDelay = 5 * time.Second
		if err := cmd.Start(); err != nil {
			for _, q := range procs[:r] {
				if q == nil {
					continue
				}
				q.cmd.Process.Kill()
				<-q.done
			}
			t.Fatalf("starting rank %d: %v", r, err)
		}
		go func() { p.done <- cmd.Wait() }()
		procs[r] = p
	}
	t.Cleanup(func() {
		for _, p := range procs {
			if p == nil {
				continue
			}
			p.cmd.Process.Kill()
			select {
			case <-p.done:
			case <-time.After(10 * time.Second):
				t.Errorf("rank %d did not exit", p.rank)
			}
		}
	})
	return procs
}

// waitAll waits for every rank to exit and fails the test on a failure.
func waitAll(t *testing.T, procs []*rankProc) {
	t.Helper()
	for _, p := range procs {
		if p == nil {
			continue
		}
		err := <-p.done
		p.done <- err // for the cleanup
		if err != nil {
			t.Errorf("rank %d: %v\n%s", p.rank, err, p.log)
		}
	}
}

// waitLine waits for a marker line from p; it fails the test when d passes
// or p exits without one.
func waitLine(t *testing.T, p *rankProc, prefix string, d time.Duration) markLine {
	t.Helper()
	l, err := awaitLine(p, prefix, d)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// awaitLine is waitLine's wait: the line, or an error when d passes or p
// exits without one (an exited rank fails at once: rank 0 whose store
// could not start must not cost the test a minute).
func awaitLine(p *rankProc, prefix string, d time.Duration) (markLine, error) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case l := <-p.log.lines:
			if strings.HasPrefix(l.text, prefix) {
				return l, nil
			}
		case err := <-p.done:
			p.done <- err // for whoever waits next
			// Wait has returned, so the output is all in: the lines left
			// are in the channel.
			for {
				select {
				case l := <-p.log.lines:
					if strings.HasPrefix(l.text, prefix) {
						return l, nil
					}
				default:
					return markLine{}, fmt.Errorf("rank %d exited (%v) with no %s line; output:\n%s", p.rank, err, prefix, p.log)
				}
			}
		case <-timer.C:
			return markLine{}, fmt.Errorf("rank %d: no %s line within %v; output:\n%s", p.rank, prefix, d, p.log)
		}
	}
}

func masterEnv(t *testing.T, host string) []string {
	return []string{"MASTER_ADDR=" + host, "MASTER_PORT=" + strconv.Itoa(freePort(t))}
}

// launchReady starts n ranks of role as processes over the transport tr
// (launchRanks), each with the variables env and rank 0's store on a free
// port of this host, and waits until every rank says READY.
func launchReady(t *testing.T, ctx context.Context, n int, role, tr string, env ...string) []*rankProc {
	t.Helper()
	for attempt := 1; ; attempt++ {
		master := masterEnv(t, "127.0.0.1")
		procs := launchRanks(t, ctx, n, role, nil, func(int) []string {
			return append(append([]string{"HCOMM_TRANSPORT=" + tr}, env...), master...)
		})
		var err error
		for _, p := range procs {
			if _, err = awaitLine(p, "READY", 60*time.Second); err != nil {
				break
			}
		}
		if err == nil {
			return procs
		}
		// The port was free when freePort looked; something may have
		// bound it since. Another port, twice at most.
		if attempt == 3 || !strings.Contains(err.Error(), "in use") {
			t.Fatal(err)
		}
		t.Logf("launch %d: %s is taken; again on another port", attempt, master[1])
		for _, p := range procs {
			p.cmd.Process.Kill()
			p.done <- <-p.done // for the cleanup
		}
	}
}

// crossProcessTransports are the transports that connect processes in this build.
func crossProcessTransports(t *testing.T) []string {
	var out []string
	for _, tr := range hcomm.Transports() {
		if tr != hcomm.TransportInproc {
			out = append(out, tr)
		}
	}
	if len(out) == 0 {
		t.Skip("this build has no transport between processes (shm, tcp)")
	}
	return out
}

// procCfg is the configuration of the ranks hcommtest starts as processes:
// what the launched ranks of launchRanks get from the environment.
var procCfg = hcommtest.Options{Config: &hcomm.Config{BufferSize: 1 << 20, ConnectTimeout: 30 * time.Second, ExecTimeout: 60 * time.Second}}

// processTransports are hcommtest's transports with ranks as processes.
func processTransports(t *testing.T) []hcommtest.Transport {
	var out []hcommtest.Transport
	for _, tr := range hcommtest.Transports() {
		if tr.Processes {
			out = append(out, tr)
		}
	}
	if len(out) == 0 {
		t.Skip("this build has no transport between processes (shm, tcp)")
	}
	return out
}

// Three processes join with InitFromEnv (hcommtest sets the launcher's
// variables) and run the data plane and the collectives over every
// cross-process transport, and once with the transport left to hcomm.
func TestMultiProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	trs := processTransports(t)
	for _, tr := range append(trs, hcommtest.AutoProcesses) {
		t.Run(tr.String(), func(t *testing.T) {
			want := tr.Name
			if want == "" {
				want = trs[0].Name // hcomm's choice: the fastest between processes
			}
			procCfg.Run(t, 3, tr, func(t testing.TB, c *hcomm.Comm) {
				if got := c.ProcessesHere(); got != 3 {
					t.Errorf("ProcessesHere = %d for 3 processes on this host", got)
				}
				if err := rankWork(c, want, sizes); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
	t.Run("goroutines", func(t *testing.T) {
		hcommtest.Run(t, 3, hcommtest.Auto, func(t testing.TB, c *hcomm.Comm) {
			if got := c.ProcessesHere(); got != 1 {
				t.Errorf("ProcessesHere = %d for 3 ranks in one process", got)
			}
		})
	})
}

// InitFromEnv under mpirun's and srun's variables (as they set them), the
// rendezvous address from HCOMM_MASTER_ADDR and from the Slurm node list.
func TestMultiProcessLaunchers(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	crossProcessTransports(t)
	for name, env := range map[string]func(r, port int) []string{
		"mpirun": func(r, port int) []string {
			return []string{"OMPI_COMM_WORLD_RANK=" + strconv.Itoa(r), "OMPI_COMM_WORLD_SIZE=3", "OMPI_COMM_WORLD_LOCAL_RANK=" + strconv.Itoa(r),
				"HCOMM_MASTER_ADDR=127.0.0.1:" + strconv.Itoa(port)}
		},
		"srun": func(r, port int) []string {
			return []string{"SLURM_PROCID=" + strconv.Itoa(r), "SLURM_NTASKS=3", "SLURM_LOCALID=" + strconv.Itoa(r),
				"SLURM_JOB_NODELIST=localhost", "SLURM_JOB_ID=42", "HCOMM_ROOT_PORT=" + strconv.Itoa(port)}
		},
	} {
		t.Run(name, func(t *testing.T) {
			o := procCfg
			o.Env = func(r, port int) []string {
				// No torchrun variables, no secret: the launcher's own must be enough.
				base := []string{"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT=", "HCOMM_SECRET="}
				return append(base, env(r, port)...)
			}
			o.Run(t, 3, hcommtest.AutoProcesses, func(t testing.TB, c *hcomm.Comm) {
				if err := rankWork(c, "", []int{7}); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}

// Ranks as processes whose work is empty destroy their communicators the
// moment their inits return, rank 0 (and its store) first as often as not:
// no rank's init fails for it.
func TestMultiProcessEmptyWork(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	for range 3 {
		env := masterEnv(t, "127.0.0.1")
		procs := launchRanks(t, context.Background(), 4, "empty", nil, func(int) []string { return env })
		waitAll(t, procs)
		if t.Failed() {
			return
		}
	}
}

// A rank that dies after joining, before it reads the list of ranks, fails
// rank 0's init (which waits for every rank to read it) at once with an
// error naming it, not after HCCL_CONNECT_TIMEOUT (30 s here).
func TestMultiProcessLostBeforeList(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	env := masterEnv(t, "127.0.0.1")
	start := time.Now()
	procs := launchRanks(t, context.Background(), 3, "die-before-list", nil, func(int) []string { return env })
	err := <-procs[0].done
	procs[0].done <- err // for the cleanup
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("rank 0's init failed after %v; want it at once", d)
	}
	if out := procs[0].log.String(); err == nil || !strings.Contains(out, "rank 1 is lost") || !strings.Contains(out, "rank lost") {
		t.Fatalf("rank 0: %v, want its init to fail naming rank 1 lost; output:\n%s", err, out)
	}
	if err := <-procs[1].done; err == nil {
		t.Errorf("rank 1 did not die")
	} else {
		procs[1].done <- err
	}
}

// A rank that dies halfway through the tree gather of the ranks'
// descriptions (rank 8 of 10) fails every other rank at once (well within
// HCCL_CONNECT_TIMEOUT, 30 s here): the init of its child in the tree with
// an error naming it; the others' init or, when they had every
// description before it died, their first collective — naming it, or a
// rank whose init failed for it, whichever they learn of first.
func TestMultiProcessLostMidGather(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	const n = 10 // rank 8's parent in the tree is rank 0, its child rank 9
	env := masterEnv(t, "127.0.0.1")
	start := time.Now()
	procs := launchRanks(t, context.Background(), n, "die-mid-gather", nil, func(int) []string { return env })
	ended := make([]time.Duration, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[p.rank] = <-p.done
			p.done <- errs[p.rank] // for the cleanup
			ended[p.rank] = time.Since(start)
		}()
	}
	wg.Wait()
	for _, p := range procs {
		err, out := errs[p.rank], p.log.String()
		if p.rank == 8 {
			if err == nil {
				t.Errorf("rank 8 did not die")
			}
			continue
		}
		if strings.Contains(out, "joining the bootstrap within HCCL_CONNECT_TIMEOUT") {
			// Started so late (a loaded machine) that rank 0 had failed
			// and exited before it joined: it can only time out.
			t.Logf("rank %d joined after rank 0 exited: %s", p.rank, lastLine(out, "init: "))
			continue
		}
		if d := ended[p.rank]; d > 15*time.Second {
			t.Errorf("rank %d failed after %v; want it at once", p.rank, d)
		}
		switch {
		case p.rank == 9:
			// Rank 8's child in the tree waits for it: its init fails
			// naming it.
			if !strings.Contains(out, "init: ") || !strings.Contains(out, "rank 8 is lost") || !strings.Contains(out, "rank lost") {
				t.Errorf("rank %d: %v, want its init to fail naming rank 8 lost; output:\n%s", p.rank, err, out)
			}
			t.Logf("rank %d: %s", p.rank, lastLine(out, "init: "))
		case strings.Contains(out, "init: "):
			t.Logf("rank %d: %s", p.rank, lastLine(out, "init: "))
		case strings.Contains(out, "OPERROR"):
			// Its init had every description before rank 8 died; its
			// first collective fails, naming rank 8 when it learnt of the
			// loss first, or a rank that failed its init for it.
			t.Logf("rank %d: %s", p.rank, lastLine(out, "OPERROR"))
		default:
			t.Errorf("rank %d: %v, want its init or first collective to fail; output:\n%s", p.rank, err, out)
		}
	}
}

// Rank 0 is this test process (GetRootInfo, InitRootInfo); ranks 1 and 2
// are processes that get the root info as a string. Transports are left to
// hcomm: shm (or tcp) between processes.
func TestMultiProcessRootInfo(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	crossProcessTransports(t)
	cfg := &hcomm.Config{BufferSize: 1 << 20, ConnectTimeout: 30 * time.Second, ExecTimeout: 60 * time.Second}
	root, err := hcomm.GetRootInfo(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	procs := launchRanks(t, ctx, 3, "work", nil, func(r int) []string {
		if r == 0 {
			return nil // rank 0 is this process
		}
		return []string{"HCOMM_TEST_ROOT=" + root.String(), "HCOMM_TRANSPORT="}
	})
	c, err := hcomm.InitRootInfo(3, root, 0, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Destroy()
	if err := rankWork(c, "", sizes); err != nil {
		t.Fatal(err)
	}
	waitAll(t, procs)
}

// When a rank's process dies mid-allreduce, the others' operations fail
// within HCCL_EXEC_TIMEOUT with an error naming it, and Destroy returns promptly.
func TestMultiProcessPeerDeath(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	for _, tr := range crossProcessTransports(t) {
		for _, count := range []int{4096, 1 << 20} { // one-shot and ring schedules
			t.Run(fmt.Sprintf("%s/%d", tr, count), func(t *testing.T) {
				peerDeath(t, tr, count, 2)
			})
		}
		t.Run(tr+"/rank0", func(t *testing.T) { peerDeath(t, tr, 4096, 0) }) // the store goes too
	}
}

func peerDeath(t *testing.T, tr string, count, victim int) {
	{
		{
			const n, execTimeout = 3, 4 * time.Second
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			procs := launchReady(t, ctx, n, "loop", tr, "HCCL_EXEC_TIMEOUT="+strconv.Itoa(int(execTimeout/time.Second)),
				"HCOMM_TEST_COUNT="+strconv.Itoa(count))
			time.Sleep(100 * time.Millisecond) // well inside the loop
			killed := time.Now()
			procs[victim].cmd.Process.Signal(syscall.SIGKILL)
			checkSurvivors(t, procs, victim, killed, execTimeout)
		}
	}
}

// checkSurvivors checks that every rank but victim reports an operation
// error naming the victim within the exec timeout (plus slack for a loaded
// machine), and destroys its communicator promptly.
func checkSurvivors(t *testing.T, procs []*rankProc, victim int, since time.Time, execTimeout time.Duration) {
	t.Helper()
	for _, p := range procs {
		if p.rank == victim {
			continue
		}
		ml := waitLine(t, p, "OPERROR", execTimeout+20*time.Second)
		line, took := ml.text, ml.at.Sub(since)
		if !strings.Contains(line, fmt.Sprintf("rank %d", victim)) {
			t.Errorf("rank %d's error does not name rank %d: %s", p.rank, victim, line)
		}
		if took > execTimeout+10*time.Second {
			t.Errorf("rank %d failed %v after the loss; HCCL_EXEC_TIMEOUT is %v", p.rank, took, execTimeout)
		}
		d := waitLine(t, p, "DESTROYED", 20*time.Second)
		ms, _ := strconv.Atoi(strings.TrimPrefix(d.text, "DESTROYED "))
		if ms > 5000 {
			t.Errorf("rank %d: Destroy took %d ms", p.rank, ms)
		}
		t.Logf("rank %d failed %v after the loss of rank %d: %s", p.rank, took.Round(time.Millisecond), victim, line)
	}
}

// lastLine returns the last line of out that contains sub, clipped.
func lastLine(out, sub string) string {
	var l string
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, sub) {
			l = line
		}
	}
	if len(l) > 300 {
		l = l[:300] + "…"
	}
	return l
}

// A rank that exits without its line fails the wait at once, with its
// output (here rank 0, whose store port is taken: the launch retries on
// that text), not when the wait's minute is up.
func TestAwaitLineExitedRank(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	procs := launchRanks(t, context.Background(), 2, "loop", nil, func(r int) []string {
		if r != 0 {
			return nil
		}
		return []string{"HCOMM_TRANSPORT=tcp", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port}
	})
	start := time.Now()
	_, err = awaitLine(procs[0], "READY", 60*time.Second)
	took := time.Since(start)
	if err == nil {
		t.Fatal("READY from a rank whose store port is taken")
	}
	t.Logf("%v after the start: %v", took, err)
	if took > 20*time.Second {
		t.Errorf("the wait ended %v after the start; the rank exits at once", took)
	}
	for _, want := range []string{"rank 0 exited", "in use"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q: %v", want, err)
		}
	}
}
