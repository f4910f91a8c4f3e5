package sim

import (
	"fmt"
	"math"
	"math/bits"
	"os"
	"strconv"
	"strings"
	"testing"

	simch "github.com/hcomm-dev/hcomm/channel/sim"
	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/internal/leakcheck"
)

func TestMain(m *testing.M) {
	if os.Getenv(ringEnv) == "1" { // a process of TestProbe's ring
		if err := RingMember(os.Args[len(os.Args)-4:], os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	leakcheck.Main(m)
}

const (
	alpha = 10e-6 // seconds
	beta  = 1e-9  // seconds per byte: 1 GB/s
)

// flat is one host of n ranks with α = 10 µs, β = 1 ns/B and free local
// work, so that closed forms are exact up to the handshake's header bytes.
func flat(t *testing.T, n int) *Cluster {
	t.Helper()
	cl, err := NewCluster(simch.Profile{Intra: simch.Level{AlphaUs: alpha * 1e6, BetaNsPerByte: beta * 1e9}, Hosts: 1, RanksPerHost: n}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

func run(t *testing.T, cl *Cluster, c Case) Result {
	t.Helper()
	r, err := cl.Run(c)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func near(t *testing.T, what string, got, want, tol float64) {
	t.Helper()
	if math.Abs(got-want) > tol*want {
		t.Errorf("%s: predicted %.2f µs, closed form %.2f µs (off by %.2f%%, tolerance %.1f%%)", what, got*1e6, want*1e6, 100*(got-want)/want, 100*tol)
	} else {
		t.Logf("%s: predicted %.2f µs, closed form %.2f µs", what, got*1e6, want*1e6)
	}
}

// TestRingClosedForm: the ring reduce-scatter and all-gather together take
// the textbook ring all-reduce's 2(n−1)·α + 2(n−1)/n·S·β, plus one α at
// each end of each collective (the handshake, and the last piece's
// acknowledgement). The sim transport is a network (its peers' memory is
// not mapped), where hcomm's own ring all-reduce pushes its result into
// every peer's inbox after the reduce-scatter: the n−1 sends leave one
// after another, (n−1)/n·S·β, and arrive one α later. It takes
// (n−1)·α + 2(n−1)/n·S·β plus three α: the handshake, the push, the
// acknowledgement.
func TestRingClosedForm(t *testing.T) {
	const S = 1 << 20
	for _, n := range []int{4, 8} {
		cl := flat(t, n)
		nf := float64(n)
		rs := run(t, cl, Case{"reducescatter", collectives.AlgoRing, S})
		ag := run(t, cl, Case{"allgather", collectives.AlgoRing, S})
		near(t, "ring reduce-scatter + all-gather, n="+itoa(n), rs.Time+ag.Time,
			2*(nf-1)*alpha+2*(nf-1)/nf*S*beta+4*alpha, 0.002)
		ar := run(t, cl, Case{"allreduce", collectives.AlgoRing, S})
		near(t, "hcomm ring all-reduce, n="+itoa(n), ar.Time, (nf-1)*alpha+2*(nf-1)/nf*S*beta+3*alpha, 0.002)
		if ar.BusBW <= 0 || math.Abs(ar.BusBW-float64(S)/ar.Time/1e9*2*(nf-1)/nf) > 1e-9 {
			t.Errorf("n=%d: busbw %v for %v s", n, ar.BusBW, ar.Time)
		}
	}
}

// TestTreeHops: a reduce up the binomial tree of one piece takes log2(n)
// hops of α + S·β, plus the handshake and the acknowledgement. The
// handshake is one α up to 8 ranks (every rank's hello to every peer at
// once) and log2(n) α above (the butterfly's rounds, one after another).
// The hellos that the inline poll sees arrive as the queued waits' do: up to
// 8 ranks this fails if ChannelNotifyTryWait does not advance the clock.
func TestTreeHops(t *testing.T) {
	const S = 256 << 10
	for _, n := range []int{2, 4, 8, 16} {
		cl := flat(t, n)
		hops := float64(bits.Len(uint(n)) - 1)
		hello := 1.0
		if n > 8 {
			hello = hops
		}
		r := run(t, cl, Case{"reduce", collectives.AlgoTree, S})
		near(t, "tree reduce, n="+itoa(n), r.Time, hops*(alpha+S*beta)+(hello+1)*alpha, 0.002)
	}
}

// TestTreeBroadcastHops: a broadcast of one piece down the binomial tree
// takes log2(n) hops of α + S·β, plus the handshake (log2(n) α: the
// butterfly's rounds) and the acknowledgement, because every rank sends
// to its children largest subtree first: the piece reaches the deepest
// rank of the tree through first sends only. Sent smallest subtree first,
// rank n−1 (the deepest) waits behind its ancestors' other children — its
// k-th ancestor's send to it is the k-th of that ancestor's — and the
// broadcast took 2712 µs instead of 1139 at 16 ranks (10 piece times, not
// 4), 4234 instead of 1703 at 64.
func TestTreeBroadcastHops(t *testing.T) {
	const S = 256 << 10
	for _, n := range []int{16, 64} {
		cl := flat(t, n)
		hops := float64(bits.Len(uint(n)) - 1)
		r := run(t, cl, Case{"broadcast", collectives.AlgoTree, S})
		near(t, "tree broadcast, n="+itoa(n), r.Time, hops*(alpha+S*beta)+(hops+1)*alpha, 0.002)
	}
}

// TestCoresShared: ranks that outnumber their host's cores take turns on
// them. A 1 MiB ring all-reduce of 4 ranks is all processor time here (no
// latency, no wake-ups), so on 2 cores it takes twice as long as on 4, and
// on 4 as long as with a core per rank.
func TestCoresShared(t *testing.T) {
	p := simch.Profile{Intra: simch.Level{BetaNsPerByte: 1}, GammaNsPerByte: 0.5, Hosts: 1, RanksPerHost: 4}
	var times [3]float64
	for i, cores := range []int{0, 4, 2} {
		p.Cores = cores
		cl, err := NewCluster(p, Options{})
		if err != nil {
			t.Fatal(err)
		}
		times[i] = run(t, cl, Case{"allreduce", collectives.AlgoRing, 1 << 20}).Time
		cl.Close()
	}
	if times[1] != times[0] || math.Abs(times[2]/times[0]-2) > 0.02 {
		t.Errorf("a core per rank: %v s, 4 cores: %v s, 2 cores: %v s; want the first two equal and the last twice as long", times[0], times[1], times[2])
	}
}

// TestCoresSlowDown: in the slowdown model (oversub_exponent), four ranks
// on two cores take twice as long as with a core each at exponent 1, and
// run the same schedule (its ranks are not Crowded).
func TestCoresSlowDown(t *testing.T) {
	p := simch.Profile{Intra: simch.Level{AlphaUs: 10, OverheadUs: 1, BetaNsPerByte: 1}, GammaNsPerByte: 0.5, Hosts: 1, RanksPerHost: 16}
	var times [2]float64
	for i, cores := range []int{0, 8} {
		p.Cores, p.OversubExp = cores, 1
		cl, err := NewCluster(p, Options{})
		if err != nil {
			t.Fatal(err)
		}
		r := run(t, cl, Case{"allreduce", collectives.AlgoAuto, 1 << 20})
		times[i] = r.Time
		if r.Algo != "hd" {
			t.Errorf("16 ranks on %d cores, the slowdown model: the selector ran %q, want hd", cores, r.Algo)
		}
		cl.Close()
	}
	if math.Abs(times[1]/times[0]-2) > 1e-9 {
		t.Errorf("8 cores: %v s, a core each: %v s; want twice as long", times[1], times[0])
	}
}

// TestCrowdedRunsTheTree: the simulated ranks of a crowded host run what
// real ones do (hcomm.Comm.Crowded: the sim Dialer tells InitAllOver its
// host's cores): 16 ranks on 2 cores all-reduce 1 MiB with the binomial
// tree, and with a core each with halving-doubling.
func TestCrowdedRunsTheTree(t *testing.T) {
	p := simch.Profile{Intra: simch.Level{AlphaUs: 5, OverheadUs: 2, BetaNsPerByte: 0.3}, GammaNsPerByte: 0.1, Hosts: 1, RanksPerHost: 16}
	for _, c := range []struct {
		cores int
		want  string
	}{{2, "tree"}, {0, "hd"}} {
		p.Cores = c.cores
		cl, err := NewCluster(p, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if r := run(t, cl, Case{"allreduce", collectives.AlgoAuto, 1 << 20}); r.Algo != c.want {
			t.Errorf("16 ranks on %d cores: the selector ran %q, want %q", c.cores, r.Algo, c.want)
		}
		cl.Close()
	}
}

// TestReplayIsDeterministic: a case's predicted time does not depend on
// the order the ranks' goroutines ran in. Two hosts share their NICs and
// two cores among 8 ranks each, where the order charges reach a NIC or a
// processor decides who waits; the replay takes them in virtual time, so
// every run of the same case gives the same time (charged as the
// goroutines came, the NIC's order varied from run to run).
func TestReplayIsDeterministic(t *testing.T) {
	p := simch.Profile{Intra: simch.Level{AlphaUs: 2, OverheadUs: 1, BetaNsPerByte: 0.2},
		Inter: simch.Level{AlphaUs: 10, OverheadUs: 3, BetaNsPerByte: 1}, GammaNsPerByte: 0.1,
		Hosts: 2, RanksPerHost: 8, Cores: 2, WakeUs: 20, SwitchUs: 5}
	cl, err := NewCluster(p, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, c := range []Case{{"allreduce", collectives.AlgoAuto, 4096}, {"alltoall", collectives.AlgoPairwise, 64 << 10}, {"allgather", collectives.AlgoRing, 256 << 10}} {
		first := run(t, cl, c).Time
		for i := 0; i < 4; i++ {
			if got := run(t, cl, c).Time; got != first {
				t.Errorf("%s %v of %d bytes: run %d took %v s, the first %v s", c.Collective, c.Algorithm, c.Bytes, i+2, got, first)
			}
		}
	}
}

// TestAutoNamesTheSelectorsChoice: a case with AlgoAuto reports what the
// selector picked, and a forced one what was forced.
func TestAutoNamesTheSelectorsChoice(t *testing.T) {
	cl := flat(t, 4)
	// Simulated links are not mapped memory: 4 ranks' small all-reduce
	// and broadcast go rd (select.go), an all-to-all one-shot.
	if r := run(t, cl, Case{"allreduce", collectives.AlgoAuto, 64}); r.Algo != "rd" {
		t.Errorf("64-byte all-reduce: algorithm %q, want the selector's rd", r.Algo)
	}
	if r := run(t, cl, Case{"broadcast", collectives.AlgoAuto, 64}); r.Algo != "rd" {
		t.Errorf("64-byte broadcast: algorithm %q, want the selector's rd", r.Algo)
	}
	if r := run(t, cl, Case{"alltoall", collectives.AlgoAuto, 256}); r.Algo != "oneshot" {
		t.Errorf("256-byte all-to-all: algorithm %q, want the selector's oneshot", r.Algo)
	}
	if r := run(t, cl, Case{"allreduce", collectives.AlgoHD, 1 << 20}); r.Algo != "hd" {
		t.Errorf("forced hd: algorithm %q", r.Algo)
	}
}

// TestLostOrRepeatedPieceFails: a write that does not land, or lands with
// the bytes of the write before it, fails the result check — the simulator
// times only schedules that deliver every piece once.
func TestLostOrRepeatedPieceFails(t *testing.T) {
	for _, c := range []Case{
		{"allreduce", collectives.AlgoRing, 1 << 20},
		{"allgather", collectives.AlgoRing, 1 << 20},
		{"broadcast", collectives.AlgoTree, 1 << 20},
		{"alltoall", collectives.AlgoPairwise, 1 << 20},
	} {
		for _, repeat := range []bool{false, true} {
			cl := flat(t, 4)
			run(t, cl, c) // fault-free first: the check passes
			cl.World().Inject(simch.Fault{Rank: 0, Nth: 3, MinBytes: 1024, Repeat: repeat})
			_, err := cl.Run(c)
			if err == nil || !strings.Contains(err.Error(), "lost or repeated") {
				t.Errorf("%s %v with a %s piece: error %v, want a failed result check", c.Collective, c.Algorithm, map[bool]string{false: "lost", true: "repeated"}[repeat], err)
			}
			cl.Close()
		}
	}
}

// TestBadInput: profiles, shapes and cases that make no sense fail with an
// error naming what is wrong.
func TestBadInput(t *testing.T) {
	good := simch.Profile{Intra: simch.Level{AlphaUs: 1}, Hosts: 1, RanksPerHost: 2}
	for _, c := range []struct {
		name string
		edit func(*simch.Profile, *Options)
		want string
	}{
		{"negative alpha", func(p *simch.Profile, _ *Options) { p.Intra.AlphaUs = -1 }, "intra.alpha_us is -1"},
		{"zero ranks per host", func(p *simch.Profile, _ *Options) { p.RanksPerHost = 0 }, "ranks_per_host is 0"},
		{"hosts × ranks overflow", func(p *simch.Profile, _ *Options) { p.Hosts, p.RanksPerHost = math.MaxInt/2, 4 }, "more than 65536 ranks"},
		{"HCCL buffers over 1 TiB", func(p *simch.Profile, o *Options) { p.RanksPerHost = 1 << 12; o.BufferSize = 1 << 30 }, "over 1 TiB"},
		{"negative buffer", func(_ *simch.Profile, o *Options) { o.BufferSize = -1 }, "must not be negative"},
	} {
		p, o := good, Options{}
		c.edit(&p, &o)
		cl, err := NewCluster(p, o)
		if err == nil {
			cl.Close()
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.name, err, c.want)
		}
	}
	cl := flat(t, 2)
	for _, c := range []struct {
		c    Case
		want string
	}{
		{Case{"allreduce", collectives.AlgoAuto, -8}, "size is negative"},
		{Case{"allgather", collectives.AlgoAuto, 4}, "moves nothing"},
		{Case{"allscatter", collectives.AlgoAuto, 64}, `no collective "allscatter"`},
		{Case{"broadcast", collectives.AlgoHD, 64}, "hd"},
	} {
		if _, err := cl.Run(c.c); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want one containing %q", c.c, err, c.want)
		}
	}
	if r := run(t, cl, Case{"allreduce", collectives.AlgoAuto, 64}); r.Time <= 0 {
		t.Errorf("after the refused cases, an all-reduce took %v s", r.Time)
	}
	small, err := NewCluster(simch.Profile{Hosts: 1, RanksPerHost: 2}, Options{MemLimit: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	if _, err := small.Run(Case{"allreduce", collectives.AlgoAuto, 1 << 20}); err == nil || !strings.Contains(err.Error(), "over the memory limit of 1048576") {
		t.Errorf("a 1 MiB all-reduce of 2 ranks under a 1 MiB limit: error %v", err)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestHeapGuard: a case whose heap passes the memory limit is aborted with
// an error naming the limit, and the cluster refuses the cases after it
// (the ring at 1024 ranks and 64 KiB grew past 24 GB without the guard).
// The limit here is below what the cluster's communicators hold already.
func TestHeapGuard(t *testing.T) {
	cl, err := NewCluster(simch.Profile{Intra: simch.Level{AlphaUs: 1}, Hosts: 1, RanksPerHost: 8}, Options{MemLimit: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	_, err = cl.Run(Case{"allreduce", collectives.AlgoAuto, 64})
	if err == nil || !strings.Contains(err.Error(), "over the memory limit of 65536 (-mem)") {
		t.Fatalf("a case over the heap limit: error %v", err)
	}
	if _, err := cl.Run(Case{"allreduce", collectives.AlgoAuto, 64}); err == nil || !strings.Contains(err.Error(), "unusable") {
		t.Errorf("the case after: error %v, want the cluster unusable", err)
	}
}
