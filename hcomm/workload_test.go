package hcomm_test

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// The work every rank of a bootstrap test does, in process or as a process of
// its own: data-plane round trips with its ring neighbours, then allreduce and
// broadcast of odd sizes checked against a float64 reference.

// sizes are the element counts the collectives are checked with.
var sizes = []int{0, 1, 7, 1023, 1<<20 + 3}

// rankWork runs the workload on c; it returns the first failure. transport,
// when not empty, is what every channel must run on.
func rankWork(c *hcomm.Comm, transport string, collSizes []int) error {
	if err := roundTrips(c, transport); err != nil {
		return fmt.Errorf("rank %d data plane: %w", c.Rank(), err)
	}
	if err := checkCollectives(c, collSizes); err != nil {
		return fmt.Errorf("rank %d collectives: %w", c.Rank(), err)
	}
	return nil
}

func roundTrips(c *hcomm.Comm, transport string) error {
	n, r := c.Size(), c.Rank()
	if n < 2 {
		return nil
	}
	next, prev := (r+1)%n, (r+n-1)%n
	descs := hcomm.ChannelDescInit(2)
	descs[0].RemoteRank, descs[1].RemoteRank = next, prev
	for i := range descs {
		descs[i].NotifyNum = 3 // 0: data, 1: quiet, 2: area ready
		descs[i].Tag = "bootstrap-test"
	}
	if next == prev {
		descs = descs[:1]
	}
	chs, err := c.ChannelAcquire(hcomm.EngineCPUTS, descs)
	if err != nil {
		return err
	}
	chNext, chPrev := chs[0], chs[len(chs)-1]
	for _, ch := range chs {
		if transport != "" && ch.Transport() != transport {
			return fmt.Errorf("channel to rank %d runs on %s, want %s", ch.RemoteRank(), ch.Transport(), transport)
		}
	}
	ts, err := c.ThreadAcquire(hcomm.EngineCPUTS, 1, 0)
	if err != nil {
		return err
	}
	t := ts[0]
	buf, size, err := c.GetHcclBuffer()
	if err != nil {
		return err
	}
	peerBuf, _, err := c.ChannelGetHcclBuffer(chNext)
	if err != nil {
		return err
	}
	prevBuf, _, err := c.ChannelGetHcclBuffer(chPrev)
	if err != nil {
		return err
	}
	half := size / 2
	dev := c.Device()
	sync := func() error { return t.Stream().SynchronizeWithTimeout(30 * time.Second) }
	pattern := func(rank int, n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rank*31 + i*7 + 1)
		}
		return b
	}
	for _, nb := range []int{1, 4099} {
		// Write + record; the peer sees the bytes once its wait returns.
		if err := dev.MemcpyHtoD(buf+device.Ptr(half), pattern(r, nb)); err != nil {
			return err
		}
		steps := []func() error{
			func() error { return hcomm.WriteOnThread(t, chNext, peerBuf, buf+device.Ptr(half), int64(nb)) },
			func() error { return hcomm.ChannelNotifyRecordOnThread(t, chNext, 0) },
			func() error { return hcomm.ChannelNotifyWaitOnThread(t, chPrev, 0, 0) },
		}
		for _, s := range steps {
			if err := s(); err != nil {
				return err
			}
		}
		if err := sync(); err != nil {
			return err
		}
		got := make([]byte, nb)
		if err := dev.MemcpyDtoH(got, buf); err != nil {
			return err
		}
		if !bytes.Equal(got, pattern(prev, nb)) {
			return fmt.Errorf("write of %d bytes from rank %d: data differs after the wait", nb, prev)
		}
		// Read the previous rank's source area (it stays put).
		if err := hcomm.ReadOnThread(t, chPrev, buf+64<<10, prevBuf+device.Ptr(half), int64(nb)); err != nil {
			return err
		}
		if err := sync(); err != nil {
			return err
		}
		if err := dev.MemcpyDtoH(got, buf+64<<10); err != nil {
			return err
		}
		if !bytes.Equal(got, pattern(prev, nb)) {
			return fmt.Errorf("read of %d bytes from rank %d: wrong data", nb, prev)
		}
		// The ring must be quiet before the next round reuses the areas.
		if err := hcomm.ChannelNotifyRecordOnThread(t, chPrev, 1); err != nil {
			return err
		}
		if err := hcomm.ChannelNotifyWaitOnThread(t, chNext, 1, 0); err != nil {
			return err
		}
		if err := sync(); err != nil {
			return err
		}
	}
	// Write-reduce: each rank adds its float32s into the next rank's area,
	// after that rank says the area holds its own values.
	const count = 1031
	mine := make([]float32, count)
	for i := range mine {
		mine[i] = float32(r*1000 + i)
	}
	if err := dev.MemcpyHtoD(buf, f32bytes(mine)); err != nil {
		return err
	}
	if err := dev.MemcpyHtoD(buf+device.Ptr(half), f32bytes(mine)); err != nil {
		return err
	}
	for _, s := range []func() error{
		// "my area is ready": its own index, since the peer may not have
		// consumed the last "quiet" yet and two records of one index collapse.
		func() error { return hcomm.ChannelNotifyRecordOnThread(t, chPrev, 2) },
		func() error { return hcomm.ChannelNotifyWaitOnThread(t, chNext, 2, 0) },
		func() error {
			return hcomm.WriteReduceOnThread(t, chNext, peerBuf, buf+device.Ptr(half), count, hcomm.Float32, hcomm.Sum)
		},
		func() error { return hcomm.ChannelNotifyRecordOnThread(t, chNext, 0) },
		func() error { return hcomm.ChannelNotifyWaitOnThread(t, chPrev, 0, 0) },
	} {
		if err := s(); err != nil {
			return err
		}
	}
	if err := sync(); err != nil {
		return err
	}
	got := make([]byte, 4*count)
	if err := dev.MemcpyDtoH(got, buf); err != nil {
		return err
	}
	for i, v := range bytesf32(got) {
		if want := float32(r*1000+i) + float32(prev*1000+i); v != want {
			return fmt.Errorf("write-reduce from rank %d: element %d = %v, want %v", prev, i, v, want)
		}
	}
	// Quiesce: nobody touches the HCCL buffers after this (the collectives use them).
	if err := hcomm.ChannelNotifyRecordOnThread(t, chPrev, 1); err != nil {
		return err
	}
	if err := hcomm.ChannelNotifyWaitOnThread(t, chNext, 1, 0); err != nil {
		return err
	}
	return sync()
}

