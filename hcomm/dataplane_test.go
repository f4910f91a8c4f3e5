package hcomm_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
	"github.com/hcomm-dev/hcomm/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

type pair struct {
	comms [2]*hcomm.Comm
	ch    [2]*hcomm.Channel
	th    [2]*hcomm.Thread
	buf   [2]device.Ptr
	size  int64
}

// newPair makes two ranks with a channel between them (3 notifies each, as in
// the seed's sample) and one thread each.
func newPair(t *testing.T, cfg *hcomm.Config) *pair {
	t.Helper()
	if cfg == nil {
		cfg = &hcomm.Config{BufferSize: 32 << 10, Name: "test"}
	}
	comms := hcommtest.Options{Config: cfg}.New(t, 2, hcommtest.Auto)
	p := &pair{}
	copy(p.comms[:], comms)
	t.Cleanup(func() { // before New's Destroy: stop what a test left pending
		for _, c := range comms {
			c.Abort()
		}
	})
	hcommtest.Each(t, comms, func(t testing.TB, c *hcomm.Comm) {
		r := c.Rank()
		d := hcomm.ChannelDescInit(1)
		d[0].RemoteRank = 1 - r
		d[0].Protocol = hcomm.ProtocolHCCS
		d[0].NotifyNum = 3
		chs, err := c.ChannelAcquire(hcomm.EngineCPUTS, d)
		if err != nil {
			t.Fatal(err)
		}
		p.ch[r] = chs[0]
		ts, err := c.ThreadAcquire(hcomm.EngineCPUTS, 1, 2)
		if err != nil {
			t.Fatal(err)
		}
		p.th[r] = ts[0]
		var size int64
		if p.buf[r], size, err = c.GetHcclBuffer(); err != nil {
			t.Fatal(err)
		}
		if r == 0 {
			p.size = size
		}
	})
	return p
}

func (p *pair) sync(t *testing.T, r int) error {
	t.Helper()
	return p.th[r].Stream().SynchronizeWithTimeout(20 * time.Second)
}

func fill(t *testing.T, c *hcomm.Comm, ptr device.Ptr, n int64, b byte) {
	t.Helper()
	if err := c.Device().Memset(ptr, n, b); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, c *hcomm.Comm, ptr device.Ptr, n int64) []byte {
	t.Helper()
	out := make([]byte, n)
	if err := c.Device().MemcpyDtoH(out, ptr); err != nil {
		t.Fatal(err)
	}
	return out
}

