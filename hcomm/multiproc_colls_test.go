package hcomm_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// collsWork is a rank of TestMultiProcessCollectives: every collective with
// every algorithm it has, at sizes that take one piece and many (the
// processes run with a 1 MB HCCL_BUFFSIZE), checked element by element.
// Separate address spaces catch what ranks of one process cannot: a peer
// address used without translation.
func collsWork(c *hcomm.Comm) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	me, n := c.Rank(), c.Size()
	val := func(r, i int) int32 { return int32(r*1000 + i%997) }
	algos := func(name string) []collectives.Algorithm {
		return append([]collectives.Algorithm{collectives.AlgoAuto}, collectives.Algorithms(name)...)
	}
	// The inline algorithms carry the data in the hello slots: oneshot a
	// rank's input, rd at most the whole output (an all-gather's).
	ok := func(a collectives.Algorithm, bytes int) bool {
		switch a {
		case collectives.AlgoOneShot:
			return int64(bytes) <= collectives.InlineBytes(c)
		case collectives.AlgoRD:
			return int64(bytes)*int64(n) <= collectives.InlineBytes(c)
		}
		return true
	}
	for _, count := range []int{7, 300001} {
		send := make([]int32, count)
		for i := range send {
			send[i] = val(me, i)
		}
		for _, a := range algos("AllReduce") {
			if !ok(a, 4*count) {
				continue
			}
			recv := make([]int32, count)
			if err := collectives.AllReduceSlice(ctx, c, send, recv, hcomm.Sum, &collectives.Options{Algorithm: a}); err != nil {
				return fmt.Errorf("AllReduce %v count %d: %w", a, count, err)
			}
			for i, v := range recv {
				var want int32
				for r := 0; r < n; r++ {
					want += val(r, i)
				}
				if v != want {
					return fmt.Errorf("AllReduce %v count %d: element %d = %d, want %d", a, count, i, v, want)
				}
			}
		}
		for _, a := range algos("Broadcast") {
			if !ok(a, 4*count) {
				continue
			}
			buf := slices.Clone(send)
			if err := collectives.BroadcastSlice(ctx, c, buf, n-1, &collectives.Options{Algorithm: a}); err != nil {
				return fmt.Errorf("Broadcast %v count %d: %w", a, count, err)
			}
			for i, v := range buf {
				if v != val(n-1, i) {
					return fmt.Errorf("Broadcast %v count %d: element %d = %d", a, count, i, v)
				}
			}
		}
		for _, a := range algos("Reduce") {
			if !ok(a, 4*count) {
				continue
			}
			var recv []int32
			if me == 1 {
				recv = make([]int32, count)
			}
			if err := collectives.ReduceSlice(ctx, c, send, recv, hcomm.Max, 1, &collectives.Options{Algorithm: a}); err != nil {
				return fmt.Errorf("Reduce %v count %d: %w", a, count, err)
			}
			for i, v := range recv {
				if v != val(n-1, i) {
					return fmt.Errorf("Reduce %v count %d: element %d = %d", a, count, i, v)
				}
			}
		}
		for _, a := range algos("AllGather") {
			if !ok(a, 4*count) {
				continue
			}
			all := make([]int32, n*count)
			if err := collectives.AllGatherSlice(ctx, c, send, all, &collectives.Options{Algorithm: a}); err != nil {
				return fmt.Errorf("AllGather %v count %d: %w", a, count, err)
			}
			for i, v := range all {
				if v != val(i/count, i%count) {
					return fmt.Errorf("AllGather %v count %d: element %d = %d", a, count, i, v)
				}
			}
		}
		for _, a := range algos("ReduceScatter") {
			if !ok(a, 4*count*n) {
				continue
			}
			in := make([]int32, n*count)
			for i := range in {
				in[i] = val(me, i)
			}
			part := make([]int32, count)
			if err := collectives.ReduceScatterSlice(ctx, c, in, part, hcomm.Sum, &collectives.Options{Algorithm: a}); err != nil {
				return fmt.Errorf("ReduceScatter %v count %d: %w", a, count, err)
			}
			for i, v := range part {
				var want int32
				for r := 0; r < n; r++ {
					want += val(r, me*count+i)
				}
				if v != want {
					return fmt.Errorf("ReduceScatter %v count %d: element %d = %d, want %d", a, count, i, v, want)
				}
			}
		}
		in := make([]int32, n*count)
		for i := range in {
			in[i] = val(me, i)
		}
		out := make([]int32, n*count)
		if err := collectives.AlltoAllSlice(ctx, c, in, out, nil); err != nil {
			return fmt.Errorf("AlltoAll count %d: %w", count, err)
		}
		for i, v := range out {
			if p := i / count; v != val(p, me*count+i%count) {
				return fmt.Errorf("AlltoAll count %d: element %d = %d", count, i, v)
			}
		}
	}
	if err := windowWork(c, val); err != nil {
		return err
	}
	return collectives.BarrierContext(ctx, c)
}

