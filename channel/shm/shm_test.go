//go:build linux

package shm_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/channel/shm"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/leakcheck"
	"github.com/hcomm-dev/hcomm/internal/reduce"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// The peer of every test is this test binary run again as another process
// (TestHelperProcess with helperEnv set). Parent and peer talk over two
// pipes (the peer's descriptors 3 and 4) in frames of a 4-byte length and
// the bytes: first the Exchange of the connect, then commands from the
// parent, each answered "ok ..." or "err ...".

const (
	helperEnv  = "HCOMM_SHM_TEST_PEER"
	bufEnv     = "HCOMM_SHM_TEST_BUF"
	notifyNum  = 4
	extraSize  = 8192
	guardSize  = 4096
	waitLimit  = 20 * time.Second
	peerRank   = 1
	parentRank = 0
)

func writeFrame(w io.Writer, b []byte) error {
	var h [4]byte
	binary.LittleEndian.PutUint32(h[:], uint32(len(b)))
	if _, err := w.Write(append(h[:], b...)); err != nil {
		return err
	}
	return nil
}

func readFrame(r io.Reader) ([]byte, error) {
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint32(h[:])
	if n > 1<<20 {
		return nil, fmt.Errorf("frame of %d bytes", n)
	}
	b := make([]byte, n)
	_, err := io.ReadFull(r, b)
	return b, err
}

// pipeExchange is a channel.Exchange over a pair of pipes.
func pipeExchange(r, w *os.File) channel.Exchange {
	return func(ctx context.Context, mine []byte) ([]byte, error) {
		if dl, ok := ctx.Deadline(); ok {
			r.SetReadDeadline(dl) // fails harmlessly on a blocking descriptor
		}
		defer r.SetReadDeadline(time.Time{})
		if err := writeFrame(w, mine); err != nil {
			return nil, err
		}
		return readFrame(r)
	}
}

// end is one rank's side: its device, memory and connected channel.
type end struct {
	dev   *device.Device
	buf   device.Ptr // HCCL buffer
	size  int64
	extra device.Ptr // registered after the buffer
	guard device.Ptr // never registered
	reg   *channel.Registry
	conn  *channel.Conn
	tr    *shm.Transport
	opts  shm.Options
}

func newEnd(size int64) (*end, error) {
	dev, err := device.Open(0)
	if err != nil {
		return nil, err
	}
	e := &end{dev: dev, size: size, reg: &channel.Registry{}}
	if e.buf, err = dev.Malloc(size); err != nil {
		dev.Close()
		return nil, err
	}
	if e.extra, err = dev.Malloc(extraSize); err != nil {
		dev.Close()
		return nil, err
	}
	if e.guard, err = dev.Malloc(guardSize); err != nil {
		dev.Close()
		return nil, err
	}
	e.reg.Add(channel.Mem{Tag: "hccl buffer", Addr: e.buf, Size: size})
	e.reg.Add(channel.Mem{Tag: "extra", Addr: e.extra, Size: extraSize})
	return e, nil
}

func (e *end) connect(ctx context.Context, rank, peer int, ex channel.Exchange) error {
	d, err := shm.NewDialer(e.opts)
	if err != nil {
		return err
	}
	defer d.Close()
	local := &channel.Local{Comm: "test", Rank: rank, Peer: peer, Device: e.dev, Registry: e.reg,
		HCCLBuf: channel.Mem{Tag: "hccl buffer", Addr: e.buf, Size: e.size}, NotifyNum: notifyNum,
		Name: fmt.Sprintf("comm test rank %d channel to rank %d", rank, peer)}
	c, err := d.Connect(ctx, local, ex)
	if err != nil {
		return err
	}
	e.conn, e.tr = c, c.Transport.(*shm.Transport)
	return nil
}

func (e *end) close() {
	if e.conn != nil {
		e.conn.Transport.Close()
	}
	e.dev.Close()
}

func (e *end) bytes(p device.Ptr, n int64) []byte {
	b, err := e.dev.Bytes(p, n)
	if err != nil {
		panic(err)
	}
	return b
}

