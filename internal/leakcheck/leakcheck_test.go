package leakcheck

import (
	"strings"
	"testing"
	"time"
)

type fakeM int

func (f fakeM) Run() int { return int(f) }

// The after functions run whether the tests passed or failed, and the tests'
// code comes back unchanged.
func TestRunCallsAfter(t *testing.T) {
	for _, code := range []int{0, 1} {
		calls := 0
		if got := run(fakeM(code), func() { calls++ }, func() { calls++ }); got != code {
			t.Errorf("run with tests ending %d returned %d", code, got)
		}
		if calls != 2 {
			t.Errorf("tests ending %d: %d of 2 after functions ran", code, calls)
		}
	}
}

// Leaked names a goroutine left running.
func TestLeakedNamesGoroutine(t *testing.T) {
	stop := make(chan struct{})
	go leakyForTest(stop)
	defer close(stop)
	if got := Leaked(50 * time.Millisecond); !strings.Contains(got, "leakyForTest") {
		t.Fatalf("Leaked did not name the running goroutine:\n%s", got)
	}
}

func leakyForTest(stop chan struct{}) { <-stop }