func checkCollectives(c *hcomm.Comm, collSizes []int) error {
	n, r := c.Size(), c.Rank()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, size := range collSizes {
		send := make([]float32, size)
		want := make([]float64, size)
		for i := range send {
			send[i] = float32((r+1)*(i%97) - 40)
			for q := 0; q < n; q++ {
				want[i] += float64((q+1)*(i%97) - 40)
			}
		}
		recv := make([]float32, size)
		if err := collectives.AllReduceSlice(ctx, c, send, recv, hcomm.Sum, nil); err != nil {
			return fmt.Errorf("allreduce of %d: %w", size, err)
		}
		for i := range recv {
			if math.Abs(float64(recv[i])-want[i]) > 1e-3 {
				return fmt.Errorf("allreduce of %d: element %d = %v, want %v", size, i, recv[i], want[i])
			}
		}
		root := n - 1
		bc := make([]float32, size)
		for i := range bc {
			if r == root {
				bc[i] = float32(i%1000) + 0.5
			} else {
				bc[i] = -1
			}
		}
		if err := collectives.BroadcastSlice(ctx, c, bc, root, nil); err != nil {
			return fmt.Errorf("broadcast of %d: %w", size, err)
		}
		for i := range bc {
			if bc[i] != float32(i%1000)+0.5 {
				return fmt.Errorf("broadcast of %d from rank %d: element %d = %v", size, root, i, bc[i])
			}
		}
	}
	return nil
}

func f32bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		u := math.Float32bits(x)
		b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
	}
	return b
}

func bytesf32(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(uint32(b[4*i]) | uint32(b[4*i+1])<<8 | uint32(b[4*i+2])<<16 | uint32(b[4*i+3])<<24)
	}
	return v
}
