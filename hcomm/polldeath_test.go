package hcomm_test

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// pollDeathRank is one rank of TestPeerDiesMidCollective
// (HCOMM_TEST_ROLE=polldeath): it joins, sets the collective channels up
// with a barrier and says READY; rank 1 then waits to be killed, rank 0
// issues a small all-reduce — its hello polled in the calling goroutine,
// then waited for by the stream — says how long the call took, and reports
// how its stream's Synchronize ended and when.
func pollDeathRank(t *testing.T) {
	c, err := hcomm.InitFromEnv(nil)
	if err != nil {
		t.Fatalf("init: %v", err)
	}
	s, err := c.Device().CreateStream()
	if err != nil {
		t.Fatal(err)
	}
	if err := collectives.Barrier(c, s); err != nil {
		t.Fatal(err)
	}
	if err := s.SynchronizeWithTimeout(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	fmt.Println("READY")
	if c.Rank() != 0 {
		time.Sleep(60 * time.Second) // killed before this ends
		return
	}
	buf, err := c.Device().Malloc(16)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := collectives.AllReduce(buf, buf, 4, hcomm.Float32, hcomm.Sum, c, s, &collectives.Options{Algorithm: collectives.AlgoOneShot}); err != nil {
		fmt.Printf("POLL-ISSUE-ERR %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
		return
	}
	fmt.Printf("POLL-ISSUED in %dus\n", time.Since(start).Microseconds())
	err = s.SynchronizeWithTimeout(120 * time.Second)
	fmt.Printf("POLL-RESULT after %v: %v\n", time.Since(start).Round(time.Millisecond), strings.ReplaceAll(fmt.Sprint(err), "\n", " "))
	c.Abort()
	c.Destroy()
}

// TestPeerDiesMidCollective: two ranks as processes over shm; rank 0
// issues a small all-reduce that rank 1 never calls, and rank 1 is killed
// (SIGKILL) while rank 0 waits for it. The call returns at once (its poll is
// bounded), and the stream's wait for the lost peer ends with an error
// naming it well before the execution timeout (600 s here), from the loss
// detection.
func TestPeerDiesMidCollective(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	for _, tr := range crossProcessTransports(t) {
		if tr != hcomm.TransportShm {
			continue
		}
		t.Run(tr, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			procs := launchReady(t, ctx, 2, "polldeath", tr, "HCCL_EXEC_TIMEOUT=600")
			// Rank 1 never calls the all-reduce: rank 0's hello waits
			// for it, first in its poll, then on its stream, when
			// rank 1 is killed.
			is := waitLine(t, procs[0], "POLL-ISSUED", 60*time.Second)
			var us int64
			fmt.Sscanf(is.text, "POLL-ISSUED in %dus", &us)
			if time.Duration(us)*time.Microsecond > time.Second {
				t.Errorf("the all-reduce took %dus to return: it waited for the peer", us)
			}
			time.Sleep(100 * time.Millisecond)
			procs[1].cmd.Process.Signal(syscall.SIGKILL)
			l := waitLine(t, procs[0], "POLL-RESULT", 60*time.Second)
			t.Log(l.text)
			if strings.HasSuffix(l.text, ": <nil>") || !strings.Contains(l.text, "rank 1") {
				t.Fatalf("rank 0's collective with a killed peer: %s; want an error naming rank 1", l.text)
			}
		})
	}
}
