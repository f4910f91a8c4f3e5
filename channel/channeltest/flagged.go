package channeltest

import (
	"context"
	"fmt"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
)

// testFlagged (transports with channel.FlagWriter): rank a stores rounds of
// data as flagged words into two slots of rank b's buffer, alternately, the
// round number as the flag; b polls its own memory with TakeFlagged, sees
// every round whole (never a word of an older round for a new one), and
// acknowledges each with a's notify 1, so that a rewrites a slot only once b
// has taken what it held. A length that is not a multiple of 4, an unaligned
// address and a range outside b's registered memory are refused, b's memory
// untouched.
func testFlagged(t TB, cfg Config) {
	p := connect(t, cfg)
	a, b := p.ends[0], p.ends[1]
	fw, ok := a.tr().(channel.FlagWriter)
	if !ok {
		t.Logf("%s has no flagged writes (channel.FlagWriter): nothing to check", p.name)
		return
	}
	const rounds = 200
	sizes := []int{4, 8, 60, 64, 68, 1020, 4096}
	const slot = 2 * 4096
	words := b.mem(t, b.buf.Addr, 2*slot)
	if !channel.Aligned8(words) {
		t.Fatalf("rank %d's buffer is not 8-byte aligned", b.rank)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		got := make([]byte, 4096)
		for r := 1; r <= rounds; r++ {
			n := sizes[r%len(sizes)]
			w := words[(r%2)*slot:][:channel.FlaggedLen(n)]
			deadline := time.Now().Add(waitLimit)
			for !channel.TakeFlagged(got[:n], w, uint32(r)) {
				if time.Now().After(deadline) {
					errc <- fmt.Errorf("round %d: the flagged words never all showed", r)
					return
				}
			}
			for i := 0; i < n; i++ {
				if want := byte(r + i); got[i] != want {
					errc <- fmt.Errorf("round %d: byte %d of %d is %d, want %d (a word of another round)", r, i, n, got[i], want)
					return
				}
			}
			if err := b.tr().NotifyRecord(nil, 1); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	src := make([]byte, 4096)
	for r := 1; r <= rounds; r++ {
		n := sizes[r%len(sizes)]
		for i := 0; i < n; i++ {
			src[i] = byte(r + i)
		}
		if err := fw.WriteFlagged(nil, b.buf.Addr+device.Ptr((r%2)*slot), src[:n], uint32(r)); err != nil {
			t.Fatalf("round %d: WriteFlagged: %v", r, err)
		}
		if err := a.wait(ctx, 1); err != nil {
			break // the checker says why
		}
	}
	if err := <-errc; err != nil {
		t.Errorf("rank %d -> rank %d: %v", a.rank, b.rank, err)
	}

	// Refusals.
	before := append([]byte(nil), words...)
	for _, c := range []struct {
		what string
		dst  device.Ptr
		n    int
	}{
		{"6 bytes", b.buf.Addr, 6},
		{"an unaligned address", b.buf.Addr + 4, 8},
		{"a range past the buffer", b.buf.Addr + device.Ptr(b.buf.Size) - 8, 8},
		{"an unregistered range", b.guard, 8},
	} {
		if err := fw.WriteFlagged(nil, c.dst, src[:c.n], 7); err == nil {
			if err := a.tr().Fence(nil); err == nil {
				t.Errorf("a flagged write of %s was not refused", c.what)
			}
		}
	}
	sameBytes(t, "rank 1's buffer after refused flagged writes", b.mem(t, b.buf.Addr, 2*slot), before)
}

// testLine (transports with channel.FlagWriter): rank a stores rounds of
// lines of every length from 0 to channel.LineData into two lines of rank
// b's buffer, alternately, through WriteLine and through a prepared line,
// the round number as the flag; b polls its own memory with TakeLine, sees
// every round whole (never a byte of an older round for a new one, never the
// line for another flag), and acknowledges each with a's notify 1, so that
// a rewrites a line only once b has taken it. A line of more than LineData
// bytes, an unaligned address and a line outside b's registered memory are
// refused, b's memory untouched.
func testLine(t TB, cfg Config) {
	p := connect(t, cfg)
	a, b := p.ends[0], p.ends[1]
	fw, ok := a.tr().(channel.FlagWriter)
	if !ok {
		t.Logf("%s has no lines (channel.FlagWriter): nothing to check", p.name)
		return
	}
	const rounds = 2 * (channel.LineData + 1)
	mem := b.mem(t, b.buf.Addr, 2*channel.LineSize)
	if !channel.Aligned8(mem) {
		t.Fatalf("rank %d's buffer is not 8-byte aligned", b.rank)
	}
	var puts [2]channel.LinePut
	for i := range puts {
		lp, err := fw.PrepareLine(b.buf.Addr + device.Ptr(i*channel.LineSize))
		if err != nil {
			t.Fatalf("PrepareLine: %v", err)
		}
		puts[i] = lp
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		got := make([]byte, channel.LineData)
		for r := 1; r <= rounds; r++ {
			n := r % (channel.LineData + 1)
			line := mem[(r%2)*channel.LineSize:][:channel.LineSize]
			deadline := time.Now().Add(waitLimit)
			for !channel.TakeLine(got[:n], line, uint32(r)) {
				if time.Now().After(deadline) {
					errc <- fmt.Errorf("round %d: the line never showed", r)
					return
				}
			}
			if channel.TakeLine(got[:0], line, uint32(r+2)) {
				errc <- fmt.Errorf("round %d: the line passes for round %d", r, r+2)
				return
			}
			for i := 0; i < n; i++ {
				if want := byte(r + i); got[i] != want {
					errc <- fmt.Errorf("round %d: byte %d of %d is %d, want %d (a byte of another round)", r, i, n, got[i], want)
					return
				}
			}
			if err := b.tr().NotifyRecord(nil, 1); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	src := make([]byte, channel.LineData)
	for r := 1; r <= rounds; r++ {
		n := r % (channel.LineData + 1)
		for i := 0; i < n; i++ {
			src[i] = byte(r + i)
		}
		var err error
		if r%3 == 0 {
			err = puts[r%2].Put(src[:n], uint32(r))
		} else {
			err = fw.WriteLine(nil, b.buf.Addr+device.Ptr((r%2)*channel.LineSize), src[:n], uint32(r))
		}
		if err != nil {
			t.Fatalf("round %d: %v", r, err)
		}
		if err := a.wait(ctx, 1); err != nil {
			break // the checker says why
		}
	}
	if err := <-errc; err != nil {
		t.Errorf("rank %d -> rank %d: %v", a.rank, b.rank, err)
	}

	// Refusals.
	before := append([]byte(nil), mem...)
	for _, c := range []struct {
		what string
		dst  device.Ptr
		n    int
	}{
		{"57 bytes", b.buf.Addr, channel.LineData + 1},
		{"an unaligned address", b.buf.Addr + 4, 8},
		{"a line past the buffer", b.buf.Addr + device.Ptr(b.buf.Size) - 32, 8},
		{"an unregistered line", b.guard, 8},
	} {
		if err := fw.WriteLine(nil, c.dst, make([]byte, c.n), 7); err == nil {
			if err := a.tr().Fence(nil); err == nil {
				t.Errorf("a line write of %s was not refused", c.what)
			}
		}
		if c.n <= channel.LineData {
			if _, err := fw.PrepareLine(c.dst); err == nil {
				t.Errorf("PrepareLine of %s was not refused", c.what)
			}
		}
	}
	if err := puts[0].Put(make([]byte, channel.LineData+1), 8); err == nil {
		t.Errorf("a Put of a line and a byte was not refused")
	}
	sameBytes(t, "rank 1's buffer after refused line writes", b.mem(t, b.buf.Addr, 2*channel.LineSize), before)
}
