//go:build unix && !linux

package tcp

import (
	"errors"

	"golang.org/x/sys/unix"
)

// Elsewhere than linux the engine's reads go through x/sys/unix's wrappers
// and writes through the net package (rawsys_linux.go says why linux makes
// them raw system calls).

const rawWrites = false

func rawSysRead(fd int, p []byte) (int, unix.Errno) {
	n, err := unix.Read(fd, p)
	return n, errnoOf(err)
}

func rawSysPeek(fd int) unix.Errno {
	var b [1]byte
	_, _, err := unix.Recvfrom(fd, b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
	return errnoOf(err)
}

// writeRaw is not called here (rawWrites is false).
func (s *sock) writeRaw(int) bool {
	s.werr = errors.ErrUnsupported
	return true
}

func errnoOf(err error) unix.Errno {
	if err == nil {
		return 0
	}
	if e, ok := err.(unix.Errno); ok {
		return e
	}
	return unix.EIO
}
