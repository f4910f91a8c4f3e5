package hcomm_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/hcomm"
)

// WriteWithNotifyOnThread: one task that writes and records; the data is
// visible once the peer's wait returns, every round; a bad notify index or
// range is refused at the call, the peer's memory untouched.
func TestWriteWithNotify(t *testing.T) {
	p := newPair(t, nil)
	const n = 1 << 16
	remote, _, _ := p.comms[0].ChannelGetHcclBuffer(p.ch[0])
	for i := 0; i < 30; i++ {
		fill(t, p.comms[0], p.buf[0], n, byte(i+1))
		fill(t, p.comms[1], p.buf[1], n, 0)
		seen := make(chan []byte, 1)
		if err := hcomm.ChannelNotifyWaitOnThread(p.th[1], p.ch[1], 2, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		p.th[1].Stream().Launch("look", func(<-chan struct{}) error {
			b, _ := p.comms[1].Device().Bytes(p.buf[1], n)
			seen <- append([]byte(nil), b...)
			return nil
		})
		if err := hcomm.WriteWithNotifyOnThread(p.th[0], p.ch[0], remote, p.buf[0], n, 2); err != nil {
			t.Fatal(err)
		}
		if err := p.sync(t, 0); err != nil {
			t.Fatal(err)
		}
		if err := p.sync(t, 1); err != nil {
			t.Fatal(err)
		}
		if got := <-seen; !bytes.Equal(got, bytes.Repeat([]byte{byte(i + 1)}, n)) {
			t.Fatalf("round %d: data not visible after the wait", i)
		}
	}
	// A zero-length write with notify is a plain record.
	if err := hcomm.ChannelNotifyWaitOnThread(p.th[1], p.ch[1], 0, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := hcomm.WriteWithNotifyOnThread(p.th[0], p.ch[0], remote, p.buf[0], 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := p.sync(t, 1); err != nil {
		t.Fatalf("zero-length write with notify: %v", err)
	}
	if err := hcomm.WriteWithNotifyOnThread(p.th[0], p.ch[0], remote, p.buf[0], 8, 3); !errors.Is(err, hcomm.ErrPara) {
		t.Errorf("notify index 3 of 3: %v, want ErrPara", err)
	}
	// A negative index is refused too, not taken for a write without a record.
	if err := hcomm.WriteWithNotifyOnThread(p.th[0], p.ch[0], remote, p.buf[0], 8, -1); !errors.Is(err, hcomm.ErrPara) {
		t.Errorf("notify index -1: %v, want ErrPara", err)
	}
	fill(t, p.comms[1], p.buf[1], 64, 0x77)
	if err := hcomm.WriteWithNotifyOnThread(p.th[0], p.ch[0], remote.Add(p.size-4), p.buf[0], 8, 0); !errors.Is(err, hcomm.ErrPara) {
		t.Errorf("write past the peer's buffer: %v, want ErrPara", err)
	}
	if got := read(t, p.comms[1], p.buf[1], 64); !bytes.Equal(got, bytes.Repeat([]byte{0x77}, 64)) {
		t.Error("a refused write touched the peer's memory")
	}
}

// LocalReduceToOnThread: dst = a op b, in place on either operand, with bad
// ranges refused at the call.
func TestLocalReduceTo(t *testing.T) {
	p := newPair(t, nil)
	c := p.comms[0]
	a, b, d := p.buf[0], p.buf[0].Add(1024), p.buf[0].Add(2048)
	ints := func(v byte, k int) []byte {
		out := make([]byte, 4*k)
		for i := 0; i < k; i++ {
			out[4*i] = v
		}
		return out
	}
	const k = 9
	c.Device().MemcpyHtoD(a, ints(3, k))
	c.Device().MemcpyHtoD(b, ints(4, k))
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(hcomm.LocalReduceToOnThread(p.th[0], d, a, b, k, hcomm.Int32, hcomm.Prod)) // d = 12
	must(hcomm.LocalReduceToOnThread(p.th[0], a, a, b, k, hcomm.Int32, hcomm.Sum))  // a = 7
	must(hcomm.LocalReduceToOnThread(p.th[0], b, d, b, k, hcomm.Int32, hcomm.Max))  // b = 12
	must(p.sync(t, 0))
	for _, tc := range []struct {
		name string
		at   int64
		want byte
	}{{"dst", 2048, 12}, {"in place on a", 0, 7}, {"in place on b", 1024, 12}} {
		if got := read(t, c, p.buf[0].Add(tc.at), 4*k); !bytes.Equal(got, ints(tc.want, k)) {
			t.Errorf("%s: %v", tc.name, got)
		}
	}
	if err := hcomm.LocalReduceToOnThread(p.th[0], d, a, p.buf[0].Add(p.size-8), k, hcomm.Int32, hcomm.Sum); !errors.Is(err, hcomm.ErrPara) {
		t.Errorf("an operand past the buffer: %v, want ErrPara", err)
	}
	if err := hcomm.LocalReduceToOnThread(nil, d, a, b, k, hcomm.Int32, hcomm.Sum); !errors.Is(err, hcomm.ErrPtr) {
		t.Errorf("nil thread: %v, want ErrPtr", err)
	}
}

// HCOMM_TCP_STREAMS sets the sockets per tcp channel; a bad value is an
// error naming the variable, at the first channel.
func TestTCPStreamsVariable(t *testing.T) {
	t.Setenv("HCOMM_TCP_STREAMS", "0")
	comms, err := hcomm.InitAll(2, &hcomm.Config{Transport: "tcp", BufferSize: 32 << 10, ConnectTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	d := hcomm.ChannelDescInit(1)
	d[0].RemoteRank = 1
	if _, err := comms[0].ChannelAcquire(hcomm.EngineCPUTS, d); err == nil || !strings.Contains(err.Error(), "HCOMM_TCP_STREAMS") {
		t.Fatalf("HCOMM_TCP_STREAMS=0: %v, want an error naming the variable", err)
	}
}

// A congestion control the host refuses (HCOMM_TCP_CONGESTION,
// Config.TCPCongestion) is an error naming it, at the first tcp channel.
func TestTCPCongestionRefused(t *testing.T) {
	comms, err := hcomm.InitAll(2, &hcomm.Config{Transport: "tcp", BufferSize: 32 << 10, ConnectTimeout: 5 * time.Second, TCPCongestion: "no_such_cc"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	d := hcomm.ChannelDescInit(1)
	d[0].RemoteRank = 1
	if _, err := comms[0].ChannelAcquire(hcomm.EngineCPUTS, d); err == nil || !strings.Contains(err.Error(), `"no_such_cc"`) {
		t.Fatalf("TCPCongestion no_such_cc: %v, want an error naming it", err)
	}
}

// Memory registered after a channel was acquired is outside what that
// channel knows of the peer (a write into it is refused at the call); a
// channel acquired afterwards reaches it.
func TestMemRegReachedByLaterChannels(t *testing.T) {
	p := newPair(t, nil)
	extra, err := p.comms[1].Device().Malloc(256)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.comms[1].CommMemReg("late", extra, 256); err != nil {
		t.Fatal(err)
	}
	if err := hcomm.WriteOnThread(p.th[0], p.ch[0], extra, p.buf[0], 8); !errors.Is(err, hcomm.ErrPara) {
		t.Fatalf("write into memory registered after the channel: %v, want ErrPara", err)
	}
	later := make([]*hcomm.Channel, 2)
	errs := make(chan error, 2)
	for r := range 2 {
		go func() {
			d := hcomm.ChannelDescInit(1)
			d[0].RemoteRank, d[0].Tag = 1-r, "later"
			chs, err := p.comms[r].ChannelAcquire(hcomm.EngineCPUTS, d)
			if err == nil {
				later[r] = chs[0]
			}
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if err := hcomm.WriteOnThread(p.th[0], later[0], extra, p.buf[0], 8); err != nil {
		t.Fatalf("write through a channel acquired after the registration: %v", err)
	}
	if err := p.sync(t, 0); err != nil {
		t.Fatal(err)
	}
}
