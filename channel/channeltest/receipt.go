package channeltest

import (
	"bytes"
	"context"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
)

// testCheckedOnReceipt: a transport that says its receiving end checks
// every write as it arrives (channel.ReceiverChecker) takes a write into a
// range the peer registered after the channel was made — the receive buffer
// a collective lends for one call — and refuses one into that range once the
// peer has removed it, before a byte of it is stored. Skipped for a
// transport that does not say so.
func testCheckedOnReceipt(t TB, cfg Config) {
	p := connect(t, cfg)
	a, b := p.ends[0], p.ends[1]
	rc, ok := a.tr().(channel.ReceiverChecker)
	if !ok || !rc.ChecksOnReceipt() {
		t.Logf("%s: the receiving end does not check writes (no channel.ReceiverChecker): skipped", p.name)
		return
	}
	const n = 100_003 // odd, and more than one frame of a small chunk size
	lentAt, err := b.dev.Malloc(n)
	if err != nil {
		t.Fatalf("rank 1: %v", err)
	}
	lent := channel.Mem{Tag: "lent", Addr: lentAt, Size: n}
	b.reg.Add(lent) // after the connect
	src := make([]byte, n)
	fill(src, 31)
	if err := a.tr().Write(nil, lentAt, src); err != nil {
		t.Fatalf("Write into the range rank 1 registered after the connect: %v", err)
	}
	if err := a.tr().NotifyRecord(nil, 2); err != nil {
		t.Fatalf("NotifyRecord after the write: %v", err)
	}
	if err := b.wait(context.Background(), 2); err != nil {
		t.Fatalf("rank 1's wait for the write: %v", err)
	}
	got := b.mem(t, lentAt, n)
	sameBytes(t, "the write into the range registered after the connect", got, src)

	// Given back: the next write there is refused and stores nothing.
	if !b.reg.Remove(lentAt, "lent") {
		t.Fatalf("rank 1 could not remove the lent range")
	}
	before := append([]byte(nil), got...)
	werr := a.tr().Write(nil, lentAt, bytes.Repeat([]byte{0xEE}, 64))
	ferr := a.tr().Fence(nil)
	if werr == nil && ferr == nil {
		t.Errorf("a write into the range rank 1 removed: neither the call nor the Fence after it failed")
	} else if werr == nil {
		time.Sleep(10 * time.Millisecond) // a refusal the peer applied would show by now
	}
	sameBytes(t, "rank 1's removed range after the refused write", b.mem(t, lentAt, n), before)
}
