// Package procs decides how many processors (GOMAXPROCS) a Go process gets
// when it is one of several ranks on a host — for `hcomm run`, which sets
// the variable for the ranks it starts, and for hcomm.InitFromEnv under the
// other launchers (mpirun, srun, torchrun), which sets it in the rank itself.
//
// Why: a Go process runs as many threads as it has processors; n ranks on the
// same processors wake and preempt each other, and small collectives, which
// hand off between ranks every few microseconds, run several times slower
// when ranks outnumber processors. mpirun binds ranks to cores for the same
// reason.
package procs

import (
	"os"
	"runtime"
	"strconv"
	"strings"
)

// PerRank returns the GOMAXPROCS for each of ranks processes that share cpus
// processors: cpus/ranks, at least 1. ok is false — leave GOMAXPROCS alone —
// when getenv sets GOMAXPROCS (the user's choice wins), or for a single rank.
func PerRank(getenv func(string) string, ranks, cpus int) (n int, ok bool) {
	if getenv("GOMAXPROCS") != "" || ranks <= 1 {
		return 0, false
	}
	return max(1, cpus/ranks), true
}

// Shared returns how many processors the ranks of this host share, as one
// rank started by a launcher sees it: runtime.NumCPU(), which follows this
// process's CPU affinity — or 0 when the launcher bound this process to fewer
// processors than the host has: it shared them out itself (mpirun
// --bind-to core, srun --cpu-bind), and the Go runtime already sizes itself
// to the binding.
func Shared() int {
	n := runtime.NumCPU()
	if h := hostCPUs(); h > 0 && n < h {
		return 0
	}
	return n
}

// hostCPUs counts the host's online processors (/sys/devices/system/cpu/online,
// "0-7" or "0-3,8-11"); 0 when unknown.
func hostCPUs() int {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return 0
	}
	return countList(strings.TrimSpace(string(b)))
}

// countList counts the members of a kernel CPU list ("0-3,8,10-11" is 7);
// 0 when malformed.
func countList(s string) int {
	n := 0
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return 0
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return 0
			}
		}
		n += b - a + 1
	}
	return n
}
