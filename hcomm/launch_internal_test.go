package hcomm

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/internal/bootstrap"
	"github.com/hcomm-dev/hcomm/internal/procs"
)

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago,
// outside the kernel's ephemeral range (bootstrap.FreePort).
func freePort(t *testing.T) string {
	t.Helper()
	p, err := bootstrap.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	return strconv.Itoa(p)
}

// launchRanks joins one communicator per environment, concurrently, each
// as InitFromEnv would with that environment, and returns the communicators,
// errors and how long the slowest took.
func launchRanks(t *testing.T, cfg Config, envs ...map[string]string) ([]*Comm, []error, time.Duration) {
	t.Helper()
	c, err := resolveAll(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	comms := make([]*Comm, len(envs))
	errs := make([]error, len(envs))
	start := time.Now()
	var wg sync.WaitGroup
	for i, env := range envs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			le, err := parseLaunchEnv(envOf(env))
			if err != nil {
				errs[i] = err
				return
			}
			comms[i], errs[i] = joinEnv(context.Background(), "InitFromEnv", c, le)
		}()
	}
	wg.Wait()
	return comms, errs, time.Since(start)
}

func torchrunEnv(port string, rank, size int, more ...string) map[string]string {
	m := map[string]string{"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": strconv.Itoa(rank), "WORLD_SIZE": strconv.Itoa(size)}
	for i := 0; i+1 < len(more); i += 2 {
		m[more[i]] = more[i+1]
	}
	return m
}

// The secret derived from a launcher's variables does not depend on the
// world size: a rank launched with another WORLD_SIZE reaches the store,
// which can then say what is wrong.
func TestEnvSecretIgnoresWorldSize(t *testing.T) {
	a, err1 := parseLaunchEnv(envOf(torchrunEnv("5", 1, 4)))
	b, err2 := parseLaunchEnv(envOf(torchrunEnv("5", 1, 8)))
	if err1 != nil || err2 != nil || a.secret != b.secret {
		t.Fatalf("WORLD_SIZE 4 and 8: secrets %v, %v (%v, %v)", a.secret, b.secret, err1, err2)
	}
}

// checkPrompt checks that every rank failed within bound, with ErrPara and
// a message saying want.
func checkPrompt(t *testing.T, comms []*Comm, errs []error, took, bound time.Duration, want string) {
	t.Helper()
	for i, err := range errs {
		if comms[i] != nil {
			comms[i].Destroy()
			t.Errorf("rank #%d joined", i)
			continue
		}
		if !errors.Is(err, ErrPara) || !strings.Contains(err.Error(), want) {
			t.Errorf("rank #%d: %v; want a parameter error saying %q", i, err, want)
		}
	}
	if took > bound {
		t.Errorf("the ranks failed after %v; want every one within %v (HCCL_CONNECT_TIMEOUT is longer)", took, bound)
	}
}

// A rank launched with another WORLD_SIZE fails every rank at once, with
// the reason — not a refused secret for it and a timeout for the others.
func TestEnvWorldSizeMismatchFailsFast(t *testing.T) {
	port := freePort(t)
	comms, errs, took := launchRanks(t, Config{ConnectTimeout: 8 * time.Second},
		torchrunEnv(port, 0, 4), torchrunEnv(port, 1, 4), torchrunEnv(port, 2, 4), torchrunEnv(port, 3, 8))
	checkPrompt(t, comms, errs, took, 4*time.Second, "joined a job of 8 ranks; this job has 4")
}

// Two processes that claim one rank fail every rank at once, naming both.
func TestEnvDuplicateRankFailsFast(t *testing.T) {
	port := freePort(t)
	comms, errs, took := launchRanks(t, Config{ConnectTimeout: 8 * time.Second},
		torchrunEnv(port, 0, 3), torchrunEnv(port, 1, 3), torchrunEnv(port, 1, 3))
	checkPrompt(t, comms, errs, took, 4*time.Second, fmt.Sprintf("two processes claim rank 1 (pid %d on", os.Getpid()))
}

