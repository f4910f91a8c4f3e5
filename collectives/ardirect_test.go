package collectives_test

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
)

// TestDirectAllReduce: between ranks that read each other's memory (in
// process; shm processes of a host, here ranks of one process over shm)
// the selector gives an all-reduce whose block (count/n elements) reaches
// ArDirectMin the direct schedule, which reads every peer's input and
// reduced block where it lies: exact against the reference with 2 to 4
// ranks, in place and out, just below and at the threshold, odd counts,
// counts below the rank count (empty blocks) and a small HCCL buffer (many
// pieces a block), forced and chosen, back to back with the staged
// schedules; the reads are counted, and none runs below the threshold or
// with HCOMM_SHM_CMA_DISABLE's Config field (the ring then, on every rank).
func TestDirectAllReduce(t *testing.T) {
	cases := []struct {
		tr  hcommtest.Transport
		n   int
		off bool
	}{{hcommtest.Inproc, 2, false}, {hcommtest.Inproc, 3, false}, {hcommtest.Inproc, 4, false},
		{hcommtest.Shm, 2, false}, {hcommtest.Shm, 3, false}, {hcommtest.Shm, 3, true}}
	dts := []hcomm.DataType{hcomm.Float32, hcomm.Int8, hcomm.BFloat16}
	if raceEnabled {
		cases = []struct {
			tr  hcommtest.Transport
			n   int
			off bool
		}{{hcommtest.Inproc, 3, false}, {hcommtest.Shm, 2, false}, {hcommtest.Shm, 3, true}}
		dts = []hcomm.DataType{hcomm.Float32}
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%v/ranks=%d/cmaoff=%v", tc.tr, tc.n, tc.off), func(t *testing.T) {
			comms := hcommtest.Options{Config: &hcomm.Config{BufferSize: 256 << 10, ShmCMADisable: tc.off}}.New(t, tc.n, tc.tr)
			n := int64(tc.n)
			for _, dt := range dts {
				es := int64(dt.Size())
				at := n * collectives.ArDirectMin / es // the least count chosen direct
				for _, c := range []struct {
					count int64
					algo  collectives.Algorithm
					read  bool // lent reads expected
				}{
					{at - 1, collectives.AlgoAuto, false},
					{at, collectives.AlgoAuto, true},
					{at + n + 1, collectives.AlgoAuto, true},
					{n - 1, collectives.AlgoDirect, true},
					{7, collectives.AlgoDirect, true},
					{at/3 + 5, collectives.AlgoDirect, true},
				} {
					for _, op := range []hcomm.ReduceOp{hcomm.Sum, hcomm.Max} {
						for _, inPlace := range []bool{false, true} {
							m := matrixCase{dt: dt, op: op, count: c.count, inline: 1 << 40}
							r0 := collectives.LentReads()
							allReduceRaw(t, comms, m, c.algo, inPlace)
							read := collectives.LentReads() > r0
							if want := c.read && !tc.off; read != want {
								t.Fatalf("%v %v in-place=%v: read lent %v, want %v", m, c.algo, inPlace, read, want)
							}
							// A staged schedule right after, on the same counters.
							allReduceRaw(t, comms, m, collectives.AlgoRing, !inPlace)
						}
					}
				}
			}
		})
	}
}

// TestDirectAllReduceRefusedPair: where the kernel refuses one pair of
// ranks (here made so) but not the others, a direct all-reduce fails at
// once on every rank with ErrMismatch — the pair's ranks run the ring, the
// others the direct schedule — instead of waiting for reads that never
// come until the timeout.
func TestDirectAllReduceRefusedPair(t *testing.T) {
	defer collectives.RefuseDirectReads(func(me, p int) bool { return me+p == 3 && me != 0 && p != 0 })() // ranks 1 and 2
	comms := hcommtest.Options{Config: &hcomm.Config{ExecTimeout: time.Minute}}.New(t, 3, hcommtest.Inproc)
	start := time.Now()
	run(t, comms, func(c *hcomm.Comm) error {
		s, err := c.Device().CreateStream()
		if err != nil {
			return err
		}
		defer s.Destroy()
		const count = 1 << 18
		send, _ := c.Device().Malloc(4 * count)
		recv, _ := c.Device().Malloc(4 * count)
		defer c.Device().Free(send)
		defer c.Device().Free(recv)
		err = collectives.AllReduce(send, recv, count, hcomm.Float32, hcomm.Sum, c, s, &collectives.Options{Algorithm: collectives.AlgoDirect})
		if err == nil {
			err = s.SynchronizeWithTimeout(time.Minute)
		}
		if !errors.Is(err, collectives.ErrMismatch) || !strings.Contains(err.Error(), "direct") || !strings.Contains(err.Error(), "ring") {
			return fmt.Errorf("rank %d: %v, want ErrMismatch naming the direct schedule and the ring", c.Rank(), err)
		}
		return nil
	})
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("the calls ended after %v: a rank waited for its timeout", d)
	}
}

// TestDirectAllReduceNoPairReads: where the kernel refuses every pair (here
// made so), the direct all-reduce, forced or chosen, runs as the ring on
// every rank: exact, and nothing read lent.
func TestDirectAllReduceNoPairReads(t *testing.T) {
	defer collectives.RefuseDirectReads(func(int, int) bool { return true })()
	for _, n := range []int{2, 3} {
		comms := hcommtest.Options{Config: &hcomm.Config{BufferSize: 256 << 10}}.New(t, n, hcommtest.Inproc)
		for _, count := range []int64{7, int64(n) * collectives.ArDirectMin / 4} {
			for _, algo := range []collectives.Algorithm{collectives.AlgoDirect, collectives.AlgoAuto} {
				m := matrixCase{dt: hcomm.Float32, op: hcomm.Sum, count: count, inline: 1 << 40}
				r0 := collectives.LentReads()
				allReduceRaw(t, comms, m, algo, false)
				allReduceRaw(t, comms, m, algo, true)
				if r := collectives.LentReads() - r0; r != 0 {
					t.Fatalf("%d ranks, %v %v: %d lent reads with every pair refused", n, m, algo, r)
				}
			}
		}
	}
}

