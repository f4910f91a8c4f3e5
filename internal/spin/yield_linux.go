package spin

import "golang.org/x/sys/unix"

// osYield gives the core to another thread of the host, if one waits for it.
func osYield() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
