package collectives_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
)

// sendRecvPair runs, on c, a send to peer and a receive from it of one
// float32 (one BatchSendRecv) and checks the value received.
func sendRecvPair(c *hcomm.Comm, peer int) error {
	dev := c.Device()
	s, err := dev.CreateStream()
	if err != nil {
		return err
	}
	defer s.Destroy()
	p, err := dev.Malloc(8)
	if err != nil {
		return err
	}
	defer dev.Free(p)
	if err := dev.MemcpyHtoD(p, []byte{byte(c.Rank()), 0, 0, 0}); err != nil {
		return err
	}
	items := []collectives.SendRecvItem{
		{Type: collectives.SendItem, Buf: p, Count: 4, DataType: hcomm.Uint8, RemoteRank: peer},
		{Type: collectives.RecvItem, Buf: p.Add(4), Count: 4, DataType: hcomm.Uint8, RemoteRank: peer},
	}
	if err := collectives.BatchSendRecv(items, c, s); err != nil {
		return err
	}
	if err := s.SynchronizeWithTimeout(30 * time.Second); err != nil {
		return err
	}
	got := make([]byte, 1)
	if err := dev.MemcpyDtoH(got, p.Add(4)); err != nil {
		return err
	}
	if int(got[0]) != peer {
		return errors.New("received the wrong byte")
	}
	return nil
}

// TestLazyChannels: a rank sets up a collective channel to a peer when a
// schedule first needs it, and to no other: a send/receive between ranks 0
// and 1 of four opens their channel only, while ranks 2 and 3 stay idle
// (before, the first call opened a channel to every peer, and waited for
// all of them); a collective over all four then opens the rest.
func TestLazyChannels(t *testing.T) {
	for _, tr := range []hcommtest.Transport{hcommtest.Inproc, hcommtest.TCP} {
		t.Run(tr.String(), func(t *testing.T) {
			opts := hcommtest.Options{Config: &hcomm.Config{BufferSize: 1 << 20, ConnectTimeout: 10 * time.Second}}
			comms := opts.New(t, 4, tr)
			var wg sync.WaitGroup
			errs := make([]error, 2)
			for r := 0; r < 2; r++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[r] = sendRecvPair(comms[r], 1-r)
				}()
			}
			wg.Wait()
			for r, err := range errs {
				if err != nil {
					t.Fatalf("rank %d: send/receive with rank %d: %v", r, 1-r, err)
				}
			}
			for r, want := range []int{1, 1, 0, 0} {
				if got := collectives.CollChannels(comms[r]); got != want {
					t.Errorf("after a send/receive between ranks 0 and 1: rank %d has %d collective channels, want %d", r, got, want)
				}
			}
			if err := hcommtest.Go(comms, func(c *hcomm.Comm) error {
				b := []float32{1}
				return collectives.AllReduceSlice(context.Background(), c, b, b, hcomm.Sum, nil)
			}); err != nil {
				t.Fatal(err)
			}
			for r := range comms {
				if got := collectives.CollChannels(comms[r]); got < 1 || got > 3 {
					t.Errorf("after an all-reduce: rank %d has %d collective channels, want 1 to 3", r, got)
				}
			}
		})
	}
}

// TestLazySetupFailures: a lazy setup is bounded and named: a peer that
// never comes fails the collective at HCCL_CONNECT_TIMEOUT with ErrTimeout
// naming the peer — at a later collective too, once other channels are up
// — and Abort ends a setup under way at once.
func TestLazySetupFailures(t *testing.T) {
	t.Run("timeout", func(t *testing.T) {
		opts := hcommtest.Options{Config: &hcomm.Config{BufferSize: 1 << 20, ConnectTimeout: time.Second}}
		comms := opts.New(t, 3, hcommtest.Inproc)
		if err := hcommtest.Go(comms[:2], func(c *hcomm.Comm) error { return sendRecvPair(c, 1-c.Rank()) }); err != nil {
			t.Fatal(err)
		}
		// Rank 0 now needs rank 2, which never calls.
		start := time.Now()
		err := sendRecvPair(comms[0], 2)
		d := time.Since(start)
		if err == nil || hcomm.ResultOf(err) != hcomm.ErrTimeout || !strings.Contains(err.Error(), "rank 2") {
			t.Fatalf("a send/receive with a rank that never calls: %v; want ErrTimeout naming rank 2", err)
		}
		if d > 10*time.Second {
			t.Fatalf("the setup gave up after %v; HCCL_CONNECT_TIMEOUT is 1 s", d)
		}
	})
	t.Run("abort", func(t *testing.T) {
		opts := hcommtest.Options{Config: &hcomm.Config{BufferSize: 1 << 20, ConnectTimeout: time.Minute}}
		comms := opts.New(t, 2, hcommtest.Inproc)
		c := comms[0]
		s, err := c.Device().CreateStream()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Destroy()
		p, err := c.Device().Malloc(64)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Device().Free(p)
		done := make(chan error, 1)
		go func() { done <- collectives.AllReduce(p, p, 4, hcomm.Float32, hcomm.Sum, c, s, nil) }()
		time.Sleep(200 * time.Millisecond)
		start := time.Now()
		c.Abort()
		select {
		case err := <-done:
			if !errors.Is(err, hcomm.ErrAborted) {
				t.Fatalf("an all-reduce whose setup Abort ended: %v; want ErrAborted", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the all-reduce still waits for its setup 10 s after Abort")
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("the setup ended %v after Abort", d)
		}
	})
}
