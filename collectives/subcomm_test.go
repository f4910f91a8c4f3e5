package collectives_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// TestSubCommunicators: Split by parity and CreateSubComm of a reordered
// subset make communicators whose collectives see only their members, ranked
// as documented, alongside the parent, which keeps working.
func TestSubCommunicators(t *testing.T) {
	const n = 5
	comms := initAll(t, n, &hcomm.Config{BufferSize: 1 << 20})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	run(t, comms, func(c *hcomm.Comm) error {
		r := c.Rank()
		// Split: even ranks and odd ranks; key = -rank reverses the order.
		// Rank 4 opts out.
		color := r % 2
		if r == 4 {
			color = hcomm.SplitNoColor
		}
		sub, err := c.Split(color, -r, nil)
		if err != nil {
			return err
		}
		if r == 4 {
			if sub != nil {
				return fmt.Errorf("rank 4 split with no color got a communicator")
			}
		} else {
			defer sub.Destroy()
			members := map[int][]int{0: {2, 0}, 1: {3, 1}}[color]
			if sub.Size() != len(members) || members[sub.Rank()] != r {
				return fmt.Errorf("rank %d: sub rank %d of %d, want position in %v", r, sub.Rank(), sub.Size(), members)
			}
			v := []int32{int32(r), 1}
			if err := collectives.AllReduceSlice(ctx, sub, v, v, hcomm.Sum, nil); err != nil {
				return err
			}
			if want := int32(members[0] + members[1]); v[0] != want || v[1] != 2 {
				return fmt.Errorf("rank %d: sub allreduce = %v, want [%d 2]", r, v, want)
			}
		}
		// CreateSubComm of ranks 3, 1, 4 (in that order).
		if r == 3 || r == 1 || r == 4 {
			sub2, err := c.CreateSubComm([]int{3, 1, 4}, 7, nil)
			if err != nil {
				return err
			}
			defer sub2.Destroy()
			all := make([]int64, 3)
			if err := collectives.AllGatherSlice(ctx, sub2, []int64{int64(r)}, all, nil); err != nil {
				return err
			}
			if all[0] != 3 || all[1] != 1 || all[2] != 4 {
				return fmt.Errorf("rank %d: sub-communicator allgather = %v, want [3 1 4]", r, all)
			}
		}
		// The parent still works.
		v := []float32{1}
		if err := collectives.AllReduceSlice(ctx, c, v, v, hcomm.Sum, nil); err != nil {
			return err
		}
		if v[0] != n {
			return fmt.Errorf("rank %d: parent allreduce = %v", r, v[0])
		}
		return nil
	})
}

func TestSubCommBadInput(t *testing.T) {
	comms := initAll(t, 2, nil)
	if _, err := comms[0].CreateSubComm([]int{1}, 1, nil); err == nil {
		t.Error("a sub-communicator without the calling rank was accepted")
	}
	if _, err := comms[0].CreateSubComm([]int{0, 0}, 1, nil); err == nil {
		t.Error("a rank listed twice was accepted")
	}
	if _, err := comms[0].CreateSubComm([]int{0, 5}, 1, nil); err == nil {
		t.Error("a rank out of range was accepted")
	}
}
