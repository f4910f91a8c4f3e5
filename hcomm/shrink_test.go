package hcomm_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// shrinkAll runs Shrink on every rank listed in who concurrently and
// returns what each got, by old rank.
func shrinkAll(t *testing.T, comms []*hcomm.Comm, who []int, exclude []int) (map[int]*hcomm.Comm, map[int][]int, map[int]error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var mu sync.Mutex
	ncs, olds, errs := map[int]*hcomm.Comm{}, map[int][]int{}, map[int]error{}
	var wg sync.WaitGroup
	for _, r := range who {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nc, old, err := comms[r].Shrink(ctx, exclude, nil)
			mu.Lock()
			ncs[r], olds[r], errs[r] = nc, old, err
			mu.Unlock()
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range ncs {
			if c != nil {
				c.Destroy()
			}
		}
	})
	return ncs, olds, errs
}

// checkShrunk checks that the survivors agree on oldRanks = want, that
// each new communicator has the right rank and size, and that an
// all-reduce over them is correct.
func checkShrunk(t *testing.T, ncs map[int]*hcomm.Comm, olds map[int][]int, errs map[int]error, want []int) {
	t.Helper()
	for _, r := range want {
		if errs[r] != nil {
			t.Fatalf("rank %d: Shrink: %v", r, errs[r])
		}
		if !slices.Equal(olds[r], want) {
			t.Fatalf("rank %d: oldRanks = %v, want %v", r, olds[r], want)
		}
		nc := ncs[r]
		if nc.Size() != len(want) || want[nc.Rank()] != r {
			t.Fatalf("old rank %d: new rank %d of %d; want rank %d of %d", r, nc.Rank(), nc.Size(), slices.Index(want, r), len(want))
		}
	}
	errc := make(chan error, len(want))
	for _, r := range want {
		nc := ncs[r]
		go func() {
			send := make([]float32, 1000)
			for i := range send {
				send[i] = float32(r + i)
			}
			recv := make([]float32, len(send))
			if err := collectives.AllReduceSlice(context.Background(), nc, send, recv, hcomm.Sum, nil); err != nil {
				errc <- err
				return
			}
			for i, v := range recv {
				var w float32
				for _, o := range want {
					w += float32(o + i)
				}
				if v != w {
					errc <- fmt.Errorf("new rank %d: element %d = %v, want %v", nc.Rank(), i, v, w)
					return
				}
			}
			errc <- nil
		}()
	}
	for range want {
		if err := <-errc; err != nil {
			t.Error(err)
		}
	}
}

// In one process (InitAll): the ranks that stay shrink around an excluded
// one, which leaves (nil, nil, nil); the old communicator is revoked.
func TestShrinkInProcess(t *testing.T) {
	comms, err := hcomm.InitAll(4, &hcomm.Config{BufferSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	ncs, olds, errs := shrinkAll(t, comms, []int{0, 1, 2, 3}, []int{2})
	if ncs[2] != nil || olds[2] != nil || errs[2] != nil {
		t.Errorf("the excluded rank got %v, %v, %v; want nil, nil, nil", ncs[2], olds[2], errs[2])
	}
	checkShrunk(t, ncs, olds, errs, []int{0, 1, 3})
	for _, c := range comms {
		if err := c.Check(); !errors.Is(err, hcomm.ErrRevoked) {
			t.Errorf("rank %d: the old communicator after Shrink: %v; want ErrRevoked", c.Rank(), err)
		}
	}
	// And again: the shrunk communicator shrinks too.
	list := []*hcomm.Comm{ncs[0], ncs[1], ncs[3]}
	ncs2, olds2, errs2 := shrinkAll(t, list, []int{0, 2}, []int{1})
	checkShrunk(t, ncs2, olds2, errs2, []int{0, 2})
}

// Bad input: an exclude rank outside the communicator is ErrPara.
func TestShrinkBadExclude(t *testing.T) {
	comms, err := hcomm.InitAll(2, &hcomm.Config{BufferSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	for _, ex := range [][]int{{2}, {-1}} {
		if _, _, err := comms[0].Shrink(context.Background(), ex, nil); !errors.Is(err, hcomm.ErrPara) {
			t.Errorf("Shrink(exclude %v) = %v; want ErrPara", ex, err)
		}
	}
	var nilComm *hcomm.Comm
	if _, _, err := nilComm.Shrink(context.Background(), nil, nil); err == nil {
		t.Error("Shrink on nil: no error")
	}
}

// Ranks of one process joined over the TCP bootstrap (each with its
// standby store): rank 0 goes away (its communicator destroyed: its store
// and standby store close), and the others shrink without it — the
// agreement meets at rank 1's standby store.
func TestShrinkWithoutRankZero(t *testing.T) {
	cfg := testCfg()
	root, err := hcomm.GetRootInfo(cfg)
	if err != nil {
		t.Fatal(err)
	}
	comms := initRanks(t, 4, func(r int) (*hcomm.Comm, error) { return hcomm.InitRootInfo(4, root, r, cfg) })
	comms[0].Destroy()
	ncs, olds, errs := shrinkAll(t, comms, []int{1, 2, 3}, []int{0})
	checkShrunk(t, ncs, olds, errs, []int{1, 2, 3})
	// The new rank 0 (old rank 1) serves the new store: a second shrink
	// without it meets at old rank 2's new standby store.
	list := []*hcomm.Comm{ncs[1], ncs[2], ncs[3]}
	list[0].Destroy()
	ncs2, olds2, errs2 := shrinkAll(t, list, []int{1, 2}, []int{0})
	checkShrunk(t, ncs2, olds2, errs2, []int{1, 2})
}

// A rank the others leave out that calls Shrink anyway learns so: an error
// wrapping ErrRankLost, and no communicator.
func TestShrinkLeftOutRank(t *testing.T) {
	comms, err := hcomm.InitAll(3, &hcomm.Config{BufferSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	ncs, olds, errs := shrinkAll(t, comms, []int{0, 1}, []int{2})
	checkShrunk(t, ncs, olds, errs, []int{0, 1})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, old, err := comms[2].Shrink(ctx, nil, nil)
	if nc != nil || old != nil || !errors.Is(err, hcomm.ErrRankLost) || !strings.Contains(err.Error(), "left this rank out") {
		t.Errorf("the left-out rank's Shrink = %v, %v, %v; want an error matching ErrRankLost", nc, old, err)
	}
}
