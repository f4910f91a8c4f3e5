//go:build !linux

package spin

import "runtime"

// osYield gives the processor to another goroutine: without sched_yield,
// the best this platform's Go offers.
func osYield() { runtime.Gosched() }
