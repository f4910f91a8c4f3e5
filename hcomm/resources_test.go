package hcomm_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// acquireBoth acquires the channel desc names (peer filled in) on both ranks
// at once.
func acquireBoth(t *testing.T, comms [2]*hcomm.Comm, notifies int, tag string) [2]*hcomm.Channel {
	t.Helper()
	var out [2]*hcomm.Channel
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := hcomm.ChannelDescInit(1)
			d[0].RemoteRank, d[0].NotifyNum, d[0].Tag = 1-r, notifies, tag
			chs, err := comms[r].ChannelAcquire(hcomm.EngineCPUTS, d)
			if err == nil {
				out[r] = chs[0]
			}
			errs[r] = err
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: ChannelAcquire: %v", r, err)
		}
	}
	return out
}

func mapsWith(s string) int {
	b, _ := os.ReadFile("/proc/self/maps")
	return strings.Count(string(b), s)
}

// ChannelDestroy, on every transport: the peer's pending wait fails with
// channel.ErrPeerClosed; every call with the destroyed channel fails with
// ErrPtr naming it; ChannelQuery no longer finds it; a second destroy is
// refused; a later ChannelAcquire of the same descriptor on both ends
// builds a new channel that works. Over shm, the memory files the two ends
// mapped from each other for the channel are unmapped at once on both.
func TestChannelDestroy(t *testing.T) {
	for _, tr := range hcomm.Transports() {
		t.Run(tr, func(t *testing.T) {
			p := pairOn(t, tr)
			maps := mapsWith("memfd:")
			ch := acquireBoth(t, p.comms, 2, "destroy")
			if tr == hcomm.TransportShm && mapsWith("memfd:") <= maps {
				t.Fatal("no memory file is mapped for the new shm channel")
			}
			remote := remoteBuf(t, p, 0)
			if err := hcomm.ChannelNotifyWaitOnThread(p.th[1], ch[1], 0, 20*time.Second); err != nil {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond) // the wait is pending
			if err := p.comms[0].ChannelDestroy([]*hcomm.Channel{ch[0]}); err != nil {
				t.Fatal(err)
			}
			err := hcomm.ThreadSynchronize(p.th[1])
			if !errors.Is(err, channel.ErrPeerClosed) {
				t.Errorf("the peer's pending wait: %v, want channel.ErrPeerClosed", err)
			}
			if tr == hcomm.TransportShm {
				deadline := time.Now().Add(5 * time.Second)
				for mapsWith("memfd:") > maps+1 && time.Now().Before(deadline) {
					time.Sleep(5 * time.Millisecond)
				}
				// What may stay is rank 1's own notify page, until rank 1
				// destroys its end too.
				if got := mapsWith("memfd:"); got > maps+1 {
					t.Errorf("%d memory-file mappings after rank 0 destroyed the channel, %d before it was acquired: the peer still maps rank 0's memory", got, maps)
				}
			}
			for name, call := range map[string]func() error{
				"WriteOnThread":             func() error { return hcomm.WriteOnThread(p.th[0], ch[0], remote, p.buf[0], 8) },
				"ChannelNotifyWaitOnThread": func() error { return hcomm.ChannelNotifyWaitOnThread(p.th[0], ch[0], 0, time.Second) },
				"BatchTransferOnThread": func() error {
					return hcomm.BatchTransferOnThread(p.th[0], ch[0], []hcomm.TransferDesc{{Type: hcomm.TransferNotifyRecord}})
				},
				"WriteNbi":                    func() error { return hcomm.WriteNbi(nil, ch[0], remote, p.buf[0], 8) },
				"ChannelFence":                func() error { return hcomm.ChannelFence(nil, ch[0]) },
				"ChannelDrainOnThread":        func() error { return hcomm.ChannelDrainOnThread(p.th[0], ch[0]) },
				"ChannelGetHcclBuffer":        func() error { _, _, err := p.comms[0].ChannelGetHcclBuffer(ch[0]); return err },
				"ChannelDestroy (a 2nd time)": func() error { return p.comms[0].ChannelDestroy([]*hcomm.Channel{ch[0]}) },
			} {
				err := call()
				if !errors.Is(err, hcomm.ErrPtr) || !strings.Contains(err.Error(), "destroyed") {
					t.Errorf("%s with a destroyed channel: %v, want ErrPtr saying it is destroyed", name, err)
				}
			}
			d := hcomm.ChannelDescInit(1)
			d[0].RemoteRank, d[0].NotifyNum, d[0].Tag = 1, 2, "destroy"
			if q, err := p.comms[0].ChannelQuery(hcomm.EngineCPUTS, d); err != nil || q[0] != nil {
				t.Errorf("ChannelQuery after destroy: %v, %v; want no channel", q, err)
			}
			// Both ends destroyed: acquiring again builds a new channel.
			if err := p.comms[1].ChannelDestroy([]*hcomm.Channel{ch[1]}); err != nil {
				t.Fatal(err)
			}
			if tr == hcomm.TransportShm {
				if got := mapsWith("memfd:"); got != maps {
					t.Errorf("%d memory-file mappings after both ends destroyed the channel, %d before", got, maps)
				}
			}
			again := acquireBoth(t, p.comms, 2, "destroy")
			if again[0] == ch[0] || again[1] == ch[1] {
				t.Fatal("ChannelAcquire after ChannelDestroy returned the destroyed channel")
			}
			fill(t, p.comms[0], p.buf[0], 64, 0x3c)
			if err := hcomm.ChannelNotifyWaitOnThread(p.th[1], again[1], 1, 20*time.Second); err != nil {
				t.Fatal(err)
			}
			if err := hcomm.WriteWithNotifyOnThread(p.th[0], again[0], remote.Add(512), p.buf[0], 64, 1); err != nil {
				t.Fatal(err)
			}
			for r := range 2 {
				if err := hcomm.ThreadSynchronize(p.th[r]); err != nil {
					t.Fatalf("rank %d on the new channel: %v", r, err)
				}
			}
			if got := read(t, p.comms[1], p.buf[1].Add(512), 64); !bytes.Equal(got, filled(64, 0x3c)) {
				t.Error("the new channel's write did not arrive")
			}
			// The pair's own channel was never touched.
			if q, err := p.comms[0].ChannelQuery(hcomm.EngineCPUTS, []hcomm.ChannelDesc{{RemoteRank: 1, Protocol: hcomm.ProtocolHCCS}}); err != nil || q[0] != p.ch[0] {
				t.Errorf("ChannelQuery of the pair's channel: %v, %v; want it", q, err)
			}
			if err := p.comms[0].ChannelDestroy([]*hcomm.Channel{nil}); !errors.Is(err, hcomm.ErrPtr) {
				t.Errorf("ChannelDestroy(nil): %v, want ErrPtr", err)
			}
			if err := p.comms[0].ChannelDestroy([]*hcomm.Channel{p.ch[1]}); !errors.Is(err, hcomm.ErrPtr) {
				t.Errorf("ChannelDestroy of another communicator's channel: %v, want ErrPtr", err)
			}
			if _, err := p.comms[0].ChannelQuery(hcomm.EngineCPUTS, []hcomm.ChannelDesc{{RemoteRank: 0}}); !errors.Is(err, hcomm.ErrPara) {
				t.Errorf("ChannelQuery of a channel to oneself: %v, want ErrPara", err)
			}
		})
	}
}

