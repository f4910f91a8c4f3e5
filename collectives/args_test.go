package collectives_test

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// TestSliceLayerNilComm: the slice layer, BarrierContext and RegisterWindow
// return an error on a nil communicator; they do not panic.
func TestSliceLayerNilComm(t *testing.T) {
	ctx := context.Background()
	x := []float32{1, 2}
	for name, call := range map[string]func() error{
		"AllReduceSlice":     func() error { return collectives.AllReduceSlice(ctx, nil, x, x, hcomm.Sum, nil) },
		"BroadcastSlice":     func() error { return collectives.BroadcastSlice(ctx, nil, x, 0, nil) },
		"AllGatherSlice":     func() error { return collectives.AllGatherSlice(ctx, nil, x, x, nil) },
		"ReduceScatterSlice": func() error { return collectives.ReduceScatterSlice(ctx, nil, x, x, hcomm.Sum, nil) },
		"ReduceSlice":        func() error { return collectives.ReduceSlice(ctx, nil, x, x, hcomm.Sum, 0, nil) },
		"AlltoAllSlice":      func() error { return collectives.AlltoAllSlice(ctx, nil, x, x, nil) },
		"BarrierContext":     func() error { return collectives.BarrierContext(ctx, nil) },
		"RegisterWindow":     func() error { _, err := collectives.RegisterWindow(nil, 0, 8); return err },
		"AllReduce":          func() error { return collectives.AllReduce(0, 0, 0, hcomm.Float32, hcomm.Sum, nil, nil, nil) },
	} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s(nil communicator) panicked: %v", name, r)
				}
			}()
			if err := call(); !errors.Is(err, hcomm.ErrPtr) {
				t.Errorf("%s(nil communicator) = %v, want ErrPtr", name, err)
			}
		}()
	}
}

// argBufs is one rank's stream and a small device buffer.
func argBufs(t *testing.T, c *hcomm.Comm) (*device.Stream, device.Ptr) {
	t.Helper()
	s, err := c.Device().CreateStream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Destroy() })
	p, err := c.Device().Malloc(1 << 10)
	if err != nil {
		t.Fatal(err)
	}
	return s, p
}

// TestBadCallFailsBeforeSetup: a call that one rank can tell is wrong —
// root, algorithm, a forced one-shot too large for the hello slots — fails at
// once on a fresh communicator whose peers never call, not after the channel
// setup times out, and leaves the communicators usable for a good call.
func TestBadCallFailsBeforeSetup(t *testing.T) {
	const n = 3
	comms := initAll(t, n, &hcomm.Config{ConnectTimeout: 5 * time.Second, BufferSize: 64 << 10})
	s, p := argBufs(t, comms[0])
	c := comms[0]
	inline := collectives.InlineBytes(c)
	big, err := c.Device().Malloc(inline + 64)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		code hcomm.Result
		call func() error
	}{
		{"Broadcast root 3", hcomm.ErrPara, func() error { return collectives.Broadcast(p, 4, hcomm.Float32, n, c, s, nil) }},
		{"Reduce root -1", hcomm.ErrPara, func() error { return collectives.Reduce(p, p, 4, hcomm.Float32, hcomm.Sum, -1, c, s, nil) }},
		{"Scatter root 3", hcomm.ErrPara, func() error { return collectives.Scatter(p, p, 4, hcomm.Float32, n, c, s, nil) }},
		{"AllReduce with pairwise", hcomm.ErrNotSupport, func() error {
			return collectives.AllReduce(p, p, 4, hcomm.Float32, hcomm.Sum, c, s, &collectives.Options{Algorithm: collectives.AlgoPairwise})
		}},
		{"AllGather rd too large", hcomm.ErrPara, func() error {
			// rd's hellos carry the whole output: n times the input.
			return collectives.AllGather(big, big, inline/2, hcomm.Int8, c, s, &collectives.Options{Algorithm: collectives.AlgoRD})
		}},
		{"AlltoAll with ring", hcomm.ErrNotSupport, func() error {
			return collectives.AlltoAll(p, 4, hcomm.Float32, p.Add(64), 4, hcomm.Float32, c, s, &collectives.Options{Algorithm: collectives.AlgoRing})
		}},
		{"AllReduce one-shot too large", hcomm.ErrPara, func() error {
			return collectives.AllReduce(big, big, inline+8, hcomm.Int8, hcomm.Sum, c, s, &collectives.Options{Algorithm: collectives.AlgoOneShot})
		}},
		{"AllReduce bad op", hcomm.ErrNotSupport, func() error { return collectives.AllReduce(p, p, 4, hcomm.Float32, hcomm.ReduceOp(99), c, s, nil) }},
		{"AllReduce bad type", hcomm.ErrNotSupport, func() error { return collectives.AllReduce(p, p, 4, hcomm.DataType(99), hcomm.Sum, c, s, nil) }},
		{"AllReduce negative count", hcomm.ErrPara, func() error { return collectives.AllReduce(p, p, -1, hcomm.Float32, hcomm.Sum, c, s, nil) }},
	} {
		start := time.Now()
		err := tc.call()
		if hcomm.ResultOf(err) != tc.code {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.code)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("%s: failed after %v, want at once (before any channel setup)", tc.name, d)
		}
	}
	// The communicators are still usable: a good all-reduce on every rank.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	run(t, comms, func(c *hcomm.Comm) error {
		x := []float32{float32(c.Rank()), 1}
		if err := collectives.AllReduceSlice(ctx, c, x, x, hcomm.Sum, nil); err != nil {
			return err
		}
		if x[0] != 3 || x[1] != 3 {
			t.Errorf("rank %d: all-reduce after the bad calls = %v, want [3 3]", c.Rank(), x)
		}
		return nil
	})
}

