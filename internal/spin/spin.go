// Package spin holds the wait policy every hand-off in hcomm uses: spin briefly
// (yielding the processor between checks) and only then sleep.
//
// Why: waking a sleeping thread on another core costs 30–40 µs on the small
// virtual machines hcomm is developed on, while a spin that sees the condition
// costs well under a microsecond. Spinning forever would starve the other ranks
// when 4–8 of them share two cores, so every spin is bounded and yields with
// runtime.Gosched between checks.
package spin

import (
	"runtime"
	"time"
)

// Default is how long a hand-off spins before it sleeps.
const Default = 50 * time.Microsecond

// Until polls cond, yielding between polls, for at most d. It reports whether
// cond became true. It never sleeps.
func Until(d time.Duration, cond func() bool) bool {
	if cond() {
		return true
	}
	if d <= 0 {
		return false
	}
	start := Mono()
	for i := 0; ; i++ {
		runtime.Gosched()
		if cond() {
			return true
		}
		// Reading the clock costs more than a poll; look at it every few polls.
		if i&7 == 7 && Mono()-start >= d {
			return false
		}
	}
}

// TightPolls is how many times UntilYield polls before its first yield: a
// peer on another core answers within a fraction of a microsecond, and a
// yield costs a system call (0.3 µs on the machines hcomm is measured on)
// even when nothing else wants the core. The shared notify's wait polls this
// way: the 8-byte all-reduce of 2 processes on 2 cores went from 0.85 to
// 0.6 µs when it stopped yielding on the first polls.
const TightPolls = 256

// UntilYield is Until for a condition another process makes true (a peer
// over shared memory): it polls TightPolls times in a row, then yields the
// core to other processes (sched_yield) between polls — the peer may be
// waiting for this very core when processes outnumber cores — and to this
// process's goroutines only every 64th poll, for at most d. It never
// sleeps.
func UntilYield(d time.Duration, cond func() bool) bool {
	return UntilYieldN(d, TightPolls, cond)
}

// UntilYieldN is UntilYield with tight polls in a row before the first
// yield instead of TightPolls: fewer where the peer is likely not running
// (a host whose ranks outnumber its cores).
func UntilYieldN(d time.Duration, tight int, cond func() bool) bool {
	if cond() {
		return true
	}
	if d <= 0 {
		return false
	}
	for i := 0; i < tight; i++ {
		if cond() {
			return true
		}
	}
	start := Mono()
	for i := 1; ; i++ {
		if i&63 == 0 {
			runtime.Gosched()
		}
		Yield()
		if cond() {
			return true
		}
		if i&7 == 0 && Mono()-start >= d {
			return false
		}
	}
}

// monoBase anchors Mono.
var monoBase = time.Now()

// Mono reads the monotonic clock alone: a span between two readings is a
// duration, as between two time.Now's, but each costs one read of the clock
// where time.Now makes two (it reads the wall clock too). For the loops that
// read it at every look.
func Mono() time.Duration { return time.Since(monoBase) }
