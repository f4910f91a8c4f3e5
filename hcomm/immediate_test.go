package hcomm_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// The immediate calls (WriteNbi, WriteWithNotifyNbi, ChannelNotifyRecord,
// ChannelNotifyWait) inside one stream task per rank, over every transport:
// a write then a record is visible once the peer's immediate wait returns,
// round after round, in both directions at once; bad arguments are refused
// with ErrPara naming what was wrong, the peer's memory untouched; a wait
// that nobody records times out naming the peer; an abort ends it.
func TestImmediateCalls(t *testing.T) {
	for _, tr := range hcomm.Transports() {
		t.Run(tr, func(t *testing.T) {
			p := newPair(t, &hcomm.Config{BufferSize: 32 << 10, Name: "now", Transport: tr})
			const n = 4099
			var remote [2]device.Ptr
			for r := 0; r < 2; r++ {
				var err error
				if remote[r], _, err = p.comms[r].ChannelGetHcclBuffer(p.ch[r]); err != nil {
					t.Fatal(err)
				}
			}
			for round := 0; round < 20; round++ {
				var got [2][]byte
				for r := 0; r < 2; r++ {
					fill(t, p.comms[r], p.buf[r], n, byte(10*round+r+1))
				}
				for r := 0; r < 2; r++ {
					r := r
					dev := p.comms[r].Device()
					// Rank r writes its buffer into the upper half of the
					// peer's, records notify 1 (or, every other round,
					// writes and records in two calls), then waits for the
					// peer's and reads what arrived.
					err := p.th[r].Stream().Launch("exchange", func(stop <-chan struct{}) error {
						dst := remote[r].Add(16 << 10)
						if round%2 == 0 {
							if err := hcomm.WriteWithNotifyNbi(stop, p.ch[r], dst, p.buf[r], n, 1); err != nil {
								return err
							}
						} else {
							if err := hcomm.WriteNbi(stop, p.ch[r], dst, p.buf[r], n); err != nil {
								return err
							}
							if err := hcomm.ChannelNotifyRecord(stop, p.ch[r], 1); err != nil {
								return err
							}
						}
						if err := hcomm.ChannelNotifyWait(stop, p.ch[r], 1, 10*time.Second); err != nil {
							return err
						}
						b, err := dev.Bytes(p.buf[r].Add(16<<10), n)
						if err != nil {
							return err
						}
						got[r] = append([]byte(nil), b...)
						return nil
					})
					if err != nil {
						t.Fatal(err)
					}
				}
				for r := 0; r < 2; r++ {
					if err := p.sync(t, r); err != nil {
						t.Fatalf("round %d rank %d: %v", round, r, err)
					}
				}
				for r := 0; r < 2; r++ {
					want := bytes.Repeat([]byte{byte(10*round + (1 - r) + 1)}, n)
					if !bytes.Equal(got[r], want) {
						i := 0
						for i < n && got[r][i] == want[i] {
							i++
						}
						t.Fatalf("round %d: rank %d read byte %d = %d after its wait, want %d", round, r, i, got[r][i], want[i])
					}
				}
			}

			// Refused at the call, naming what was wrong; the peer's memory
			// is untouched.
			fill(t, p.comms[1], p.buf[1], 64, 0x77)
			for _, c := range []struct {
				name string
				call func() error
				want string
			}{
				{"past the peer's buffer", func() error {
					return hcomm.WriteNbi(nil, p.ch[0], remote[0].Add(p.size-4), p.buf[0], 8)
				}, "remote dst"},
				{"negative length", func() error { return hcomm.WriteNbi(nil, p.ch[0], remote[0], p.buf[0], -1) }, "negative"},
				{"notify index past the peer's", func() error {
					return hcomm.WriteWithNotifyNbi(nil, p.ch[0], remote[0], p.buf[0], 8, 3)
				}, "remote notify index 3"},
				{"negative notify index", func() error {
					return hcomm.WriteWithNotifyNbi(nil, p.ch[0], remote[0], p.buf[0], 8, -1)
				}, "remote notify index -1"},
				{"record index past the peer's", func() error { return hcomm.ChannelNotifyRecord(nil, p.ch[0], 3) }, "remote notify index 3"},
				{"wait index past ours", func() error { return hcomm.ChannelNotifyWait(nil, p.ch[0], 7, time.Second) }, "7"},
			} {
				err := c.call()
				if !errors.Is(err, hcomm.ErrPara) || !strings.Contains(err.Error(), c.want) {
					t.Errorf("%s: %v, want ErrPara mentioning %q", c.name, err, c.want)
				}
			}
			if err := hcomm.WriteNbi(nil, nil, remote[0], p.buf[0], 8); !errors.Is(err, hcomm.ErrPtr) {
				t.Errorf("nil channel: %v, want ErrPtr", err)
			}
			if got := read(t, p.comms[1], p.buf[1], 64); !bytes.Equal(got, bytes.Repeat([]byte{0x77}, 64)) {
				t.Error("a refused write touched the peer's memory")
			}

			// A wait nobody records times out naming the peer.
			err := hcomm.ChannelNotifyWait(nil, p.ch[0], 2, 30*time.Millisecond)
			if !errors.Is(err, hcomm.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "rank 1") {
				t.Errorf("unrecorded wait: %v, want a timeout naming rank 1", err)
			}
			// Closing stop ends a wait at once.
			stop := make(chan struct{})
			done := make(chan error, 1)
			go func() { done <- hcomm.ChannelNotifyWait(stop, p.ch[0], 2, time.Minute) }()
			time.Sleep(5 * time.Millisecond)
			close(stop)
			select {
			case err := <-done:
				if err == nil || errors.Is(err, hcomm.ErrTimeout) {
					t.Errorf("wait whose stop closed: %v, want an abort", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("a wait whose stop closed did not return")
			}
			// After Destroy, the calls refuse.
			p.comms[0].Destroy()
			if err := hcomm.ChannelNotifyRecord(nil, p.ch[0], 0); !errors.Is(err, hcomm.ErrUnavail) {
				t.Errorf("record after Destroy: %v, want ErrUnavail", err)
			}
		})
	}
}

// ChannelNotifyTryWait never waits: false before the peer records, true
// (and the notify reset) once its record has arrived, false again after;
// a bad index is ErrPara.
func TestChannelNotifyTryWait(t *testing.T) {
	for _, tr := range hcomm.Transports() {
		t.Run(tr, func(t *testing.T) {
			p := newPair(t, &hcomm.Config{BufferSize: 32 << 10, Name: "poll", Transport: tr})
			for round := 0; round < 3; round++ {
				start := time.Now()
				if ok, err := hcomm.ChannelNotifyTryWait(p.ch[1], 2); ok || err != nil {
					t.Fatalf("round %d: before the record: %v, %v; want false, nil", round, ok, err)
				}
				if d := time.Since(start); d > time.Second {
					t.Fatalf("a poll took %v", d)
				}
				if err := hcomm.ChannelNotifyRecord(nil, p.ch[0], 2); err != nil {
					t.Fatal(err)
				}
				deadline := time.Now().Add(10 * time.Second)
				for {
					ok, err := hcomm.ChannelNotifyTryWait(p.ch[1], 2)
					if err != nil {
						t.Fatal(err)
					}
					if ok {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("round %d: the record never showed", round)
					}
					time.Sleep(100 * time.Microsecond)
				}
				if ok, err := hcomm.ChannelNotifyTryWait(p.ch[1], 2); ok || err != nil {
					t.Fatalf("round %d: after the poll took the record: %v, %v; want false, nil", round, ok, err)
				}
			}
			_, err := hcomm.ChannelNotifyTryWait(p.ch[1], 3)
			if !errors.Is(err, hcomm.ErrPara) || !strings.Contains(err.Error(), "index 3") {
				t.Fatalf("index 3 of 3: %v, want ErrPara naming the index", err)
			}
		})
	}
}

// WriteFlaggedNbi stores flagged words into the peer's memory where the
// transport maps it (inproc, shm), which the peer sees with
// channel.TakeFlagged and no notify; bad lengths, addresses and ranges are
// ErrPara, and a transport without flagged words (tcp) ErrNotSupport.
func TestWriteFlaggedNbi(t *testing.T) {
	for _, tr := range hcomm.Transports() {
		t.Run(tr, func(t *testing.T) {
			p := newPair(t, &hcomm.Config{BufferSize: 32 << 10, Name: "flagged", Transport: tr})
			remote, _, err := p.comms[0].ChannelGetHcclBuffer(p.ch[0])
			if err != nil {
				t.Fatal(err)
			}
			const n = 16
			fill(t, p.comms[0], p.buf[0], n, 42)
			dst := remote.Add(8 << 10)
			if !p.ch[0].Flagged() {
				err := hcomm.WriteFlaggedNbi(nil, p.ch[0], dst, p.buf[0], n, 7)
				if !errors.Is(err, hcomm.ErrNotSupport) {
					t.Fatalf("on %s, which has no flagged writes: %v, want ErrNotSupport", tr, err)
				}
				return
			}
			for flag := uint32(1); flag <= 3; flag++ {
				if err := hcomm.WriteFlaggedNbi(nil, p.ch[0], dst, p.buf[0], n, flag); err != nil {
					t.Fatal(err)
				}
				words, err := p.comms[1].Device().Bytes(p.buf[1].Add(8<<10), 2*n)
				if err != nil {
					t.Fatal(err)
				}
				got := make([]byte, n)
				deadline := time.Now().Add(10 * time.Second)
				for !channel.TakeFlagged(got, words, flag) {
					if time.Now().After(deadline) {
						t.Fatalf("flag %d: the words never showed", flag)
					}
				}
				if want := bytes.Repeat([]byte{42}, n); !bytes.Equal(got, want) {
					t.Fatalf("flag %d: took %v, want %v", flag, got, want)
				}
			}
			for _, c := range []struct {
				what string
				dst  device.Ptr
				n    int64
			}{
				{"6 bytes", dst, 6},
				{"an unaligned address", dst + 4, 8},
				{"a range past the HCCL buffer", remote.Add(p.size - 8), 8},
			} {
				if err := hcomm.WriteFlaggedNbi(nil, p.ch[0], c.dst, p.buf[0], c.n, 9); !errors.Is(err, hcomm.ErrPara) {
					t.Errorf("%s: %v, want ErrPara", c.what, err)
				}
			}
		})
	}
}

// WriteLineNbi and a PreparedLine store a line into the peer's memory where
// the transport maps it (inproc, shm), which the peer sees whole with
// channel.TakeLine and no notify, round after round with other lengths and
// flags; a line of more than channel.LineData bytes, an unaligned address
// or a line past the peer's HCCL buffer is ErrPara, a transport without
// lines (tcp) ErrNotSupport, and once the channel is destroyed Put fails
// instead of storing.
func TestWriteLineNbi(t *testing.T) {
	for _, tr := range hcomm.Transports() {
		t.Run(tr, func(t *testing.T) {
			p := newPair(t, &hcomm.Config{BufferSize: 32 << 10, Name: "line", Transport: tr})
			remote, _, err := p.comms[0].ChannelGetHcclBuffer(p.ch[0])
			if err != nil {
				t.Fatal(err)
			}
			dst := remote.Add(8 << 10)
			if !p.ch[0].Flagged() {
				if err := hcomm.WriteLineNbi(nil, p.ch[0], dst, p.buf[0], 16, 7); !errors.Is(err, hcomm.ErrNotSupport) {
					t.Fatalf("on %s, which has no lines: %v, want ErrNotSupport", tr, err)
				}
				if _, err := hcomm.PrepareLine(p.ch[0], dst); !errors.Is(err, hcomm.ErrNotSupport) {
					t.Fatalf("PrepareLine on %s: %v, want ErrNotSupport", tr, err)
				}
				return
			}
			line, err := p.comms[1].Device().Bytes(p.buf[1].Add(8<<10), channel.LineSize)
			if err != nil {
				t.Fatal(err)
			}
			take := func(flag uint32, n int) []byte {
				t.Helper()
				got := make([]byte, n)
				deadline := time.Now().Add(10 * time.Second)
				for !channel.TakeLine(got, line, flag) {
					if time.Now().After(deadline) {
						t.Fatalf("flag %d: the line never showed", flag)
					}
				}
				if channel.TakeLine(got, line, flag+1) {
					t.Fatalf("flag %d: the line passes for flag %d too", flag, flag+1)
				}
				return got
			}
			for flag, n := range []int64{16, 0, channel.LineData, 1} {
				fill(t, p.comms[0], p.buf[0], n, byte(40+flag))
				if err := hcomm.WriteLineNbi(nil, p.ch[0], dst, p.buf[0], n, uint32(flag+1)); err != nil {
					t.Fatal(err)
				}
				if got, want := take(uint32(flag+1), int(n)), bytes.Repeat([]byte{byte(40 + flag)}, int(n)); !bytes.Equal(got, want) {
					t.Fatalf("flag %d: took %v, want %v", flag+1, got, want)
				}
			}
			pl, err := hcomm.PrepareLine(p.ch[0], dst)
			if err != nil {
				t.Fatal(err)
			}
			for flag := uint32(10); flag < 13; flag++ {
				src := bytes.Repeat([]byte{byte(flag)}, int(flag))
				if err := pl.Put(src, flag); err != nil {
					t.Fatal(err)
				}
				if got := take(flag, len(src)); !bytes.Equal(got, src) {
					t.Fatalf("Put flag %d: took %v, want %v", flag, got, src)
				}
			}
			if err := pl.Put(make([]byte, channel.LineData+1), 20); err == nil {
				t.Error("a Put of a line and a byte was not refused")
			}
			for _, c := range []struct {
				what string
				dst  device.Ptr
				n    int64
			}{
				{"57 bytes", dst, channel.LineData + 1},
				{"an unaligned address", dst + 4, 8},
				{"a line past the HCCL buffer", remote.Add(p.size - 32), 8},
			} {
				if err := hcomm.WriteLineNbi(nil, p.ch[0], c.dst, p.buf[0], c.n, 9); !errors.Is(err, hcomm.ErrPara) {
					t.Errorf("%s: %v, want ErrPara", c.what, err)
				}
				if c.n <= channel.LineData {
					if _, err := hcomm.PrepareLine(p.ch[0], c.dst); !errors.Is(err, hcomm.ErrPara) {
						t.Errorf("PrepareLine, %s: %v, want ErrPara", c.what, err)
					}
				}
			}
			if err := p.comms[0].ChannelDestroy([]*hcomm.Channel{p.ch[0]}); err != nil {
				t.Fatal(err)
			}
			if err := pl.Put([]byte{1}, 30); err == nil {
				t.Error("a Put on a destroyed channel did not fail")
			}
			if channel.TakeLine(make([]byte, 1), line, 30) {
				t.Error("a Put on a destroyed channel stored its line")
			}
		})
	}
}

// A PreparedWrite, checked once, writes and records like WriteWithNotifyNbi
// on every transport, round after round with different lengths; what the
// one-time check refuses (a range past the peer's HCCL buffer, a notify it
// does not have) is ErrPara at Prepare, a length past the prepared one is
// ErrPara at Do, and once the channel is destroyed Do fails instead of
// writing.
func TestPreparedWrite(t *testing.T) {
	for _, tr := range hcomm.Transports() {
		t.Run(tr, func(t *testing.T) {
			p := newPair(t, &hcomm.Config{BufferSize: 32 << 10, Name: "prepared", Transport: tr})
			remote, _, err := p.comms[0].ChannelGetHcclBuffer(p.ch[0])
			if err != nil {
				t.Fatal(err)
			}
			const most = 300
			dst := remote.Add(8 << 10)
			w, err := hcomm.PrepareWriteWithNotify(p.ch[0], dst, p.buf[0], most, 1)
			if err != nil {
				t.Fatal(err)
			}
			for round, n := range []int64{most, 1, 77, 0, most} {
				fill(t, p.comms[0], p.buf[0], most, byte(round+1))
				if err := w.Do(nil, n); err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
				if err := hcomm.ChannelNotifyWait(nil, p.ch[1], 1, 10*time.Second); err != nil {
					t.Fatalf("round %d: the record never came: %v", round, err)
				}
				got := make([]byte, n)
				if err := p.comms[1].Device().MemcpyDtoH(got, p.buf[1].Add(8<<10)); err != nil {
					t.Fatal(err)
				}
				if want := bytes.Repeat([]byte{byte(round + 1)}, int(n)); !bytes.Equal(got, want) {
					t.Fatalf("round %d: the peer has %v, want %v", round, got, want)
				}
			}
			if _, err := hcomm.PrepareWriteWithNotify(p.ch[0], remote.Add(p.size-8), p.buf[0], 16, 1); !errors.Is(err, hcomm.ErrPara) {
				t.Errorf("a range past the peer's HCCL buffer: %v, want ErrPara", err)
			}
			if _, err := hcomm.PrepareWriteWithNotify(p.ch[0], dst, p.buf[0], 16, 3); !errors.Is(err, hcomm.ErrPara) {
				t.Errorf("notify 3 of 3: %v, want ErrPara", err)
			}
			if err := w.Do(nil, most+1); !errors.Is(err, hcomm.ErrPara) || !strings.Contains(err.Error(), "prepared") {
				t.Errorf("a length past the prepared one: %v, want ErrPara naming the prepared length", err)
			}
			if err := p.comms[0].ChannelDestroy([]*hcomm.Channel{p.ch[0]}); err != nil {
				t.Fatal(err)
			}
			if err := w.Do(nil, 8); err == nil {
				t.Errorf("Do on a destroyed channel succeeded")
			}
		})
	}
}

// ChannelNotifyPeek sees a record without taking it (the wait after it still
// finds it), sees nothing before one and after it is taken, and is false for
// an index the channel does not have or a nil channel.
func TestChannelNotifyPeek(t *testing.T) {
	p := newPair(t, &hcomm.Config{BufferSize: 32 << 10, Name: "peek", Transport: "inproc"})
	if hcomm.ChannelNotifyPeek(p.ch[1], 1) {
		t.Fatal("peek saw a record before any")
	}
	if err := hcomm.ChannelNotifyRecord(nil, p.ch[0], 1); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ { // a look takes nothing
		if !hcomm.ChannelNotifyPeek(p.ch[1], 1) {
			t.Fatalf("look %d: peek missed the record", i)
		}
	}
	if ok, err := hcomm.ChannelNotifyTryWait(p.ch[1], 1); !ok || err != nil {
		t.Fatalf("the record was gone after the peeks: %v %v", ok, err)
	}
	if hcomm.ChannelNotifyPeek(p.ch[1], 1) {
		t.Fatal("peek saw a record already taken")
	}
	if hcomm.ChannelNotifyPeek(p.ch[1], 3) || hcomm.ChannelNotifyPeek(p.ch[1], -1) || hcomm.ChannelNotifyPeek(nil, 0) {
		t.Fatal("peek at a notify that does not exist said true")
	}
}

// WriteVWithNotifyNbi gathers its segments, in order, into one range of the
// peer's memory before the record, on every transport: pieces out of order
// in local memory, an empty one, a few (tcp: one frame) and more than a
// frame takes (tcp: a write each); and refuses what is wrong, naming it.
func TestWriteVWithNotifyNbi(t *testing.T) {
	for _, tr := range hcomm.Transports() {
		t.Run(tr, func(t *testing.T) {
			p := newPair(t, &hcomm.Config{BufferSize: 32 << 10, Name: "writev", Transport: tr})
			remote, _, err := p.comms[0].ChannelGetHcclBuffer(p.ch[0])
			if err != nil {
				t.Fatal(err)
			}
			src := make([]byte, 4096)
			for i := range src {
				src[i] = byte(i*7 + i/256)
			}
			if err := p.comms[0].Device().MemcpyHtoD(p.buf[0], src); err != nil {
				t.Fatal(err)
			}
			seg := func(off, n int64) hcomm.Segment { return hcomm.Segment{Src: p.buf[0].Add(off), N: n} }
			dst := remote.Add(8 << 10)
			for round, segs := range [][]hcomm.Segment{
				{seg(1000, 40), seg(0, 0), seg(3000, 300), seg(200, 17)},
				{seg(64, 64)},
				{seg(10, 1), seg(20, 2), seg(30, 3), seg(40, 4), seg(50, 5), seg(2000, 1000)},
			} {
				fill(t, p.comms[1], p.buf[1].Add(8<<10), 2048, 0xee)
				var want []byte
				for _, s := range segs {
					off := int64(s.Src) - int64(p.buf[0])
					want = append(want, src[off:off+s.N]...)
				}
				if err := hcomm.WriteVWithNotifyNbi(nil, p.ch[0], dst, segs, 2); err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
				if err := hcomm.ChannelNotifyWait(nil, p.ch[1], 2, 10*time.Second); err != nil {
					t.Fatalf("round %d: the record never came: %v", round, err)
				}
				got := read(t, p.comms[1], p.buf[1].Add(8<<10), int64(len(want))+1)
				if !bytes.Equal(got[:len(want)], want) || got[len(want)] != 0xee {
					t.Fatalf("round %d: the peer's memory does not hold the %d gathered bytes (and nothing more)", round, len(want))
				}
			}
			for _, c := range []struct {
				name string
				segs []hcomm.Segment
				dst  device.Ptr
				idx  int
				says string
			}{
				{"no segments", nil, dst, 1, "segments"},
				{"nine segments", make([]hcomm.Segment, 9), dst, 1, "segments"},
				{"a negative length", []hcomm.Segment{seg(0, 8), seg(8, -1)}, dst, 1, "segment 1"},
				{"a local range outside memory", []hcomm.Segment{seg(0, 8), {Src: 1 << 40, N: 8}}, dst, 1, "local segment 1"},
				{"past the peer's buffer", []hcomm.Segment{seg(0, 8), seg(0, 8)}, remote.Add(p.size - 8), 1, "outside"},
				{"a notify the peer does not have", []hcomm.Segment{seg(0, 8)}, dst, 3, "notify index 3"},
			} {
				err := hcomm.WriteVWithNotifyNbi(nil, p.ch[0], c.dst, c.segs, c.idx)
				if !errors.Is(err, hcomm.ErrPara) || !strings.Contains(err.Error(), c.says) {
					t.Errorf("%s: %v, want ErrPara saying %q", c.name, err, c.says)
				}
			}
		})
	}
}

// TestWriteLentWithNotifyNbi: over tcp and inproc a write may target memory the peer
// registered after the channel was made (a collective's lent receive
// buffer), which the writing end cannot check: it lands, in pieces and
// whole, and the record after it comes. A write outside what the peer
// registered never touches the peer's memory: the peer's end refuses the
// frame and the channel breaks, so that the peer's wait fails instead of
// seeing a record (in one process the write itself fails). Over shm, whose
// writes go into the peer memory mapped when the channel was made, it is
// refused with ErrNotSupport; bad arguments are ErrPara naming them.
func TestWriteLentWithNotifyNbi(t *testing.T) {
	for _, tr := range hcomm.Transports() {
		t.Run(tr, func(t *testing.T) {
			p := newPair(t, &hcomm.Config{BufferSize: 32 << 10, Name: "lent", Transport: tr})
			dev1 := p.comms[1].Device()
			lent, err := dev1.Malloc(64 << 10)
			if err != nil {
				t.Fatal(err)
			}
			defer dev1.Free(lent)
			outside, err := dev1.Malloc(4096)
			if err != nil {
				t.Fatal(err)
			}
			defer dev1.Free(outside)
			h, err := p.comms[1].CommMemReg("lent/test", lent, 64<<10)
			if err != nil {
				t.Fatal(err)
			}
			defer p.comms[1].CommMemDereg(h)
			src := make([]byte, 8192)
			for i := range src {
				src[i] = byte(i*13 + 5)
			}
			if err := p.comms[0].Device().MemcpyHtoD(p.buf[0], src); err != nil {
				t.Fatal(err)
			}
			if !p.ch[0].TakesLent() {
				if tr != hcomm.TransportShm {
					t.Fatalf("a %s channel does not take lent writes", tr)
				}
				err := hcomm.WriteLentWithNotifyNbi(nil, p.ch[0], lent, p.buf[0], 8, 1)
				if !errors.Is(err, hcomm.ErrNotSupport) || !strings.Contains(err.Error(), tr) {
					t.Fatalf("a lent write over %s: %v, want ErrNotSupport naming the transport", tr, err)
				}
				return
			}
			fill(t, p.comms[1], lent, 64<<10, 0xee)
			// A piece without a record, then the rest with it.
			if err := hcomm.WriteLentNbi(nil, p.ch[0], lent.Add(1000), p.buf[0], 3000); err != nil {
				t.Fatal(err)
			}
			if err := hcomm.WriteLentWithNotifyNbi(nil, p.ch[0], lent.Add(4000), p.buf[0].Add(3000), 5192, 2); err != nil {
				t.Fatal(err)
			}
			if err := hcomm.ChannelNotifyWait(nil, p.ch[1], 2, 10*time.Second); err != nil {
				t.Fatalf("the record after the lent write never came: %v", err)
			}
			got := read(t, p.comms[1], lent, 64<<10)
			if got[999] != 0xee || !bytes.Equal(got[1000:9192], src) || got[9192] != 0xee {
				t.Fatal("the lent range does not hold the 8192 bytes written into it (and nothing more)")
			}
			for _, c := range []struct {
				name     string
				dst, src device.Ptr
				n        int64
				idx      int
				says     string
			}{
				{"a negative length", lent, p.buf[0], -1, 1, "length -1"},
				{"a null destination", 0, p.buf[0], 8, 1, "not a range"},
				{"a local range outside memory", lent, 1 << 40, 8, 1, "local src"},
				{"a negative notify", lent, p.buf[0], 8, -1, "notify index -1"},
				{"a notify the peer does not have", lent, p.buf[0], 8, 3, "notify index 3"},
			} {
				err := hcomm.WriteLentWithNotifyNbi(nil, p.ch[0], c.dst, c.src, c.n, c.idx)
				if !errors.Is(err, hcomm.ErrPara) || !strings.Contains(err.Error(), c.says) {
					t.Errorf("%s: %v, want ErrPara saying %q", c.name, err, c.says)
				}
			}
			// Outside what rank 1 registered: refused, the memory
			// untouched — over tcp at rank 1, whose wait then fails on the
			// broken channel; in one process at once, here.
			fill(t, p.comms[1], outside, 4096, 0x5a)
			werr := hcomm.WriteLentWithNotifyNbi(nil, p.ch[0], outside, p.buf[0], 64, 1)
			if tr == hcomm.TransportTCP {
				if err := hcomm.ChannelNotifyWait(nil, p.ch[1], 1, 10*time.Second); err == nil || device.CodeOf(err).Timeout() {
					t.Fatalf("the wait after a write outside the registered memory: %v, want the broken channel's error", err)
				}
			} else if werr == nil || !strings.Contains(werr.Error(), "registered") {
				t.Fatalf("a write outside the registered memory: %v, want a refusal", werr)
			}
			if got := read(t, p.comms[1], outside, 4096); !bytes.Equal(got, bytes.Repeat([]byte{0x5a}, 4096)) {
				t.Fatal("a write outside the registered memory changed it")
			}
		})
	}
}

// TestReadLentNbi: over shm (two ranks of this process; the pair reads
// when the kernel allows it), rank 0 reads rank 1's memory that rank 1
// never registered, by address and through its memory file, byte for byte;
// bad arguments are ErrPara naming them; over the other transports, and
// over shm with Config.ShmCMADisable, it is ErrNotSupport naming the
// transport.
func TestReadLentNbi(t *testing.T) {
	overLentPairs(t, "lentread", func(t *testing.T, p *pair, tr string, off bool) {
		dev1 := p.comms[1].Device()
		const n = 1<<20 + 77
		lent, err := dev1.Malloc(n)
		if err != nil {
			t.Fatal(err)
		}
		defer dev1.Free(lent)
		want := make([]byte, n)
		for i := range want {
			want[i] = byte(i*7 + 3)
		}
		if err := dev1.MemcpyHtoD(lent, want); err != nil {
			t.Fatal(err)
		}
		file, err := dev1.FileOf(lent, n)
		if err != nil {
			t.Fatal(err)
		}
		pf := channel.PeerFile{FD: int64(file.FD), Ino: file.Ino, Off: file.Off}
		dev0 := p.comms[0].Device()
		dst, err := dev0.Malloc(n)
		if err != nil {
			t.Fatal(err)
		}
		defer dev0.Free(dst)
		if !p.ch[0].ReadsLent() {
			if tr == hcomm.TransportShm && !off && shmReadsHere() {
				t.Fatal("an shm channel does not read lent memory where the kernel allows it")
			}
			err := hcomm.ReadLentNbi(nil, p.ch[0], dst, lent, 8, channel.NoPeerFile)
			if !errors.Is(err, hcomm.ErrNotSupport) || !strings.Contains(err.Error(), tr) {
				t.Fatalf("a lent read over %s: %v, want ErrNotSupport naming the transport", tr, err)
			}
			return
		}
		if p.ch[1].ReadsLent() != p.ch[0].ReadsLent() {
			t.Fatal("the two ends of the channel disagree on ReadsLent")
		}
		for _, f := range []channel.PeerFile{channel.NoPeerFile, pf} {
			fill(t, p.comms[0], dst, n, 0)
			if err := hcomm.ReadLentNbi(nil, p.ch[0], dst, lent, n, f); err != nil {
				t.Fatal(err)
			}
			if got := read(t, p.comms[0], dst, n); !bytes.Equal(got, want) {
				t.Fatalf("file %+v: the bytes read differ from rank 1's", f)
			}
		}
		for _, c := range []struct {
			name     string
			dst, src device.Ptr
			n        int64
			says     string
		}{
			{"a negative length", dst, lent, -1, "length -1"},
			{"a null source", dst, 0, 8, "not a range"},
			{"a source that wraps around", dst, ^device.Ptr(0) - 3, 8, "not a range"},
			{"a local range outside memory", 1 << 40, lent, 8, "local dst"},
		} {
			err := hcomm.ReadLentNbi(nil, p.ch[0], c.dst, c.src, c.n, channel.NoPeerFile)
			if !errors.Is(err, hcomm.ErrPara) || !strings.Contains(err.Error(), c.says) {
				t.Errorf("%s: %v, want ErrPara saying %q", c.name, err, c.says)
			}
		}
	})
}

// TestWritePeerLentNbi: over shm (two ranks of this process; the pair
// writes when the kernel allows it), rank 0 writes into rank 1's memory
// that rank 1 never registered, by address and through its memory file,
// byte for byte and nothing past the range, and records rank 1's notify
// after the bytes; bad arguments are ErrPara naming them and write
// nothing; over the other transports, and over shm with
// Config.ShmCMADisable, it is ErrNotSupport naming the transport.
func TestWritePeerLentNbi(t *testing.T) {
	overLentPairs(t, "lentwrite", func(t *testing.T, p *pair, tr string, off bool) {
		dev0, dev1 := p.comms[0].Device(), p.comms[1].Device()
		const n = 1<<20 + 77
		lent, err := dev1.Malloc(n + 64) // 64 bytes past the range, which stay
		if err != nil {
			t.Fatal(err)
		}
		defer dev1.Free(lent)
		file, err := dev1.FileOf(lent, n)
		if err != nil {
			t.Fatal(err)
		}
		pf := channel.PeerFile{FD: int64(file.FD), Ino: file.Ino, Off: file.Off}
		src, err := dev0.Malloc(n)
		if err != nil {
			t.Fatal(err)
		}
		defer dev0.Free(src)
		if !p.ch[0].WritesPeerLent() {
			if tr == hcomm.TransportShm && !off && shmReadsHere() {
				t.Fatal("an shm channel does not write lent memory where the kernel allows it")
			}
			err := hcomm.WritePeerLentNbi(nil, p.ch[0], lent, src, 8, channel.NoPeerFile, -1)
			if !errors.Is(err, hcomm.ErrNotSupport) || !strings.Contains(err.Error(), tr) {
				t.Fatalf("a lent write over %s: %v, want ErrNotSupport naming the transport", tr, err)
			}
			return
		}
		if p.ch[1].WritesPeerLent() != p.ch[0].WritesPeerLent() {
			t.Fatal("the two ends of the channel disagree on WritesPeerLent")
		}
		for i, f := range []channel.PeerFile{channel.NoPeerFile, pf} {
			fill(t, p.comms[1], lent, n+64, 0xEE)
			fill(t, p.comms[0], src, n, byte(i+1))
			if err := hcomm.WritePeerLentNbi(nil, p.ch[0], lent, src, n, f, 2); err != nil {
				t.Fatal(err)
			}
			if err := hcomm.ChannelNotifyWait(nil, p.ch[1], 2, 10*time.Second); err != nil {
				t.Fatalf("file %+v: rank 1's notify after the write: %v", f, err)
			}
			got := read(t, p.comms[1], lent, n+64)
			if !bytes.Equal(got[:n], bytes.Repeat([]byte{byte(i + 1)}, n)) || !bytes.Equal(got[n:], bytes.Repeat([]byte{0xEE}, 64)) {
				t.Fatalf("file %+v: rank 1's memory is not the bytes written, and only them", f)
			}
		}
		fill(t, p.comms[1], lent, n, 0xEE)
		for _, c := range []struct {
			name     string
			dst, src device.Ptr
			n        int64
			idx      int
			says     string
		}{
			{"a negative length", lent, src, -1, -1, "length -1"},
			{"a null destination", 0, src, 8, -1, "not a range"},
			{"a destination that wraps around", ^device.Ptr(0) - 3, src, 8, -1, "not a range"},
			{"a local range outside memory", lent, 1 << 40, 8, -1, "local src"},
			{"a notify the peer has not", lent, src, 8, 1 << 20, "remote notify index"},
		} {
			err := hcomm.WritePeerLentNbi(nil, p.ch[0], c.dst, c.src, c.n, channel.NoPeerFile, c.idx)
			if !errors.Is(err, hcomm.ErrPara) || !strings.Contains(err.Error(), c.says) {
				t.Errorf("%s: %v, want ErrPara saying %q", c.name, err, c.says)
			}
		}
		if got := read(t, p.comms[1], lent, n); !bytes.Equal(got, bytes.Repeat([]byte{0xEE}, n)) {
			t.Fatal("a refused write changed rank 1's memory")
		}
	})
}

// overLentPairs runs fn on a pair of ranks of this process (named name)
// over each transport, and over shm with Config.ShmCMADisable too (off):
// the cases of the lent reads' and writes' tests.
func overLentPairs(t *testing.T, name string, fn func(t *testing.T, p *pair, tr string, off bool)) {
	for _, tc := range []struct {
		tr  string
		off bool
	}{{hcomm.TransportInproc, false}, {hcomm.TransportShm, false}, {hcomm.TransportShm, true}, {hcomm.TransportTCP, false}} {
		t.Run(fmt.Sprintf("%s/cmaoff=%v", tc.tr, tc.off), func(t *testing.T) {
			if !slices.Contains(hcomm.Transports(), tc.tr) {
				t.Skipf("no %s transport here", tc.tr)
			}
			fn(t, newPair(t, &hcomm.Config{BufferSize: 32 << 10, Name: name, Transport: tc.tr, ShmCMADisable: tc.off}), tc.tr, tc.off)
		})
	}
}
