// Command transfer moves a large buffer from rank 0's device to every other
// rank's with WriteOnThread and the notify handshake of the HCCL seed sample
// (pre-sync, the writes, write-done, post-sync), checks what arrived with a
// CRC-32C checksum that travels with the data, and reports GB/s.
//
//	go run ./examples/transfer                          # 2 ranks in this process, 256 MiB
//	go run ./examples/transfer -ranks 3 -size 1G -iters 5
//	hcomm run -n 2 go run ./examples/transfer           # one rank per process
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// Options configure a transfer.
type Options struct {
	Ranks int   // ranks in this process (ignored under a launcher)
	Size  int64 // bytes moved to each receiver per iteration
	Chunk int64 // bytes per WriteOnThread
	Iters int
	// Corrupt, for tests, changes a received buffer before it is checked.
	Corrupt func(b []byte)
}

// Result is what rank 0 measured, one entry per (iteration, receiver).
type Result struct {
	GBps []float64 // decimal GB/s of each transfer
	Best float64
	Mean float64
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func parseSize(s string) (int64, error) {
	mult := int64(1)
	t := strings.ToUpper(strings.TrimSpace(s))
	for suf, m := range map[string]int64{"K": 1 << 10, "M": 1 << 20, "G": 1 << 30} {
		if strings.HasSuffix(t, suf) {
			t, mult = strings.TrimSuffix(t, suf), m
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n <= 0 || n > (1<<40)/mult {
		return 0, fmt.Errorf("size %q: want a positive integer with an optional K, M or G suffix", s)
	}
	return n * mult, nil
}

func main() {
	o := Options{Ranks: 2, Size: 256 << 20, Chunk: 4 << 20, Iters: 3}
	size := flag.String("size", "256M", "bytes to move to each receiver (K/M/G suffixes)")
	chunk := flag.String("chunk", "4M", "bytes per WriteOnThread")
	flag.IntVar(&o.Ranks, "ranks", o.Ranks, "ranks in this process (under hcomm run: one per process)")
	flag.IntVar(&o.Iters, "iters", o.Iters, "transfers per receiver")
	flag.Parse()
	var err error
	if o.Size, err = parseSize(*size); err == nil {
		o.Chunk, err = parseSize(*chunk)
	}
	if err == nil {
		_, err = Run(o, os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "transfer:", err)
		os.Exit(1)
	}
}

// Run makes the communicators and runs the transfers; rank 0 reports to out.
func Run(o Options, out io.Writer) (*Result, error) {
	if o.Size <= 0 || o.Chunk <= 0 || o.Iters < 1 || o.Ranks < 2 {
		return nil, fmt.Errorf("size %d, chunk %d, iters %d, ranks %d: want positive sizes, iters >= 1, ranks >= 2", o.Size, o.Chunk, o.Iters, o.Ranks)
	}
	var comms []*hcomm.Comm
	if _, ok := hcomm.Launched(nil); ok {
		c, err := hcomm.InitFromEnv(&hcomm.Config{Name: "transfer"})
		if err != nil {
			return nil, err
		}
		if c.Size() < 2 {
			c.Destroy()
			return nil, errors.New("transfer needs at least 2 ranks")
		}
		comms = []*hcomm.Comm{c}
	} else {
		var err error
		if comms, err = hcomm.InitAll(o.Ranks, &hcomm.Config{Name: "transfer", BufferSize: 1 << 20}); err != nil {
			return nil, err
		}
	}
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	var res *Result
	var mu sync.Mutex
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	var once sync.Once
	for i, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := io.Discard
			if c.Rank() == 0 {
				w = out
			}
			r, err := rank(c, o, w)
			if err != nil {
				errs[i] = err
				once.Do(func() { // stop the others waiting for this rank
					for _, x := range comms {
						x.Abort()
					}
				})
				return
			}
			if c.Rank() == 0 {
				mu.Lock()
				res = r
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if res == nil {
		res = &Result{}
	}
	return res, nil
}

// Notify indices of the handshake (the seed's three phases).
const (
	nReady = 0 // pre-sync: "my buffer is free, write it"
	nDone  = 1 // the writes are complete
	nSeen  = 2 // post-sync: "checked"
)

// rank is one rank's part: rank 0 sends to every other rank in turn.
func rank(c *hcomm.Comm, o Options, out io.Writer) (*Result, error) {
	me, n := c.Rank(), c.Size()
	dev := c.Device()
	total := o.Size + 4 // the data, then its CRC-32C
	buf, err := dev.Malloc(total)
	if err != nil {
		return nil, err
	}
	defer dev.Free(buf)
	var mh *hcomm.MemHandle
	if me != 0 {
		if mh, err = c.CommMemReg("transfer", buf, total); err != nil {
			return nil, err
		}
		defer c.CommMemDereg(mh)
	}
	descs := hcomm.ChannelDescInit(1)
	peers := []int{0}
	if me == 0 {
		descs = hcomm.ChannelDescInit(n - 1)
		peers = peers[:0]
		for p := 1; p < n; p++ {
			peers = append(peers, p)
		}
	}
	for i, p := range peers {
		descs[i].RemoteRank, descs[i].NotifyNum, descs[i].Tag = p, 3, "transfer"
		if mh != nil {
			descs[i].MemHandles = []*hcomm.MemHandle{mh}
		}
	}
	chs, err := c.ChannelAcquire(hcomm.EngineCPUTS, descs)
	if err != nil {
		return nil, err
	}
	ths, err := c.ThreadAcquire(hcomm.EngineCPUTS, 1, 0)
	if err != nil {
		return nil, err
	}
	th := ths[0]
	ctx := context.Background()
	sync := func() error { return th.Stream().Synchronize(ctx) }
	if me == 0 {
		data := make([]byte, total)
		rng := rand.New(rand.NewPCG(42, 7))
		for i := int64(0); i+8 <= o.Size; i += 8 {
			binary.LittleEndian.PutUint64(data[i:], rng.Uint64())
		}
		binary.LittleEndian.PutUint32(data[o.Size:], crc32.Checksum(data[:o.Size], castagnoli))
		if err := dev.MemcpyHtoD(buf, data); err != nil {
			return nil, err
		}
		fmt.Fprintf(out, "transfer: %d MiB from rank 0 to ranks 1..%d in %d-byte writes, %d times each\n", o.Size>>20, n-1, o.Chunk, o.Iters)
		res := &Result{}
		for it := 0; it < o.Iters; it++ {
			for _, ch := range chs {
				dst, err := remoteBuf(c, ch, total)
				if err != nil {
					return nil, err
				}
				// pre-sync: wait until the receiver says its buffer is free.
				if err := hcomm.ChannelNotifyWaitOnThread(th, ch, nReady, 0); err != nil {
					return nil, err
				}
				if err := sync(); err != nil {
					return nil, err
				}
				start := time.Now()
				for off := int64(0); off < total; off += o.Chunk {
					if err := hcomm.WriteOnThread(th, ch, dst.Add(off), buf.Add(off), min(o.Chunk, total-off)); err != nil {
						return nil, err
					}
				}
				if err := hcomm.ChannelNotifyRecordOnThread(th, ch, nDone); err != nil {
					return nil, err
				}
				if err := sync(); err != nil {
					return nil, err
				}
				el := time.Since(start)
				gbps := float64(o.Size) / el.Seconds() / 1e9
				res.GBps = append(res.GBps, gbps)
				// post-sync: the receiver has checked the data.
				if err := hcomm.ChannelNotifyWaitOnThread(th, ch, nSeen, 0); err != nil {
					return nil, err
				}
				if err := sync(); err != nil {
					return nil, err
				}
				fmt.Fprintf(out, "  iteration %d to rank %d: %8.3f ms  %6.2f GB/s\n", it+1, ch.RemoteRank(), el.Seconds()*1e3, gbps)
			}
		}
		for _, g := range res.GBps {
			res.Best = max(res.Best, g)
			res.Mean += g / float64(len(res.GBps))
		}
		fmt.Fprintf(out, "every transfer arrived intact (CRC-32C checked by each receiver); best %.2f GB/s, mean %.2f GB/s\n", res.Best, res.Mean)
		return res, nil
	}
	ch := chs[0]
	got := make([]byte, total)
	for it := 0; it < o.Iters; it++ {
		if err := dev.Memset(buf, total, 0); err != nil {
			return nil, err
		}
		if err := hcomm.ChannelNotifyRecordOnThread(th, ch, nReady); err != nil {
			return nil, err
		}
		if err := hcomm.ChannelNotifyWaitOnThread(th, ch, nDone, 0); err != nil {
			return nil, err
		}
		if err := sync(); err != nil {
			return nil, err
		}
		if err := dev.MemcpyDtoH(got, buf); err != nil {
			return nil, err
		}
		if o.Corrupt != nil {
			o.Corrupt(got)
		}
		want := binary.LittleEndian.Uint32(got[o.Size:])
		if sum := crc32.Checksum(got[:o.Size], castagnoli); sum != want {
			return nil, fmt.Errorf("rank %d, iteration %d: the data arrived damaged: CRC-32C %08x, the sender's %08x", me, it+1, sum, want)
		}
		if err := hcomm.ChannelNotifyRecordOnThread(th, ch, nSeen); err != nil {
			return nil, err
		}
		if err := sync(); err != nil {
			return nil, err
		}
	}
	return nil, nil
}

// remoteBuf finds the receive buffer the peer registered for the transfer.
func remoteBuf(c *hcomm.Comm, ch *hcomm.Channel, size int64) (device.Ptr, error) {
	mems, err := c.ChannelGetRemoteMems(ch)
	if err != nil {
		return 0, err
	}
	for _, m := range mems {
		if m.Tag == "transfer" && m.Size >= size {
			return m.Addr, nil
		}
	}
	return 0, fmt.Errorf("rank %d did not register a %d-byte receive buffer", ch.RemoteRank(), size)
}
