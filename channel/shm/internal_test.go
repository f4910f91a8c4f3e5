//go:build linux

package shm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/notify"
)

// memExchange connects two Exchanges in one process.
func memExchange() (a, b channel.Exchange) {
	ab, ba := make(chan []byte, 1), make(chan []byte, 1)
	mk := func(out, in chan []byte) channel.Exchange {
		return func(ctx context.Context, mine []byte) ([]byte, error) {
			out <- mine
			select {
			case m := <-in:
				return m, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	return mk(ab, ba), mk(ba, ab)
}

type side struct {
	dev  *device.Device
	buf  device.Ptr
	d    *Dialer
	conn *channel.Conn
	err  error
}

func newSide(t *testing.T, size int64) *side {
	t.Helper()
	dev, err := device.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	buf, err := dev.Malloc(size)
	if err != nil {
		t.Fatal(err)
	}
	d, _ := NewDialer(Options{})
	t.Cleanup(func() { d.Close() })
	return &side{dev: dev, buf: buf, d: d}
}

// pair connects two ends in this process (the pid checks pass: it is the
// same process at both ends).
func pair(t *testing.T, a, b *side, size int64) { pairN(t, a, b, size, 2) }

// pairN is pair with n notifies at each end.
func pairN(t *testing.T, a, b *side, size int64, n int) {
	t.Helper()
	exA, exB := memExchange()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i, s := range []*side{a, b} {
		ex := []channel.Exchange{exA, exB}[i]
		wg.Add(1)
		go func(i int, s *side) {
			defer wg.Done()
			reg := &channel.Registry{}
			reg.Add(channel.Mem{Tag: "hccl buffer", Addr: s.buf, Size: size})
			l := &channel.Local{Rank: i, Peer: 1 - i, Device: s.dev, Registry: reg, NotifyNum: n,
				HCCLBuf: channel.Mem{Tag: "hccl buffer", Addr: s.buf, Size: size}, Name: "pair"}
			s.conn, s.err = s.d.Connect(ctx, l, ex)
			if s.conn != nil {
				t.Cleanup(func() { s.conn.Transport.Close() })
			}
		}(i, s)
	}
	wg.Wait()
}

// TestLyingPeerRefused: a peer whose description points past the end of
// its memory file is refused by the honest end, and both ends say why.
func TestLyingPeerRefused(t *testing.T) {
	for _, c := range []struct {
		name string
		lie  func(m []memEntry)
		want string
	}{
		{"offset past the file", func(m []memEntry) { m[0].Offset = 1 << 30 }, "runs past its end"},
		{"size past the file", func(m []memEntry) { m[0].Size += 8192 }, "runs past its end"},
		{"wrapping range", func(m []memEntry) { m[0].Addr = ^uint64(0) - 10 }, "wraps around"},
	} {
		t.Run(c.name, func(t *testing.T) {
			honest, liar := newSide(t, 4096), newSide(t, 4096)
			liar.d.tamper = c.lie
			pair(t, honest, liar, 4096)
			if !errors.Is(honest.err, channel.ErrRefused) || !strings.Contains(honest.err.Error(), c.want) {
				t.Errorf("honest end: %v, want channel.ErrRefused saying %q", honest.err, c.want)
			}
			if !errors.Is(liar.err, channel.ErrRefused) || !strings.Contains(liar.err.Error(), c.want) {
				t.Errorf("lying end: %v, want the honest end's refusal saying %q", liar.err, c.want)
			}
		})
	}
}

func TestCheckFileWantsSealedMemory(t *testing.T) {
	fd, err := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	unix.Ftruncate(fd, 8192)
	if err := checkFile(fd, 0, 4096); err == nil || !strings.Contains(err.Error(), "not sealed") {
		t.Fatalf("unsealed file: %v", err)
	}
	unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK)
	if err := checkFile(fd, 0, 8192); err != nil {
		t.Fatalf("sealed file: %v", err)
	}
	if err := checkFile(fd, 4096, 4097); err == nil {
		t.Fatal("a range past the end passed")
	}
	r, w, _ := osPipe(t)
	if err := checkFile(r, 0, 1); err == nil || !strings.Contains(err.Error(), "not a sealable memory file") {
		t.Fatalf("a pipe: %v", err)
	}
	_ = w
}

func osPipe(t *testing.T) (int, int, error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
	return p[0], p[1], nil
}

// TestOperationsRaceClose: writes and records from several goroutines while
// the transport closes either succeed or fail with channel.ErrClosed; none touches
// unmapped memory.
func TestOperationsRaceClose(t *testing.T) {
	const size = 1 << 20
	a, b := newSide(t, size), newSide(t, size)
	pair(t, a, b, size)
	if a.err != nil || b.err != nil {
		t.Fatal(a.err, b.err)
	}
	tr := a.conn.Transport
	dst := a.conn.RemoteMems[0].Addr
	src := bytes.Repeat([]byte{7}, 64<<10)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				err := tr.Write(nil, dst, src)
				if err == nil {
					err = tr.NotifyRecord(nil, 1)
				}
				if err != nil {
					if !errors.Is(err, channel.ErrClosed) {
						errs <- err
					}
					return
				}
			}
		}()
	}
	time.Sleep(20 * time.Millisecond)
	tr.Close()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("operation racing Close: %v", err)
	}
	// The other end saw the goodbye.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		err := b.conn.Notifies[0].WaitNow(ctx)
		if errors.Is(err, channel.ErrPeerClosed) {
			break
		}
		if err != nil {
			t.Fatalf("peer's wait: %v", err)
		}
	}
}

