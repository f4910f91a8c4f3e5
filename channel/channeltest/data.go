package channeltest

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/reduce"
)

// This file holds the cases of the data path: what a transport must move,
// and when the far end sees it.

func testConnect(t TB, cfg Config) {
	p := connect(t, cfg)
	for i, e := range p.ends {
		peer := p.ends[1-i]
		c := e.conn
		if len(c.Notifies) != notifyNum || c.PeerNotifyNum != notifyNum {
			t.Errorf("rank %d: %d notifies, %d at the peer; want %d and %d", e.rank, len(c.Notifies), c.PeerNotifyNum, notifyNum, notifyNum)
		}
		if len(c.RemoteMems) == 0 || c.RemoteMems[0].Addr != peer.buf.Addr || c.RemoteMems[0].Size != peer.buf.Size {
			t.Errorf("rank %d: remote memory %v does not start with the peer's HCCL buffer %v", e.rank, c.RemoteMems, peer.buf)
		}
		found := false
		for _, m := range c.RemoteMems {
			found = found || m.Addr == peer.extra.Addr && m.Size == peer.extra.Size
		}
		if !found {
			t.Errorf("rank %d: remote memory %v lacks the range %v the peer registered before the connect", e.rank, c.RemoteMems, peer.extra)
		}
		if c.Transport.Name() != p.name {
			t.Errorf("rank %d: transport name %q, the Dialer's %q", e.rank, c.Transport.Name(), p.name)
		}
	}
}

// f32s returns b's first cnt float32s (little-endian, as the host stores them).
func f32s(b []byte, cnt int) []float32 {
	out := make([]float32, cnt)
	for i := range out {
		out[i] = math.Float32frombits(uint32(b[4*i]) | uint32(b[4*i+1])<<8 | uint32(b[4*i+2])<<16 | uint32(b[4*i+3])<<24)
	}
	return out
}

func putF32s(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 1))
	for i := 0; i+4 <= len(b); i += 4 {
		u := math.Float32bits(float32(r.NormFloat64()))
		b[i], b[i+1], b[i+2], b[i+3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
	}
}

func testRoundTrips(t TB, cfg Config) {
	p := connect(t, cfg)
	for dir := range 2 {
		a, b := p.ends[dir], p.ends[1-dir]
		tr, mb := a.tr(), b.bufBytes(t)
		for _, n := range []int{0, 1, 7, 4093, 1<<20 + 3} {
			what := fmt.Sprintf("rank %d -> rank %d, %d bytes", a.rank, b.rank, n)
			const off = 13 // unaligned on purpose
			fill(mb, uint64(n)+1)
			src := make([]byte, n)
			fill(src, uint64(n))
			if err := tr.Write(nil, b.buf.Addr+off, src); err != nil {
				t.Fatalf("%s: Write: %v", what, err)
			}
			if err := tr.Fence(nil); err != nil {
				t.Fatalf("%s: Fence: %v", what, err)
			}
			sameBytes(t, what+": written bytes at the peer", mb[off:off+n], src)
			back := make([]byte, n)
			if err := tr.Read(nil, back, b.buf.Addr+off); err != nil {
				t.Fatalf("%s: Read: %v", what, err)
			}
			sameBytes(t, what+": read bytes", back, src)

			// WriteReduce, uint8 sum: peer = peer + src.
			want := append([]byte(nil), mb[off:off+n]...)
			fill(src, uint64(n)+5)
			for i := range want {
				want[i] += src[i]
			}
			if err := tr.WriteReduce(nil, b.buf.Addr+off, src, n, reduce.Uint8, reduce.Sum); err != nil {
				t.Fatalf("%s: WriteReduce: %v", what, err)
			}
			if err := tr.Fence(nil); err != nil {
				t.Fatalf("%s: Fence: %v", what, err)
			}
			sameBytes(t, what+": write-reduce (uint8 sum) at the peer", mb[off:off+n], want)

			// ReadReduce, float32 max over the whole elements: dst = max(dst, peer).
			cnt := n / 4
			dst := make([]byte, 4*cnt)
			putF32s(dst, uint64(n)+2)
			putF32s(mb[64:64+4*cnt], uint64(n)+3)
			mine, theirs := f32s(dst, cnt), f32s(mb[64:], cnt)
			if err := tr.ReadReduce(nil, dst, b.buf.Addr+64, cnt, reduce.Float32, reduce.Max); err != nil {
				t.Fatalf("%s: ReadReduce: %v", what, err)
			}
			got := f32s(dst, cnt)
			for i := range cnt {
				if w := max(mine[i], theirs[i]); got[i] != w {
					t.Fatalf("%s: read-reduce (fp32 max) element %d: %v, want %v", what, i, got[i], w)
				}
			}
		}
	}
}

// roundLen is the size of round r's write, 1 byte to 3 MiB.
func roundLen(r int) int { return 1 + (r*797_003)%(3<<20-1) }

