package collectives_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// TestButterflyMismatch: above helloFullMax ranks each rank trades hellos
// with log2(n) partners only, yet a rank that makes a different call still
// fails every rank with ErrMismatch naming both calls — the odd rank's
// partners find the difference and poison their later hellos — well within
// the execution timeout. At 16 ranks (a power of two) and 11 (three ranks
// folded), with the odd rank a folded one, a folding one and one of the
// exchange, for a different collective, count (the same algorithm, and one
// that makes the selector pick another, which needs other peers' channels:
// that rank's call fails with ErrMismatch rather than wait for setups that
// its peers never join), data type, reduce op and root.
func TestButterflyMismatch(t *testing.T) {
	type call func(c *hcomm.Comm, s *device.Stream, buf device.Ptr) error
	allreduce := func(count int64, dt hcomm.DataType, op hcomm.ReduceOp) call {
		return func(c *hcomm.Comm, s *device.Stream, buf device.Ptr) error {
			return collectives.AllReduce(buf, buf, count, dt, op, c, s, nil)
		}
	}
	bcast := func(root int) call {
		return func(c *hcomm.Comm, s *device.Stream, buf device.Ptr) error {
			return collectives.Broadcast(buf, 64, hcomm.Float32, root, c, s, nil)
		}
	}
	cases := []struct {
		name       string
		odd, usual call
		want       string // in the error of every rank
	}{
		{"collective", func(c *hcomm.Comm, s *device.Stream, buf device.Ptr) error {
			return collectives.AllGather(buf, buf.Add(1<<20), 64, hcomm.Float32, c, s, nil)
		}, allreduce(64, hcomm.Float32, hcomm.Sum), "AllGather"},
		{"count", allreduce(65, hcomm.Float32, hcomm.Sum), allreduce(64, hcomm.Float32, hcomm.Sum), "count 65"},
		{"count-across-algorithms", allreduce(100000, hcomm.Float32, hcomm.Sum), allreduce(64, hcomm.Float32, hcomm.Sum), "count 100000"},
		{"dtype", allreduce(64, hcomm.Int32, hcomm.Sum), allreduce(64, hcomm.Float32, hcomm.Sum), "int32"},
		{"op", allreduce(64, hcomm.Float32, hcomm.Max), allreduce(64, hcomm.Float32, hcomm.Sum), "max"},
		{"root", bcast(2), bcast(0), "root 2"},
	}
	for _, n := range []int{16, 11} {
		for i, tc := range cases {
			// Ranks 1 (folded at 11 ranks), 2 (folding) and n-1 (in the
			// exchange) take turns at being the odd one.
			odd := []int{1, 2, n - 1}[i%3]
			t.Run(fmt.Sprintf("ranks=%d/%s/odd=%d", n, tc.name, odd), func(t *testing.T) {
				// Fresh communicators: a rank whose call needed other peers
				// than the rest fails the call itself, leaving its
				// communicator out of step.
				comms := initAll(t, n, &hcomm.Config{ExecTimeout: 20 * time.Second, ConnectTimeout: 20 * time.Second, BufferSize: 1 << 20})
				start := time.Now()
				errs := make([]error, n)
				run(t, comms, func(c *hcomm.Comm) error {
					s, err := c.Device().CreateStream()
					if err != nil {
						return err
					}
					defer s.Destroy()
					buf, err := c.Device().Malloc(4 << 20)
					if err != nil {
						return err
					}
					defer c.Device().Free(buf)
					f := tc.usual
					if c.Rank() == odd {
						f = tc.odd
					}
					if err := f(c, s, buf); err != nil {
						// The odd rank's schedule may need channels the
						// others do not set up: its call fails with the
						// butterfly's mismatch, not the setup's timeout.
						if !errors.Is(err, collectives.ErrMismatch) {
							return err
						}
						errs[c.Rank()] = err
						return nil
					}
					errs[c.Rank()] = s.SynchronizeWithTimeout(time.Minute)
					return nil
				})
				if d := time.Since(start); d > 10*time.Second {
					t.Errorf("the mismatch took %v to surface; the timeout was 20s and detection must not wait for it", d)
				}
				t.Logf("rank 0: %v", errs[0])
				for r, err := range errs {
					if !errors.Is(err, collectives.ErrMismatch) {
						t.Errorf("rank %d: %v; want an error matching ErrMismatch", r, err)
						continue
					}
					msg := err.Error()
					if !strings.Contains(msg, tc.want) || !strings.Contains(msg, fmt.Sprintf("rank %d", odd)) {
						t.Errorf("rank %d: %q does not name rank %d and %q", r, msg, odd, tc.want)
					}
				}
			})
		}
	}
}

// TestCostModelFromEnv: HCOMM_COST_MODEL that makes no sense fails the
// first collective on every rank, at once, with an error naming the
// variable and the term; one that does is used.
func TestCostModelFromEnv(t *testing.T) {
	t.Setenv("HCOMM_COST_MODEL", "network:alpha=-3us")
	comms := initAll(t, 2, &hcomm.Config{BufferSize: 1 << 20})
	for _, c := range comms {
		err := collectives.AllReduceSlice(context.Background(), c, []float32{1}, []float32{0}, hcomm.Sum, nil)
		if err == nil || !strings.Contains(err.Error(), "HCOMM_COST_MODEL") || !strings.Contains(err.Error(), "alpha") {
			t.Errorf("rank %d: %v; want an error naming HCOMM_COST_MODEL and alpha", c.Rank(), err)
		}
	}
	t.Setenv("HCOMM_COST_MODEL", "network:alpha=35us,beta=5GB/s;mapped:o=0.5us")
	comms = initAll(t, 2, &hcomm.Config{BufferSize: 1 << 20})
	allReduceCase[float32](t, comms, 7, hcomm.Sum, false, collectives.AlgoAuto)
}
