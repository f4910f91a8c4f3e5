// Package leakcheck fails a test binary whose tests leave goroutines behind.
//
// Use it from TestMain:
//
//	func TestMain(m *testing.M) { leakcheck.Main(m) }
package leakcheck

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Main runs the tests, then waits up to five seconds for the goroutines the
// tests started to end, and fails the binary listing those that did not. The
// after functions run last, whatever the outcome: a test binary removes there
// what it made for all its tests (built programs, temporary directories).
func Main(m *testing.M, after ...func()) {
	os.Exit(run(m, after...))
}

// run is Main without the exit.
func run(m interface{ Run() int }, after ...func()) int {
	defer func() {
		for _, f := range after {
			f()
		}
	}()
	code := m.Run()
	if code == 0 {
		if leaked := Leaked(5 * time.Second); leaked != "" {
			fmt.Fprintf(os.Stderr, "leakcheck: goroutines left after the tests:\n%s\n", leaked)
			code = 1
		}
	}
	return code
}

// Leaked waits up to d for the goroutines outside the testing framework and the
// runtime to end, and returns the stacks of those still running ("" if none).
func Leaked(d time.Duration) string {
	deadline := time.Now().Add(d)
	for {
		left := interesting()
		if len(left) == 0 {
			return ""
		}
		if time.Now().After(deadline) {
			return strings.Join(left, "\n\n")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func interesting() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		switch {
		case strings.Contains(g, "leakcheck.interesting"),
			strings.Contains(g, "testing.(*M).Run"),
			strings.Contains(g, "testing.tRunner"),
			strings.Contains(g, "testing.runTests"),
			strings.Contains(g, "runtime.goexit") && strings.Contains(g, "created by runtime"),
			strings.Contains(g, "signal.signal_recv"),
			strings.Contains(g, "os/signal.loop"),
			strings.Contains(g, "runtime.ensureSigM"),
			strings.Contains(g, "testing.(*F)"),
			strings.Contains(g, "main.main()"),
			strings.TrimSpace(g) == "":
			continue
		}
		out = append(out, g)
	}
	return out
}
