package notify

import (
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The futex calls of shared notifies. They use the shared (not private)
// futex operations: the word lives in a MAP_SHARED mapping, and the kernel
// must find the waiters of another process by the page, not the address.

// Futex operations (linux/futex.h); golang.org/x/sys/unix does not name them.
const (
	futexWaitOp = 0 // FUTEX_WAIT
	futexWakeOp = 1 // FUTEX_WAKE
)

// futexWait sleeps while *w == v, for at most d (forever when d <= 0). It
// returns early on a wake-up, a change of the word, or a signal: the caller
// looks again in every case.
func futexWait(w *uint32, v uint32, d time.Duration) {
	var ts *unix.Timespec
	if d > 0 {
		t := unix.NsecToTimespec(int64(d))
		ts = &t
	}
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWaitOp, uintptr(v),
		uintptr(unsafe.Pointer(ts)), 0, 0)
}

// futexWake wakes every sleeper on w.
func futexWake(w *uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWakeOp, uintptr(1<<31-1), 0, 0, 0)
}
