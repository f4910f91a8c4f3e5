package spin

import (
	"sync/atomic"
	"testing"
	"time"
)

// UntilYield sees a condition another goroutine makes true, and gives up
// after its bound without sleeping past it by much.
func TestUntilYield(t *testing.T) {
	var flag atomic.Bool
	go func() {
		time.Sleep(time.Millisecond)
		flag.Store(true)
	}()
	if !UntilYield(10*time.Second, flag.Load) {
		t.Fatal("UntilYield gave up on a condition that became true")
	}
	start := time.Now()
	if UntilYield(200*time.Microsecond, func() bool { return false }) {
		t.Fatal("UntilYield reported a condition that never held")
	}
	if d := time.Since(start); d < 200*time.Microsecond || d > 5*time.Second {
		t.Fatalf("UntilYield(200µs) gave up after %v", d)
	}
	if UntilYield(0, func() bool { return false }) || !UntilYield(0, func() bool { return true }) {
		t.Fatal("UntilYield(0) must poll once")
	}
}