// A second job on the port of a running one fails at once, saying so: its
// rank 0 cannot listen, its other ranks are refused by the first job's store
// (another secret: another job id; the same secret: the first job is
// complete) — and the first job goes on.
func TestEnvTwoJobsOnOnePort(t *testing.T) {
	port := freePort(t)
	cfg := Config{ConnectTimeout: 8 * time.Second}
	first, errs, _ := launchRanks(t, cfg, torchrunEnv(port, 0, 2), torchrunEnv(port, 1, 2))
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		for _, c := range first {
			c.Destroy()
		}
	}()
	for _, tc := range []struct {
		name string
		envs []map[string]string
		want []string
	}{
		{"another job id", []map[string]string{torchrunEnv(port, 0, 2, "TORCHELASTIC_RUN_ID", "b"), torchrunEnv(port, 1, 2, "TORCHELASTIC_RUN_ID", "b")},
			[]string{"127.0.0.1:" + port + " in use: another job on this port (MASTER_PORT)?", "another job on this port (MASTER_PORT)"}},
		{"the same secret", []map[string]string{torchrunEnv(port, 1, 3), torchrunEnv(port, 2, 3)},
			[]string{"all 2 ranks of this store's job have joined", "all 2 ranks of this store's job have joined"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms, errs, took := launchRanks(t, cfg, tc.envs...)
			for i, err := range errs {
				if comms[i] != nil {
					comms[i].Destroy()
					t.Errorf("rank #%d of the second job joined", i)
				} else if err == nil || !strings.Contains(err.Error(), tc.want[i]) {
					t.Errorf("rank #%d of the second job: %v; want it to say %q", i, err, tc.want[i])
				}
			}
			if took > 4*time.Second {
				t.Errorf("the second job failed after %v", took)
			}
		})
	}
	// The first job still sets up channels through its store.
	var wg sync.WaitGroup
	for r, c := range first {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := ChannelDescInit(1)
			d[0].RemoteRank = 1 - r
			if _, err := c.ChannelAcquire(EngineCPU, d); err != nil {
				t.Errorf("the first job's rank %d after the intruders: %v", r, err)
			}
		}()
	}
	wg.Wait()
}

// Rank 0 listens on the address MASTER_ADDR names when it is this host's,
// else on every interface.
func TestListenAddr(t *testing.T) {
	for addr, want := range map[string]string{
		"127.0.0.1:5":   "127.0.0.1:5",
		"localhost:5":   "127.0.0.1:5",
		"[::1]:5":       "[::1]:5",
		"192.0.2.250:5": ":5", // TEST-NET: not this host's
	} {
		if got, err := listenAddr(Config{}, addr); err != nil || got != want {
			t.Errorf("listenAddr(%q) = %q, %v; want %q", addr, got, err, want)
		}
	}
	// An address of one of this host's interfaces.
	if ifaces, err := net.InterfaceAddrs(); err == nil {
		for _, a := range ifaces {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
				addr := net.JoinHostPort(n.IP.String(), "7")
				if got, err := listenAddr(Config{}, addr); err != nil || got != addr {
					t.Errorf("listenAddr(%q) = %q, %v; want it", addr, got, err)
				}
				break
			}
		}
	}
}

