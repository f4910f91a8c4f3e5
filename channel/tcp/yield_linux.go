package tcp

import "golang.org/x/sys/unix"

// osYield gives the processor to another runnable thread of any process
// (sched_yield). A raw system call: it never blocks, so the Go scheduler
// need not hand this thread's P to another while it runs.
func osYield() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
