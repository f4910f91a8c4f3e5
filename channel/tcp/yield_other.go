//go:build !linux

package tcp

// osYield is sched_yield where hcomm knows how to call it (linux); elsewhere
// a poll yields to Go's scheduler only.
func osYield() {}
