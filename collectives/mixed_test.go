package collectives_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/channel/shm"
	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// mixedEnv carries the root info to the process TestMixedLayout starts,
// which then runs the communicator's last ranks.
const mixedEnv = "HCOMM_TEST_MIXED_ROOT"

// TestMixedLayout: 4 ranks in two processes of two ranks each — this one
// and a copy of the test binary it starts — joined by InitRootInfo, so that
// each rank reaches its peer in its own process over inproc and its two
// peers in the other over shm, as a job of several processes with several
// devices each would. Every collective and algorithm of the matrix runs on
// it, at a count that fits a hello, one that takes several pieces of the
// 256 KiB HCCL buffer, and all-gathers around a lowered push threshold,
// where one call writes its in-process peer's output lent and pushes into
// the other process's ranks' memory files (counted in each process).
// The two processes run the same calls in the same order, each checking
// its own ranks' results against the float64 reference.
func TestMixedLayout(t *testing.T) {
	if shm.HostID() == "" {
		t.Skip("no shared-memory transport on this system")
	}
	if testing.Short() {
		t.Skip("-short: starts a second process")
	}
	const n, here = 4, 2
	const pushMin = 96 << 10
	defer collectives.SetShmPushMin(pushMin)()
	cfg := hcomm.Config{BufferSize: 256 << 10, ConnectTimeout: 30 * time.Second, ExecTimeout: time.Minute}
	first := 0
	var root hcomm.RootInfo
	if s := os.Getenv(mixedEnv); s != "" {
		var err error
		if root, err = hcomm.ParseRootInfo(s); err != nil {
			t.Fatalf("%s=%q: %v", mixedEnv, s, err)
		}
		first = here
	} else {
		var err error
		if root, err = hcomm.GetRootInfo(&cfg); err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		child := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestMixedLayout$", "-test.count=1", "-test.v", "-test.timeout=4m")
		child.Env = append(os.Environ(), mixedEnv+"="+root.String())
		var out bytes.Buffer // read once Wait has returned: exec writes it from one goroutine at a time
		child.Stdout, child.Stderr, child.WaitDelay = &out, &out, 5*time.Second
		if err := child.Start(); err != nil {
			t.Fatalf("starting the second process: %v", err)
		}
		done := make(chan error, 1)
		go func() { done <- child.Wait() }()
		defer func() {
			if t.Failed() {
				cancel() // its ranks would wait for ours until their timeout
			}
			if err := <-done; err != nil {
				t.Errorf("the second process (ranks %d–%d): %v\n%s", here, n-1, err, out.String())
			}
		}()
	}
	comms, errs := make([]*hcomm.Comm, here), make([]error, here)
	var wg sync.WaitGroup
	for i := range here {
		wg.Go(func() { comms[i], errs[i] = hcomm.InitRootInfo(n, root, first+i, &cfg) })
	}
	wg.Wait()
	defer func() {
		for _, c := range comms {
			if c != nil {
				c.Destroy()
			}
		}
	}()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", first+i, err)
		}
	}
	for _, c := range comms {
		for p := range n {
			want := hcomm.TransportShm
			if p/here == c.Rank()/here {
				want = hcomm.TransportInproc
			}
			if p == c.Rank() {
				continue
			}
			if got, err := c.TransportTo(p, hcomm.ProtocolAuto); err != nil || got != want {
				t.Fatalf("rank %d to %d: transport %q (%v), want %q", c.Rank(), p, got, err, want)
			}
		}
	}
	inline := collectives.InlineBytes(comms[0])
	for _, dt := range []hcomm.DataType{hcomm.Int8, hcomm.Float32} {
		es := int64(dt.Size())
		at := (pushMin + n*es - 1) / (n * es) // the least count whose all-gather pushes
		for _, count := range []int64{7, 70001, at - 1, at, at + 3} {
			m := matrixCase{dt: dt, op: hcomm.Sum, count: count, root: int(count) % n, inline: inline}
			p0 := collectives.LentPushes()
			for _, inPlace := range []bool{false, true} {
				for _, a := range algosOf("AllGather") {
					testAllGather(t, comms, m, a, inPlace)
				}
			}
			pushed := collectives.LentPushes() > p0
			if want := n*count*es >= pushMin; pushed != want {
				t.Fatalf("all-gather %v (output %d bytes, threshold %d): pushed %v, want %v", m, n*count*es, pushMin, pushed, want)
			}
			if count >= at-1 {
				continue // the rest once per type and size
			}
			testVCollectives(t, comms, m)
			for _, op := range []hcomm.ReduceOp{hcomm.Sum, hcomm.Max} {
				m.op = op
				inPlace := op == hcomm.Max
				for _, a := range algosOf("AllReduce") {
					if fits(a, count*es, inline) && a != collectives.AlgoHier {
						allReduceRaw(t, comms, m, a, inPlace)
					}
				}
				for _, a := range algosOf("ReduceScatter") {
					testReduceScatter(t, comms, m, a, inPlace)
				}
				for _, a := range algosOf("Reduce") {
					testReduce(t, comms, m, a, inPlace)
				}
			}
			m.op = hcomm.Sum
			for _, a := range algosOf("Broadcast") {
				if fits(a, count*es, inline) {
					broadcastRaw(t, comms, m, a)
				}
			}
			for _, a := range algosOf("Scatter") {
				testScatterGather(t, comms, m, a)
			}
			for _, a := range algosOf("AlltoAll") {
				if fits(a, count*es, inline) {
					testAlltoAll(t, comms, m, a)
				}
			}
			testSendRecv(t, comms, m)
		}
	}
	// Every rank is done with every call before either process destroys
	// its communicators.
	run(t, comms, func(c *hcomm.Comm) error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return collectives.BarrierContext(ctx, c)
	})
}
