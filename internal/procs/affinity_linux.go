package procs

import "golang.org/x/sys/unix"

// Affinity returns the processors this process may run on (its CPU
// affinity, as sched_getaffinity reports it for the calling thread), or
// nil when the kernel does not say.
func Affinity() []int {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil
	}
	var out []int
	for c := 0; c < len(set)*64; c++ {
		if set.IsSet(c) {
			out = append(out, c)
		}
	}
	return out
}