// TestPopulateMapsUpFront: with Options.Populate the connect maps the
// peer's pages at once; the channel works the same.
func TestPopulateMapsUpFront(t *testing.T) {
	const size = 4 << 20
	a, b := newSide(t, size), newSide(t, size)
	a.d.opts.Populate = true
	pair(t, a, b, size)
	if a.err != nil || b.err != nil {
		t.Fatal(a.err, b.err)
	}
	src := bytes.Repeat([]byte("populate"), size/8)
	if err := a.conn.Transport.Write(nil, a.conn.RemoteMems[0].Addr, src); err != nil {
		t.Fatal(err)
	}
	got, _ := b.dev.Bytes(b.buf, size)
	if !bytes.Equal(got, src) {
		t.Fatal("the write through a populated mapping did not reach the peer's memory")
	}
	if err := a.conn.Transport.NotifyRecord(nil, 1); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.conn.Notifies[1].WaitNow(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestNoNotifies: a channel may have no notifies at either end; records
// are then refused, naming the peer.
func TestNoNotifies(t *testing.T) {
	a, b := newSide(t, 4096), newSide(t, 4096)
	pairN(t, a, b, 4096, 0)
	if a.err != nil || b.err != nil {
		t.Fatal(a.err, b.err)
	}
	if len(a.conn.Notifies) != 0 || a.conn.PeerNotifyNum != 0 {
		t.Fatalf("notifies %d, peer %d", len(a.conn.Notifies), a.conn.PeerNotifyNum)
	}
	if err := a.conn.Transport.NotifyRecord(nil, 0); err == nil || !strings.Contains(err.Error(), "rank 1 has no notify 0") {
		t.Fatalf("NotifyRecord = %v", err)
	}
	if err := a.conn.Transport.Write(nil, a.conn.RemoteMems[0].Addr, []byte("ok")); err != nil {
		t.Fatal(err)
	}
}

// TestPeerNeverDials: the hello is fine but the peer never connects; the
// listening end gives up when ctx ends, and leaves no listener behind (a
// dial to its name then fails).
func TestPeerNeverDials(t *testing.T) {
	s := newSide(t, 4096)
	var addr string
	ex := func(_ context.Context, mine []byte) ([]byte, error) {
		h, err := decodeHello(mine)
		if err != nil {
			return nil, err
		}
		addr = h.Addr
		fake := &hello{HostID: HostID(), PID: 1, Rank: 1, Peer: 0}
		return fake.encode(), nil
	}
	l := &channel.Local{Rank: 0, Peer: 1, Device: s.dev, NotifyNum: 1, HCCLBuf: channel.Mem{Addr: s.buf, Size: 4096}}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := s.d.Connect(ctx, l, ex)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Connect = %v, want a timeout", err)
	}
	if !strings.Contains(err.Error(), "rank 1") {
		t.Errorf("error %q does not name the peer", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Connect took %v past its 100ms context", d)
	}
	if addr == "" {
		t.Fatal("rank 0 did not listen")
	}
	var nd net.Dialer
	if c, err := nd.Dial("unixpacket", "@"+addr); err == nil {
		c.Close()
		t.Fatal("the listener outlived the failed connect")
	}
}

var _ channel.WriteNotifier = (*Transport)(nil)

// TestNotifyRacingClose: calls on this end's notifies that run while the
// transport closes never fault — the notify page is mapped over with
// private memory, not unmapped (retire) — and fail as the closed channel's
// once they see it.
func TestNotifyRacingClose(t *testing.T) {
	for round := 0; round < 20; round++ {
		a, b := newSide(t, 4096), newSide(t, 4096)
		pair(t, a, b, 4096)
		if a.err != nil || b.err != nil {
			t.Fatal(a.err, b.err)
		}
		ns := a.conn.Notifies
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for _, n := range ns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					n.Set()
					n.IsSet()
					n.TryReset()
					n.Reset()
				}
			}()
		}
		time.Sleep(time.Millisecond)
		if err := a.conn.Transport.Close(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond) // the hammering goes on past the close
		close(stop)
		wg.Wait()
		for _, n := range ns {
			if err := n.WaitNow(context.Background()); !errors.Is(err, channel.ErrClosed) {
				t.Fatalf("wait after Close = %v", err)
			}
		}
		b.conn.Transport.Close()
	}
}