func (e *end) wait(idx int) error {
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	return e.conn.Notifies[idx].WaitNow(ctx)
}

func pattern(b []byte, seed int) {
	for i := range b {
		b[i] = byte(i*7 + seed*13 + 1)
	}
}

func hashOf(b []byte) string {
	h := fnv.New64a()
	h.Write(b)
	return strconv.FormatUint(h.Sum64(), 16)
}

// TestHelperProcess is the peer process; it does nothing in a normal run.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) == "" {
		return // only the peer process of the other tests
	}
	os.Exit(peerMain())
}

func peerMain() int {
	in, out := os.NewFile(3, "from-parent"), os.NewFile(4, "to-parent")
	size, _ := strconv.ParseInt(os.Getenv(bufEnv), 10, 64)
	fdsBefore := countFDs()
	e, err := newEnd(size)
	if err != nil {
		fmt.Fprintln(os.Stderr, "peer:", err)
		return 2
	}
	pattern(e.bytes(e.buf, size), 5)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	err = e.connect(ctx, peerRank, parentRank, pipeExchange(in, out))
	cancel()
	if err != nil {
		writeFrame(out, []byte("err "+err.Error()))
		return 3
	}
	reply := func(format string, args ...any) { writeFrame(out, []byte(fmt.Sprintf(format, args...))) }
	reply("ok connected")
	parentBuf := e.conn.RemoteMems[0]
	for {
		f, err := readFrame(in)
		if err != nil {
			return 0 // the parent went away
		}
		args := strings.Fields(string(f))
		num := func(i int) int64 { v, _ := strconv.ParseInt(args[i], 10, 64); return v }
		switch args[0] {
		case "hash": // hash off n: of this end's buffer
			reply("ok %s", hashOf(e.bytes(e.buf.Add(num(1)), num(2))))
		case "fill": // fill seed: this end's buffer with a pattern
			pattern(e.bytes(e.buf, size), int(num(1)))
			reply("ok")
		case "echo": // echo rounds n: wait, copy own buffer's first n bytes into the parent's, record
			rounds, n := int(num(1)), num(2)
			for i := 0; i < rounds; i++ {
				if err := e.wait(0); err != nil {
					reply("err round %d: %v", i, err)
					goto next
				}
				if err := e.tr.Write(nil, parentBuf.Addr, e.bytes(e.buf, n)); err != nil {
					reply("err round %d: %v", i, err)
					goto next
				}
				if err := e.tr.NotifyRecord(nil, 0); err != nil {
					reply("err round %d: %v", i, err)
					goto next
				}
			}
			reply("ok")
		case "guard": // are the unregistered guard and the bytes around the extra range untouched?
			if bytes.Count(e.bytes(e.guard, guardSize), []byte{0}) != guardSize {
				reply("err the guard allocation was written")
			} else {
				reply("ok clean")
			}
		case "close": // close the channel and the device; report descriptors
			open := countFDs()
			e.close()
			reply("ok %d %d %d", fdsBefore, open, countFDs())
			return 0
		case "pingpong": // pingpong n: wait, write 8 bytes into the parent's buffer, record; n times
			rounds := int(num(1))
			for i := 0; i < rounds; i++ {
				if err := e.wait(0); err != nil {
					reply("err round %d: %v", i, err)
					goto next
				}
				if err := e.tr.Write(nil, parentBuf.Addr, e.bytes(e.buf, 8)); err != nil {
					reply("err round %d: %v", i, err)
					goto next
				}
				if err := e.tr.NotifyRecord(nil, 0); err != nil {
					reply("err round %d: %v", i, err)
					goto next
				}
			}
			reply("ok")
		case "idle":
			reply("ok")
		case "reads": // does this end read the parent's lent memory?
			reply("ok %v", e.tr.ReadsPeer())
		case "lend": // lend n seed: a new allocation of n bytes, not registered, filled with a pattern
			p, err := e.dev.Malloc(num(1))
			if err != nil {
				reply("err %v", err)
				break
			}
			pattern(e.bytes(p, num(1)), int(num(2)))
			f, err := e.dev.FileOf(p, num(1))
			if err != nil {
				reply("err %v", err)
				break
			}
			reply("ok %d %d %d %d", p, f.FD, f.Ino, f.Off)
		case "hashat": // hashat addr n: of n bytes of this process's device memory at addr
			b, err := e.dev.Bytes(device.Ptr(num(1)), num(2))
			if err != nil {
				reply("err %v", err)
				break
			}
			reply("ok %s", hashOf(b))
		case "free": // free addr
			if err := e.dev.Free(device.Ptr(num(1))); err != nil {
				reply("err %v", err)
				break
			}
			reply("ok")
		default:
			reply("err unknown command %q", args[0])
		}
	next:
	}
}

