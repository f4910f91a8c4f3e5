//go:build !linux

package procs

// Affinity returns nil: this system's processor affinity is not read, and
// ranks fall back to their own runtime.NumCPU().
func Affinity() []int { return nil }
