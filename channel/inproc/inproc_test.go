package inproc

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/bootstrap"
	"github.com/hcomm-dev/hcomm/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

type end struct {
	dev   *device.Device
	reg   *channel.Registry
	buf   device.Ptr
	local *channel.Local
}

func newEnd(t *testing.T, rank, peer int) *end {
	t.Helper()
	dev, err := device.Open(rank)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	buf, err := dev.Malloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	reg := &channel.Registry{}
	m := channel.Mem{Tag: "hccl buffer", Addr: buf, Size: 4096}
	reg.Add(m)
	return &end{dev: dev, reg: reg, buf: buf, local: &channel.Local{Comm: "t", Rank: rank, Peer: peer, Device: dev,
		Registry: reg, HCCLBuf: m, NotifyNum: 2, Name: "test channel"}}
}

func exchange(s bootstrap.Store, me, peer string) channel.Exchange {
	n := 0
	return func(ctx context.Context, mine []byte) ([]byte, error) {
		n++
		return bootstrap.Exchange(ctx, s, "x/"+string(rune('0'+n)), me, peer, mine)
	}
}

// connectPair connects rank 0 over d0 and rank 1 over d1.
func connectPair(t *testing.T, d0, d1 *Dialer, e0, e1 *end) ([2]*channel.Conn, [2]error) {
	s := bootstrap.NewMemStore()
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var conns [2]*channel.Conn
	var errs [2]error
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); conns[0], errs[0] = d0.Connect(ctx, e0.local, exchange(s, "0", "1")) }()
	go func() { defer wg.Done(); conns[1], errs[1] = d1.Connect(ctx, e1.local, exchange(s, "1", "0")) }()
	wg.Wait()
	return conns, errs
}

// connected connects rank 0 and rank 1 over a fresh fabric; the test's
// end closes both ends.
func connected(t *testing.T) (e0, e1 *end, conns [2]*channel.Conn) {
	t.Helper()
	e0, e1 = newEnd(t, 0, 1), newEnd(t, 1, 0)
	d := NewDialer(NewFabric())
	conns, errs := connectPair(t, d, d, e0, e1)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	t.Cleanup(func() { conns[0].Transport.Close(); conns[1].Transport.Close() })
	return e0, e1, conns
}

// TestDialerWithdrawsEndpoints: a connect leaves nothing on the fabric, and
// the notifies carry the channel's name. What the channel does is
// channeltest's (TestConformance).
func TestDialerWithdrawsEndpoints(t *testing.T) {
	f := NewFabric()
	d := NewDialer(f)
	defer d.Close()
	e0, e1 := newEnd(t, 0, 1), newEnd(t, 1, 0)
	conns, errs := connectPair(t, d, d, e0, e1)
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if f.Len() != 0 {
		t.Fatalf("fabric keeps %d endpoints after the connect", f.Len())
	}
	for r, c := range conns {
		if !strings.Contains(c.Notifies[1].Name(), "test channel notify 1") {
			t.Fatalf("rank %d's notify 1 is named %q", r, c.Notifies[1].Name())
		}
	}
}

// Ends on different fabrics (different processes, or InitAll groups) cannot
// connect, and both say why instead of hanging.
func TestDialerOtherFabric(t *testing.T) {
	e0, e1 := newEnd(t, 0, 1), newEnd(t, 1, 0)
	_, errs := connectPair(t, NewDialer(NewFabric()), NewDialer(NewFabric()), e0, e1)
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "fabric") {
			t.Fatalf("rank %d: %v, want an error about the fabric", r, err)
		}
	}
}

// TestWriteStream: a streamed write (channel.StreamWriter, the lent writes
// of collectives) lands byte for byte, past the streaming threshold and
// with an unaligned head and tail, in memory the peer registered after the
// channel was made; a range the peer did not register is refused with an
// error naming it, and nothing is written.
func TestWriteStream(t *testing.T) {
	_, e1, conns := connected(t)
	const size = 512 << 10
	area, err := e1.dev.Malloc(size)
	if err != nil {
		t.Fatal(err)
	}
	e1.reg.Add(channel.Mem{Tag: "lent", Addr: area, Size: size})
	sw, ok := conns[0].Transport.(channel.StreamWriter)
	if !ok {
		t.Fatal("inproc does not stream")
	}
	mem, err := e1.dev.Bytes(area, size)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ off, n int64 }{{0, 100}, {3, 200<<10 + 5}, {64, 256 << 10}, {size - 70<<10 - 1, 70<<10 + 1}} {
		clear(mem)
		src := make([]byte, tc.n)
		for i := range src {
			src[i] = byte(i*7 + int(tc.off))
		}
		if err := sw.WriteStream(nil, area.Add(tc.off), src); err != nil {
			t.Fatalf("%d bytes at %d: %v", tc.n, tc.off, err)
		}
		for i, b := range mem {
			want := byte(0)
			if j := int64(i) - tc.off; j >= 0 && j < tc.n {
				want = src[j]
			}
			if b != want {
				t.Fatalf("%d bytes at %d: byte %d is %d, want %d", tc.n, tc.off, i, b, want)
			}
		}
	}
	clear(mem)
	err = sw.WriteStream(nil, area.Add(size-100), make([]byte, 200))
	if err == nil || !strings.Contains(err.Error(), "not in its registered memory") {
		t.Fatalf("a write past the registered range: %v, want a refusal naming it", err)
	}
	for i, b := range mem {
		if b != 0 {
			t.Fatalf("the refused write stored byte %d", i)
		}
	}
}

