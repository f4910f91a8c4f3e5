package collectives_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
)

func TestSliceLayer(t *testing.T) {
	const n, m = 3, 5
	comms := initAll(t, n, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	run(t, comms, func(c *hcomm.Comm) error {
		r := c.Rank()
		mine := make([]int64, m)
		for i := range mine {
			mine[i] = int64(10*r + i)
		}
		// AllGather
		all := make([]int64, n*m)
		if err := collectives.AllGatherSlice(ctx, c, mine, all, nil); err != nil {
			return err
		}
		for i, v := range all {
			if want := int64(10*(i/m) + i%m); v != want {
				return fmt.Errorf("rank %d: AllGatherSlice[%d] = %d, want %d", r, i, v, want)
			}
		}
		// ReduceScatter: send all, receive the sum of block r.
		part := make([]int64, m)
		if err := collectives.ReduceScatterSlice(ctx, c, all, part, hcomm.Sum, nil); err != nil {
			return err
		}
		for i, v := range part {
			if want := int64(n) * int64(10*r+i); v != want {
				return fmt.Errorf("rank %d: ReduceScatterSlice[%d] = %d, want %d", r, i, v, want)
			}
		}
		// Reduce to rank 2.
		var out []int64
		if r == 2 {
			out = make([]int64, m)
		}
		if err := collectives.ReduceSlice(ctx, c, mine, out, hcomm.Max, 2, nil); err != nil {
			return err
		}
		if r == 2 && !slices.Equal(out, []int64{20, 21, 22, 23, 24}) {
			return fmt.Errorf("ReduceSlice = %v", out)
		}
		// AlltoAll: block p of rank r is 100*r + p.
		send := make([]int64, n*2)
		for i := range send {
			send[i] = int64(100*r + i/2)
		}
		recv := make([]int64, n*2)
		if err := collectives.AlltoAllSlice(ctx, c, send, recv, nil); err != nil {
			return err
		}
		for i, v := range recv {
			if want := int64(100*(i/2) + r); v != want {
				return fmt.Errorf("rank %d: AlltoAllSlice[%d] = %d, want %d", r, i, v, want)
			}
		}
		return collectives.BarrierContext(ctx, c)
	})
}