// The seed's handshake: write, record, and the peer sees the data once its wait returns.
func TestWriteThenRecordIsVisibleAfterWait(t *testing.T) {
	p := newPair(t, nil)
	const n = 4099
	fill(t, p.comms[0], p.buf[0], n, 0x5A)
	remote, rsize, err := p.comms[0].ChannelGetHcclBuffer(p.ch[0])
	if err != nil || remote != p.buf[1] || rsize != p.size {
		t.Fatalf("ChannelGetHcclBuffer = %#x, %d, %v; want rank 1's buffer", remote, rsize, err)
	}
	for i := 0; i < 50; i++ { // many rounds: visibility must hold every time
		fill(t, p.comms[1], p.buf[1], n, 0)
		seen := make(chan []byte, 1)
		if err := hcomm.ChannelNotifyWaitOnThread(p.th[1], p.ch[1], 1, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		p.th[1].Stream().Launch("look", func(<-chan struct{}) error {
			b, _ := p.comms[1].Device().Bytes(p.buf[1], n)
			seen <- append([]byte(nil), b...)
			return nil
		})
		if err := hcomm.WriteOnThread(p.th[0], p.ch[0], remote, p.buf[0], n); err != nil {
			t.Fatal(err)
		}
		if err := hcomm.ChannelNotifyRecordOnThread(p.th[0], p.ch[0], 1); err != nil {
			t.Fatal(err)
		}
		if err := p.sync(t, 0); err != nil {
			t.Fatal(err)
		}
		if err := p.sync(t, 1); err != nil {
			t.Fatal(err)
		}
		if got := <-seen; !bytes.Equal(got, bytes.Repeat([]byte{0x5A}, n)) {
			t.Fatalf("round %d: data not visible after the wait", i)
		}
	}
}

func TestReadAndReduceOps(t *testing.T) {
	p := newPair(t, nil)
	c0, c1 := p.comms[0], p.comms[1]
	// rank 1's buffer holds int32 5s; rank 0 reads them, read-reduces, write-reduces.
	vals := func(v int32, k int) []byte {
		b := make([]byte, 4*k)
		for i := 0; i < k; i++ {
			b[4*i] = byte(v)
		}
		return b
	}
	const k = 7
	c1.Device().MemcpyHtoD(p.buf[1], vals(5, k))
	c0.Device().MemcpyHtoD(p.buf[0], vals(2, k))
	local2 := p.buf[0].Add(1024)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(hcomm.ReadOnThread(p.th[0], p.ch[0], local2, p.buf[1], 4*k))                                // local2 = 5
	must(hcomm.ReadReduceOnThread(p.th[0], p.ch[0], p.buf[0], p.buf[1], k, hcomm.Int32, hcomm.Sum))  // buf0 = 2+5
	must(hcomm.WriteReduceOnThread(p.th[0], p.ch[0], p.buf[1], p.buf[0], k, hcomm.Int32, hcomm.Max)) // buf1 = max(5,7)
	must(hcomm.LocalReduceOnThread(p.th[0], local2, p.buf[0], k, hcomm.Int32, hcomm.Prod))           // local2 = 5*7
	must(hcomm.LocalCopyOnThread(p.th[0], p.buf[0].Add(2048), local2, 4*k))
	must(hcomm.ChannelFenceOnThread(p.th[0], p.ch[0]))
	must(p.sync(t, 0))
	if got := read(t, c0, p.buf[0], 4*k); !bytes.Equal(got, vals(7, k)) {
		t.Fatalf("read-reduce: %v", got)
	}
	if got := read(t, c1, p.buf[1], 4*k); !bytes.Equal(got, vals(7, k)) {
		t.Fatalf("write-reduce: %v", got)
	}
	if got := read(t, c0, p.buf[0].Add(2048), 4*k); !bytes.Equal(got, vals(35, k)) {
		t.Fatalf("local reduce/copy: %v", got)
	}
}

func TestOutOfBoundsIsRejectedAndPeerUntouched(t *testing.T) {
	p := newPair(t, nil)
	fill(t, p.comms[1], p.buf[1], p.size, 0x11)
	own, _ := p.comms[1].Device().Malloc(4096) // rank 1 memory it never registered
	fill(t, p.comms[1], own, 4096, 0x22)
	cases := []struct {
		name string
		err  error
	}{
		{"write past the end", hcomm.WriteOnThread(p.th[0], p.ch[0], p.buf[1].Add(p.size-8), p.buf[0], 16)},
		{"write before the start", hcomm.WriteOnThread(p.th[0], p.ch[0], p.buf[1]-8, p.buf[0], 8)},
		{"write to unregistered", hcomm.WriteOnThread(p.th[0], p.ch[0], own, p.buf[0], 8)},
		{"read past the end", hcomm.ReadOnThread(p.th[0], p.ch[0], p.buf[0], p.buf[1].Add(p.size), 1)},
		{"write-reduce past the end", hcomm.WriteReduceOnThread(p.th[0], p.ch[0], p.buf[1].Add(p.size-4), p.buf[0], 2, hcomm.Float32, hcomm.Sum)},
		{"read-reduce past the end", hcomm.ReadReduceOnThread(p.th[0], p.ch[0], p.buf[0], p.buf[1].Add(p.size-4), 2, hcomm.Float32, hcomm.Sum)},
		{"negative length", hcomm.WriteOnThread(p.th[0], p.ch[0], p.buf[1], p.buf[0], -1)},
		{"local src past the end", hcomm.WriteOnThread(p.th[0], p.ch[0], p.buf[1], p.buf[0].Add(p.size-1), 2)},
		{"bad data type", hcomm.WriteReduceOnThread(p.th[0], p.ch[0], p.buf[1], p.buf[0], 1, 99, hcomm.Sum)},
		{"bad op", hcomm.WriteReduceOnThread(p.th[0], p.ch[0], p.buf[1], p.buf[0], 1, hcomm.Int32, 9)},
		{"record index", hcomm.ChannelNotifyRecordOnThread(p.th[0], p.ch[0], 3)},
		{"wait index", hcomm.ChannelNotifyWaitOnThread(p.th[0], p.ch[0], -1, time.Second)},
		{"nil channel", hcomm.WriteOnThread(p.th[0], nil, p.buf[1], p.buf[0], 8)},
		{"nil thread", hcomm.WriteOnThread(nil, p.ch[0], p.buf[1], p.buf[0], 8)},
		{"foreign thread", hcomm.WriteOnThread(p.th[1], p.ch[0], p.buf[1], p.buf[0], 8)},
	}
	for _, c := range cases {
		var he *hcomm.Error
		if !errors.As(c.err, &he) {
			t.Errorf("%s: got %v, want an *hcomm.Error", c.name, c.err)
			continue
		}
		if c.name != "nil channel" && (he.Rank != 0 || !strings.Contains(he.Error(), "rank 0")) {
			t.Errorf("%s: error %q does not name the rank", c.name, he)
		}
	}
	if err := p.sync(t, 0); err != nil {
		t.Fatal(err)
	}
	if got := read(t, p.comms[1], p.buf[1], p.size); !bytes.Equal(got, bytes.Repeat([]byte{0x11}, int(p.size))) {
		t.Fatal("a rejected write touched the peer's buffer")
	}
	if got := read(t, p.comms[1], own, 4096); !bytes.Equal(got, bytes.Repeat([]byte{0x22}, 4096)) {
		t.Fatal("a rejected write touched the peer's unregistered memory")
	}
}

func TestWaitTimeoutNamesEverything(t *testing.T) {
	p := newPair(t, nil)
	start := time.Now()
	if err := hcomm.ChannelNotifyWaitOnThread(p.th[0], p.ch[0], 2, 30*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	err := p.sync(t, 0)
	if !errors.Is(err, device.ErrWaitTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want a wait timeout", err)
	}
	if time.Since(start) > 10*time.Second {
		t.Fatal("timed-out wait took too long")
	}
	for _, word := range []string{"comm test", "rank 0", "channel to rank 1", "HCCS", "notify 2"} {
		if !strings.Contains(err.Error(), word) {
			t.Errorf("timeout error %q does not say %q", err, word)
		}
	}
}

func TestDefaultWaitTimeoutComesFromConfig(t *testing.T) {
	p := newPair(t, &hcomm.Config{BufferSize: 4096, ExecTimeout: 30 * time.Millisecond})
	hcomm.ChannelNotifyWaitOnThread(p.th[0], p.ch[0], 0, 0)
	if err := p.sync(t, 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the ExecTimeout to apply", err)
	}
}

func TestAbortUnblocksPendingWaits(t *testing.T) {
	p := newPair(t, &hcomm.Config{BufferSize: 4096, ExecTimeout: time.Hour})
	hcomm.ChannelNotifyWaitOnThread(p.th[0], p.ch[0], 0, 0)
	done := make(chan error, 1)
	go func() { done <- p.sync(t, 0) }()
	time.Sleep(10 * time.Millisecond)
	if err := p.comms[0].Abort(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, device.ErrStreamAbort) {
			t.Fatalf("err = %v, want stream abort", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Abort did not unblock the pending wait")
	}
	err := hcomm.WriteOnThread(p.th[0], p.ch[0], p.buf[1], p.buf[0], 8)
	if !errors.Is(err, hcomm.ErrUnavail) || !errors.Is(err, hcomm.ErrAborted) {
		t.Fatalf("after Abort: %v", err)
	}
	p.comms[0].Abort() // idempotent
}

func TestThreadNotifies(t *testing.T) {
	p := newPair(t, nil)
	ts, err := p.comms[0].ThreadAcquire(hcomm.EngineCPUTS, 2, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := hcomm.ThreadNotifyRecordOnThread(ts[0], ts[1], 1); err != nil {
		t.Fatal(err)
	}
	if err := hcomm.ThreadNotifyWaitOnThread(ts[1], 1, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := ts[1].Stream().SynchronizeWithTimeout(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := hcomm.ThreadNotifyRecordOnThread(ts[0], ts[1], 2); err == nil {
		t.Fatal("index 2 of 2 accepted")
	}
	s, _ := p.comms[0].Device().CreateStream()
	defer s.Destroy()
	if _, err := p.comms[0].ThreadAcquireWithStream(hcomm.EngineCPUTS, s, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := p.comms[1].ThreadAcquireWithStream(hcomm.EngineCPUTS, s, 1); !errors.Is(err, hcomm.ErrPtr) {
		t.Fatalf("stream of another device accepted: %v", err)
	}
}

func TestControlPlaneErrors(t *testing.T) {
	p := newPair(t, nil)
	c := p.comms[0]
	for _, e := range []hcomm.Engine{hcomm.EngineAICPU, hcomm.EngineAICPUTS, hcomm.EngineAIV, hcomm.EngineCCU} {
		if _, err := c.ThreadAcquire(e, 1, 1); !errors.Is(err, hcomm.ErrNotSupport) {
			t.Errorf("engine %v: %v", e, err)
		}
		d := hcomm.ChannelDescInit(1)
		d[0].RemoteRank = 1
		if _, err := c.ChannelAcquire(e, d); !errors.Is(err, hcomm.ErrNotSupport) {
			t.Errorf("engine %v: %v", e, err)
		}
	}
	bad := []hcomm.ChannelDesc{{RemoteRank: 0}, {RemoteRank: 2}, {RemoteRank: -1}, {RemoteRank: 1, NotifyNum: -1},
		{RemoteRank: 1, Protocol: 42}}
	for _, d := range bad {
		if _, err := c.ChannelAcquire(hcomm.EngineCPU, []hcomm.ChannelDesc{d}); !errors.Is(err, hcomm.ErrPara) {
			t.Errorf("desc %+v: %v", d, err)
		}
	}
	// ROCE needs the network transport; with it, the channel is a tcp one
	// (tested with both ends in transport_test.go).
	d := hcomm.ChannelDescInit(1)
	d[0].RemoteRank, d[0].Protocol = 1, hcomm.ProtocolROCE
	if !slices.Contains(hcomm.Transports(), hcomm.TransportTCP) {
		if _, err := c.ChannelAcquire(hcomm.EngineCPU, d); !errors.Is(err, hcomm.ErrNotSupport) {
			t.Errorf("ROCE: %v", err)
		}
	}
	if d := hcomm.ChannelDescInit(2); d[1].RemoteRank != -1 || d[1].Protocol != hcomm.ProtocolAuto || d[1].NotifyNum != 0 {
		t.Errorf("ChannelDescInit = %+v", d[1])
	}
	// idempotent per (engine, remote, protocol)
	again := hcomm.ChannelDescInit(1)
	again[0].RemoteRank, again[0].Protocol, again[0].NotifyNum = 1, hcomm.ProtocolHCCS, 3
	chs, err := c.ChannelAcquire(hcomm.EngineCPUTS, again)
	if err != nil || chs[0] != p.ch[0] {
		t.Fatalf("second acquire returned %v, %v; want the same channel", chs, err)
	}
	// a channel whose peer never comes times out within ConnectTimeout
	lone, _ := hcomm.InitAll(2, &hcomm.Config{BufferSize: 4096, ConnectTimeout: 30 * time.Millisecond})
	defer lone[0].Destroy()
	defer lone[1].Destroy()
	d = hcomm.ChannelDescInit(1)
	d[0].RemoteRank = 1
	if _, err := lone[0].ChannelAcquire(hcomm.EngineCPU, d); !errors.Is(err, hcomm.ErrTimeout) {
		t.Fatalf("lonely acquire: %v", err)
	}
	if _, err := hcomm.InitAll(0, nil); !errors.Is(err, hcomm.ErrPara) {
		t.Fatal("InitAll(0) accepted")
	}
}

func TestConfigFromEnvironment(t *testing.T) {
	t.Setenv("HCCL_BUFFSIZE", "1")
	t.Setenv("HCCL_EXEC_TIMEOUT", "7")
	t.Setenv("HCCL_CONNECT_TIMEOUT", "130")
	comms, err := hcomm.InitAll(1, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := comms[0].Config()
	_, size, _ := comms[0].GetHcclBuffer()
	if cfg.BufferSize != 1<<20 || size != 2<<20 || cfg.ExecTimeout != 7*time.Second || cfg.ConnectTimeout != 130*time.Second {
		t.Fatalf("config %+v, buffer %d", cfg, size)
	}
	comms[0].Destroy()
	comms, _ = hcomm.InitAll(1, &hcomm.Config{BufferSize: 4096}) // code wins
	if comms[0].Config().BufferSize != 4096 {
		t.Fatal("code did not win over the environment")
	}
	comms[0].Destroy()
	t.Setenv("HCCL_BUFFSIZE", "lots")
	if _, err := hcomm.InitAll(1, nil); err == nil || !strings.Contains(err.Error(), "HCCL_BUFFSIZE") {
		t.Fatalf("bad env: %v", err)
	}
	t.Setenv("HCCL_BUFFSIZE", "")
	comms, _ = hcomm.InitAll(1, nil)
	if comms[0].Config().BufferSize != hcomm.DefaultBufferSize || comms[0].Config().ExecTimeout != 7*time.Second {
		t.Fatalf("defaults: %+v", comms[0].Config())
	}
	comms[0].Destroy()
}

func TestDestroyIsIdempotentAndMemRegWorks(t *testing.T) {
	comms, _ := hcomm.InitAll(2, &hcomm.Config{BufferSize: 4096})
	extra, _ := comms[1].Device().Malloc(256)
	h, err := comms[1].CommMemReg("extra", extra, 256)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	chs := make([]*hcomm.Channel, 2)
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			d := hcomm.ChannelDescInit(1)
			d[0].RemoteRank = 1 - r
			c, err := comms[r].ChannelAcquire(hcomm.EngineCPU, d)
			if err != nil {
				t.Error(err)
				return
			}
			chs[r] = c[0]
		}(r)
	}
	wg.Wait()
	mems, _ := comms[0].ChannelGetRemoteMems(chs[0])
	if len(mems) != 2 || mems[1].Addr != extra || mems[1].Tag != "extra" {
		t.Fatalf("remote mems %+v", mems)
	}
	if err := comms[1].CommMemDereg(h); err != nil {
		t.Fatal(err)
	}
	if _, err := comms[0].CommMemReg(strings.Repeat("x", 256), extra, 8); !errors.Is(err, hcomm.ErrPara) {
		t.Fatal("long tag accepted")
	}
	for _, c := range comms {
		if err := c.Destroy(); err != nil {
			t.Fatal(err)
		}
		if err := c.Destroy(); err != nil {
			t.Fatal(err)
		}
		if _, _, err := c.GetHcclBuffer(); !errors.Is(err, hcomm.ErrUnavail) {
			t.Fatalf("after Destroy: %v", err)
		}
	}
	_ = fmt.Sprint
}