// TestPeerFreesMemoryInUse: a peer that frees memory this rank writes into
// or reads from — a prepared post's and line's range (checked once, when
// prepared), or a lent buffer read while the Free runs — makes the write or
// read fail with an error naming the peer, never fault the process: every
// copy pins the peer's memory (device.Held), and the Free waits for it.
// Before, the prepared Post and Put stored into unmapped memory (SIGSEGV),
// and a read racing with the Free could too.
func TestPeerFreesMemoryInUse(t *testing.T) {
	_, e1, conns := connected(t)
	tr := conns[0].Transport.(*Transport)
	const size = 4 << 20
	area, err := e1.dev.Malloc(size)
	if err != nil {
		t.Fatal(err)
	}
	e1.reg.Add(channel.Mem{Tag: "window", Addr: area, Size: size}) // and never taken back
	post, err := tr.PreparePost(area, 64, 0)
	if err != nil {
		t.Fatal(err)
	}
	line, err := tr.PrepareLine(area.Add(4096))
	if err != nil {
		t.Fatal(err)
	}
	if err := post.Post(make([]byte, 64)); err != nil {
		t.Fatal(err)
	}
	if err := line.Put([]byte{1, 2, 3}, 1); err != nil {
		t.Fatal(err)
	}
	// Reads of the whole area, running while rank 1 frees it.
	dst := make([]byte, size)
	reads := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		var err error
		for i := 0; err == nil; i++ {
			if i == 2 {
				close(started)
			}
			err = tr.ReadPeer(nil, dst, area, channel.NoPeerFile)
		}
		reads <- err
	}()
	<-started
	if err := e1.dev.Free(area); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-reads:
		if !strings.Contains(err.Error(), "rank 1") {
			t.Fatalf("a read of freed memory: %v, want an error naming rank 1", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("reads of the freed area still succeed")
	}
	for what, err := range map[string]error{
		"post":  post.Post(make([]byte, 64)),
		"line":  line.Put([]byte{1, 2, 3}, 2),
		"read":  tr.ReadPeer(nil, dst[:64], area, channel.NoPeerFile),
		"write": tr.Write(nil, area, make([]byte, 64)),
	} {
		if err == nil || !strings.Contains(err.Error(), "rank 1") {
			t.Errorf("%s into memory rank 1 freed: %v, want an error naming rank 1", what, err)
		}
	}
	// A line into the HCCL buffer, not pinned (the buffer is freed only
	// after the channel closes): a Put after rank 1 closed its end fails.
	bufLine, err := tr.PrepareLine(e1.buf.Add(64))
	if err != nil {
		t.Fatal(err)
	}
	if err := bufLine.Put([]byte{4}, 1); err != nil {
		t.Fatal(err)
	}
	conns[1].Transport.Close()
	if err := bufLine.Put([]byte{5}, 2); err == nil || !strings.Contains(err.Error(), "rank 1") {
		t.Errorf("a line into the HCCL buffer of rank 1, closed: %v, want an error naming rank 1", err)
	}
}

// TestCopiesIntoFreedHCCLBuffer: copies into and out of the peer's HCCL
// buffer — lines, writes, reads, posts — are not pinned, and a copy that
// passed its check just as the peer closed and freed the buffer touches
// memory this end keeps mapped until its own Close, instead of faulting
// the process. The test holds that instant open: rank 1 frees the buffer
// with the channel still open, and every copy still succeeds. (Without the
// keep, they fault: SIGSEGV, the test binary gone; pinned, as writes were
// before keptBytes, they fail.) Memory outside the buffer is pinned as
// ever: a range that runs past its end is checked against the registry.
func TestCopiesIntoFreedHCCLBuffer(t *testing.T) {
	_, e1, conns := connected(t)
	tr := conns[0].Transport.(*Transport)
	line, err := tr.PrepareLine(e1.buf.Add(64))
	if err != nil {
		t.Fatal(err)
	}
	post, err := tr.PreparePost(e1.buf.Add(128), 64, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Write(nil, e1.buf.Add(4090), make([]byte, 8)); err == nil || !strings.Contains(err.Error(), "rank 1") {
		t.Errorf("a write running past the end of rank 1's HCCL buffer: %v, want an error naming rank 1", err)
	}
	if err := e1.dev.Free(e1.buf); err != nil {
		t.Fatal(err)
	}
	if err := line.Put([]byte{1, 2, 3}, 1); err != nil {
		t.Fatal(err)
	}
	want := []byte{9, 8, 7, 6, 5, 4, 3, 2}
	if err := tr.Write(nil, e1.buf.Add(256), want); err != nil {
		t.Errorf("a write into the HCCL buffer rank 1 freed, channel open: %v", err)
	}
	got := make([]byte, 8)
	if err := tr.Read(nil, got, e1.buf.Add(256)); err != nil || string(got) != string(want) {
		t.Errorf("a read of it: %v, %v (want %v)", got, err, want)
	}
	if err := tr.WriteFlagged(nil, e1.buf.Add(512), want, 3); err != nil {
		t.Errorf("a flagged write into it: %v", err)
	}
	if err := post.Post(want); err != nil {
		t.Errorf("a post into it: %v", err)
	}
	conns[0].Transport.Close() // the keep's end: the buffer is unmapped now
	if err := line.Put([]byte{4}, 2); !errors.Is(err, channel.ErrClosed) {
		t.Errorf("a line after this end closed: %v, want channel.ErrClosed", err)
	}
	if err := tr.Write(nil, e1.buf.Add(256), want); !errors.Is(err, channel.ErrClosed) {
		t.Errorf("a write after this end closed: %v, want channel.ErrClosed", err)
	}
	if err := post.Post(want); !errors.Is(err, channel.ErrClosed) {
		t.Errorf("a post after this end closed: %v, want channel.ErrClosed", err)
	}
}
