//go:build !linux

package spin

import "runtime"

// Yield gives the processor to another goroutine: without sched_yield, the
// best this platform's Go offers (the linux Yield gives it to any thread of
// the host). Safe for concurrent use.
func Yield() { runtime.Gosched() }
