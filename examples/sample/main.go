// Command sample runs the seed document's Sample for HcommWriteOnThread with
// two ranks in one process: rank 0 writes its HCCL buffer into rank 1's, with
// the three-phase notify handshake (pre-sync, write-done, post-sync), and then
// rank 1 checks every byte it received.
//
//	go run ./examples/sample
package main

import (
	"bytes"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// notifyTimeout is the seed's NOTIFY_TIMEOUT (1 second).
const notifyTimeout = time.Second

// sample is the seed's Sample(comm, channel, thread, rank).
func sample(comm *hcomm.Comm, ch *hcomm.Channel, th *hcomm.Thread, rank int) error {
	step := func(idx int) error { // record on the peer, then wait for the peer's record
		if err := hcomm.ChannelNotifyRecordOnThread(th, ch, idx); err != nil {
			return err
		}
		return hcomm.ChannelNotifyWaitOnThread(th, ch, idx, notifyTimeout)
	}
	if rank == 0 {
		localAddr, localSize, err := comm.GetHcclBuffer()
		if err != nil {
			return err
		}
		remoteAddr, remoteSize, err := comm.ChannelGetHcclBuffer(ch)
		if err != nil {
			return err
		}
		n := min(localSize, remoteSize)
		if err := step(0); err != nil { // pre-sync: both ends ready
			return err
		}
		if err := hcomm.WriteOnThread(th, ch, remoteAddr, localAddr, n); err != nil {
			return err
		}
		if err := step(1); err != nil { // write done
			return err
		}
		return step(2) // post-sync: the peer has the data
	}
	for idx := 0; idx < 3; idx++ {
		if err := step(idx); err != nil {
			return err
		}
	}
	return nil
}

func run() error {
	comms, err := hcomm.InitAll(2, &hcomm.Config{Name: "sample", BufferSize: 4 << 20})
	if err != nil {
		return err
	}
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	// Rank 0's buffer holds a pattern; rank 1's is zero.
	buf0, size, _ := comms[0].GetHcclBuffer()
	pattern := make([]byte, size)
	for i := range pattern {
		pattern[i] = byte(i*31 + 7)
	}
	if err := comms[0].Device().MemcpyHtoD(buf0, pattern); err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	streams := make([]*device.Stream, 2)
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			c := comms[r]
			desc := hcomm.ChannelDescInit(1)
			desc[0].RemoteRank = 1 - r
			desc[0].Protocol = hcomm.ProtocolHCCS
			desc[0].NotifyNum = 3
			chs, err := c.ChannelAcquire(hcomm.EngineCPUTS, desc)
			if err != nil {
				errs[r] = err
				return
			}
			s, err := c.Device().CreateStream()
			if err != nil {
				errs[r] = err
				return
			}
			streams[r] = s
			th, err := c.ThreadAcquireWithStream(hcomm.EngineCPUTS, s, 2)
			if err != nil {
				errs[r] = err
				return
			}
			if err := sample(c, chs[0], th, r); err != nil {
				errs[r] = err
				return
			}
			errs[r] = s.SynchronizeWithTimeout(10 * time.Second) // as the seed: synchronize the stream
		}(r)
	}
	wg.Wait()
	for _, s := range streams {
		if s != nil {
			s.Destroy()
		}
	}
	for r, err := range errs {
		if err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
	}
	buf1, _, _ := comms[1].GetHcclBuffer()
	got := make([]byte, size)
	if err := comms[1].Device().MemcpyDtoH(got, buf1); err != nil {
		return err
	}
	if !bytes.Equal(got, pattern) {
		return fmt.Errorf("rank 1's HCCL buffer differs from rank 0's")
	}
	fmt.Printf("rank 0 wrote its HCCL buffer (%d bytes) into rank 1's with 3 notify handshakes\n", size)
	fmt.Printf("rank 1 checked all %d bytes: identical\n", size)
	return nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "sample:", err)
		os.Exit(1)
	}
}
