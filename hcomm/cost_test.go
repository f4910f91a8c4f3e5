package hcomm_test

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// TestCostGrowSuspend prints what Grow and Suspend/Resume cost, for
// BENCHMARKS.md; it runs only with HCOMM_COST=1 (a timing, not a check):
//
//	HCOMM_COST=1 go test -run TestCostGrowSuspend -v ./hcomm/
//
// Grow: m ranks in this process grow by m newcomers (GrowToken to the last
// Grow returning), then the first AllReduce on the grown communicator (its
// channels' setup). Suspend/Resume: every rank suspends and resumes, then
// the first AllReduce (the channels come back), against an AllReduce
// without the cycle.
func TestCostGrowSuspend(t *testing.T) {
	if os.Getenv("HCOMM_COST") != "1" {
		t.Skip("set HCOMM_COST=1 to measure")
	}
	ctx := context.Background()
	allReduce := func(comms []*hcomm.Comm) time.Duration {
		start := time.Now()
		var wg sync.WaitGroup
		for _, c := range comms {
			wg.Add(1)
			go func() {
				defer wg.Done()
				v := []float32{1, 2, 3, 4}
				if err := collectives.AllReduceSlice(ctx, c, v, v, hcomm.Sum, nil); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		return time.Since(start)
	}
	for _, tr := range hcomm.Transports() {
		for _, m := range []int{2, 4} {
			cfg := testCfg()
			cfg.Transport = tr
			root, err := hcomm.GetRootInfo(cfg)
			if err != nil {
				t.Fatal(err)
			}
			old := initRanks(t, m, func(r int) (*hcomm.Comm, error) { return hcomm.InitRootInfo(m, root, r, cfg) })
			allReduce(old)
			start := time.Now()
			grown := growRanks(t, old, m, cfg)
			grow := time.Since(start)
			first := allReduce(grown)
			t.Logf("%-6s Grow %d -> %d ranks: %8.2f ms; first AllReduce after it %8.2f ms", tr, m, 2*m, ms(grow), ms(first))

			steady := allReduce(grown)
			start = time.Now()
			for _, c := range grown {
				if err := c.Suspend(); err != nil {
					t.Fatal(err)
				}
			}
			susp := time.Since(start)
			start = time.Now()
			for _, c := range grown {
				if err := c.Resume(); err != nil {
					t.Fatal(err)
				}
			}
			res := time.Since(start)
			after := allReduce(grown)
			t.Logf("%-6s %d ranks: Suspend %8.3f ms, Resume %8.3f ms (all ranks); first AllReduce after Resume %8.2f ms (one without the cycle: %8.3f ms)",
				tr, 2*m, ms(susp), ms(res), ms(after), ms(steady))
		}
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
