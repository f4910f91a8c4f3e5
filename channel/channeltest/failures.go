package channeltest

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/reduce"
)

// This file holds the cases of refusals and endings: bad ranges and
// indices, Close, and a lost peer.

// testRangeRefusals sends every data operation to ranges of rank 1 outside
// what it registered. Each must fail, at the latest at the Fence after it
// (a transport may learn of the refusal from the peer, and may then close
// the channel: the case reconnects), and rank 1's memory — its buffer, its
// other range and its unregistered allocation — must not change. A record
// of a notify rank 1 does not have fails at once, and the channel works on.
func testRangeRefusals(t TB, cfg Config) {
	ranges := []struct {
		name string
		at   func(b *end) device.Ptr
		n    int
	}{
		{"straddles the end of the HCCL buffer", func(b *end) device.Ptr { return b.buf.Addr + bufSize - 4 }, 8},
		{"one past the end of the HCCL buffer", func(b *end) device.Ptr { return b.buf.Addr + bufSize }, 1},
		{"before the HCCL buffer", func(b *end) device.Ptr { return b.buf.Addr - 1 }, 2},
		{"beyond the registered range", func(b *end) device.Ptr { return b.extra.Addr + extraSize - 1 }, 2},
		{"unregistered allocation", func(b *end) device.Ptr { return b.guard }, 64},
		{"nil", func(*end) device.Ptr { return 0 }, 1},
		{"far away", func(b *end) device.Ptr { return b.buf.Addr + 1<<40 }, 16},
	}
	type op struct {
		name string
		call func(tr channel.Transport, at device.Ptr, n int) error
	}
	ops := []op{
		{"Write", func(tr channel.Transport, at device.Ptr, n int) error {
			return tr.Write(nil, at, bytes.Repeat([]byte{0xEE}, n))
		}},
		{"WriteReduce", func(tr channel.Transport, at device.Ptr, n int) error {
			return tr.WriteReduce(nil, at, bytes.Repeat([]byte{0x11}, n), n, reduce.Uint8, reduce.Sum)
		}},
		{"Read", func(tr channel.Transport, at device.Ptr, n int) error {
			return tr.Read(nil, make([]byte, n), at)
		}},
		{"ReadReduce", func(tr channel.Transport, at device.Ptr, n int) error {
			return tr.ReadReduce(nil, make([]byte, n), at, n, reduce.Uint8, reduce.Max)
		}},
	}
	var p *pair
	var before [3][]byte
	peerMem := func() [3][]byte {
		b := p.ends[1]
		return [3][]byte{b.bufBytes(t), b.extraBytes(t), b.guardBytes(t)}
	}
	reconnect := func() {
		p = connect(t, cfg)
		for i, m := range peerMem() {
			fill(m, uint64(9+i))
			before[i] = append([]byte(nil), m...)
		}
	}
	reconnect()
	if _, ok := p.ends[0].tr().(channel.WriteNotifier); ok {
		ops = append(ops, op{"WriteWithNotify", func(tr channel.Transport, at device.Ptr, n int) error {
			return tr.(channel.WriteNotifier).WriteWithNotify(nil, at, bytes.Repeat([]byte{0xEE}, n), 0)
		}})
	}
	for _, o := range ops {
		for _, rg := range ranges {
			a, b := p.ends[0], p.ends[1]
			at := rg.at(b)
			err := o.call(a.tr(), at, rg.n)
			ferr := a.tr().Fence(nil)
			if err == nil && ferr == nil {
				t.Errorf("%s of [%#x, +%d) (%s): neither the call nor the Fence after it failed", o.name, uintptr(at), rg.n, rg.name)
			} else {
				t.Logf("%s (%s): %v; Fence: %v", o.name, rg.name, err, ferr)
			}
			if err == nil && ferr != nil {
				// Refused by the peer, after the call returned: give the
				// refusal time to have been applied (it never should be).
				time.Sleep(10 * time.Millisecond)
			}
			for i, m := range peerMem() {
				what := []string{"HCCL buffer", "registered range", "unregistered allocation"}[i]
				if !sameBytes(t, fmt.Sprintf("%s of [%#x, +%d) (%s): rank 1's %s", o.name, uintptr(at), rg.n, rg.name, what), m, before[i]) {
					copy(m, before[i])
				}
			}
			if ferr != nil {
				p.close() // the transport closed the channel over the refusal
				reconnect()
			}
		}
	}

	// Notify indices the peer lacks: refused at once, nothing written.
	a, b := p.ends[0], p.ends[1]
	mb := b.bufBytes(t)
	mb[0] = 0xAA
	for _, idx := range []int{notifyNum, -1, 1 << 20} {
		if err := a.tr().NotifyRecord(nil, idx); err == nil {
			t.Errorf("NotifyRecord(%d) of %d notifies: no error", idx, notifyNum)
		} else if !strings.Contains(err.Error(), fmt.Sprint(idx)) {
			t.Errorf("NotifyRecord(%d): %q does not name the index", idx, err)
		}
		if wn, ok := a.tr().(channel.WriteNotifier); ok {
			if err := wn.WriteWithNotify(nil, b.buf.Addr, []byte{0x55}, idx); err == nil {
				t.Errorf("WriteWithNotify(notify %d) of %d notifies: no error", idx, notifyNum)
			}
		}
	}
	if err := a.tr().Fence(nil); err != nil {
		t.Fatalf("the channel after refused notify indices: %v", err)
	}
	if mb[0] != 0xAA {
		t.Errorf("a WriteWithNotify refused for its notify index wrote its byte")
	}
	for i := range notifyNum {
		if b.conn.Notifies[i].IsSet() {
			t.Errorf("rank 1's notify %d is set by a refused record", i)
		}
	}
	if err := a.tr().Write(nil, b.buf.Addr, []byte{0x66}); err != nil {
		t.Fatalf("Write after the refusals: %v", err)
	}
	if err := a.tr().NotifyRecord(nil, notifyNum-1); err != nil {
		t.Fatalf("NotifyRecord after the refusals: %v", err)
	}
	if err := b.wait(context.Background(), notifyNum-1); err != nil {
		t.Fatalf("rank 1's wait after the refusals: %v", err)
	}
	if mb[0] != 0x66 {
		t.Errorf("the write before the record is not visible after the wait")
	}
}

