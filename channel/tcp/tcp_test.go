package tcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/leakcheck"
	"github.com/hcomm-dev/hcomm/internal/reduce"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// rankMem is one rank's device and registered memory.
type rankMem struct {
	rank int
	dev  *device.Device
	reg  *channel.Registry
	buf  channel.Mem
}

func newRankMem(t testing.TB, rank int, size int64) *rankMem {
	t.Helper()
	dev, err := device.Open(rank)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	p, err := dev.Malloc(size)
	if err != nil {
		t.Fatal(err)
	}
	r := &rankMem{rank: rank, dev: dev, reg: &channel.Registry{}, buf: channel.Mem{Tag: "hccl buffer", Addr: p, Size: size}}
	r.reg.Add(r.buf)
	return r
}

func (r *rankMem) bytes(t testing.TB) []byte {
	b, err := r.dev.Bytes(r.buf.Addr, r.buf.Size)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (r *rankMem) local(peer, notifyNum int) *channel.Local {
	return &channel.Local{Comm: "test", Rank: r.rank, Peer: peer, Device: r.dev, Registry: r.reg, HCCLBuf: r.buf,
		NotifyNum: notifyNum, Name: fmt.Sprintf("rank %d channel to rank %d", r.rank, peer)}
}

// exchangePair returns the two ends of an Exchange carried by Go channels.
func exchangePair() (channel.Exchange, channel.Exchange) {
	ab, ba := make(chan []byte, 1), make(chan []byte, 1)
	mk := func(out, in chan []byte) channel.Exchange {
		return func(ctx context.Context, mine []byte) ([]byte, error) {
			select {
			case out <- mine:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			select {
			case theirs := <-in:
				return theirs, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	return mk(ab, ba), mk(ba, ab)
}

func newDialer(t testing.TB, o Options) *Dialer {
	t.Helper()
	if o.Addr == "" {
		o.Addr = "127.0.0.1"
	}
	d, err := NewDialer(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// pair is a connected channel between rank 0 and rank 1.
type pair struct {
	r0, r1 *rankMem
	c0, c1 *channel.Conn
}

func (p *pair) t0() *conn { return p.c0.Transport.(*conn) }
func (p *pair) t1() *conn { return p.c1.Transport.(*conn) }

func connectPair(t testing.TB, o0, o1 Options, size int64, notifyNum int) *pair {
	t.Helper()
	d0, d1 := newDialer(t, o0), newDialer(t, o1)
	p := &pair{r0: newRankMem(t, 0, size), r1: newRankMem(t, 1, size)}
	e0, e1 := exchangePair()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err1 error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		p.c1, err1 = d1.Connect(ctx, p.r1.local(0, notifyNum), e1)
	}()
	c0, err0 := d0.Connect(ctx, p.r0.local(1, notifyNum), e0)
	wg.Wait()
	p.c0 = c0
	if err0 != nil || err1 != nil {
		t.Fatalf("connect: rank 0: %v; rank 1: %v", err0, err1)
	}
	t.Cleanup(func() {
		p.c0.Transport.Close()
		p.c1.Transport.Close()
	})
	return p
}

func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 7))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

func TestConnectDescribesPeer(t *testing.T) {
	p := connectPair(t, Options{Streams: 3}, Options{Streams: 2}, 4096, 3)
	if len(p.t0().socks) != 2 || len(p.t1().socks) != 2 {
		t.Fatalf("sockets: %d and %d, want the smaller of 3 and 2", len(p.t0().socks), len(p.t1().socks))
	}
	if len(p.c0.Notifies) != 3 || p.c0.PeerNotifyNum != 3 {
		t.Fatalf("notifies %d, peer's %d", len(p.c0.Notifies), p.c0.PeerNotifyNum)
	}
	if len(p.c0.RemoteMems) != 1 || p.c0.RemoteMems[0] != p.r1.buf {
		t.Fatalf("rank 0 sees remote memory %v, want %v", p.c0.RemoteMems, p.r1.buf)
	}
	if p.c1.RemoteMems[0] != p.r0.buf {
		t.Fatalf("rank 1 sees remote memory %v, want %v", p.c1.RemoteMems, p.r0.buf)
	}
	if p.c0.Transport.Name() != "tcp" {
		t.Fatal(p.c0.Transport.Name())
	}
}

func roundLen(r int) int { return 1 + (r*797_003)%(3<<20-1) }

// checkRounds is rank 1 of TestWriteWithNotifyIsVisible: for each round it
// waits for notify 0, checks that the round's roundLen(r) bytes all read r (a
// notify that overtook a write leaves older bytes), and acknowledges with
// notify 1. A failed check cancels ctx, so that rank 0's wait ends at once.
func checkRounds(ctx context.Context, cancel context.CancelFunc, p *pair, m1 []byte, rounds int) <-chan error {
	errc := make(chan error, 1)
	go func() {
		var err error
		defer func() {
			if err != nil {
				cancel()
			}
			errc <- err
		}()
		for r := 1; r <= rounds; r++ {
			if err = p.c1.Notifies[0].WaitNow(ctx); err != nil {
				return
			}
			n := roundLen(r)
			for i := 0; i < n; i++ {
				if m1[i] != byte(r) {
					err = fmt.Errorf("round %d: byte %d of %d is %d: the notify overtook a write", r, i, n, m1[i])
					return
				}
			}
			if err = p.c1.Transport.NotifyRecord(nil, 1); err != nil {
				return
			}
		}
	}()
	return errc
}

// TestWriteWithNotifyIsVisible: the coalesced write and record
// (WriteWithNotify: one small frame and its NOTIFY in one system call)
// after a big write split over four sockets: every wait that returns sees
// the big write's bytes, which travelled on other sockets, and the small
// one's; a write too big for one frame falls back to Write and
// NotifyRecord; a bad notify index is refused before anything is sent.
func TestWriteWithNotifyIsVisible(t *testing.T) {
	const size = 3 << 20
	o := Options{Streams: 4, ChunkSize: 64 << 10}
	p := connectPair(t, o, o, size, 2)
	m0, m1 := p.r0.bytes(t), p.r1.bytes(t)
	wn, ok := p.c0.Transport.(channel.WriteNotifier)
	if !ok {
		t.Fatal("the tcp transport does not implement channel.WriteNotifier")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const rounds = 40
	errc := checkRounds(ctx, cancel, p, m1, rounds)
	for r := 1; r <= rounds; r++ {
		n := roundLen(r)
		for i := 0; i < n; i++ {
			m0[i] = byte(r)
		}
		tail := min(n, 100+r) // one frame, sent with the record
		if r%5 == 0 {
			tail = n // the whole round in one call: several frames, the fallback
		}
		if err := p.c0.Transport.Write(nil, p.r1.buf.Addr, m0[:n-tail]); err != nil {
			t.Fatal(err)
		}
		var stop chan struct{}
		if r%2 == 0 {
			stop = make(chan struct{}) // the watched path
		}
		if err := wn.WriteWithNotify(stop, p.r1.buf.Addr+device.Ptr(n-tail), m0[n-tail:n], 0); err != nil {
			t.Fatal(err)
		}
		if err := p.c0.Notifies[1].WaitNow(ctx); err != nil {
			t.Fatalf("round %d: %v (checker: %v)", r, err, <-errc)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	m1[0] = 0xAA
	if err := wn.WriteWithNotify(nil, p.r1.buf.Addr, m0[:8], 2); err == nil || !strings.Contains(err.Error(), "no notify 2") {
		t.Fatalf("notify index 2 of 2: %v", err)
	}
	time.Sleep(20 * time.Millisecond)
	if m1[0] != 0xAA {
		t.Fatal("a refused WriteWithNotify wrote its bytes")
	}
}

func TestConnectGivesUp(t *testing.T) {
	d1 := newDialer(t, Options{})
	r1 := newRankMem(t, 1, 4096)
	fake := &hello{rank: 0, streams: 2, notifyNum: 1, addrs: []string{"127.0.0.1:1"}, mems: []channel.Mem{{Addr: 4096, Size: 4096}}}
	ex := func(ctx context.Context, mine []byte) ([]byte, error) { return fake.marshal(), nil }
	// Rank 0 never dials: the context ends the wait.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := d1.Connect(ctx, r1.local(0, 1), ex); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "rank 1 channel to rank 0") {
		t.Fatalf("connect without a dialing peer: %v", err)
	}
	// Closing the Dialer ends it too.
	errc := make(chan error, 1)
	go func() {
		_, err := d1.Connect(context.Background(), r1.local(0, 1), ex)
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	d1.Close()
	if err := <-errc; !errors.Is(err, channel.ErrClosed) {
		t.Fatalf("connect across Dialer.Close: %v", err)
	}
	// A hello from the wrong rank is refused.
	d2 := newDialer(t, Options{})
	fake.rank = 5
	if _, err := d2.Connect(context.Background(), r1.local(0, 1), ex); !errors.Is(err, channel.ErrRefused) {
		t.Fatalf("hello from rank 5 on the channel to rank 0: %v", err)
	}
}

func TestCallerChecks(t *testing.T) {
	p := connectPair(t, Options{Streams: 1}, Options{Streams: 1}, 4096, 1)
	m0 := p.r0.bytes(t)
	tr := p.c0.Transport
	if err := tr.NotifyRecord(nil, 1); err == nil || !strings.Contains(err.Error(), "no notify 1") {
		t.Fatalf("record of a notify the peer lacks: %v", err)
	}
	if err := tr.WriteReduce(nil, p.r1.buf.Addr, m0[:8], 3, reduce.Float32, reduce.Sum); err == nil {
		t.Fatal("write-reduce of 3 float32 from 8 bytes succeeded")
	}
	if err := tr.ReadReduce(nil, m0[:8], p.r1.buf.Addr, 1, reduce.DataType(99), reduce.Sum); err == nil {
		t.Fatal("read-reduce of an unknown data type succeeded")
	}
	stop := make(chan struct{})
	close(stop)
	if err := tr.Write(stop, p.r1.buf.Addr, m0[:8]); !errors.Is(err, device.ErrStreamAbort) {
		t.Fatalf("write with a closed stop: %v", err)
	}
	if err := tr.Fence(nil); err != nil {
		t.Fatalf("the channel suffered from the checks: %v", err)
	}
}

// rawPeer is rank 0 played by the test: it passed the handshake of rank 1's
// Dialer with the right secret and speaks frames by hand.
type rawPeer struct {
	r1    *rankMem
	c1    *channel.Conn
	nc    net.Conn
	hello *hello
}

func connectRaw(t *testing.T, o Options) *rawPeer {
	t.Helper()
	o.Streams = 1
	d1 := newDialer(t, o)
	d0 := newDialer(t, Options{Secret: o.Secret}) // only to run the dialing half of the handshake
	rp := &rawPeer{r1: newRankMem(t, 1, 1<<16)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fake := &hello{rank: 0, streams: 1, notifyNum: 1, addrs: []string{"127.0.0.1:1"}, mems: []channel.Mem{{Addr: 4096, Size: 4096}}}
	got := make(chan []byte, 1)
	ex := func(ctx context.Context, mine []byte) ([]byte, error) {
		got <- mine
		return fake.marshal(), nil
	}
	var err1 error
	done := make(chan struct{})
	go func() {
		defer close(done)
		rp.c1, err1 = d1.Connect(ctx, rp.r1.local(0, 2), ex)
	}()
	h, err := parseHello(<-got)
	if err != nil {
		t.Fatal(err)
	}
	rp.hello = h
	rp.nc, err = d0.dialOne(ctx, h.addrs[0], 0, h.nonce, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	<-done
	if err1 != nil {
		t.Fatal(err1)
	}
	t.Cleanup(func() {
		rp.nc.Close()
		rp.c1.Transport.Close()
	})
	return rp
}

func (rp *rawPeer) send(t *testing.T, ty frameType, dt reduce.DataType, op reduce.Op, id, addr, size uint64, payload []byte) {
	t.Helper()
	h := make(header, headerLen)
	h.encode(ty, dt, op, uint32(len(payload)), id, addr, size)
	if _, err := rp.nc.Write(append(h, payload...)); err != nil {
		t.Fatal(err)
	}
}

// readFrame reads the next frame the transport sent, skipping heartbeats.
func (rp *rawPeer) readFrame(t *testing.T) (header, []byte) {
	t.Helper()
	rp.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		h := make(header, headerLen)
		if _, err := io.ReadFull(rp.nc, h); err != nil {
			t.Fatalf("reading a frame: %v", err)
		}
		p := make([]byte, h.length())
		if _, err := io.ReadFull(rp.nc, p); err != nil {
			t.Fatalf("reading a payload: %v", err)
		}
		if h.typ() != framePing {
			return h, p
		}
	}
}

func TestBadFramesAreRefused(t *testing.T) {
	vec := make([]byte, 8) // ordering vector of a 1-socket channel: nothing before
	cases := []struct {
		name  string
		frame func(rp *rawPeer, victim device.Ptr) (frameType, reduce.DataType, reduce.Op, uint64, uint64, uint64, []byte)
		want  string
	}{
		{"write to unregistered memory", func(rp *rawPeer, v device.Ptr) (frameType, reduce.DataType, reduce.Op, uint64, uint64, uint64, []byte) {
			return frameWrite, 0, 0, 0, uint64(v), 0, bytes.Repeat([]byte{0xEE}, 64)
		}, "outside the memory rank 1 registered"},
		{"write past the end of the buffer", func(rp *rawPeer, v device.Ptr) (frameType, reduce.DataType, reduce.Op, uint64, uint64, uint64, []byte) {
			return frameWrite, 0, 0, 0, uint64(rp.r1.buf.Addr) + uint64(rp.r1.buf.Size) - 8, 0, bytes.Repeat([]byte{0xEE}, 16)
		}, "outside the memory rank 1 registered"},
		{"write-reduce to unregistered memory", func(rp *rawPeer, v device.Ptr) (frameType, reduce.DataType, reduce.Op, uint64, uint64, uint64, []byte) {
			return frameWriteReduce, reduce.Int32, reduce.Sum, 0, uint64(v), 0, bytes.Repeat([]byte{1}, 64)
		}, "outside the memory rank 1 registered"},
		{"read of unregistered memory", func(rp *rawPeer, v device.Ptr) (frameType, reduce.DataType, reduce.Op, uint64, uint64, uint64, []byte) {
			return frameRead, 0, 0, 1, uint64(v), 64, vec
		}, "outside the memory rank 1 registered"},
		{"read wrapping around", func(rp *rawPeer, v device.Ptr) (frameType, reduce.DataType, reduce.Op, uint64, uint64, uint64, []byte) {
			return frameRead, 0, 0, 1, math.MaxUint64 - 8, 64, vec
		}, "wraps around"},
		{"notify out of range", func(rp *rawPeer, v device.Ptr) (frameType, reduce.DataType, reduce.Op, uint64, uint64, uint64, []byte) {
			return frameNotify, 0, 0, 2, 0, 0, vec
		}, "notify 2 does not exist"},
		{"unknown type", func(rp *rawPeer, v device.Ptr) (frameType, reduce.DataType, reduce.Op, uint64, uint64, uint64, []byte) {
			return 77, 0, 0, 0, 0, 0, nil
		}, "unknown frame type 77"},
		{"response to a read never sent", func(rp *rawPeer, v device.Ptr) (frameType, reduce.DataType, reduce.Op, uint64, uint64, uint64, []byte) {
			return frameReadResp, 0, 0, 42, 0, 0, []byte{1, 2, 3}
		}, "never sent"},
		{"write padded past its payload", func(rp *rawPeer, v device.Ptr) (frameType, reduce.DataType, reduce.Op, uint64, uint64, uint64, []byte) {
			return frameWrite, 0, 9, 0, uint64(rp.r1.buf.Addr), 0, []byte("hello")
		}, "pads its data by 9 bytes"},
		{"write padded by more than a cache line", func(rp *rawPeer, v device.Ptr) (frameType, reduce.DataType, reduce.Op, uint64, uint64, uint64, []byte) {
			return frameWrite, 0, 64, 0, uint64(rp.r1.buf.Addr), 0, make([]byte, 200)
		}, "pads its data by 64 bytes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var logBuf syncBuffer
			rp := connectRaw(t, Options{Secret: []byte("s3cret"), Logger: slog.New(slog.NewTextHandler(&logBuf, nil))})
			victim, err := rp.r1.dev.Malloc(4096) // rank 1's memory, never registered
			if err != nil {
				t.Fatal(err)
			}
			vb, _ := rp.r1.dev.Bytes(victim, 4096)
			fill(vb, 3)
			want := append([]byte(nil), vb...)
			mine := rp.r1.bytes(t)
			fill(mine, 4)
			wantMine := append([]byte(nil), mine...)
			ty, dt, op, id, addr, size, payload := tc.frame(rp, victim)
			rp.send(t, ty, dt, op, id, addr, size, payload)
			// The transport answers with ERROR, naming the reason, and hangs up.
			h, text := rp.readFrame(t)
			if h.typ() != frameError || !strings.Contains(string(text), tc.want) {
				t.Fatalf("got %v %q, want an ERROR saying %q", h, text, tc.want)
			}
			err = rp.c1.Transport.Fence(nil)
			if !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "rank 1 channel to rank 0") {
				t.Fatalf("the channel after a bad frame: %v", err)
			}
			t.Logf("rank 1 after the frame: %v", err)
			if !bytes.Equal(vb, want) || !bytes.Equal(mine, wantMine) {
				t.Fatal("a refused frame changed rank 1's memory")
			}
			if !logSays(&logBuf, 5*time.Second, tc.want) {
				t.Fatalf("log does not say %q: %s", tc.want, logBuf.String())
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := rp.c1.Notifies[0].WaitNow(ctx); !errors.Is(err, ErrProtocol) {
				t.Fatalf("a wait on the dead channel: %v", err)
			}
		})
	}
}

// TestRefusalReachesSender: rank 1 unregisters memory after connecting;
// rank 0's write into it is refused by rank 1, and rank 0 learns why.
func TestRefusalReachesSender(t *testing.T) {
	p := connectPair(t, Options{Streams: 2}, Options{Streams: 2}, 1<<20, 1)
	extra, err := p.r1.dev.Malloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	p.r1.reg.Add(channel.Mem{Tag: "user", Addr: extra, Size: 4096})
	xb, _ := p.r1.dev.Bytes(extra, 4096)
	if err := p.c0.Transport.Write(nil, extra, make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	if err := p.c0.Transport.Fence(nil); err != nil {
		t.Fatal(err)
	}
	p.r1.reg.Remove(extra, "user")
	fill(xb, 1)
	want := append([]byte(nil), xb...)
	if err := p.c0.Transport.Write(nil, extra+100, bytes.Repeat([]byte{7}, 1000)); err != nil {
		t.Fatal(err) // handed to the kernel: the refusal comes later
	}
	err = p.c0.Transport.Fence(nil)
	if !errors.Is(err, channel.ErrPeerLost) || !strings.Contains(err.Error(), "outside the memory rank 1 registered") {
		t.Fatalf("rank 0 after the refused write: %v", err)
	}
	t.Logf("rank 0: %v", err)
	if !bytes.Equal(xb, want) {
		t.Fatal("the refused write reached rank 1's memory")
	}
}

// TestRawPeerFrames checks a hand-made peer's valid frames land where they say.
func TestRawPeerFrames(t *testing.T) {
	rp := connectRaw(t, Options{})
	mine := rp.r1.bytes(t)
	clear(mine)
	rp.send(t, frameWrite, 0, 0, 0, uint64(rp.r1.buf.Addr)+100, 0, []byte("hello"))
	rp.send(t, frameNotify, 0, 0, 1, 0, 0, make([]byte, 8))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rp.c1.Notifies[1].WaitNow(ctx); err != nil {
		t.Fatal(err)
	}
	if string(mine[100:105]) != "hello" {
		t.Fatalf("memory holds %q", mine[100:105])
	}
	// A padded write: its padding is skipped, whatever it holds.
	rp.send(t, frameWrite, 0, 3, 0, uint64(rp.r1.buf.Addr)+200, 0, []byte("xyzworld"))
	rp.send(t, frameNotify, 0, 0, 1, 0, 0, []byte{0, 0, 0, 0, 0, 0, 0, 3})
	if err := rp.c1.Notifies[1].WaitNow(ctx); err != nil {
		t.Fatal(err)
	}
	if string(mine[200:205]) != "world" || mine[205] != 0 {
		t.Fatalf("memory holds %q after a padded write", mine[200:206])
	}
	// A notify that claims an earlier frame on its socket that never came.
	rp.send(t, frameNotify, 0, 0, 1, 0, 0, []byte{0, 0, 0, 0, 0, 0, 0, 99})
	if h, text := rp.readFrame(t); h.typ() != frameError || !strings.Contains(string(text), "earlier frames") {
		t.Fatalf("got %v %q", h, text)
	}
}

// The transport pads a WRITE of padMin bytes and more so that its data
// starts a multiple of 64 bytes into the frame (dataPad), and no smaller
// one; with its NOTIFY (writePair) alike.
func TestWritesPadTheirData(t *testing.T) {
	rp := connectRaw(t, Options{})
	at := device.Ptr(4096) // the fake peer's memory (connectRaw): 4096 bytes at 4096
	for _, c := range []struct {
		n      int
		notify bool
	}{{100, false}, {padMin, false}, {padMin - 1, true}, {padMin, true}} {
		data := make([]byte, c.n)
		fill(data, uint64(c.n))
		var err error
		if c.notify {
			err = rp.c1.Transport.(*conn).WriteWithNotify(nil, at, data, 0)
		} else {
			err = rp.c1.Transport.Write(nil, at, data)
		}
		if err != nil {
			t.Fatal(err)
		}
		h, p := rp.readFrame(t)
		if h.typ() != frameWrite || h.addr() != uint64(at) {
			t.Fatalf("%d bytes: got %v", c.n, h)
		}
		start := headerLen + int(h.size()) + int(h.pad())
		if c.n >= padMin && start%64 != 0 {
			t.Errorf("%d bytes: the data starts %d bytes into the frame (vector %d, pad %d)", c.n, start, h.size(), h.pad())
		}
		if c.n < padMin && h.pad() != 0 {
			t.Errorf("%d bytes: padded by %d", c.n, h.pad())
		}
		if !bytes.Equal(p[start-headerLen:], data) {
			t.Errorf("%d bytes: the frame's data differs from what was written", c.n)
		}
		if c.notify {
			if h, _ := rp.readFrame(t); h.typ() != frameNotify {
				t.Fatalf("%d bytes: after the write, %v", c.n, h)
			}
		}
	}
}

// syncBuffer is a bytes.Buffer safe for the logger's concurrent writes.
// logSays reports whether b comes to hold every one of want within d.
func logSays(b *syncBuffer, d time.Duration, want ...string) bool {
	deadline := time.Now().Add(d)
	for {
		s, all := b.String(), true
		for _, w := range want {
			all = all && strings.Contains(s, w)
		}
		if all || time.Now().After(deadline) {
			return all
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestWrongSecretIsRefused(t *testing.T) {
	var logBuf syncBuffer
	secret := []byte("the right secret")
	d1 := newDialer(t, Options{Secret: secret, Logger: slog.New(slog.NewTextHandler(&logBuf, nil))})
	d0 := newDialer(t, Options{Secret: secret})
	impostor := newDialer(t, Options{Secret: []byte("a guess")})
	r0, r1 := newRankMem(t, 0, 4096), newRankMem(t, 1, 4096)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	hello1 := make(chan []byte, 1)
	hello0 := make(chan []byte, 1)
	ex1 := func(ctx context.Context, mine []byte) ([]byte, error) {
		hello1 <- mine
		return <-hello0, nil
	}
	var c1 *channel.Conn
	var err1 error
	done := make(chan struct{})
	go func() {
		defer close(done)
		c1, err1 = d1.Connect(ctx, r1.local(0, 1), ex1)
	}()
	h1b := <-hello1
	h1, err := parseHello(h1b)
	if err != nil {
		t.Fatal(err)
	}
	// The impostor knows the channel's nonce and address, not the secret.
	if _, err := impostor.dialOne(ctx, h1.addrs[0], 0, h1.nonce, 0, 2); !errors.Is(err, channel.ErrRefused) {
		t.Fatalf("impostor: %v, want channel.ErrRefused", err)
	}
	// The real rank 0 connects afterwards.
	ex0 := func(ctx context.Context, mine []byte) ([]byte, error) {
		hello0 <- mine
		return h1b, nil
	}
	c0, err := d0.Connect(ctx, r0.local(1, 1), ex0)
	<-done
	if err != nil || err1 != nil {
		t.Fatalf("rank 0: %v; rank 1: %v", err, err1)
	}
	defer c0.Transport.Close()
	defer c1.Transport.Close()
	if err := c0.Transport.NotifyRecord(nil, 0); err != nil {
		t.Fatal(err)
	}
	if err := c1.Notifies[0].WaitNow(ctx); err != nil {
		t.Fatal(err)
	}
	// The acceptor logs a refusal after it has answered it: the impostor
	// may see the refusal before the line is written.
	if !logSays(&logBuf, 5*time.Second, "refused connection", "proof of the secret is wrong") {
		t.Fatalf("the refusal was not logged: %s", logBuf.String())
	}
	if strings.Contains(logBuf.String(), string(secret)) {
		t.Fatal("the secret appears in the log")
	}
}

// TestOneLostSocketFailsChannel: one of the channel's two sockets dies
// while the other lives (channeltest's PeerLoss kills them all): the whole
// channel fails at once, naming the peer, since the frames that socket
// carried are lost.
func TestOneLostSocketFailsChannel(t *testing.T) {
	p := connectPair(t, Options{Streams: 2}, Options{Streams: 2}, 4096, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- p.c1.Notifies[0].WaitNow(ctx) }()
	time.Sleep(20 * time.Millisecond) // let the wait sleep
	start := time.Now()
	p.t0().socks[1].nc.Close()
	err := <-errc
	if !errors.Is(err, channel.ErrPeerLost) || !strings.Contains(err.Error(), "channel to rank 0") {
		t.Fatalf("wait: %v, want channel.ErrPeerLost naming rank 0", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the wait took %v to notice", d)
	}
	if err := p.c1.Transport.Write(nil, p.r0.buf.Addr, make([]byte, 8)); !errors.Is(err, channel.ErrPeerLost) {
		t.Fatalf("a later write: %v", err)
	}
	if err := p.c1.Notifies[1].WaitNow(ctx); !errors.Is(err, channel.ErrPeerLost) {
		t.Fatalf("a later wait: %v", err)
	}
}

// TestSilentPeerIsDetected puts a proxy between the ranks that stops
// forwarding without closing anything: only the heartbeat can tell.
func TestSilentPeerIsDetected(t *testing.T) {
	const timeout = 600 * time.Millisecond
	d1 := newDialer(t, Options{PeerTimeout: timeout})
	px := newProxy(t, d1.Addr().String())
	d1.adv = []string{px.addr()}
	d0 := newDialer(t, Options{PeerTimeout: timeout})
	r0, r1 := newRankMem(t, 0, 4096), newRankMem(t, 1, 4096)
	e0, e1 := exchangePair()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var c1 *channel.Conn
	var err1 error
	done := make(chan struct{})
	go func() {
		defer close(done)
		c1, err1 = d1.Connect(ctx, r1.local(0, 1), e1)
	}()
	c0, err0 := d0.Connect(ctx, r0.local(1, 1), e0)
	<-done
	if err0 != nil || err1 != nil {
		t.Fatal(err0, err1)
	}
	defer c0.Transport.Close()
	defer c1.Transport.Close()
	time.Sleep(3 * timeout) // heartbeats keep an idle channel alive, for several timeouts
	if err := c1.Transport.Fence(nil); err != nil {
		t.Fatalf("idle channel died: %v", err)
	}
	errc := make(chan error, 1)
	go func() { errc <- c1.Notifies[0].WaitNow(ctx) }()
	start := time.Now()
	px.silence()
	err := <-errc
	if !errors.Is(err, channel.ErrPeerLost) || !strings.Contains(err.Error(), "rank 0") {
		t.Fatalf("wait: %v", err)
	}
	if d := time.Since(start); d > 5*timeout {
		t.Fatalf("a silent peer went unnoticed for %v", d)
	}
	t.Logf("silent peer noticed after %v: %v", time.Since(start).Round(time.Millisecond), err)
}

// proxy forwards TCP connections to target until silenced, then swallows
// everything without closing.
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	quiet  bool
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	px := &proxy{ln: ln, target: target}
	px.wg.Add(1)
	go px.loop()
	t.Cleanup(func() {
		ln.Close()
		px.mu.Lock()
		for _, c := range px.conns {
			c.Close()
		}
		px.mu.Unlock()
		px.wg.Wait()
	})
	return px
}

func (px *proxy) addr() string { return px.ln.Addr().String() }

func (px *proxy) silence() {
	px.mu.Lock()
	px.quiet = true
	px.mu.Unlock()
}

func (px *proxy) loop() {
	defer px.wg.Done()
	for {
		a, err := px.ln.Accept()
		if err != nil {
			return
		}
		b, err := net.Dial("tcp", px.target)
		if err != nil {
			a.Close()
			continue
		}
		px.mu.Lock()
		px.conns = append(px.conns, a, b)
		px.mu.Unlock()
		px.wg.Add(2)
		go px.pipe(a, b)
		go px.pipe(b, a)
	}
}

func (px *proxy) pipe(from, to net.Conn) {
	defer px.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if err != nil {
			return
		}
		px.mu.Lock()
		quiet := px.quiet
		px.mu.Unlock()
		if !quiet {
			if _, err := to.Write(buf[:n]); err != nil {
				return
			}
		}
	}
}

func TestStopAbortsBlockedCalls(t *testing.T) {
	// Made before the calls start: under the race detector and a loaded
	// machine, zeroing 48 MiB inside the call could outlast the 100 ms the
	// test waits before it closes stop, and the call would then be stopped
	// before it started, leaving the channel alive.
	big := make([]byte, 48<<20)
	calls := []struct {
		name  string
		call  func(tr channel.Transport, mine []byte, stop <-chan struct{}) error
		kills bool // whether the abort must close the channel
	}{
		{"Fence", func(tr channel.Transport, mine []byte, stop <-chan struct{}) error { return tr.Fence(stop) }, false},
		{"Read", func(tr channel.Transport, mine []byte, stop <-chan struct{}) error {
			return tr.Read(stop, mine[:100], 4096)
		}, false},
		{"ReadReduce", func(tr channel.Transport, mine []byte, stop <-chan struct{}) error {
			return tr.ReadReduce(stop, mine[:100], 4096, 25, reduce.Float32, reduce.Sum)
		}, false},
		{"Write of one 1 MiB frame", func(tr channel.Transport, mine []byte, stop <-chan struct{}) error {
			return tr.Write(stop, 4096, big[:1<<20])
		}, true},
		{"Write of 48 MiB in chunks", func(tr channel.Transport, mine []byte, stop <-chan struct{}) error {
			return tr.Write(stop, 4096, big)
		}, true},
		// One write and its notify in one system call (writePair), whose
		// watchdog is armed once the kernel stops taking bytes.
		{"WriteWithNotify of 1 MiB", func(tr channel.Transport, mine []byte, stop <-chan struct{}) error {
			return tr.(channel.WriteNotifier).WriteWithNotify(stop, 4096, big[:1<<20], 0)
		}, true},
	}
	for _, c := range calls {
		// The raw peer never reads nor answers; small buffers fill at once.
		rp := connectRaw(t, Options{SocketBuffer: 64 << 10})
		tr := rp.c1.Transport
		stop := make(chan struct{})
		errc := make(chan error, 1)
		go func() { errc <- c.call(tr, rp.r1.bytes(t), stop) }()
		select {
		case err := <-errc:
			t.Fatalf("%s returned before stop: %v", c.name, err)
		case <-time.After(100 * time.Millisecond):
		}
		start := time.Now()
		close(stop)
		select {
		case err := <-errc:
			if !errors.Is(err, device.ErrStreamAbort) || device.CodeOf(err) != device.ErrStreamAbort {
				t.Fatalf("%s: %v, want ErrStreamAbort", c.name, err)
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("%s ignored stop", c.name)
		}
		t.Logf("%s returned %v after stop", c.name, time.Since(start).Round(time.Microsecond))
		if alive := tr.(*conn).failure() == nil; alive == c.kills {
			t.Fatalf("%s: channel alive = %v after the abort", c.name, alive)
		}
		if !c.kills {
			if err := tr.NotifyRecord(nil, 0); err != nil {
				t.Fatalf("%s: the channel does not work after the abort: %v", c.name, err)
			}
		}
	}
}

func TestCloseReleasesEverything(t *testing.T) {
	r0, r1 := newRankMem(t, 0, 1<<20), newRankMem(t, 1, 1<<20)
	m0 := r0.bytes(t)
	fds := openFDs(t)
	for range 3 {
		d0, err := NewDialer(Options{Addr: "127.0.0.1", Streams: 4})
		if err != nil {
			t.Fatal(err)
		}
		d1, err := NewDialer(Options{Addr: "127.0.0.1", Streams: 4})
		if err != nil {
			t.Fatal(err)
		}
		e0, e1 := exchangePair()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var c1 *channel.Conn
		var err1 error
		done := make(chan struct{})
		go func() {
			defer close(done)
			c1, err1 = d1.Connect(ctx, r1.local(0, 1), e1)
		}()
		c0, err0 := d0.Connect(ctx, r0.local(1, 1), e0)
		<-done
		cancel()
		if err0 != nil || err1 != nil {
			t.Fatal(err0, err1)
		}
		if err := c0.Transport.Write(nil, r1.buf.Addr, m0); err != nil {
			t.Fatal(err)
		}
		if err := c1.Transport.Read(nil, m0[:1000], r0.buf.Addr); err != nil {
			t.Fatal(err)
		}
		for _, c := range []*channel.Conn{c0, c1, c0} { // twice: Close is idempotent
			if err := c.Transport.Close(); err != nil {
				t.Fatal(err)
			}
		}
		if err := c0.Transport.Write(nil, r1.buf.Addr, m0[:1]); !errors.Is(err, channel.ErrClosed) {
			t.Fatalf("write after close: %v", err)
		}
		if err := c1.Notifies[0].WaitNow(context.Background()); !errors.Is(err, channel.ErrClosed) && !errors.Is(err, channel.ErrPeerClosed) {
			t.Fatalf("wait after close: %v", err)
		}
		for _, d := range []*Dialer{d0, d1, d0} {
			d.Close()
		}
	}
	if left := leakcheck.Leaked(5 * time.Second); left != "" {
		t.Fatalf("goroutines left after Close:\n%s", left)
	}
	if fds >= 0 {
		deadline := time.Now().Add(2 * time.Second)
		for openFDs(t) != fds && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := openFDs(t); n != fds {
			t.Fatalf("%d file descriptors open after Close, %d before", n, fds)
		}
	}
}

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents)
}

func TestNewDialerOptions(t *testing.T) {
	for _, addr := range []string{"127.0.0.1", "127.0.0.1:0", ""} {
		d, err := NewDialer(Options{Addr: addr})
		if err != nil {
			t.Fatalf("Addr %q: %v", addr, err)
		}
		if len(d.adv) == 0 {
			t.Fatalf("Addr %q advertises nothing", addr)
		}
		if addr != "" && d.adv[0] != d.Addr().String() {
			t.Fatalf("Addr %q advertises %v, listens on %v", addr, d.adv, d.Addr())
		}
		if addr == "" && !strings.HasPrefix(d.adv[len(d.adv)-1], "127.") && !strings.HasPrefix(d.adv[len(d.adv)-1], "[::1]") {
			t.Fatalf("all interfaces: loopback should come last in %v", d.adv)
		}
		d.Close()
		d.Close()
	}
	for _, o := range []Options{{Addr: "256.1.1.1"}, {Streams: 65}, {Streams: -1}, {ChunkSize: maxPayload + 1},
		{Advertise: []string{"no port"}}} {
		if d, err := NewDialer(o); err == nil {
			d.Close()
			t.Fatalf("NewDialer(%+v) succeeded", o)
		}
	}
	d := newDialer(t, Options{})
	d.Close()
	r := newRankMem(t, 0, 4096)
	if _, err := d.Connect(context.Background(), r.local(1, 1), nil); !errors.Is(err, channel.ErrClosed) {
		t.Fatalf("Connect on a closed Dialer: %v", err)
	}
}

// TestRing runs six ranks on a ring (more ranks than cores): each round,
// every rank writes a block to its right neighbour and records its notify,
// then waits for its left neighbour's block and checks it.
func TestRing(t *testing.T) {
	const n, block, rounds = 6, 96 << 10, 15
	ranks := make([]*rankMem, n)
	dialers := make([]*Dialer, n)
	for i := range n {
		ranks[i] = newRankMem(t, i, 2*block)
		dialers[i] = newDialer(t, Options{Streams: 2, ChunkSize: 32 << 10})
	}
	// right[i] is rank i's channel to i+1, left[i] its channel to i-1.
	right, left := make([]*channel.Conn, n), make([]*channel.Conn, n)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for i := range n {
		j := (i + 1) % n
		ei, ej := exchangePair()
		wg.Add(2)
		go func() {
			defer wg.Done()
			c, err := dialers[i].Connect(ctx, ranks[i].local(j, 1), ei)
			right[i] = c
			if err != nil {
				errs <- err
			}
		}()
		go func() {
			defer wg.Done()
			c, err := dialers[j].Connect(ctx, ranks[j].local(i, 1), ej)
			left[j] = c
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	defer func() {
		for i := range n {
			right[i].Transport.Close()
			left[i].Transport.Close()
		}
	}()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mem := ranks[i].bytes(t)
			next := ranks[(i+1)%n]
			for r := range rounds {
				// The first half is what this rank sends, the second what it receives.
				out := mem[:block]
				for k := range out {
					out[k] = byte(i + r)
				}
				if err := right[i].Transport.Write(nil, next.buf.Addr+block, out); err != nil {
					errs <- err
					return
				}
				if err := right[i].Transport.NotifyRecord(nil, 0); err != nil {
					errs <- err
					return
				}
				if err := left[i].Notifies[0].WaitNow(ctx); err != nil {
					errs <- err
					return
				}
				from := (i + n - 1) % n
				for k, v := range mem[block:] {
					if v != byte(from+r) {
						errs <- fmt.Errorf("rank %d round %d: byte %d is %d, want %d", i, r, k, v, byte(from+r))
						cancel()
						return
					}
				}
				// Tell the left neighbour its block was consumed.
				if err := left[i].Transport.NotifyRecord(nil, 0); err != nil {
					errs <- err
					return
				}
				if err := right[i].Notifies[0].WaitNow(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestStuckSendIsDetected: a write that stays under way (its socket held,
// its count odd) for longer than the peer timeout fails the channel with
// an error saying the send is stuck — the monitor reads the writes' count,
// not a clock the write keeps. (A held socket sends no heartbeat either, so
// the peer's side is not what is checked here.)
func TestStuckSendIsDetected(t *testing.T) {
	const timeout = 400 * time.Millisecond
	p := connectPair(t, Options{PeerTimeout: timeout, Streams: 1}, Options{PeerTimeout: 20 * timeout, Streams: 1}, 4096, 1)
	c0, c1, r0 := p.c0, p.c1, p.r0
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Rank 1 keeps writing, so that rank 0 hears from it throughout.
	stopW := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopW:
				return
			case <-tick.C:
				c1.Transport.Write(nil, r0.buf.Addr, make([]byte, 8))
			}
		}
	}()
	s := c0.Transport.(*conn).socks[0]
	s.wmu.Lock()
	s.wseq.Add(1) // a write begun that does not end
	start := time.Now()
	err := c0.Notifies[0].WaitNow(ctx)
	s.wseq.Add(1)
	s.wmu.Unlock()
	close(stopW)
	wg.Wait()
	if !errors.Is(err, channel.ErrPeerLost) || !strings.Contains(err.Error(), "stuck") {
		t.Fatalf("wait: %v, want a stuck send", err)
	}
	if d := time.Since(start); d < timeout || d > 3*timeout {
		t.Fatalf("the stuck send was noticed after %v, want between %v and %v", d, timeout, 3*timeout)
	}
}

// TestDefaultSocketBuffer: a Dialer asks for DefaultSocketBuffer only where
// the kernel's caps grant it whole, and otherwise leaves the buffers to
// autotuning (a capped request would stop the kernel growing them); a
// SocketBuffer the caller set is kept.
func TestDefaultSocketBuffer(t *testing.T) {
	const stock = 212992
	for _, c := range []struct{ r, w, want int }{
		{4 << 20, 4 << 20, DefaultSocketBuffer},
		{32 << 20, 8 << 20, DefaultSocketBuffer},
		{stock, stock, -1},
		{4 << 20, stock, -1},
		{stock, 4 << 20, -1},
		{0, 0, -1}, // unknown
	} {
		if got := defaultBuffer(c.r, c.w); got != c.want {
			t.Errorf("rmem_max %d, wmem_max %d: asks for %d, want %d", c.r, c.w, got, c.want)
		}
	}
	dir := t.TempDir()
	for text, want := range map[string]int{"4194304\n": 4194304, "212992": 212992, "x": 0, "-5": 0} {
		p := filepath.Join(dir, "cap")
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		if got := readCap(p); got != want {
			t.Errorf("readCap(%q) = %d, want %d", text, got, want)
		}
	}
	if got := readCap(filepath.Join(dir, "none")); got != 0 {
		t.Errorf("readCap of a missing file = %d, want 0", got)
	}
	d, err := NewDialer(Options{Addr: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if want := defaultBuffer(readCap("/proc/sys/net/core/rmem_max"), readCap("/proc/sys/net/core/wmem_max")); d.opts.SocketBuffer != want {
		t.Errorf("a Dialer on this host asks for %d, want %d", d.opts.SocketBuffer, want)
	}
	d2, err := NewDialer(Options{Addr: "127.0.0.1", SocketBuffer: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if d2.opts.SocketBuffer != 1<<20 {
		t.Errorf("a SocketBuffer the caller set became %d", d2.opts.SocketBuffer)
	}
}
