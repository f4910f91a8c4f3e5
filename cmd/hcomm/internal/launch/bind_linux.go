package launch

import (
	"fmt"
	"os/exec"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/hcomm-dev/hcomm/internal/procs"
)

// DefaultBind is `hcomm run`'s --bind-to default: BindAuto on Linux.
const DefaultBind = BindAuto

// startBound starts c bound to cpus. A new process inherits the CPU
// affinity of the thread that forks it, so a goroutine locked to a thread of
// its own sets that thread's affinity and forks; it never unlocks, so the
// thread — the only one bound — ends with it, and no other goroutine ever
// runs on it.
func startBound(c *exec.Cmd, cpus []int) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		var set unix.CPUSet
		for _, cpu := range cpus {
			set.Set(cpu)
		}
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			done <- fmt.Errorf("binding to processors %s: %w", procs.FormatList(cpus), err)
			return
		}
		done <- c.Start()
	}()
	return <-done
}