// testVisibility: rank a writes round r's bytes (all r) into rank b's buffer
// and records b's notify 0; b waits, checks every byte, and acknowledges
// with a's notify 1. A record that overtakes a write leaves older bytes.
// Every other round sends its last part with WriteWithNotify, when the
// transport has it.
func testVisibility(t TB, cfg Config) {
	p := connect(t, cfg)
	const rounds = 30
	for dir := range 2 {
		a, b := p.ends[dir], p.ends[1-dir]
		wn, _ := a.tr().(channel.WriteNotifier)
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			err := checkRounds(ctx, t, a, b, rounds)
			if err != nil {
				cancel()
			}
			errc <- err
		}()
		src := make([]byte, 3<<20)
		failed := false
		for r := 1; r <= rounds && !failed; r++ {
			n := roundLen(r)
			setAll(src[:n], byte(r))
			// Two writes (the big one split in chunks, where a transport
			// splits), then the record.
			half := n / 2
			tail := n - half
			if wn != nil && r%2 == 1 {
				tail = min(n-half, 100+r) // one small frame, sent with the record
			}
			if err := a.tr().Write(nil, b.buf.Addr, src[:half]); err != nil {
				t.Errorf("rank %d round %d: Write: %v", a.rank, r, err)
				break
			}
			if err := a.tr().Write(nil, b.buf.Addr+device.Ptr(half), src[half:n-tail]); err != nil {
				t.Errorf("rank %d round %d: Write: %v", a.rank, r, err)
				break
			}
			var err error
			if wn != nil && r%2 == 1 {
				err = wn.WriteWithNotify(nil, b.buf.Addr+device.Ptr(n-tail), src[n-tail:n], 0)
			} else if err = a.tr().Write(nil, b.buf.Addr+device.Ptr(n-tail), src[n-tail:n]); err == nil {
				err = a.tr().NotifyRecord(nil, 0)
			}
			if err != nil {
				t.Errorf("rank %d round %d: sending: %v", a.rank, r, err)
				break
			}
			if err := a.wait(ctx, 1); err != nil {
				failed = true // the checker says why
			}
		}
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("rank %d -> rank %d: %v", a.rank, b.rank, err)
		}
	}
}

// checkRounds is the receiving side of testVisibility.
func checkRounds(ctx context.Context, t TB, a, b *end, rounds int) error {
	mb, err := b.dev.Bytes(b.buf.Addr, b.buf.Size)
	if err != nil {
		return err
	}
	want := make([]byte, 3<<20)
	for r := 1; r <= rounds; r++ {
		if err := b.wait(ctx, 0); err != nil {
			return fmt.Errorf("round %d: waiting for the record: %w", r, err)
		}
		n := roundLen(r)
		setAll(want[:n], byte(r))
		if !bytes.Equal(mb[:n], want[:n]) {
			i := firstDiff(mb[:n], want[:n])
			return fmt.Errorf("round %d: the wait returned, but byte %d of %d is %d, want %d: the record overtook a write (%d bytes not yet there)",
				r, i, n, mb[i], r, diffCount(mb[:n], want[:n]))
		}
		if err := b.tr().NotifyRecord(nil, 1); err != nil {
			return fmt.Errorf("round %d: acknowledging: %w", r, err)
		}
	}
	return nil
}