// ThreadFree drains the thread's queued work first (a write queued behind a
// wait lands once the wait is satisfied), releases it, and every later call
// with it is refused with ErrPtr naming it; the communicator's other threads
// and Destroy are unaffected.
func TestThreadFree(t *testing.T) {
	for _, tr := range hcomm.Transports() {
		t.Run(tr, func(t *testing.T) {
			p := pairOn(t, tr)
			remote := remoteBuf(t, p, 0)
			ts, err := p.comms[0].ThreadAcquire(hcomm.EngineCPUTS, 1, 2)
			if err != nil {
				t.Fatal(err)
			}
			th := ts[0]
			if n, err := p.comms[0].GetNotifyNumInThread(th); err != nil || n != 2 {
				t.Errorf("GetNotifyNumInThread: %d, %v; want 2", n, err)
			}
			fill(t, p.comms[0], p.buf[0], 64, 0x42)
			fill(t, p.comms[1], p.buf[1], 64, 0)
			if err := hcomm.ChannelNotifyWaitOnThread(th, p.ch[0], 0, 20*time.Second); err != nil {
				t.Fatal(err)
			}
			if err := hcomm.WriteOnThread(th, p.ch[0], remote, p.buf[0], 64); err != nil {
				t.Fatal(err)
			}
			go func() {
				time.Sleep(20 * time.Millisecond)
				hcomm.ChannelNotifyRecord(nil, p.ch[1], 0)
			}()
			if err := p.comms[0].ThreadFree([]*hcomm.Thread{th}); err != nil {
				t.Fatalf("ThreadFree: %v", err)
			}
			// The write ran; a fence (tcp's writes are not acknowledged) makes
			// it complete at the peer.
			if err := hcomm.ChannelFenceOnThread(p.th[0], p.ch[0]); err != nil {
				t.Fatal(err)
			}
			if err := hcomm.ThreadSynchronize(p.th[0]); err != nil {
				t.Fatal(err)
			}
			if got := read(t, p.comms[1], p.buf[1], 64); !bytes.Equal(got, filled(64, 0x42)) {
				t.Error("ThreadFree did not drain the queued write")
			}
			for name, call := range map[string]func() error{
				"WriteOnThread":               func() error { return hcomm.WriteOnThread(th, p.ch[0], remote, p.buf[0], 8) },
				"ChannelNotifyRecordOnThread": func() error { return hcomm.ChannelNotifyRecordOnThread(th, p.ch[0], 0) },
				"LocalCopyOnThread":           func() error { return hcomm.LocalCopyOnThread(th, p.buf[0], p.buf[0].Add(64), 8) },
				"ThreadNotifyRecordOnThread":  func() error { return hcomm.ThreadNotifyRecordOnThread(p.th[0], th, 0) },
				"ThreadNotifyWaitOnThread":    func() error { return hcomm.ThreadNotifyWaitOnThread(th, 0, time.Second) },
				"ThreadSynchronize":           func() error { return hcomm.ThreadSynchronize(th) },
				"FenceOnThread":               func() error { return hcomm.FenceOnThread(th) },
				"BatchModeStart":              func() error { return hcomm.BatchModeStart(th, "") },
				"GetNotifyNumInThread":        func() error { _, err := p.comms[0].GetNotifyNumInThread(th); return err },
				"ThreadFree (a 2nd time)":     func() error { return p.comms[0].ThreadFree([]*hcomm.Thread{th}) },
			} {
				err := call()
				if !errors.Is(err, hcomm.ErrPtr) || !strings.Contains(err.Error(), "freed") {
					t.Errorf("%s with a freed thread: %v, want ErrPtr saying it is freed", name, err)
				}
			}
			if err := p.comms[0].ThreadFree([]*hcomm.Thread{p.th[1]}); !errors.Is(err, hcomm.ErrPtr) {
				t.Errorf("ThreadFree of another communicator's thread: %v, want ErrPtr", err)
			}
			if err := p.comms[0].ThreadFree([]*hcomm.Thread{nil}); !errors.Is(err, hcomm.ErrPtr) {
				t.Errorf("ThreadFree(nil): %v, want ErrPtr", err)
			}
			if err := hcomm.WriteOnThread(p.th[0], p.ch[0], remote, p.buf[0], 8); err != nil {
				t.Errorf("the communicator's other thread after ThreadFree: %v", err)
			}
			if err := hcomm.ThreadSynchronize(p.th[0]); err != nil {
				t.Error(err)
			}
		})
	}
}

