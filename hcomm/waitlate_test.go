package hcomm_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/hcomm"
)

// A notify wait that times out returns within a few milliseconds of its
// timeout: describing where the other ranks are reads only what the store
// already holds, and does not wait for a rank that published nothing.
func TestNotifyWaitTimeoutIsPunctual(t *testing.T) {
	p := newPair(t, nil)
	const timeout = 200 * time.Millisecond
	for _, name := range []string{"immediate", "queued"} {
		start := time.Now()
		var err error
		if name == "immediate" {
			err = hcomm.ChannelNotifyWait(nil, p.ch[0], 0, timeout)
		} else {
			if err = hcomm.ChannelNotifyWaitOnThread(p.th[0], p.ch[0], 1, timeout); err == nil {
				err = p.th[0].Stream().Synchronize(context.Background())
			}
		}
		took := time.Since(start)
		if !errors.Is(err, hcomm.ErrTimeout) {
			t.Fatalf("%s: err = %v, want a timeout", name, err)
		}
		if !strings.Contains(err.Error(), "rank 1 reports no wait") {
			t.Errorf("%s: error %q does not say where rank 1 is", name, err)
		}
		// Generous for a loaded machine; the store's blocking read made it 500 ms.
		if took > timeout+80*time.Millisecond {
			t.Errorf("%s: a wait with timeout %v returned after %v", name, timeout, took)
		}
		t.Logf("%s: %v", name, took)
	}
}
