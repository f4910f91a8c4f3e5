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

// TestCollectivesKeepTheViewContract runs the collectives whose host code
// touches device memory (the handshake's headers and inline payloads, the
// one-shot reductions, the count tables) on devices whose views are copies,
// as an accelerator backend's would be (HCOMM_DEVICE_VIEW=copy): a Fetch or
// Flush missing anywhere shows as a stale header (a mismatch error) or a
// wrong result.
func TestCollectivesKeepTheViewContract(t *testing.T) {
	t.Setenv("HCOMM_DEVICE_VIEW", "copy")
	const n = 3
	comms := initAll(t, n, nil)
	for _, inPlace := range []bool{false, true} {
		allReduceCase[float32](t, comms, 7, hcomm.Sum, inPlace, collectives.AlgoOneShot)
		allReduceCase[int64](t, comms, 1, hcomm.Max, inPlace, collectives.AlgoOneShot)
	}
	for root := 0; root < n; root++ {
		broadcastCase[int32](t, comms, 5, root, collectives.AlgoOneShot)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	one := &collectives.Options{Algorithm: collectives.AlgoOneShot}
	run(t, comms, func(c *hcomm.Comm) error {
		r := c.Rank()
		mine := []int64{int64(10 * r), int64(10*r + 1)}
		all := make([]int64, 2*n)
		if err := collectives.AllGatherSlice(ctx, c, mine, all, one); err != nil {
			return err
		}
		if want := []int64{0, 1, 10, 11, 20, 21}; !slices.Equal(all, want) {
			return fmt.Errorf("rank %d: AllGatherSlice = %v, want %v", r, all, want)
		}
		part := make([]int64, 2)
		if err := collectives.ReduceScatterSlice(ctx, c, all, part, hcomm.Sum, one); err != nil {
			return err
		}
		if want := []int64{int64(n * 10 * r), int64(n * (10*r + 1))}; !slices.Equal(part, want) {
			return fmt.Errorf("rank %d: ReduceScatterSlice = %v, want %v", r, part, want)
		}
		var out []int64
		if r == 1 {
			out = make([]int64, 2)
		}
		if err := collectives.ReduceSlice(ctx, c, mine, out, hcomm.Max, 1, one); err != nil {
			return err
		}
		if r == 1 && !slices.Equal(out, []int64{20, 21}) {
			return fmt.Errorf("ReduceSlice = %v, want [20 21]", out)
		}
		// AlltoAll carries its count table in the hello: the peers check it.
		send := make([]int64, n)
		for i := range send {
			send[i] = int64(100*r + i)
		}
		recv := make([]int64, n)
		if err := collectives.AlltoAllSlice(ctx, c, send, recv, nil); err != nil {
			return err
		}
		for p, v := range recv {
			if want := int64(100*p + r); v != want {
				return fmt.Errorf("rank %d: AlltoAllSlice[%d] = %d, want %d", r, p, v, want)
			}
		}
		return collectives.BarrierContext(ctx, c)
	})
	// Send/Recv: the hello carries digests of the item sizes.
	run(t, comms, func(c *hcomm.Comm) error {
		dev := c.Device()
		s, err := dev.CreateStream()
		if err != nil {
			return err
		}
		defer s.Destroy()
		buf, err := dev.Malloc(8)
		if err != nil {
			return err
		}
		defer dev.Free(buf)
		r := c.Rank()
		switch r {
		case 0:
			err = dev.MemcpyHtoD(buf, []byte("sendrecv"))
			if err == nil {
				err = collectives.Send(buf, 8, hcomm.Uint8, 2, c, s)
			}
		case 2:
			err = collectives.Recv(buf, 8, hcomm.Uint8, 0, c, s)
		}
		if err != nil {
			return err
		}
		if err := s.SynchronizeWithTimeout(time.Minute); err != nil {
			return err
		}
		if r == 2 {
			got := make([]byte, 8)
			if err := dev.MemcpyDtoH(got, buf); err != nil {
				return err
			}
			if string(got) != "sendrecv" {
				return fmt.Errorf("Recv got %q, want %q", got, "sendrecv")
			}
		}
		return nil
	})
}