// TestDirectAllReducePeerGone: a direct all-reduce whose peer goes away —
// before its hello (the peer, its channels set up by a call before, never
// makes this one, and leaves), or in the middle of the schedule (the peer
// aborts once the first lent read has begun) —
// fails on the rank left within seconds, not at its 10-minute
// HCCL_EXEC_TIMEOUT, with an error naming the peer; in process and
// between shm ranks.
func TestDirectAllReducePeerGone(t *testing.T) {
	for _, tr := range []hcommtest.Transport{hcommtest.Inproc, hcommtest.Shm} {
		for _, mid := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/mid=%v", tr, mid), func(t *testing.T) {
				comms := hcommtest.Options{Config: &hcomm.Config{BufferSize: 1 << 20, ExecTimeout: 10 * time.Minute}}.New(t, 2, tr)
				const count = 16 << 20 // 64 MiB of float32: a block is 256 pieces
				r0 := collectives.LentReads()
				peerGone(t, comms, "all-reduce", mid, func() bool { return collectives.LentReads() != r0 }, 4*count, 4*count,
					func(c *hcomm.Comm, s *device.Stream, _, buf device.Ptr, small bool) error {
						if small {
							return collectives.AllReduce(buf, buf, 1, hcomm.Float32, hcomm.Sum, c, s, nil)
						}
						return collectives.AllReduce(buf, buf, count, hcomm.Float32, hcomm.Sum, c, s, &collectives.Options{Algorithm: collectives.AlgoDirect})
					})
			})
		}
	}
}

// peerGone runs a collective between the 2 ranks of comms, named what,
// whose rank 1 goes away: before its call (mid false: it destroys its
// communicator), or once begun reports that the call is under way (mid
// true: it aborts). call issues the collective on send (sendBytes) and
// recv (recvBytes); small, a small call first, which sets up the channels
// (a peer gone before its channels exist is found by
// HCCL_CONNECT_TIMEOUT). Mid-call, rank 1 aborts at its own stream's first
// step once begun holds (testJitter; its call may then fail while still
// being issued), and its goroutine watches begun too, for a schedule with
// no step left by then: the watcher alone could wait for a core until the
// whole call had run (under -race on 2 cores it did, and rank 0's call
// succeeded). Rank 0's call must fail within 20 s, not at its
// HCCL_EXEC_TIMEOUT, with an error naming rank 1.
func peerGone(t *testing.T, comms []*hcomm.Comm, what string, mid bool, begun func() bool, sendBytes, recvBytes int64,
	call func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, small bool) error) {
	t.Helper()
	errs := make([]error, 2)
	var took time.Duration
	if mid {
		var aborting atomic.Bool
		var wg sync.WaitGroup
		defer wg.Wait()
		collectives.SetTestJitter(func(rank int) {
			if rank != 1 || !begun() || aborting.Swap(true) {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); comms[1].Abort() }()
			for deadline := time.Now().Add(time.Minute); comms[1].GetStatus() == hcomm.StatusReady && time.Now().Before(deadline); {
				time.Sleep(100 * time.Microsecond)
			}
		})
		defer collectives.SetTestJitter(nil)
	}
	hcommtest.Each(t, comms, func(t testing.TB, c *hcomm.Comm) {
		s, err := c.Device().CreateStream()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Destroy()
		send, err := c.Device().Malloc(sendBytes)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Device().Free(send)
		recv, err := c.Device().Malloc(recvBytes)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Device().Free(recv)
		if err := call(c, s, send, recv, true); err != nil {
			t.Fatal(err)
		}
		if err := s.SynchronizeWithTimeout(time.Minute); err != nil {
			t.Fatal(err)
		}
		if c.Rank() == 1 {
			if !mid {
				time.Sleep(100 * time.Millisecond)
				c.Destroy()
				return
			}
			if err := call(c, s, send, recv, false); err != nil {
				if !errors.Is(err, hcomm.ErrAborted) && !errors.Is(err, hcomm.ErrUnavail) {
					t.Fatal(err)
				}
				errs[1] = err // aborted by the hook above while it issued the call
				c.Destroy()
				return
			}
			for deadline := time.Now().Add(time.Minute); !begun() && time.Now().Before(deadline); {
				runtime.Gosched()
			}
			c.Abort()
			errs[1] = s.SynchronizeWithTimeout(time.Minute)
			c.Destroy()
			return
		}
		start := time.Now()
		err = call(c, s, send, recv, false)
		if err == nil {
			err = s.SynchronizeWithTimeout(time.Minute)
		}
		errs[0], took = err, time.Since(start)
	})
	if mid && errs[1] == nil {
		t.Fatalf("rank 1's %s ended before its abort: nothing was left in the middle", what)
	}
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "rank 1") {
		t.Fatalf("rank 0's %s with rank 1 gone: %v; want an error naming rank 1", what, errs[0])
	}
	if took > 20*time.Second {
		t.Fatalf("rank 0 failed %v after its call: the peer's loss did not end its wait", took)
	}
	t.Logf("rank 0: %v (%v)", errs[0], took.Round(time.Millisecond))
}