// testOrdering: a Read returns the writes issued before it (no record, no
// fence); after Fence the peer's memory holds the earlier writes and
// write-reduces; and records arrive in the order they were made.
func testOrdering(t TB, cfg Config) {
	p := connect(t, cfg)
	for dir := range 2 {
		a, b := p.ends[dir], p.ends[1-dir]
		tr, mb := a.tr(), b.bufBytes(t)
		const n = 1 << 20
		src, back := make([]byte, n), make([]byte, n)
		for r := range 10 {
			fill(src, uint64(r))
			if err := tr.Write(nil, b.buf.Addr, src); err != nil {
				t.Fatalf("rank %d round %d: Write: %v", a.rank, r, err)
			}
			if err := tr.Read(nil, back, b.buf.Addr); err != nil {
				t.Fatalf("rank %d round %d: Read: %v", a.rank, r, err)
			}
			if !sameBytes(t, fmt.Sprintf("rank %d round %d: a Read right after a Write", a.rank, r), back, src) {
				return
			}
		}
		// Fence: a write and a write-reduce of two ranges are in the peer's
		// memory when it returns.
		fill(src, 42)
		fill(mb[n:2*n], 43)
		ones := bytes.Repeat([]byte{1}, n)
		want := append(append([]byte(nil), src...), mb[n:2*n]...)
		for i := n; i < 2*n; i++ {
			want[i]++
		}
		if err := tr.Write(nil, b.buf.Addr, src); err != nil {
			t.Fatalf("rank %d: Write: %v", a.rank, err)
		}
		if err := tr.WriteReduce(nil, b.buf.Addr+n, ones, n, reduce.Uint8, reduce.Sum); err != nil {
			t.Fatalf("rank %d: WriteReduce: %v", a.rank, err)
		}
		if err := tr.Fence(nil); err != nil {
			t.Fatalf("rank %d: Fence: %v", a.rank, err)
		}
		sameBytes(t, fmt.Sprintf("rank %d: the peer's memory when Fence returned", a.rank), mb[:2*n], want)
		// Two writes of one thread to the same bytes land in issue order, with
		// nothing between them: a write then a write-reduce of the same range
		// (a reduce-scatter's step), and a write then one that overlaps it.
		// Both are large, so that a transport with several sockets splits
		// them over all of them.
		second := make([]byte, n/2)
		for r := range 8 {
			fill(src, uint64(100+r))
			if err := tr.Write(nil, b.buf.Addr, src); err != nil {
				t.Fatalf("rank %d round %d: Write: %v", a.rank, r, err)
			}
			if err := tr.WriteReduce(nil, b.buf.Addr, ones, n, reduce.Uint8, reduce.Sum); err != nil {
				t.Fatalf("rank %d round %d: WriteReduce: %v", a.rank, r, err)
			}
			fill(second, uint64(200+r))
			if err := tr.Write(nil, b.buf.Addr+n, src); err != nil {
				t.Fatalf("rank %d round %d: Write: %v", a.rank, r, err)
			}
			if err := tr.Write(nil, b.buf.Addr+n+n/4, second); err != nil {
				t.Fatalf("rank %d round %d: overlapping Write: %v", a.rank, r, err)
			}
			if err := tr.Fence(nil); err != nil {
				t.Fatalf("rank %d round %d: Fence: %v", a.rank, r, err)
			}
			want := append([]byte(nil), src...)
			for i := range want {
				want[i]++
			}
			if !sameBytes(t, fmt.Sprintf("rank %d round %d: a Write then a WriteReduce of the same bytes", a.rank, r), mb[:n], want) {
				return
			}
			want = append(want[:0], src...)
			copy(want[n/4:], second)
			if !sameBytes(t, fmt.Sprintf("rank %d round %d: a Write then a Write over half of it", a.rank, r), mb[n:2*n], want) {
				return
			}
		}
		// Records in order: when the second is seen, the first is set.
		for r := range 50 {
			if err := tr.NotifyRecord(nil, 2); err != nil {
				t.Fatalf("rank %d: NotifyRecord: %v", a.rank, err)
			}
			if err := tr.NotifyRecord(nil, 3); err != nil {
				t.Fatalf("rank %d: NotifyRecord: %v", a.rank, err)
			}
			if err := b.wait(context.Background(), 3); err != nil {
				t.Fatalf("rank %d round %d: waiting for the second record: %v", b.rank, r, err)
			}
			if !b.conn.Notifies[2].IsSet() {
				t.Fatalf("rank %d round %d: the second record arrived before the first", b.rank, r)
			}
			for _, i := range []int{0, 1} {
				if b.conn.Notifies[i].IsSet() {
					t.Fatalf("rank %d round %d: notify %d is set, but only 2 and 3 were recorded", b.rank, r, i)
				}
			}
			if err := b.wait(context.Background(), 2); err != nil {
				t.Fatalf("rank %d round %d: waiting for the first record: %v", b.rank, r, err)
			}
		}
	}
}

// testConcurrent runs writers on several goroutines over one channel, each
// with its own region and notify, as a communicator's threads do; the peer
// checks each region when its record arrives and acknowledges on the same
// notify.
func testConcurrent(t TB, cfg Config) {
	p := connect(t, cfg)
	const workers, region, rounds = notifyNum, 256 << 10, 10
	a, b := p.ends[0], p.ends[1]
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 2*workers)
	mb := b.bufBytes(t)
	for w := range workers {
		wg.Add(2)
		go func() {
			defer wg.Done()
			src := make([]byte, region)
			for r := 1; r <= rounds; r++ {
				setAll(src, byte(r+w))
				if err := a.tr().Write(nil, b.buf.Addr+device.Ptr(w*region), src); err != nil {
					errs <- err
					return
				}
				if err := a.tr().NotifyRecord(nil, w); err != nil {
					errs <- err
					return
				}
				if err := a.wait(ctx, w); err != nil {
					errs <- err
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			want := make([]byte, region)
			for r := 1; r <= rounds; r++ {
				if err := b.wait(ctx, w); err != nil {
					errs <- err
					return
				}
				setAll(want, byte(r+w))
				got := mb[w*region : (w+1)*region]
				if !bytes.Equal(got, want) {
					i := firstDiff(got, want)
					errs <- fmt.Errorf("thread %d round %d: byte %d of its region is %d, want %d", w, r, i, got[i], want[i])
					cancel()
					return
				}
				if err := b.tr().NotifyRecord(nil, w); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("%v", err)
	}
}
