//go:build !linux

package notify

import (
	"sync/atomic"
	"time"
)

// Without futexes a shared wait polls the word: it sleeps in short steps
// while the word still holds v.

const pollStep = 200 * time.Microsecond

func futexWait(w *uint32, v uint32, d time.Duration) {
	step := pollStep
	if d > 0 && d < step {
		step = d
	}
	if atomic.LoadUint32(w) == v {
		time.Sleep(step)
	}
}

func futexWake(*uint32) {}
