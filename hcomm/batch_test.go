package hcomm_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// pairOn is newPair over one transport.
func pairOn(t *testing.T, tr string) *pair {
	return newPair(t, &hcomm.Config{BufferSize: 32 << 10, Name: "batch", Transport: tr})
}

func remoteBuf(t *testing.T, p *pair, r int) device.Ptr {
	t.Helper()
	b, _, err := p.comms[r].ChannelGetHcclBuffer(p.ch[r])
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func filled(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }

// BatchTransferOnThread: every descriptor type in one batch, on every
// transport. Rank 0 writes, write-reduces the same bytes (they must land in
// order), writes and write-reduces with notifies, reads and read-reduces,
// records, and waits for rank 1's answer; rank 1 waits for the three
// records and answers. The peer's memory and rank 0's reads come out as
// the single calls would leave them.
func TestBatchTransfer(t *testing.T) {
	for _, tr := range hcomm.Transports() {
		t.Run(tr, func(t *testing.T) {
			p := pairOn(t, tr)
			const k = 1024
			remote := remoteBuf(t, p, 0)
			l := p.buf[0]
			fill(t, p.comms[0], l, k, 5)                 // the write
			fill(t, p.comms[0], l.Add(k), k, 1)          // the reduce operand
			fill(t, p.comms[0], l.Add(2*k), k, 7)        // the write with notify
			fill(t, p.comms[0], l.Add(9*k), k, 2)        // the read-reduce target
			fill(t, p.comms[1], p.buf[1], 4*k, 0)        // what rank 0 writes into
			fill(t, p.comms[1], p.buf[1].Add(4*k), k, 9) // what rank 0 reads
			descs := []hcomm.TransferDesc{
				{Type: hcomm.TransferWrite, Dst: remote, Src: l, Len: k},
				{Type: hcomm.TransferWriteReduce, Dst: remote, Src: l.Add(k), Count: k, DataType: hcomm.Uint8, ReduceOp: hcomm.Sum},
				{Type: hcomm.TransferWriteWithNotify, Dst: remote.Add(k), Src: l.Add(2 * k), Len: k, NotifyIdx: 0},
				{Type: hcomm.TransferWriteReduceWithNotify, Dst: remote.Add(k), Src: l.Add(k), Count: k, DataType: hcomm.Uint8, ReduceOp: hcomm.Sum, NotifyIdx: 1},
				{Type: hcomm.TransferRead, Dst: l.Add(8 * k), Src: remote.Add(4 * k), Len: k},
				{Type: hcomm.TransferReadReduce, Dst: l.Add(9 * k), Src: remote.Add(4 * k), Count: k, DataType: hcomm.Uint8, ReduceOp: hcomm.Sum},
				{Type: hcomm.TransferNotifyRecord, NotifyIdx: 2},
				{Type: hcomm.TransferNotifyWait, NotifyIdx: 0, Timeout: 20 * time.Second},
			}
			seen := make(chan []byte, 1)
			for _, idx := range []int{0, 1, 2} {
				if err := hcomm.ChannelNotifyWaitOnThread(p.th[1], p.ch[1], idx, 20*time.Second); err != nil {
					t.Fatal(err)
				}
			}
			p.th[1].Stream().Launch("look", func(<-chan struct{}) error {
				b, _ := p.comms[1].Device().Bytes(p.buf[1], 2*k)
				seen <- append([]byte(nil), b...)
				return nil
			})
			if err := hcomm.ChannelNotifyRecordOnThread(p.th[1], p.ch[1], 0); err != nil {
				t.Fatal(err)
			}
			if err := hcomm.BatchTransferOnThread(p.th[0], p.ch[0], descs); err != nil {
				t.Fatal(err)
			}
			for r := range 2 {
				if err := p.sync(t, r); err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
			}
			got := <-seen
			if !bytes.Equal(got[:k], filled(k, 6)) {
				t.Errorf("WRITE then WRITE_REDUCE of the same bytes: got %d..., want 6", got[0])
			}
			if !bytes.Equal(got[k:2*k], filled(k, 8)) {
				t.Errorf("WRITE_WITH_NOTIFY then WRITE_REDUCE_WITH_NOTIFY, seen after the waits: got %d..., want 8", got[k])
			}
			if b := read(t, p.comms[0], l.Add(8*k), k); !bytes.Equal(b, filled(k, 9)) {
				t.Errorf("READ: got %d..., want 9", b[0])
			}
			if b := read(t, p.comms[0], l.Add(9*k), k); !bytes.Equal(b, filled(k, 11)) {
				t.Errorf("READ_REDUCE: got %d..., want 11", b[0])
			}
		})
	}
}

// A batch with a bad descriptor anywhere is refused at the call, naming the
// descriptor, and nothing of it runs: the valid write before it never
// reaches the peer. Each kind of refusal, on every transport.
func TestBatchTransferRefusesBeforeRunning(t *testing.T) {
	for _, tr := range hcomm.Transports() {
		t.Run(tr, func(t *testing.T) {
			p := pairOn(t, tr)
			remote := remoteBuf(t, p, 0)
			l := p.buf[0]
			fill(t, p.comms[0], l, 64, 0x55)
			fill(t, p.comms[1], p.buf[1], 64, 0x11)
			good := hcomm.TransferDesc{Type: hcomm.TransferWrite, Dst: remote, Src: l, Len: 64}
			for _, c := range []struct {
				name string
				bad  hcomm.TransferDesc
				want string
			}{
				{"past the peer's buffer", hcomm.TransferDesc{Type: hcomm.TransferWrite, Dst: remote.Add(p.size - 8), Src: l, Len: 64}, "outside the memory rank 1 registered"},
				{"unknown type", hcomm.TransferDesc{Type: 7, Dst: remote, Src: l, Len: 8}, "transfer type TransferType(7)"},
				{"invalid type", hcomm.TransferDesc{Type: hcomm.TransferInvalid}, "transfer type INVALID"},
				{"remote notify out of range", hcomm.TransferDesc{Type: hcomm.TransferNotifyRecord, NotifyIdx: 3}, "remote notify index 3"},
				{"negative notify with a write", hcomm.TransferDesc{Type: hcomm.TransferWriteWithNotify, Dst: remote, Src: l, Len: 8, NotifyIdx: -1}, "remote notify index -1"},
				{"local notify out of range", hcomm.TransferDesc{Type: hcomm.TransferNotifyWait, NotifyIdx: 5}, "local notify index 5"},
				{"bad data type", hcomm.TransferDesc{Type: hcomm.TransferReadReduce, Dst: l, Src: remote, Count: 4, DataType: 99, ReduceOp: hcomm.Sum}, "data type"},
				{"negative length", hcomm.TransferDesc{Type: hcomm.TransferRead, Dst: l, Src: remote, Len: -1}, "negative"},
			} {
				err := hcomm.BatchTransferOnThread(p.th[0], p.ch[0], []hcomm.TransferDesc{good, c.bad, good})
				if err == nil || !strings.Contains(err.Error(), "descriptor 1") || !strings.Contains(err.Error(), c.want) {
					t.Errorf("%s: %v, want a refusal of descriptor 1 saying %q", c.name, err, c.want)
				}
				if code := hcomm.ResultOf(err); code != hcomm.ErrPara && code != hcomm.ErrNotSupport {
					t.Errorf("%s: code %v, want ErrPara or ErrNotSupport", c.name, code)
				}
			}
			if err := hcomm.BatchTransferOnThread(p.th[0], p.ch[0], nil); !errors.Is(err, hcomm.ErrPara) {
				t.Errorf("an empty batch: %v, want ErrPara", err)
			}
			if err := p.sync(t, 0); err != nil {
				t.Fatal(err)
			}
			if got := read(t, p.comms[1], p.buf[1], 64); !bytes.Equal(got, filled(64, 0x11)) {
				t.Error("a refused batch's valid write reached the peer")
			}
		})
	}
}

// BatchModeStart/End: the calls between them are checked at once but run
// only at End, as one task, in issue order; a bad call is refused at the
// call and not cached; mismatched Start/End are refused; ThreadSynchronize
// refuses a thread in batch mode.
func TestBatchMode(t *testing.T) {
	for _, tr := range hcomm.Transports() {
		t.Run(tr, func(t *testing.T) {
			p := pairOn(t, tr)
			remote := remoteBuf(t, p, 0)
			l := p.buf[0]
			th := p.th[0]
			fill(t, p.comms[0], l, 256, 3)
			fill(t, p.comms[1], p.buf[1], 512, 0)
			if err := hcomm.BatchModeEnd(th, ""); !errors.Is(err, hcomm.ErrPara) {
				t.Errorf("End without Start: %v, want ErrPara", err)
			}
			if err := hcomm.BatchModeStart(th, "step"); err != nil {
				t.Fatal(err)
			}
			if err := hcomm.BatchModeStart(th, "other"); !errors.Is(err, hcomm.ErrPara) {
				t.Errorf("a second Start: %v, want ErrPara", err)
			}
			if err := hcomm.LocalCopyOnThread(th, l.Add(1024), l, 256); err != nil {
				t.Fatal(err)
			}
			if err := hcomm.WriteOnThread(th, p.ch[0], remote, l.Add(1024), 256); err != nil {
				t.Fatal(err)
			}
			if err := hcomm.WriteReduceWithNotifyOnThread(th, p.ch[0], remote, l, 256, hcomm.Uint8, hcomm.Sum, 1); err != nil {
				t.Fatal(err)
			}
			if err := hcomm.WriteOnThread(th, p.ch[0], remote.Add(p.size-8), l, 256); !errors.Is(err, hcomm.ErrPara) {
				t.Errorf("a bad write in batch mode: %v, want ErrPara at the call", err)
			}
			if err := hcomm.ThreadSynchronize(th); !errors.Is(err, hcomm.ErrPara) {
				t.Errorf("ThreadSynchronize in batch mode: %v, want ErrPara", err)
			}
			time.Sleep(20 * time.Millisecond)
			if err := th.Stream().Query(); err != nil {
				t.Errorf("the stream has work before BatchModeEnd: %v", err)
			}
			if got := read(t, p.comms[1], p.buf[1], 256); !bytes.Equal(got, filled(256, 0)) {
				t.Error("a cached write reached the peer before BatchModeEnd")
			}
			if err := hcomm.BatchModeEnd(th, "other"); !errors.Is(err, hcomm.ErrPara) {
				t.Errorf("End with another tag: %v, want ErrPara", err)
			}
			if err := hcomm.ChannelNotifyWaitOnThread(p.th[1], p.ch[1], 1, 20*time.Second); err != nil {
				t.Fatal(err)
			}
			if err := hcomm.BatchModeEnd(th, "step"); err != nil {
				t.Fatal(err)
			}
			if err := hcomm.ThreadSynchronize(th); err != nil {
				t.Fatal(err)
			}
			if err := hcomm.ThreadSynchronize(p.th[1]); err != nil {
				t.Fatal(err)
			}
			if got := read(t, p.comms[1], p.buf[1], 256); !bytes.Equal(got, filled(256, 6)) {
				t.Errorf("after BatchModeEnd the peer holds %d..., want 6 (copy, write, then write-reduce, in order)", got[0])
			}
		})
	}
}

// BenchmarkBatchTransfer: 32 small writes and a record on one channel, as one
// BatchTransferOnThread (one stream task) and as 33 single calls (33
// tasks), each followed by a ThreadSynchronize. With one CPU (-cpu 1) the
// difference is the tasks' cost; with more, the single calls' tasks run
// while the caller issues the next ones, which hides part of it in the
// time per op (not in the CPU spent).
func BenchmarkBatchTransfer(b *testing.B) {
	comms, err := hcomm.InitAll(2, &hcomm.Config{BufferSize: 32 << 10, Name: "bench", Transport: hcomm.TransportInproc})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	chs := make([][]*hcomm.Channel, 2)
	errs := make(chan error, 2)
	for r := range 2 {
		go func() {
			d := hcomm.ChannelDescInit(1)
			d[0].RemoteRank, d[0].NotifyNum = 1-r, 1
			var err error
			chs[r], err = comms[r].ChannelAcquire(hcomm.EngineCPUTS, d)
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	ts, err := comms[0].ThreadAcquire(hcomm.EngineCPUTS, 1, 0)
	if err != nil {
		b.Fatal(err)
	}
	th, ch := ts[0], chs[0][0]
	remote, _, _ := comms[0].ChannelGetHcclBuffer(ch)
	local, _, _ := comms[0].GetHcclBuffer()
	const writes, size = 32, 256
	descs := make([]hcomm.TransferDesc, 0, writes+1)
	for i := range writes {
		descs = append(descs, hcomm.TransferDesc{Type: hcomm.TransferWrite, Dst: remote.Add(int64(i * size)), Src: local.Add(int64(i * size)), Len: size})
	}
	descs = append(descs, hcomm.TransferDesc{Type: hcomm.TransferNotifyRecord, NotifyIdx: 0})
	b.Run("batch", func(b *testing.B) {
		b.SetBytes(writes * size)
		b.ReportAllocs()
		for b.Loop() {
			if err := hcomm.BatchTransferOnThread(th, ch, descs); err != nil {
				b.Fatal(err)
			}
			if err := hcomm.ThreadSynchronize(th); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(1, "tasks/op")
	})
	b.Run("single", func(b *testing.B) {
		b.SetBytes(writes * size)
		b.ReportAllocs()
		for b.Loop() {
			for _, d := range descs[:writes] {
				if err := hcomm.WriteOnThread(th, ch, d.Dst, d.Src, d.Len); err != nil {
					b.Fatal(err)
				}
			}
			if err := hcomm.ChannelNotifyRecordOnThread(th, ch, 0); err != nil {
				b.Fatal(err)
			}
			if err := hcomm.ThreadSynchronize(th); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(writes+1, "tasks/op")
	})
}