// TestRetire: a retired notify page lets its memory file go at once, stays
// addressable (private memory) while its notifies live, and is unmapped
// once they are collected.
func TestRetire(t *testing.T) {
	fd, err := unix.MemfdCreate("hcomm-retire-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	unix.Ftruncate(fd, int64(pageSize))
	m, err := unix.Mmap(fd, 0, pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := uintptr(unsafe.Pointer(&m[0]))
	mapping := func() string { return mappingAt(addr) }
	if l := mapping(); !strings.Contains(l, "hcomm-retire-test") {
		t.Fatalf("the page is mapped as %q, want the memory file", l)
	}
	func() {
		ns := []*notify.Notify{notify.NewShared("a", wordAt(m, 0)), notify.NewShared("b", wordAt(m, 1))}
		before := unmapped.Load()
		retire(m, ns)
		if l := mapping(); l == "" || strings.Contains(l, "hcomm-retire-test") {
			t.Fatalf("retired page mapped as %q, want private memory", l)
		}
		ns[0].Set() // not detached here: the private word takes it
		if !ns[0].IsSet() || ns[1].IsSet() {
			t.Fatal("the retired page's words do not hold what was stored")
		}
		runtime.KeepAlive(ns)
		if unmapped.Load() != before {
			t.Fatal("unmapped while its notifies live")
		}
	}()
	for deadline := time.Now().Add(10 * time.Second); unmapped.Load() == 0 && time.Now().Before(deadline); {
		runtime.GC()
		time.Sleep(5 * time.Millisecond)
	}
	if unmapped.Load() == 0 {
		t.Fatal("the retired page was not unmapped after its notifies were collected")
	}
}

// TestLineRacingClose: a prepared line's Put takes no lock, so Puts that
// run while the transport closes never fault — the mapping the line stores
// into is retired (private memory), not unmapped — and fail with
// channel.ErrClosed once they see the close. The retired mapping holds no
// memory file, and its addresses go when the line is collected.
func TestLineRacingClose(t *testing.T) {
	for round := 0; round < 20; round++ {
		tr, b := linePair(t)
		l, err := tr.PrepareLine(b.buf + channel.LineSize)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Put([]byte{1, 2, 3}, 9); err != nil {
			t.Fatal(err)
		}
		line, _ := b.dev.Bytes(b.buf+channel.LineSize, channel.LineSize)
		got := make([]byte, 3)
		if !channel.TakeLine(got, line, 9) || got[0] != 1 || got[2] != 3 {
			t.Fatalf("the peer's line holds %v, want the flag 9 and 1 2 3", line[:16])
		}
		addr := uintptr(unsafe.Pointer(&tr.mems[0].m[0]))
		var closed error
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := uint32(0); ; i++ {
				if err := l.Put([]byte{byte(i)}, i); err != nil {
					closed = err
					return
				}
			}
		}()
		time.Sleep(time.Millisecond)
		if err := tr.Close(); err != nil {
			t.Fatal(err)
		}
		<-done
		if !errors.Is(closed, channel.ErrClosed) {
			t.Fatalf("Put after Close = %v, want channel.ErrClosed", closed)
		}
		if m := mappingAt(addr); m == "" || strings.Contains(m, "memfd") {
			t.Fatalf("the closed channel's mapping of the peer's memory is %q, want private memory while a line stores into it", m)
		}
		runtime.KeepAlive(l)
		b.conn.Transport.Close()
	}
	// Each round's line is garbage now: its retired mapping goes.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		runtime.GC()
		time.Sleep(5 * time.Millisecond)
		if retiredMaps.Load() == 0 {
			return
		}
	}
	t.Fatalf("%d retired mappings still wait for their lines after they were collected", retiredMaps.Load())
}

