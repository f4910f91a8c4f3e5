package hcomm_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/channel/inproc"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// countingDialer is inproc's Dialer that counts what hcomm tells a
// virtual-time transport: returned waits and local work.
type countingDialer struct {
	*inproc.Dialer
	waited, local *atomic.Int64
}

func (d countingDialer) Name() string { return "counting" }

func (d countingDialer) Connect(ctx context.Context, l *channel.Local, ex channel.Exchange) (*channel.Conn, error) {
	c, err := d.Dialer.Connect(ctx, l, ex)
	if err == nil {
		c.Transport = countingTransport{c.Transport, d.waited}
	}
	return c, err
}

func (d countingDialer) LocalWork(n int64) { d.local.Add(n) }

type countingTransport struct {
	channel.Transport
	waited *atomic.Int64
}

func (t countingTransport) NotifyWaited(int) { t.waited.Add(1) }
func (t countingTransport) Name() string     { return "counting" }

// TestInitAllOver: every channel goes over the given Dialers, whatever
// the protocol; a returned wait reaches channel.Clocked, a local copy
// channel.LocalCoster; ranks beyond device.MaxDevices share devices.
func TestInitAllOver(t *testing.T) {
	var waited, local atomic.Int64
	fab := inproc.NewFabric()
	ds := []channel.Dialer{countingDialer{inproc.NewDialer(fab), &waited, &local}, countingDialer{inproc.NewDialer(fab), &waited, &local}}
	comms, err := hcomm.InitAllOver(ds, []string{"a", "b"}, &hcomm.Config{BufferSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	if comms[0].HostOf(0) == comms[0].HostOf(1) {
		t.Errorf("ranks on hosts a and b share host %q", comms[0].HostOf(0))
	}
	chs := make([][]*hcomm.Channel, 2)
	errs := make(chan error, 2)
	for r, c := range comms {
		go func(r int, c *hcomm.Comm) {
			d := hcomm.ChannelDescInit(1)
			d[0].RemoteRank, d[0].NotifyNum, d[0].Protocol = 1-r, 1, hcomm.ProtocolROCE
			var err error
			chs[r], err = c.ChannelAcquire(hcomm.EngineCPUTS, d)
			errs <- err
		}(r, c)
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := chs[0][0].Transport(); got != "counting" {
		t.Fatalf("a ROCE channel went over %q, want the given Dialer's", got)
	}
	ts := make([]*hcomm.Thread, 2)
	for r, c := range comms {
		th, err := c.ThreadAcquire(hcomm.EngineCPUTS, 1, 1)
		if err != nil {
			t.Fatal(err)
		}
		ts[r] = th[0]
	}
	buf, _, _ := comms[0].GetHcclBuffer()
	if err := hcomm.LocalCopyOnThread(ts[0], buf, buf.Add(4096), 512); err != nil {
		t.Fatal(err)
	}
	if err := hcomm.ChannelNotifyRecordOnThread(ts[0], chs[0][0], 0); err != nil {
		t.Fatal(err)
	}
	if err := hcomm.ChannelNotifyWaitOnThread(ts[1], chs[1][0], 0, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, th := range ts {
		if err := hcomm.ThreadSynchronize(th); err != nil {
			t.Fatal(err)
		}
	}
	if waited.Load() != 1 || local.Load() != 512 {
		t.Errorf("told of %d waits and %d bytes of local work; want 1 and 512", waited.Load(), local.Load())
	}
	// A try-wait that finds the record is a returned wait too (the
	// collectives' inline hello polls with it), one that does not is not.
	if ok, err := hcomm.ChannelNotifyTryWait(chs[1][0], 0); ok || err != nil {
		t.Fatalf("try-wait with nothing recorded: %v, %v", ok, err)
	}
	if err := hcomm.ChannelNotifyRecordOnThread(ts[0], chs[0][0], 0); err != nil {
		t.Fatal(err)
	}
	if err := hcomm.ThreadSynchronize(ts[0]); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		ok, err := hcomm.ChannelNotifyTryWait(chs[1][0], 0)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("try-wait did not see the record in 5s")
		}
		time.Sleep(time.Millisecond)
	}
	if waited.Load() != 2 {
		t.Errorf("after a try-wait that found the record: told of %d waits, want 2", waited.Load())
	}
}

// TestInitAllOverBadInput: each mistake is named.
func TestInitAllOverBadInput(t *testing.T) {
	d := inproc.NewDialer(nil)
	for _, c := range []struct {
		name    string
		dialers []channel.Dialer
		hosts   []string
		cfg     *hcomm.Config
		want    string
	}{
		{"no ranks", nil, nil, nil, "rank count 0"},
		{"nil dialer", []channel.Dialer{d, nil}, nil, nil, "rank 1 has no Dialer"},
		{"hosts", []channel.Dialer{d, d}, []string{"a"}, nil, "1 host names for 2 ranks"},
		{"forced transport", []channel.Dialer{d}, nil, &hcomm.Config{Transport: "tcp"}, `Config.Transport "tcp" is set`},
		{"taken name", []channel.Dialer{d}, nil, nil, ""},
	} {
		comms, err := hcomm.InitAllOver(c.dialers, c.hosts, c.cfg)
		for _, cm := range comms {
			cm.Destroy()
		}
		if c.want == "" {
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.name, err, c.want)
		}
	}
	// More ranks than devices: devices are shared.
	many := make([]channel.Dialer, device.MaxDevices+2)
	for i := range many {
		many[i] = inproc.NewDialer(nil)
	}
	comms, err := hcomm.InitAllOver(many, nil, &hcomm.Config{BufferSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if got := comms[device.MaxDevices+1].Device().ID(); got != 1 {
		t.Errorf("rank %d is on device %d, want 1", device.MaxDevices+1, got)
	}
	for _, cm := range comms {
		cm.Destroy()
	}
}

// receiptDialer is countingDialer saying that its channels check writes on
// receipt (channel.ReceiverChecker).
type receiptDialer struct{ countingDialer }

func (receiptDialer) ChecksOnReceipt() bool { return true }

// TestTakesLentTo: whether a peer's channels take lent writes is known
// before any channel is made — a Dialer of InitAllOver's says so or not —
// and in-process ranks' (inproc) do; bad peers are false, not a panic.
func TestTakesLentTo(t *testing.T) {
	var waited, local atomic.Int64
	for _, c := range []struct {
		name string
		mk   func(fab *inproc.Fabric) channel.Dialer
		want bool
	}{
		{"a Dialer that says nothing", func(fab *inproc.Fabric) channel.Dialer {
			return countingDialer{inproc.NewDialer(fab), &waited, &local}
		}, false},
		{"a Dialer that checks on receipt", func(fab *inproc.Fabric) channel.Dialer {
			return receiptDialer{countingDialer{inproc.NewDialer(fab), &waited, &local}}
		}, true},
	} {
		fab := inproc.NewFabric()
		comms, err := hcomm.InitAllOver([]channel.Dialer{c.mk(fab), c.mk(fab)}, nil, &hcomm.Config{BufferSize: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		if got := comms[0].TakesLentTo(1); got != c.want {
			t.Errorf("%s: TakesLentTo(1) %v, want %v", c.name, got, c.want)
		}
		for _, bad := range []int{0, -1, 2} {
			if comms[0].TakesLentTo(bad) {
				t.Errorf("%s: TakesLentTo(%d) of rank 0 of 2 is true", c.name, bad)
			}
		}
		for _, cm := range comms {
			cm.Destroy()
		}
		if comms[1].TakesLentTo(0) {
			t.Errorf("%s: a destroyed communicator's TakesLentTo is true", c.name)
		}
	}
	for _, c := range []struct {
		transport string
		want      bool
	}{{"", true}, {hcomm.TransportTCP, true}, {hcomm.TransportShm, false}} {
		comms, err := hcomm.InitAll(2, &hcomm.Config{BufferSize: 1 << 20, Transport: c.transport})
		if err != nil {
			t.Fatal(err)
		}
		if got := comms[1].TakesLentTo(0); got != c.want {
			t.Errorf("in-process ranks, transport %q: TakesLentTo(0) %v, want %v", c.transport, got, c.want)
		}
		for _, cm := range comms {
			cm.Destroy()
		}
	}
}
