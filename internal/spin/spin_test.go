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

// UntilYieldN polls tight times in a row before its first yield, then
// looks at the clock every 8th yielding poll: with a bound already past,
// a condition that never holds is polled 1 + tight + 8 times, whatever
// tight is (UntilYield's is TightPolls).
func TestUntilYieldNPollsTightFirst(t *testing.T) {
	for _, tight := range []int{0, 32, TightPolls} {
		calls := 0
		if UntilYieldN(time.Nanosecond, tight, func() bool { calls++; return false }) {
			t.Fatal("UntilYieldN reported a condition that never held")
		}
		if want := 1 + tight + 8; calls != want {
			t.Errorf("UntilYieldN(tight %d) polled %d times, want %d", tight, calls, want)
		}
	}
	calls := 0
	UntilYield(time.Nanosecond, func() bool { calls++; return false })
	if want := 1 + TightPolls + 8; calls != want {
		t.Errorf("UntilYield polled %d times, want %d", calls, want)
	}
}
