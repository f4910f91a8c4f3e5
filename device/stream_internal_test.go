package device

import (
	"testing"
	"time"
)

// A stream its caller keeps busy never empties its queue; its slice must
// still stay about MaxPending long (the consumed front is reused), not grow by
// every task it ever ran.
func TestBusyStreamQueueStaysBounded(t *testing.T) {
	d, err := Open(0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	s, err := d.CreateStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	const n = 20 * MaxPending
	for i := 0; i < n; i++ {
		if err := s.Launch("busy", func(<-chan struct{}) error {
			for t0 := time.Now(); time.Since(t0) < time.Microsecond; {
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	s.mu.Lock()
	c := cap(s.q)
	s.mu.Unlock()
	if err := s.SynchronizeWithTimeout(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if c > 4*MaxPending {
		t.Fatalf("after %d tasks the queue's slice holds %d entries; a busy stream should reuse about %d", n, c, MaxPending)
	}
}
