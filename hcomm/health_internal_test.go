package hcomm

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// joinInProcess joins n ranks of one process over the TCP bootstrap.
func joinInProcess(t *testing.T, n int, cfg func(rank int) *Config) ([]*Comm, []error) {
	t.Helper()
	root, err := GetRootInfo(cfg(0))
	if err != nil {
		t.Fatal(err)
	}
	comms := make([]*Comm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			comms[r], errs[r] = InitRootInfo(n, root, r, cfg(r))
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range comms {
			if c != nil {
				c.Destroy()
			}
		}
	})
	return comms, errs
}

// A loss event naming no rank of the communicator, or that does not parse,
// or that was numbered but never set, is logged and skipped: a later loss
// is still seen (a malformed one used to end every rank's watch for the
// rest of the job).
func TestMalformedLossEventIgnored(t *testing.T) {
	cfg := func(int) *Config {
		return &Config{BufferSize: 256 << 10, ConnectTimeout: 20 * time.Second, ExecTimeout: 30 * time.Second}
	}
	comms, errs := joinInProcess(t, 3, cfg)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	s := comms[1].boot.store
	ctx := context.Background()
	postLoss(s, 7, "a rank outside the job") // an authenticated stranger's claim
	n, err := s.Add(ctx, eventCtr, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Set(ctx, eventPfx+itoa(n), []byte("{not json")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Add(ctx, eventCtr, 1); err != nil { // a publisher that died between numbering and setting
		t.Fatal(err)
	}
	postLoss(s, 2, "killed by the test")
	deadline := time.Now().Add(5 * time.Second)
	for _, c := range comms[:2] {
		for !slices.Equal(c.LostRanks(), []int{2}) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if l := c.LostRanks(); !slices.Equal(l, []int{2}) {
			t.Fatalf("rank %d: LostRanks = %v after two malformed events and rank 2's loss; want [2]", c.rank, l)
		}
		if err := c.Check(); !errors.Is(err, ErrRankLost) || !strings.Contains(err.Error(), "rank 2") {
			t.Errorf("rank %d: Check = %v; want ErrRankLost naming rank 2", c.rank, err)
		}
	}
}

func itoa(n int64) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// A rank that fails after joining the bootstrap (its HCCL buffer cannot be
// reserved) tells the others: their first collective's channel setup fails
// at once naming it, instead of waiting out HCCL_CONNECT_TIMEOUT.
func TestSetupFailureNamesTheRank(t *testing.T) {
	for _, bad := range []int{2, 0} {
		t.Run(itoa(int64(bad)), func(t *testing.T) {
			cfg := func(r int) *Config {
				c := &Config{BufferSize: 256 << 10, ConnectTimeout: 20 * time.Second, ExecTimeout: 30 * time.Second}
				if r == bad {
					c.BufferSize = 1 << 40 // a 2 TiB HCCL buffer: more than one allocation may be
				}
				return c
			}
			comms, errs := joinInProcess(t, 3, cfg)
			if errs[bad] == nil {
				t.Fatalf("rank %d with a 2 TiB buffer joined", bad)
			}
			start := time.Now()
			var wg sync.WaitGroup
			for r, c := range comms {
				if r == bad {
					continue
				}
				if errs[r] != nil {
					// The rank saw the loss while it still set up (its
					// gathering of the ranks' descriptions outlived rank
					// bad's setup): the same promise, kept earlier.
					if !errors.Is(errs[r], ErrRankLost) || !strings.Contains(errs[r].Error(), "rank "+itoa(int64(bad))) {
						t.Fatalf("rank %d: %v; want it to join, or ErrRankLost naming rank %d", r, errs[r], bad)
					}
					continue
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					descs := ChannelDescInit(2)
					for i, j := 0, 0; i < 3; i++ {
						if i != r {
							descs[j].RemoteRank = i
							j++
						}
					}
					_, err := c.ChannelAcquire(EngineCPUTS, descs)
					if !errors.Is(err, ErrRankLost) || !strings.Contains(err.Error(), "rank "+itoa(int64(bad))) {
						t.Errorf("rank %d: ChannelAcquire = %v; want ErrRankLost naming rank %d", r, err, bad)
					}
				}()
			}
			wg.Wait()
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("the channel setups failed %v after the rank's failure; HCCL_CONNECT_TIMEOUT is 20 s", d)
			}
		})
	}
}

// A quiet job's loss watch looks at rank 0's store less and less often:
// at 1, 3, 7, … graces (quietGrace), not once a grace — rank 0's store
// served 3n messages a grace for nothing before.
func TestLossWatchBacksOff(t *testing.T) {
	if testing.Short() {
		t.Skip("waits 4.5 s")
	}
	t.Parallel()
	comms, errs := joinInProcess(t, 2, func(int) *Config { return &Config{BufferSize: 64 << 10} })
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	if g := comms[0].eventGrace(); g != time.Second {
		t.Fatalf("grace %v at 2 ranks; the test counts in seconds", g)
	}
	time.Sleep(4500 * time.Millisecond) // once a grace: 4 looks; backing off: at 1 s and 3 s
	for _, c := range comms {
		if k := c.health.looks.Load(); k < 1 || k > 2 {
			t.Errorf("rank %d: the loss watch looked %d times in 4.5 s; want 1 or 2 (at 1 s, 3 s)", c.rank, k)
		}
	}
}
