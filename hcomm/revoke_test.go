package hcomm_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// One rank's Revoke fails the other ranks' pending collectives — waiting in
// their first collective's channel setup, or in a notify wait of a later
// one — and every later operation, with ErrRevoked.
func TestRevokeFailsPendingAndLaterOperations(t *testing.T) {
	for _, tc := range []struct {
		name string
		warm bool
		tcp  bool // joined over the TCP bootstrap: the revocation goes through rank 0's store
	}{{"setup", false, false}, {"wait", true, false}, {"setup/bootstrap", false, true}, {"wait/bootstrap", true, true}} {
		warm := tc.warm
		t.Run(tc.name, func(t *testing.T) {
			const n = 3
			var comms []*hcomm.Comm
			if tc.tcp {
				cfg := testCfg()
				root, err := hcomm.GetRootInfo(cfg)
				if err != nil {
					t.Fatal(err)
				}
				comms = initRanks(t, n, func(r int) (*hcomm.Comm, error) { return hcomm.InitRootInfo(n, root, r, cfg) })
			} else {
				var err error
				if comms, err = hcomm.InitAll(n, &hcomm.Config{BufferSize: 1 << 20}); err != nil {
					t.Fatal(err)
				}
				defer func() {
					for _, c := range comms {
						c.Destroy()
					}
				}()
			}
			ctx := context.Background()
			if warm { // channels up: the next collective waits on notifies
				errs := make(chan error, n)
				for _, c := range comms {
					go func() {
						buf := []float32{1, 2}
						errs <- collectives.AllReduceSlice(ctx, c, buf, buf, hcomm.Sum, nil)
					}()
				}
				for range n {
					if err := <-errs; err != nil {
						t.Fatal(err)
					}
				}
			}
			errs := make(chan error, n-1)
			for _, c := range comms[1:] { // rank 0 never joins
				go func() {
					buf := make([]float32, 1024)
					errs <- collectives.AllReduceSlice(ctx, c, buf, buf, hcomm.Sum, nil)
				}()
			}
			time.Sleep(50 * time.Millisecond)
			start := time.Now()
			if err := comms[0].Revoke(); err != nil {
				t.Fatal(err)
			}
			if err := comms[0].Revoke(); err != nil { // idempotent
				t.Fatal(err)
			}
			for range n - 1 {
				select {
				case err := <-errs:
					if !errors.Is(err, hcomm.ErrRevoked) {
						t.Errorf("pending collective: %v; want an error matching ErrRevoked", err)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("a pending collective did not fail within 10 s of Revoke")
				}
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("pending collectives failed %v after Revoke", d)
			}
			for _, c := range comms {
				if err := c.Check(); !errors.Is(err, hcomm.ErrRevoked) {
					t.Errorf("rank %d: Check after Revoke = %v; want ErrRevoked", c.Rank(), err)
				}
				buf := []float32{1}
				if err := collectives.AllReduceSlice(ctx, c, buf, buf, hcomm.Sum, nil); !errors.Is(err, hcomm.ErrRevoked) {
					t.Errorf("rank %d: AllReduce after Revoke = %v; want ErrRevoked", c.Rank(), err)
				}
			}
		})
	}
}

// Revoke on a nil communicator is an error, not a panic; LostRanks of a
// healthy one is empty.
func TestRevokeNilAndNoLoss(t *testing.T) {
	var c *hcomm.Comm
	if err := c.Revoke(); err == nil {
		t.Error("Revoke on nil: no error")
	}
	comms, err := hcomm.InitAll(2, &hcomm.Config{BufferSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range comms {
		if l := c.LostRanks(); l != nil {
			t.Errorf("rank %d: LostRanks = %v on a healthy communicator", c.Rank(), l)
		}
		c.Destroy()
	}
}

// Revoke after Destroy does nothing and returns nil; Revoke racing Destroy
// is safe.
func TestRevokeAfterDestroy(t *testing.T) {
	comms, err := hcomm.InitAll(2, &hcomm.Config{BufferSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		comms[1].Revoke()
		close(done)
	}()
	comms[1].Destroy()
	<-done
	comms[0].Destroy()
	if err := comms[0].Revoke(); err != nil {
		t.Errorf("Revoke after Destroy: %v", err)
	}
}
