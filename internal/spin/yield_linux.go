package spin

import "golang.org/x/sys/unix"

// Yield gives the processor to another runnable thread of any process on
// the host (sched_yield), if one waits for it; otherwise it returns at once.
// A poller of a peer in another process calls it between looks when
// processes may outnumber cores: the peer may be waiting for this very core.
// A raw system call: sched_yield never blocks, so the Go scheduler need not
// hand this thread's P to another while it runs. Safe for concurrent use.
//
// Where hcomm does not know how to call sched_yield (every platform but
// linux), Yield is runtime.Gosched: it yields to this process's goroutines
// only.
func Yield() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