// TestHugeCountIsErrPara: a count whose byte size overflows an int64 fails
// every collective with ErrPara naming the count, and one whose size fits
// but exceeds the buffer with ErrPara naming the buffer; none returns nil or
// wraps around to a small size.
func TestHugeCountIsErrPara(t *testing.T) {
	const n = 2
	comms := initAll(t, n, &hcomm.Config{ConnectTimeout: 5 * time.Second})
	c := comms[0]
	s, p := argBufs(t, c)
	for _, count := range []int64{math.MaxInt64/2 + 1, math.MaxInt64 / 4, 1 << 40} {
		cs := []int64{count, count}
		ds := []int64{0, 0}
		for name, call := range map[string]func() error{
			"AllReduce":     func() error { return collectives.AllReduce(p, p, count, hcomm.Float32, hcomm.Sum, c, s, nil) },
			"Broadcast":     func() error { return collectives.Broadcast(p, count, hcomm.Float32, 0, c, s, nil) },
			"Reduce":        func() error { return collectives.Reduce(p, p, count, hcomm.Float32, hcomm.Sum, 0, c, s, nil) },
			"AllGather":     func() error { return collectives.AllGather(p, p, count, hcomm.Float32, c, s, nil) },
			"AllGatherV":    func() error { return collectives.AllGatherV(p, count, p, cs, ds, hcomm.Float32, c, s, nil) },
			"ReduceScatter": func() error { return collectives.ReduceScatter(p, p, count, hcomm.Float32, hcomm.Sum, c, s, nil) },
			"ReduceScatterV": func() error {
				return collectives.ReduceScatterV(p, cs, ds, p, count, hcomm.Float32, hcomm.Sum, c, s, nil)
			},
			"Scatter":  func() error { return collectives.Scatter(p, p, count, hcomm.Float32, 0, c, s, nil) },
			"Gather":   func() error { return collectives.Gather(p, p, count, hcomm.Float32, 0, c, s, nil) },
			"AlltoAll": func() error { return collectives.AlltoAll(p, count, hcomm.Float32, p, count, hcomm.Float32, c, s, nil) },
			"AlltoAllV": func() error {
				return collectives.AlltoAllV(p, cs, ds, hcomm.Float32, p, cs, ds, hcomm.Float32, c, s, nil)
			},
			"Send": func() error { return collectives.Send(p, count, hcomm.Float32, 1, c, s) },
			"Recv": func() error { return collectives.Recv(p, count, hcomm.Float32, 1, c, s) },
		} {
			err := call()
			if !errors.Is(err, hcomm.ErrPara) {
				t.Errorf("%s(count %d): %v, want ErrPara", name, count, err)
			} else if overflows := count > math.MaxInt64/4; overflows && !strings.Contains(err.Error(), strconv.FormatInt(count, 10)) {
				t.Errorf("%s(count %d): %v, want the error to name the count", name, count, err)
			}
		}
	}
	if err := s.SynchronizeWithTimeout(time.Minute); err != nil {
		t.Fatal(err)
	}
}
