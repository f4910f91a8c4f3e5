package hcomm_test

import (
	"context"
	"testing"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// TestHcclBufferCommittedAsTouched: at the default HCCL_BUFFSIZE a rank's
// 400 MB HCCL buffer holds no memory after init (before, all of it was
// reserved there), a few MB after a 1 MiB all-reduce (the slots its
// collectives touched), and none again once GetHcclBufferCleared has
// cleared it.
func TestHcclBufferCommittedAsTouched(t *testing.T) {
	comms, err := hcomm.InitAll(4, &hcomm.Config{BufferSize: hcomm.DefaultBufferSize})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	committed := func(c *hcomm.Comm) (int64, int64) {
		buf, size, err := c.GetHcclBuffer()
		if err != nil {
			t.Fatal(err)
		}
		return committedBytes(c.Device(), buf), size
	}
	for _, c := range comms {
		if n, size := committed(c); n != 0 {
			t.Fatalf("rank %d: %d bytes of its %d-byte HCCL buffer committed at init; want none", c.Rank(), n, size)
		}
	}
	errs := make(chan error, len(comms))
	for _, c := range comms {
		go func() {
			b := make([]float32, 1<<18)
			errs <- collectives.AllReduceSlice(context.Background(), c, b, b, hcomm.Sum, nil)
		}()
	}
	for range comms {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range comms {
		if n, size := committed(c); n == 0 || n > 16<<20 {
			t.Errorf("rank %d: %d bytes of its %d-byte HCCL buffer committed after a 1 MiB all-reduce; want a few MB", c.Rank(), n, size)
		}
	}
	for _, c := range comms {
		if _, _, err := c.GetHcclBufferCleared(); err != nil {
			t.Fatal(err)
		}
		if n, _ := committed(c); n != 0 {
			t.Errorf("rank %d: %d bytes of its HCCL buffer committed after GetHcclBufferCleared; want none", c.Rank(), n)
		}
	}
}
