//go:build unix

package launch

import (
	"os/exec"
	"syscall"
)

// setGroup puts the rank in a process group of its own, so that a terminal's
// Ctrl-C reaches it only through the launcher (once), and so that stopping a
// rank also stops what it started (go run's compiled program).
func setGroup(c *exec.Cmd) { c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} }

// signalGroup sends sig to the rank's process group.
func signalGroup(c *exec.Cmd, sig syscall.Signal) {
	if c.Process != nil {
		syscall.Kill(-c.Process.Pid, sig)
	}
}