// countFDs counts the descriptors that a channel or device could leave
// open: memory files, sockets and pipes (not the runtime's own, such as
// its poller's).
func countFDs() int {
	ents, _ := os.ReadDir("/proc/self/fd")
	n := 0
	for _, e := range ents {
		l, _ := os.Readlink("/proc/self/fd/" + e.Name())
		if strings.HasPrefix(l, "/memfd:") || strings.HasPrefix(l, "socket:") || strings.HasPrefix(l, "pipe:") {
			n++
		}
	}
	return n
}

// peer is the peer process as the parent sees it.
type peer struct {
	t   testing.TB
	cmd *exec.Cmd
	in  *os.File // replies from the peer
	out *os.File // commands to the peer
	e   *end     // the parent's end
}

// startPeer starts the peer process and connects the parent's end to it.
func startPeer(t testing.TB, size int64) *peer {
	t.Helper()
	return startPeerWith(t, size, shm.Options{})
}

// startPeerWith is startPeer with the parent's end dialing with opts.
func startPeerWith(t testing.TB, size int64, opts shm.Options) *peer {
	t.Helper()
	toPeerR, toPeerW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	fromPeerR, fromPeerW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=1", bufEnv+"="+strconv.FormatInt(size, 10),
		// The race runtime sleeps a second at exit unless told not to.
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	cmd.ExtraFiles = []*os.File{toPeerR, fromPeerW}
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	toPeerR.Close()
	fromPeerW.Close()
	p := &peer{t: t, cmd: cmd, in: fromPeerR, out: toPeerW}
	t.Cleanup(func() {
		p.out.Close()
		p.in.Close()
		p.cmd.Process.Kill()
		p.cmd.Wait()
	})
	e, err := newEnd(size)
	if err != nil {
		t.Fatal(err)
	}
	e.opts = opts
	t.Cleanup(e.close)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := e.connect(ctx, parentRank, peerRank, pipeExchange(p.in, p.out)); err != nil {
		t.Fatal(err)
	}
	p.e = e
	if r := p.recv(); !strings.HasPrefix(r, "ok") {
		t.Fatalf("peer: %s", r)
	}
	return p
}

func (p *peer) send(format string, args ...any) {
	p.t.Helper()
	if err := writeFrame(p.out, []byte(fmt.Sprintf(format, args...))); err != nil {
		p.t.Fatal(err)
	}
}

func (p *peer) recv() string {
	p.t.Helper()
	p.in.SetReadDeadline(time.Now().Add(waitLimit))
	f, err := readFrame(p.in)
	if err != nil {
		p.t.Fatalf("no reply from the peer: %v", err)
	}
	return string(f)
}

// do sends a command and returns the reply after "ok ", failing on "err".
func (p *peer) do(format string, args ...any) string {
	p.t.Helper()
	p.send(format, args...)
	r := p.recv()
	if !strings.HasPrefix(r, "ok") {
		p.t.Fatalf("peer: %s", r)
	}
	return strings.TrimSpace(strings.TrimPrefix(r, "ok"))
}

func (p *peer) remote(i int) channel.Mem { return p.e.conn.RemoteMems[i] }

var sizes = []int64{0, 1, 7, 1<<20 + 3}

const bufSize = 2<<20 + 4096

