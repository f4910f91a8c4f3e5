package collectives_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// The first collective of the host-slice layer sets up its channels within
// its ctx: a peer that never comes fails it at ctx's deadline, not at
// HCCL_CONNECT_TIMEOUT; and the setup is not spent — once the peer comes,
// the next collective works.
func TestSliceFirstCollectiveHonoursContext(t *testing.T) {
	comms, err := hcomm.InitAll(2, &hcomm.Config{BufferSize: 1 << 20, ConnectTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	buf := []float32{1, 2, 3}
	start := time.Now()
	err = collectives.AllReduceSlice(ctx, comms[0], buf, buf, hcomm.Sum, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("AllReduceSlice with a peer that never comes: %v; want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("AllReduceSlice returned %v after its 200 ms context ended", d)
	}
	errs := make(chan error, 2)
	for _, c := range comms {
		go func() {
			b := []float32{1, 2, 3}
			if err := collectives.AllReduceSlice(context.Background(), c, b, b, hcomm.Sum, nil); err != nil {
				errs <- err
				return
			}
			if b[0] != 2 || b[2] != 6 {
				errs <- errors.New("wrong sum after a timed-out setup")
				return
			}
			errs <- nil
		}()
	}
	for range comms {
		select {
		case err := <-errs:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the collective after a timed-out setup did not finish")
		}
	}
}
