package hcomm_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
)

// Revoke and Shrink over every transport, ranks as goroutines and as
// processes: rank 1 revokes, every rank sees it; ranks 0-2 shrink without
// rank 3, which leaves; the new communicator's all-reduce is right; and
// nothing the shrink started (standby stores, their connections and
// goroutines) outlives the communicators (hcommtest's leak check).
func TestRevokeShrinkTransports(t *testing.T) {
	for _, tr := range hcommtest.Transports() {
		t.Run(tr.String(), func(t *testing.T) {
			if testing.Short() && tr.Processes {
				t.Skip("-short")
			}
			opts := hcommtest.Options{Config: &hcomm.Config{BufferSize: 1 << 20, ConnectTimeout: 30 * time.Second}}
			opts.Run(t, 4, tr, func(t testing.TB, c *hcomm.Comm) {
				ctx := context.Background()
				buf := []float32{1}
				// Rank 1 may revoke while a peer still finishes this one.
				if err := collectives.AllReduceSlice(ctx, c, buf, buf, hcomm.Sum, nil); err != nil && !errors.Is(err, hcomm.ErrRevoked) {
					t.Fatal(err)
				}
				if c.Rank() == 1 {
					if err := c.Revoke(); err != nil {
						t.Fatal(err)
					}
				}
				deadline := time.Now().Add(10 * time.Second)
				for !errors.Is(c.Check(), hcomm.ErrRevoked) && time.Now().Before(deadline) {
					time.Sleep(time.Millisecond)
				}
				if err := c.Check(); !errors.Is(err, hcomm.ErrRevoked) {
					t.Fatalf("Check 10 s after rank 1's Revoke: %v; want ErrRevoked", err)
				}
				sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				defer cancel()
				nc, old, err := c.Shrink(sctx, []int{3}, nil)
				if err != nil {
					t.Fatal(err)
				}
				if c.Rank() == 3 {
					if nc != nil || old != nil {
						t.Fatalf("the leaving rank got %v, %v", nc, old)
					}
					return
				}
				defer nc.Destroy()
				if !slices.Equal(old, []int{0, 1, 2}) || nc.Rank() != c.Rank() || nc.Size() != 3 {
					t.Fatalf("Shrink: rank %d of %d, oldRanks %v; want rank %d of 3, [0 1 2]", nc.Rank(), nc.Size(), old, c.Rank())
				}
				send := []float32{float32(nc.Rank() + 1), 10}
				recv := make([]float32, 2)
				if err := collectives.AllReduceSlice(ctx, nc, send, recv, hcomm.Sum, nil); err != nil {
					t.Fatal(err)
				}
				if recv[0] != 6 || recv[1] != 30 {
					t.Fatalf("all-reduce on the shrunk communicator: %v, want [6 30]", recv)
				}
				if err := collectives.BarrierContext(ctx, nc); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}