// testClose: Close twice returns nil. With cfg.Closes, the closed end's
// later calls fail and its waits fail; with cfg.Goodbye, the peer's wait
// in progress fails promptly, and so do its later calls.
func testClose(t TB, cfg Config) {
	p := connect(t, cfg)
	a, b := p.ends[0], p.ends[1]
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	errc := make(chan error, 1)
	go func() { errc <- b.wait(wctx, 0) }()
	time.Sleep(20 * time.Millisecond) // let the wait sleep
	start := time.Now()
	if err := a.tr().Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := a.tr().Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if cfg.Closes {
		wantErr(t, "Write after Close", a.tr().Write(nil, b.buf.Addr, []byte{1}), channel.ErrClosed)
		wantErr(t, "NotifyRecord after Close", a.tr().NotifyRecord(nil, 0), channel.ErrClosed)
		wantErr(t, "Read after Close", a.tr().Read(nil, make([]byte, 1), b.buf.Addr), channel.ErrClosed)
		wantErr(t, "Fence after Close", a.tr().Fence(nil), channel.ErrClosed)
		ctx, cancel := context.WithTimeout(context.Background(), cfg.lossWithin())
		wantErr(t, "a wait on the closed end's notify", a.conn.Notifies[1].WaitNow(ctx), channel.ErrClosed)
		cancel()
	}
	if !cfg.Goodbye {
		b.conn.Notifies[0].Set() // end the wait
		if err := <-errc; err != nil {
			t.Errorf("rank 1's wait: %v", err)
		}
		return
	}
	select {
	case err := <-errc:
		wantErr(t, "rank 1's wait when rank 0 closed", err, channel.ErrPeerClosed)
		if d := time.Since(start); d > cfg.lossWithin() {
			t.Errorf("rank 1's wait took %v to see the close", d)
		}
	case <-time.After(cfg.lossWithin()):
		wcancel()
		<-errc
		t.Fatalf("rank 1's wait did not end within %v of rank 0's Close", cfg.lossWithin())
	}
	wantErr(t, "rank 1's Write after rank 0 closed", b.tr().Write(nil, a.buf.Addr, []byte{1}), channel.ErrPeerClosed)
	ctx, cancel := context.WithTimeout(context.Background(), cfg.lossWithin())
	defer cancel()
	wantErr(t, "rank 1's later wait", b.conn.Notifies[1].WaitNow(ctx), channel.ErrPeerClosed)
}

// testPeerLoss: rank 0's end dies without a goodbye while rank 1 waits on a
// notify; the wait fails within cfg.LossWithin, wrapping channel.ErrPeerLost and
// naming rank 0, and so do rank 1's later calls and waits.
func testPeerLoss(t TB, cfg Config) {
	if cfg.Lose == nil {
		t.Logf("the transport has no peer to lose (Config.Lose is nil)")
		return
	}
	p := connect(t, cfg)
	a, b := p.ends[0], p.ends[1]
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	errc := make(chan error, 1)
	go func() { errc <- b.wait(wctx, 0) }()
	time.Sleep(20 * time.Millisecond) // let the wait sleep
	start := time.Now()
	cfg.Lose(t, a.tr())
	select {
	case err := <-errc:
		wantErr(t, "rank 1's wait when rank 0 was lost", err, channel.ErrPeerLost)
		if err != nil && !strings.Contains(err.Error(), "rank 0") {
			t.Errorf("rank 1's wait: %q does not name rank 0", err)
		}
		t.Logf("rank 1's wait, %v after the loss: %v", time.Since(start).Round(time.Millisecond), err)
	case <-time.After(cfg.lossWithin()):
		wcancel()
		<-errc
		t.Fatalf("rank 1's wait did not end within %v of rank 0's loss", cfg.lossWithin())
	}
	wantErr(t, "rank 1's Write after the loss", b.tr().Write(nil, a.buf.Addr, make([]byte, 8)), channel.ErrPeerLost)
	wantErr(t, "rank 1's NotifyRecord after the loss", b.tr().NotifyRecord(nil, 0), channel.ErrPeerLost)
	ctx, cancel := context.WithTimeout(context.Background(), cfg.lossWithin())
	defer cancel()
	wantErr(t, "rank 1's later wait", b.conn.Notifies[1].WaitNow(ctx), channel.ErrPeerLost)
}

// testNilArguments: Connect given a nil context, Local or Exchange — the
// caller's mistake — returns an error; it does not panic.
func testNilArguments(t TB, cfg Config) {
	d0, d1 := cfg.Dialers(t)
	defer d0.Close()
	defer d1.Close()
	for _, c := range []struct {
		what string
		ctx  context.Context
	}{{"a nil context", nil}, {"a live context", context.Background()}} {
		err, panicked := func() (err error, panicked any) {
			defer func() { panicked = recover() }()
			_, err = d0.Connect(c.ctx, nil, nil)
			return err, nil
		}()
		switch {
		case panicked != nil:
			t.Errorf("Connect with %s and a nil Local and Exchange panicked: %v", c.what, panicked)
		case err == nil:
			t.Errorf("Connect with %s and a nil Local and Exchange: no error", c.what)
		}
	}
}