// windowWork runs AlltoAll, an in-place AllGather and Broadcast on buffers
// in a symmetric window (collectives.RegisterWindow): over shm every rank
// reads its peers' buffers in place, through the peer's mapping.
func windowWork(c *hcomm.Comm, val func(r, i int) int32) error {
	me, n := c.Rank(), c.Size()
	const count = 100003
	dev := c.Device()
	size := int64(2 * n * count * 4)
	p, err := dev.Malloc(size)
	if err != nil {
		return err
	}
	defer dev.Free(p)
	s, err := dev.CreateStream()
	if err != nil {
		return err
	}
	defer s.Destroy()
	w, err := collectives.RegisterWindow(c, p, size)
	if err != nil {
		return fmt.Errorf("RegisterWindow: %w", err)
	}
	defer w.Deregister()
	put := func(at device.Ptr, vals func(i int) int32, k int) error {
		b := make([]byte, 4*k)
		for i := 0; i < k; i++ {
			binary.LittleEndian.PutUint32(b[4*i:], uint32(vals(i)))
		}
		return dev.MemcpyHtoD(at, b)
	}
	check := func(what string, at device.Ptr, want func(i int) int32, k int) error {
		if err := s.SynchronizeWithTimeout(60 * time.Second); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		b := make([]byte, 4*k)
		if err := dev.MemcpyDtoH(b, at); err != nil {
			return err
		}
		for i := 0; i < k; i++ {
			if v := int32(binary.LittleEndian.Uint32(b[4*i:])); v != want(i) {
				return fmt.Errorf("%s in a window: element %d = %d, want %d", what, i, v, want(i))
			}
		}
		return nil
	}
	recv := p.Add(int64(n * count * 4))
	if err := put(p, func(i int) int32 { return val(me, i) }, n*count); err != nil {
		return err
	}
	if err := collectives.AlltoAll(p, count, hcomm.Int32, recv, count, hcomm.Int32, c, s, nil); err != nil {
		return err
	}
	if err := check("AlltoAll", recv, func(i int) int32 { return val(i/count, me*count+i%count) }, n*count); err != nil {
		return err
	}
	mine := recv.Add(int64(me * count * 4))
	if err := put(mine, func(i int) int32 { return val(me, i) }, count); err != nil {
		return err
	}
	if err := collectives.AllGather(mine, recv, count, hcomm.Int32, c, s, nil); err != nil {
		return err
	}
	if err := check("AllGather in place", recv, func(i int) int32 { return val(i/count, i%count) }, n*count); err != nil {
		return err
	}
	if err := collectives.Broadcast(p, count, hcomm.Int32, n-1, c, s, nil); err != nil {
		return err
	}
	return check("Broadcast", p, func(i int) int32 { return val(n-1, i) }, count)
}

// TestMultiProcessCollectives: three processes run every collective and
// algorithm over shm and over tcp.
func TestMultiProcessCollectives(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	for _, tr := range processTransports(t) {
		t.Run(tr.String(), func(t *testing.T) {
			procCfg.Run(t, 3, tr, func(t testing.TB, c *hcomm.Comm) {
				if err := collsWork(c); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}