// The …WithDefaultTimeout waits take SetNotifyWaitTimeOut's value (and
// ExecTimeout before it is set); ThreadSynchronizeContext gives up at its
// context's deadline with ErrTimeout, the work still queued.
func TestDefaultTimeoutAndSynchronize(t *testing.T) {
	p := newPair(t, &hcomm.Config{BufferSize: 32 << 10, Name: "timeouts", ExecTimeout: 30 * time.Second})
	if err := p.comms[0].SetNotifyWaitTimeOut(50 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := hcomm.ChannelNotifyWaitOnThreadWithDefaultTimeout(p.th[0], p.ch[0], 0); err != nil {
		t.Fatal(err)
	}
	if err := hcomm.ThreadNotifyWaitOnThreadWithDefaultTimeout(p.th[0], 1); err != nil {
		t.Fatal(err)
	}
	err := hcomm.ThreadSynchronize(p.th[0])
	if !errors.Is(err, hcomm.ErrTimeout) || time.Since(start) > 10*time.Second {
		t.Errorf("a default-timeout wait nobody records: %v after %v, want ErrTimeout after about 50ms", err, time.Since(start))
	}
	// Thread waits: the second wait was skipped after the first failed;
	// issue one alone.
	start = time.Now()
	if err := hcomm.ThreadNotifyWaitOnThreadWithDefaultTimeout(p.th[0], 1); err != nil {
		t.Fatal(err)
	}
	if err := hcomm.ThreadSynchronize(p.th[0]); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 10*time.Second {
		t.Errorf("a default-timeout thread wait nobody records: %v after %v, want a timeout after about 50ms", err, time.Since(start))
	}
	// Rank 1 keeps ExecTimeout: its wait outlives a 200ms synchronize.
	if err := hcomm.ChannelNotifyWaitOnThreadWithDefaultTimeout(p.th[1], p.ch[1], 0); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err = hcomm.ThreadSynchronizeContext(ctx, p.th[1])
	if !errors.Is(err, hcomm.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("ThreadSynchronizeContext past its deadline: %v, want ErrTimeout", err)
	}
	if err := hcomm.ChannelNotifyRecord(nil, p.ch[0], 0); err != nil {
		t.Fatal(err)
	}
	if err := hcomm.ThreadSynchronize(p.th[1]); err != nil {
		t.Errorf("the wait still queued after the synchronize gave up: %v", err)
	}
	if err := hcomm.ThreadSynchronize(nil); !errors.Is(err, hcomm.ErrPtr) {
		t.Errorf("ThreadSynchronize(nil): %v, want ErrPtr", err)
	}
}

// The remaining data-plane calls, on every transport: the Nbi forms on a
// thread and ReadNbi, WriteReduceWithNotifyOnThread (visible once the wait
// returns), FenceOnThread and ChannelFence, ChannelDrainOnThread (returns
// with the work done), and their refusals.
func TestRestOfDataPlane(t *testing.T) {
	for _, tr := range hcomm.Transports() {
		t.Run(tr, func(t *testing.T) {
			p := pairOn(t, tr)
			remote := remoteBuf(t, p, 0)
			l := p.buf[0]
			fill(t, p.comms[0], l, 4096, 2)
			fill(t, p.comms[0], l.Add(2048), 1024, 0) // what ReadNbiOnThread reads into
			fill(t, p.comms[1], p.buf[1], 4096, 1)
			fill(t, p.comms[1], p.buf[1].Add(p.size-8), 8, 1)
			if err := hcomm.ChannelNotifyWaitOnThread(p.th[1], p.ch[1], 2, 20*time.Second); err != nil {
				t.Fatal(err)
			}
			seen := make(chan []byte, 1)
			p.th[1].Stream().Launch("look", func(<-chan struct{}) error {
				b, _ := p.comms[1].Device().Bytes(p.buf[1], 1024)
				seen <- append([]byte(nil), b...)
				return nil
			})
			if err := hcomm.WriteReduceWithNotifyOnThread(p.th[0], p.ch[0], remote, l, 1024, hcomm.Uint8, hcomm.Sum, 2); err != nil {
				t.Fatal(err)
			}
			if got := <-seen; !bytes.Equal(got, filled(1024, 3)) {
				t.Errorf("WriteReduceWithNotifyOnThread: the peer saw %d... after its wait, want 3", got[0])
			}
			if err := hcomm.WriteNbiOnThread(p.th[0], p.ch[0], remote.Add(1024), l, 512); err != nil {
				t.Fatal(err)
			}
			if err := hcomm.WriteWithNotifyNbiOnThread(p.th[0], p.ch[0], remote.Add(1536), l, 512, 0); err != nil {
				t.Fatal(err)
			}
			if err := hcomm.ReadNbiOnThread(p.th[0], p.ch[0], l.Add(2048), remote.Add(1024), 1024); err != nil {
				t.Fatal(err)
			}
			if err := hcomm.FenceOnThread(p.th[0]); err != nil {
				t.Fatal(err)
			}
			if err := hcomm.ChannelDrainOnThread(p.th[0], p.ch[0]); err != nil {
				t.Fatal(err)
			}
			if got := read(t, p.comms[0], l.Add(2048), 1024); !bytes.Equal(got, filled(1024, 2)) {
				t.Errorf("ReadNbiOnThread after the Nbi writes: %d..., want 2", got[0])
			}
			if got := read(t, p.comms[1], p.buf[1].Add(1024), 1024); !bytes.Equal(got, filled(1024, 2)) {
				t.Errorf("after ChannelDrainOnThread the peer holds %d..., want 2", got[0])
			}
			if err := hcomm.ChannelNotifyWait(nil, p.ch[1], 0, 10*time.Second); err != nil {
				t.Errorf("the record of WriteWithNotifyNbiOnThread: %v", err)
			}
			// Immediate: ReadNbi and ChannelFence.
			fill(t, p.comms[0], l.Add(2048), 1024, 0)
			if err := hcomm.ReadNbi(nil, p.ch[0], l.Add(2048), remote, 1024); err != nil {
				t.Fatal(err)
			}
			if got := read(t, p.comms[0], l.Add(2048), 1024); !bytes.Equal(got, filled(1024, 3)) {
				t.Errorf("ReadNbi: %d..., want 3", got[0])
			}
			if err := hcomm.ChannelFence(nil, p.ch[0]); err != nil {
				t.Fatal(err)
			}
			// Refusals.
			for name, err := range map[string]error{
				"WriteReduceWithNotifyOnThread, notify -1":    hcomm.WriteReduceWithNotifyOnThread(p.th[0], p.ch[0], remote, l, 8, hcomm.Uint8, hcomm.Sum, -1),
				"WriteReduceWithNotifyOnThread, notify 3":     hcomm.WriteReduceWithNotifyOnThread(p.th[0], p.ch[0], remote, l, 8, hcomm.Uint8, hcomm.Sum, 3),
				"WriteReduceWithNotifyOnThread, past the end": hcomm.WriteReduceWithNotifyOnThread(p.th[0], p.ch[0], remote.Add(p.size-4), l, 8, hcomm.Uint8, hcomm.Sum, 0),
				"ReadNbi, past the end":                       hcomm.ReadNbi(nil, p.ch[0], l, remote.Add(p.size-4), 8),
				"ReadNbiOnThread, past the end":               hcomm.ReadNbiOnThread(p.th[0], p.ch[0], l, remote.Add(p.size-4), 8),
				"WriteNbiOnThread, negative":                  hcomm.WriteNbiOnThread(p.th[0], p.ch[0], remote, l, -1),
				"WriteWithNotifyNbiOnThread, notify -1":       hcomm.WriteWithNotifyNbiOnThread(p.th[0], p.ch[0], remote, l, 8, -1),
			} {
				if !errors.Is(err, hcomm.ErrPara) {
					t.Errorf("%s: %v, want ErrPara", name, err)
				}
			}
			for name, err := range map[string]error{
				"ChannelFence(nil)":             hcomm.ChannelFence(nil, nil),
				"FenceOnThread(nil)":            hcomm.FenceOnThread(nil),
				"ChannelDrainOnThread(nil, ch)": hcomm.ChannelDrainOnThread(nil, p.ch[0]),
				"ReadNbi(nil)":                  hcomm.ReadNbi(nil, nil, l, remote, 8),
			} {
				if !errors.Is(err, hcomm.ErrPtr) {
					t.Errorf("%s: %v, want ErrPtr", name, err)
				}
			}
			if err := hcomm.ThreadSynchronize(p.th[0]); err != nil {
				t.Fatal(err)
			}
			if got := read(t, p.comms[1], p.buf[1].Add(p.size-4), 4); !bytes.Equal(got, filled(4, 1)) {
				t.Error("a refused call touched the peer's memory")
			}
		})
	}
}

// GetHcclBufferCleared returns the HCCL buffer zeroed.
func TestGetHcclBufferCleared(t *testing.T) {
	p := newPair(t, nil)
	fill(t, p.comms[0], p.buf[0], p.size, 0x5a)
	buf, size, err := p.comms[0].GetHcclBufferCleared()
	if err != nil || buf != p.buf[0] || size != p.size {
		t.Fatalf("GetHcclBufferCleared: %v, %d, %v", buf, size, err)
	}
	if got := read(t, p.comms[0], buf, size); !bytes.Equal(got, make([]byte, size)) {
		t.Error("the buffer is not cleared")
	}
}