// TestRoundTrips: write, read, write-reduce and read-reduce of odd sizes
// between two processes, checked by the peer's own view of its memory.
func TestRoundTrips(t *testing.T) {
	p := startPeer(t, bufSize)
	tr, e := p.e.tr, p.e
	rb := p.remote(0)
	if rb.Size != bufSize || len(p.e.conn.RemoteMems) != 2 || p.remote(1).Size != extraSize {
		t.Fatalf("remote mems %+v", p.e.conn.RemoteMems)
	}
	if p.e.conn.PeerNotifyNum != notifyNum || len(p.e.conn.Notifies) != notifyNum {
		t.Fatalf("notifies: %d local, %d peer", len(p.e.conn.Notifies), p.e.conn.PeerNotifyNum)
	}
	for _, n := range sizes {
		off := int64(4093) // not aligned
		src := make([]byte, n)
		pattern(src, int(n))
		if err := tr.Write(nil, rb.Addr.Add(off), src); err != nil {
			t.Fatalf("write %d: %v", n, err)
		}
		if got := p.do("hash %d %d", off, n); got != hashOf(src) {
			t.Fatalf("write %d: the peer holds other bytes", n)
		}
		back := make([]byte, n)
		if err := tr.Read(nil, back, rb.Addr.Add(off)); err != nil || !bytes.Equal(back, src) {
			t.Fatalf("read %d: %v, equal %v", n, err, bytes.Equal(back, src))
		}
	}
	// Read what the peer filled itself.
	p.do("fill 9")
	want := make([]byte, 1<<20+3)
	full := make([]byte, bufSize)
	pattern(full, 9)
	copy(want, full[100:])
	got := make([]byte, len(want))
	if err := tr.Read(nil, got, rb.Addr.Add(100)); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read of the peer's pattern: %v", err)
	}
	// Write-reduce float32 SUM: peer = peer + src, checked by hash against a
	// local reference; read-reduce MAX into local memory.
	for _, count := range []int{0, 1, 7, 262145} {
		n := int64(count * 4)
		a, b := make([]byte, n), make([]byte, n)
		for i := 0; i < count; i++ {
			binary.LittleEndian.PutUint32(a[i*4:], math.Float32bits(float32(i%100)))
			binary.LittleEndian.PutUint32(b[i*4:], math.Float32bits(float32(i%7)+0.5))
		}
		if err := tr.Write(nil, rb.Addr, a); err != nil {
			t.Fatal(err)
		}
		if err := tr.WriteReduce(nil, rb.Addr, b, count, reduce.Float32, reduce.Sum); err != nil {
			t.Fatalf("write-reduce %d: %v", count, err)
		}
		ref := append([]byte(nil), a...)
		if err := reduce.Reduce(ref, b, count, reduce.Float32, reduce.Sum); err != nil {
			t.Fatal(err)
		}
		if got := p.do("hash 0 %d", n); got != hashOf(ref) {
			t.Fatalf("write-reduce %d: the peer holds other bytes", count)
		}
		local := e.bytes(e.buf, n)
		copy(local, b)
		if err := tr.ReadReduce(nil, local, rb.Addr, count, reduce.Float32, reduce.Max); err != nil {
			t.Fatalf("read-reduce %d: %v", count, err)
		}
		max := append([]byte(nil), b...)
		reduce.Reduce(max, ref, count, reduce.Float32, reduce.Max)
		if !bytes.Equal(local, max) {
			t.Fatalf("read-reduce %d: wrong result", count)
		}
	}
	// The second range (registered after the buffer) is reachable too.
	if err := tr.Write(nil, p.remote(1).Addr.Add(extraSize-3), []byte{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	if err := tr.Fence(nil); err != nil {
		t.Fatal(err)
	}
}

// TestWriteThenRecordVisibleAfterWait: many rounds, both directions. The
// parent writes a new pattern and records; the peer waits, copies its buffer
// back into the parent's and records; the parent waits and must see the
// pattern of this round, never an older one.
func TestWriteThenRecordVisibleAfterWait(t *testing.T) {
	p := startPeer(t, bufSize)
	const rounds = 300
	for _, n := range []int64{1, 7, 4096, 1<<20 + 3} {
		p.send("echo %d %d", rounds, n)
		src := make([]byte, n)
		for i := 0; i < rounds; i++ {
			pattern(src, i+int(n))
			if i%2 == 1 { // the combined call, every other round
				if err := p.e.tr.WriteWithNotify(nil, p.remote(0).Addr, src, 0); err != nil {
					t.Fatal(err)
				}
			} else {
				if err := p.e.tr.Write(nil, p.remote(0).Addr, src); err != nil {
					t.Fatal(err)
				}
				if err := p.e.tr.NotifyRecord(nil, 0); err != nil {
					t.Fatal(err)
				}
			}
			if err := p.e.wait(0); err != nil {
				t.Fatalf("size %d round %d: %v", n, i, err)
			}
			if got := p.e.bytes(p.e.buf, n); !bytes.Equal(got, src) {
				t.Fatalf("size %d round %d: the echo holds other bytes", n, i)
			}
			if i == rounds/2 && n == 7 {
				time.Sleep(5 * time.Millisecond) // let the peer fall asleep on the futex once
			}
		}
		if r := p.recv(); !strings.HasPrefix(r, "ok") {
			t.Fatalf("peer: %s", r)
		}
	}
}

// TestOutOfRangeRefused: ranges outside what the peer shared fail with
// ErrOutOfRange, naming the peer and the range, and the peer's memory is
// untouched.
func TestOutOfRangeRefused(t *testing.T) {
	p := startPeer(t, 64<<10)
	tr := p.e.tr
	rb, ex := p.remote(0), p.remote(1)
	before := p.do("hash 0 %d", rb.Size)
	cases := []struct {
		name string
		dst  device.Ptr
		n    int
	}{
		{"straddles the end of the buffer", rb.Addr.Add(rb.Size - 4), 8},
		{"one past the end", rb.Addr.Add(rb.Size), 1},
		{"before the buffer", rb.Addr - 1, 2},
		{"beyond the extra range", ex.Addr.Add(extraSize - 1), 2},
		{"nil", 0, 1},
		{"far away", rb.Addr.Add(1 << 40), 16},
	}
	for _, c := range cases {
		src := bytes.Repeat([]byte{0xEE}, c.n)
		err := tr.Write(nil, c.dst, src)
		if !errors.Is(err, shm.ErrOutOfRange) || !strings.Contains(err.Error(), "rank 1") ||
			!strings.Contains(err.Error(), fmt.Sprintf("%#x", uintptr(c.dst))) {
			t.Errorf("%s: Write = %v, want ErrOutOfRange naming rank 1 and the address", c.name, err)
		}
		if err := tr.WriteReduce(nil, c.dst, src, c.n, reduce.Uint8, reduce.Sum); !errors.Is(err, shm.ErrOutOfRange) {
			t.Errorf("%s: WriteReduce = %v", c.name, err)
		}
		if err := tr.Read(nil, make([]byte, c.n), c.dst); !errors.Is(err, shm.ErrOutOfRange) {
			t.Errorf("%s: Read = %v", c.name, err)
		}
		if err := tr.WriteWithNotify(nil, c.dst, src, 0); !errors.Is(err, shm.ErrOutOfRange) {
			t.Errorf("%s: WriteWithNotify = %v", c.name, err)
		}
	}
	// A bad notify index is refused before a byte is written.
	if err := tr.WriteWithNotify(nil, rb.Addr, []byte{0xEE}, notifyNum); err == nil || !strings.Contains(err.Error(), "no notify 4") {
		t.Errorf("WriteWithNotify(notify %d) = %v", notifyNum, err)
	}
	if err := tr.NotifyRecord(nil, notifyNum); err == nil || !strings.Contains(err.Error(), "no notify 4") {
		t.Errorf("NotifyRecord(%d) = %v", notifyNum, err)
	}
	if err := tr.NotifyRecord(nil, -1); err == nil {
		t.Error("NotifyRecord(-1) accepted")
	}
	if after := p.do("hash 0 %d", rb.Size); after != before {
		t.Fatal("a refused write changed the peer's buffer")
	}
	if r := p.do("guard"); r != "clean" {
		t.Fatalf("guard: %s", r)
	}
}

// TestPeerKilledMidWait: the peer dies while this end waits; the wait fails
// at once (not at its timeout) with channel.ErrPeerLost naming the rank, and later
// operations fail the same way.
func TestPeerKilledMidWait(t *testing.T) {
	p := startPeer(t, 64<<10)
	s, err := p.e.dev.CreateStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	if err := p.e.conn.Notifies[2].Wait(s, time.Minute); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.e.wait(1) }()
	time.Sleep(50 * time.Millisecond) // both waits are asleep
	start := time.Now()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, channel.ErrPeerLost) || !strings.Contains(err.Error(), "rank 1") {
			t.Fatalf("wait = %v, want channel.ErrPeerLost naming rank 1", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the wait did not end after the peer died")
	}
	if err := s.SynchronizeWithTimeout(10 * time.Second); !errors.Is(err, channel.ErrPeerLost) {
		t.Fatalf("stream wait = %v, want channel.ErrPeerLost", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the loss took %v to be noticed", d)
	}
	if err := p.e.tr.Write(nil, p.remote(0).Addr, []byte{1}); !errors.Is(err, channel.ErrPeerLost) {
		t.Fatalf("Write after the loss = %v", err)
	}
	if err := p.e.tr.NotifyRecord(nil, 0); !errors.Is(err, channel.ErrPeerLost) {
		t.Fatalf("NotifyRecord after the loss = %v", err)
	}
}

// TestPeerCloseBreaksWaits: a peer that closes its end says goodbye: waits
// here fail with channel.ErrPeerClosed, and the peer's own Close left nothing open.
func TestPeerCloseBreaksWaits(t *testing.T) {
	p := startPeer(t, 64<<10)
	done := make(chan error, 1)
	go func() { done <- p.e.wait(3) }()
	time.Sleep(20 * time.Millisecond)
	r := strings.Fields(p.do("close"))
	num := func(s string) int { v, _ := strconv.Atoi(s); return v }
	if len(r) != 3 || num(r[0]) != num(r[2]) || num(r[1]) <= num(r[0]) {
		t.Errorf("peer descriptors before connect / connected / after close: %v", r)
	}
	select {
	case err := <-done:
		if !errors.Is(err, channel.ErrPeerClosed) {
			t.Fatalf("wait = %v, want channel.ErrPeerClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the wait did not end after the peer closed")
	}
}

func mapsWith(s string) int {
	b, _ := os.ReadFile("/proc/self/maps")
	return strings.Count(string(b), s)
}

func devShm(t *testing.T) []string {
	ents, err := os.ReadDir("/dev/shm")
	if err != nil {
		return nil
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// TestCloseLeavesNothing: after Close (twice) and the device's Close, no
// descriptor, memory-file mapping or /dev/shm file is left; operations fail
// with channel.ErrClosed; the local notifies fail at once. Goroutines are checked
// by leakcheck in TestMain.
func TestCloseLeavesNothing(t *testing.T) {
	fds, maps, shmFiles := countFDs(), mapsWith("memfd:"), devShm(t)
	p := startPeer(t, 1<<20)
	if mapsWith("memfd:") <= maps {
		t.Fatal("no memory file is mapped while connected")
	}
	if err := p.e.tr.Write(nil, p.remote(0).Addr, []byte("x")); err != nil {
		t.Fatal(err)
	}
	n := p.e.conn.Notifies[0]
	if err := p.e.tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.e.tr.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := p.e.tr.Write(nil, p.remote(0).Addr, []byte("x")); !errors.Is(err, channel.ErrClosed) {
		t.Fatalf("Write after Close = %v", err)
	}
	if err := n.WaitNow(context.Background()); !errors.Is(err, channel.ErrClosed) {
		t.Fatalf("wait after Close = %v", err)
	}
	p.e.dev.Close()
	p.do("idle") // the peer is still there; it saw our goodbye
	p.out.Close()
	p.in.Close()
	p.cmd.Wait()
	if got := countFDs(); got != fds {
		t.Errorf("%d descriptors open, %d before", got, fds)
	}
	if got := mapsWith("memfd:"); got != maps {
		t.Errorf("%d memory-file mappings, %d before", got, maps)
	}
	if got := devShm(t); strings.Join(got, ",") != strings.Join(shmFiles, ",") {
		t.Errorf("/dev/shm holds %v, held %v", got, shmFiles)
	}
}

// TestConnectRefusals: a hello from another host, from a stranger, or a
// wrong rank is refused with a clear error; a cancelled connect ends.
func TestConnectRefusals(t *testing.T) {
	e, err := newEnd(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer e.close()
	d, _ := shm.NewDialer(shm.Options{})
	defer d.Close()
	local := &channel.Local{Rank: 0, Peer: 1, Device: e.dev, Registry: e.reg,
		HCCLBuf: channel.Mem{Addr: e.buf, Size: 4096}, NotifyNum: 1, Name: "refusal test"}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	garbage := func(context.Context, []byte) ([]byte, error) { return []byte("not a hello"), nil }
	if _, err := d.Connect(ctx, local, garbage); !errors.Is(err, channel.ErrRefused) || !strings.Contains(err.Error(), "rank 1") {
		t.Errorf("garbage hello: %v", err)
	}
	// A hello just like ours, but from another host.
	other := func(_ context.Context, mine []byte) ([]byte, error) {
		b := bytes.Replace(mine, []byte(shm.HostID()), []byte(strings.Repeat("x", len(shm.HostID()))), 1)
		return b, nil
	}
	if _, err := d.Connect(ctx, local, other); !errors.Is(err, shm.ErrOtherHost) {
		t.Errorf("other host: %v", err)
	}
	// Our own hello echoed back: wrong ranks.
	echo := func(_ context.Context, mine []byte) ([]byte, error) { return mine, nil }
	if _, err := d.Connect(ctx, local, echo); !errors.Is(err, channel.ErrRefused) {
		t.Errorf("echoed hello: %v", err)
	}
	// The exchange never answers: the connect ends with ctx.
	short, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	never := func(ctx context.Context, _ []byte) ([]byte, error) { <-ctx.Done(); return nil, ctx.Err() }
	if _, err := d.Connect(short, local, never); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("silent peer: %v", err)
	}
	d.Close()
	if _, err := d.Connect(ctx, local, echo); !errors.Is(err, channel.ErrClosed) {
		t.Errorf("closed dialer: %v", err)
	}
}

// TestManyProcessesMakeProgress: five processes on this machine's few
// cores, four channels doing echo rounds at once: waits that spin then sleep
// let every process run, so all finish well inside their timeouts.
func TestManyProcessesMakeProgress(t *testing.T) {
	const peers, rounds, n = 4, 200, 64
	ps := make([]*peer, peers)
	for i := range ps {
		ps[i] = startPeer(t, 64<<10)
	}
	start := time.Now()
	errc := make(chan error, peers)
	for i, p := range ps {
		p.send("echo %d %d", rounds, n)
		go func(i int, p *peer) {
			src := make([]byte, n)
			for r := 0; r < rounds; r++ {
				pattern(src, r+i)
				if err := p.e.tr.Write(nil, p.remote(0).Addr, src); err != nil {
					errc <- err
					return
				}
				if err := p.e.tr.NotifyRecord(nil, 0); err != nil {
					errc <- err
					return
				}
				if err := p.e.wait(0); err != nil {
					errc <- fmt.Errorf("peer %d round %d: %w", i, r, err)
					return
				}
				if !bytes.Equal(p.e.bytes(p.e.buf, n), src) {
					errc <- fmt.Errorf("peer %d round %d: the echo holds other bytes", i, r)
					return
				}
			}
			errc <- nil
		}(i, p)
	}
	for range ps {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range ps {
		if r := p.recv(); !strings.HasPrefix(r, "ok") {
			t.Fatalf("peer: %s", r)
		}
	}
	t.Logf("%d processes x %d rounds: %v", peers+1, rounds, time.Since(start))
}
