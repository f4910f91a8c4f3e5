package bench

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/hcomm"
)

// A flagged wait whose words never come ends at the execution timeout, as
// a notify wait does, and at once when stop closes.
func TestLLWaitEnds(t *testing.T) {
	comms, err := hcomm.InitAll(2, &hcomm.Config{BufferSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	chs := make([]*hcomm.Channel, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			descs := hcomm.ChannelDescInit(1)
			descs[0].RemoteRank, descs[0].NotifyNum, descs[0].Tag = 1-r, 2, "llwait"
			var got []*hcomm.Channel
			got, errs[r] = c.ChannelAcquire(hcomm.EngineCPUTS, descs)
			if errs[r] == nil {
				chs[r] = got[0]
			}
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	never := func() bool { return false }
	start := time.Now()
	err = llWait(nil, chs[0], 50*time.Millisecond, true, never)
	if err == nil || !strings.Contains(err.Error(), "execution timeout") || time.Since(start) > 5*time.Second {
		t.Fatalf("llWait with words that never come: %v after %v; want the execution timeout", err, time.Since(start))
	}
	stop := make(chan struct{})
	close(stop)
	if err := llWait(stop, chs[0], -1, true, never); err == nil || !strings.Contains(err.Error(), "stopped") {
		t.Fatalf("llWait after stop: %v", err)
	}
}
