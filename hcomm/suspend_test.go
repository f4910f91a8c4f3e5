package hcomm_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
)

// On every transport: collectives before Suspend and after Resume are
// right; while suspended the HCCL buffer is freed and the calls that need
// it fail with ErrSuspending; Suspend twice and Resume twice do nothing.
func TestSuspendResume(t *testing.T) {
	for _, tr := range hcomm.Transports() {
		t.Run(tr, func(t *testing.T) {
			cfg := testCfg()
			cfg.Transport = tr
			comms, err := hcomm.InitAll(3, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				for _, c := range comms {
					c.Destroy()
				}
			}()
			work(t, comms, tr, []int{1, 7, 70000})
			bufs := make([]device.Ptr, len(comms))
			for r, c := range comms {
				bufs[r], _, _ = c.GetHcclBuffer()
			}
			for r, c := range comms {
				for range 2 {
					if err := c.Suspend(); err != nil {
						t.Fatalf("rank %d Suspend: %v", r, err)
					}
				}
				if !c.Suspended() {
					t.Fatalf("rank %d: Suspended() is false after Suspend", r)
				}
			}
			for r, c := range comms {
				if _, err := c.Device().Bytes(bufs[r], 1); err == nil {
					t.Errorf("rank %d: the HCCL buffer is still allocated while suspended", r)
				}
				if _, _, err := c.GetHcclBuffer(); !isCode(err, hcomm.ErrSuspending) || !strings.Contains(err.Error(), "suspended") {
					t.Errorf("rank %d GetHcclBuffer while suspended: %v, want ErrSuspending", r, err)
				}
				d := hcomm.ChannelDescInit(1)
				d[0].RemoteRank, d[0].NotifyNum = (r+1)%3, 1
				if _, err := c.ChannelAcquire(hcomm.EngineCPUTS, d); !isCode(err, hcomm.ErrSuspending) {
					t.Errorf("rank %d ChannelAcquire while suspended: %v, want ErrSuspending", r, err)
				}
			}
			for r, c := range comms {
				for range 2 {
					if err := c.Resume(); err != nil {
						t.Fatalf("rank %d Resume: %v", r, err)
					}
				}
				if c.Suspended() {
					t.Fatalf("rank %d: Suspended() is true after Resume", r)
				}
			}
			work(t, comms, tr, []int{0, 1, 7, 70000})
		})
	}
}

// Suspend refuses, releasing nothing, while a thread has work queued.
func TestSuspendBusy(t *testing.T) {
	comms, err := hcomm.InitAll(2, testCfg())
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	ts, err := comms[0].ThreadAcquire(hcomm.EngineCPUTS, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	if err := ts[0].Stream().Launch("held", func(stop <-chan struct{}) error {
		select {
		case <-release:
		case <-stop:
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	err = comms[0].Suspend()
	close(release)
	if !isCode(err, hcomm.ErrAgain) || !strings.Contains(err.Error(), "thread 0 has work queued") {
		t.Fatalf("Suspend with work queued: %v, want ErrAgain naming the thread", err)
	}
	if _, _, err := comms[0].GetHcclBuffer(); err != nil {
		t.Fatalf("a refused Suspend released the buffer: %v", err)
	}
	if err := ts[0].Stream().SynchronizeWithTimeout(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := comms[0].Suspend(); err != nil {
		t.Fatalf("Suspend once idle: %v", err)
	}
	// Destroy of a suspended communicator, and Resume after Destroy.
	if err := comms[0].Destroy(); err != nil {
		t.Fatalf("Destroy while suspended: %v", err)
	}
	if err := comms[0].Resume(); !isCode(err, hcomm.ErrUnavail) {
		t.Fatalf("Resume after Destroy: %v, want ErrUnavail", err)
	}
}

// The same over every transport of hcommtest, ranks as processes included,
// each rank suspending once its collectives are done and resuming at its
// own pace: the first collective after Resume sets the channels up again,
// and nothing (descriptors, shm mappings) outlives the communicators.
func TestSuspendResumeEveryTransport(t *testing.T) {
	for _, tr := range hcommtest.Transports() {
		t.Run(tr.String(), func(t *testing.T) {
			hcommtest.Run(t, 3, tr, func(t testing.TB, c *hcomm.Comm) {
				ctx := context.Background()
				sum := func() {
					t.Helper()
					v := []float32{float32(c.Rank()), 1}
					if err := collectives.AllReduceSlice(ctx, c, v, v, hcomm.Sum, nil); err != nil {
						t.Fatal(err)
					}
					if v[0] != 3 || v[1] != 3 {
						t.Fatalf("AllReduce gave %v, want [3 3]", v)
					}
				}
				sum()
				if err := collectives.BarrierContext(ctx, c); err != nil {
					t.Fatal(err)
				}
				buf, _, _ := c.GetHcclBuffer()
				if err := c.Suspend(); err != nil {
					t.Fatal(err)
				}
				if _, err := c.Device().Bytes(buf, 1); err == nil {
					t.Error("the HCCL buffer is still allocated while suspended")
				}
				if err := collectives.AllReduceSlice(ctx, c, []float32{1}, make([]float32, 1), hcomm.Sum, nil); !isCode(err, hcomm.ErrSuspending) {
					t.Errorf("AllReduce while suspended: %v, want ErrSuspending", err)
				}
				time.Sleep(time.Duration(c.Rank()) * 50 * time.Millisecond) // resume in turn
				if err := c.Resume(); err != nil {
					t.Fatal(err)
				}
				sum()
			})
		})
	}
}