// TestLineUnmapsWithoutLines: a channel whose lines were collected before
// it closed unmaps the peer's memory at once, as one that never had any.
func TestLineUnmapsWithoutLines(t *testing.T) {
	tr, b := linePair(t)
	h := tr.mems[0].lines
	func() {
		l, err := tr.PrepareLine(b.buf)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Put(nil, 1); err != nil {
			t.Fatal(err)
		}
	}()
	for deadline := time.Now().Add(10 * time.Second); lineCount(h) > 0 && time.Now().Before(deadline); {
		runtime.GC()
		time.Sleep(5 * time.Millisecond)
	}
	if n := lineCount(h); n != 0 {
		t.Fatalf("%d lines counted after the only one was collected", n)
	}
	addr := uintptr(unsafe.Pointer(&tr.mems[0].m[0]))
	tr.Close()
	if m := mappingAt(addr); m != "" && !strings.Contains(m, "memfd") {
		t.Fatalf("the peer's memory was retired (%q) with no line storing into it, want it unmapped", m)
	}
	if _, err := tr.PrepareLine(b.buf); !errors.Is(err, channel.ErrClosed) {
		t.Fatalf("PrepareLine after Close = %v, want channel.ErrClosed", err)
	}
}

// mappingAt returns the /proc/self/maps line holding addr ("" if none).
func mappingAt(addr uintptr) string {
	raw, _ := os.ReadFile("/proc/self/maps")
	for _, l := range strings.Split(string(raw), "\n") {
		var lo, hi uintptr
		if _, err := fmt.Sscanf(l, "%x-%x", &lo, &hi); err == nil && addr >= lo && addr < hi {
			return l
		}
	}
	return ""
}

func lineCount(h *lineHold) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lines
}

// TestLinePutTakesNoLock: a prepared line's Put stores without the
// mapping lock (the locked instruction before the store was on every
// hand-off's path): it completes while another goroutine holds the lock
// for writing, as Close does to unmap.
func TestLinePutTakesNoLock(t *testing.T) {
	tr, b := linePair(t)
	l, err := tr.PrepareLine(b.buf)
	if err != nil {
		t.Fatal(err)
	}
	tr.mu.Lock()
	done := make(chan error, 1)
	go func() { done <- l.Put([]byte{7}, 3) }()
	select {
	case err := <-done:
		tr.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		tr.mu.Unlock()
		<-done
		t.Fatal("Put waited for the mapping lock")
	}
	line, _ := b.dev.Bytes(b.buf, channel.LineSize)
	got := make([]byte, 1)
	if !channel.TakeLine(got, line, 3) || got[0] != 7 {
		t.Fatalf("the peer's line holds %v, want the flag 3 and 7", line[:9])
	}
}

// linePair connects two ends with 4096-byte buffers and returns the first
// end's transport and the second end, whose buffer it stores lines into.
func linePair(t *testing.T) (*Transport, *side) {
	t.Helper()
	a, b := newSide(t, 4096), newSide(t, 4096)
	pair(t, a, b, 4096)
	if a.err != nil || b.err != nil {
		t.Fatal(a.err, b.err)
	}
	return a.conn.Transport.(*Transport), b
}

// TestLinePeerCloses: when the peer closes its end in order, this end
// unmaps the peer's memory at once (unmapPeer) — a mapping that a
// prepared line stores into is retired to private memory instead — and
// the line's Put fails with channel.ErrPeerClosed.
func TestLinePeerCloses(t *testing.T) {
	tr, b := linePair(t)
	l, err := tr.PrepareLine(b.buf)
	if err != nil {
		t.Fatal(err)
	}
	tr.mu.RLock() // the watcher clears mems when the peer's goodbye comes
	addr := uintptr(unsafe.Pointer(&tr.mems[0].m[0]))
	tr.mu.RUnlock()
	b.conn.Transport.Close()
	deadline := time.Now().Add(10 * time.Second)
	for !tr.down.Load() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if !tr.down.Load() {
		t.Fatal("the peer's memory was not given up after the peer closed")
	}
	if err := l.Put([]byte{1}, 1); !errors.Is(err, channel.ErrPeerClosed) {
		t.Fatalf("Put after the peer closed = %v, want channel.ErrPeerClosed", err)
	}
	if m := mappingAt(addr); m == "" || strings.Contains(m, "memfd") {
		t.Fatalf("the peer's memory is mapped as %q after it closed, want private memory while a line stores into it", m)
	}
	runtime.KeepAlive(l)
}