// Launcher variables: mpirun with every rank on this host needs no
// MASTER_ADDR; the ranks on this host are counted under every launcher.
func TestLaunchEnvLocalRanks(t *testing.T) {
	mpi := map[string]string{"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
	le, err := parseLaunchEnv(envOf(mpi))
	if err != nil || le.addr != "127.0.0.1:29500" || le.localSize != 4 {
		t.Errorf("mpirun on one host: %+v, %v; want 127.0.0.1:29500 and 4 local ranks", le, err)
	}
	spread := maps.Clone(mpi)
	spread["OMPI_COMM_WORLD_LOCAL_SIZE"] = "2"
	if _, err := parseLaunchEnv(envOf(spread)); err == nil || !strings.Contains(err.Error(), "MASTER_ADDR") {
		t.Errorf("mpirun over two hosts without MASTER_ADDR: %v", err)
	}
	tr := torchrunEnv("5", 0, 8, "LOCAL_WORLD_SIZE", "4")
	if le, err := parseLaunchEnv(envOf(tr)); err != nil || le.localSize != 4 {
		t.Errorf("torchrun LOCAL_WORLD_SIZE=4: %+v, %v", le, err)
	}
	for _, tc := range []struct {
		env  map[string]string
		want int
	}{
		{map[string]string{"SLURM_STEP_TASKS_PER_NODE": "4(x2)"}, 4},
		{map[string]string{"SLURM_STEP_TASKS_PER_NODE": "4(x2),3", "SLURM_NODEID": "2"}, 3},
		{map[string]string{"SLURM_STEP_TASKS_PER_NODE": "4(x2),3", "SLURM_NODEID": "1"}, 4},
		{map[string]string{"SLURM_STEP_TASKS_PER_NODE": "4(x2),3"}, 0},
		{map[string]string{"SLURM_TASKS_PER_NODE": "2", "SLURM_NTASKS_PER_NODE": "9"}, 2},
		{map[string]string{"SLURM_STEP_TASKS_PER_NODE": "x(y)", "SLURM_NTASKS_PER_NODE": "9"}, 9},
		{map[string]string{}, 0},
	} {
		if got := slurmLocalTasks(envOf(tc.env)); got != tc.want {
			t.Errorf("slurmLocalTasks(%v) = %d, want %d", tc.env, got, tc.want)
		}
	}
}

// Under mpirun (and srun, torchrun) a rank that shares its host lowers
// GOMAXPROCS to its share of the processors, as hcomm run sets it — unless
// GOMAXPROCS is set.
func TestInitFromEnvSharesProcessors(t *testing.T) {
	cpus := procs.Shared()
	if cpus < 2 || os.Getenv("GOMAXPROCS") != "" {
		t.Skipf("needs 2 unbound processors and GOMAXPROCS unset (have %d, %q)", cpus, os.Getenv("GOMAXPROCS"))
	}
	old := runtime.GOMAXPROCS(cpus)
	defer runtime.GOMAXPROCS(old)
	port := freePort(t)
	for k, v := range map[string]string{"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
		"OMPI_COMM_WORLD_LOCAL_SIZE": "2", "HCOMM_ROOT_PORT": port, "HCCL_CONNECT_TIMEOUT": "1"} {
		t.Setenv(k, v)
	}
	// Rank 1 alone: it gives up after HCCL_CONNECT_TIMEOUT, but has set
	// GOMAXPROCS first.
	if c, err := InitFromEnv(nil); err == nil {
		c.Destroy()
		t.Fatal("a lone rank 1 joined")
	} else if !strings.Contains(err.Error(), "127.0.0.1:"+port) {
		t.Errorf("rank 1 of a one-host mpirun did not dial 127.0.0.1: %v", err)
	}
	if got, want := runtime.GOMAXPROCS(0), cpus/2; got != want {
		t.Errorf("GOMAXPROCS = %d after InitFromEnv with 2 local ranks on %d processors; want %d", got, cpus, want)
	}
	runtime.GOMAXPROCS(cpus)
	if g := shareProcessors(envOf(map[string]string{"GOMAXPROCS": "7"}), 2, cpus); g != 0 || runtime.GOMAXPROCS(0) != cpus {
		t.Errorf("GOMAXPROCS set in the environment was overridden: %d", runtime.GOMAXPROCS(0))
	}
	if g := shareProcessors(envOf(nil), 2, 0); g != 0 || runtime.GOMAXPROCS(0) != cpus {
		t.Errorf("a rank bound by its launcher had GOMAXPROCS changed: %d", runtime.GOMAXPROCS(0))
	}
}
