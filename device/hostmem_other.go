//go:build !linux

package device

import (
	"errors"

	"golang.org/x/sys/unix"
)

// Without memfd, host device memory is an anonymous private mapping: it
// cannot be shared with another process (Share fails), and nothing else
// changes. Its pages are committed at first touch, lazy or not.

func hostAlloc(size int64, _ bool) ([]byte, int, error) {
	mem, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	return mem, -1, err
}

// discard cannot give memory back here: Memset writes the zeros.
func discard(int, int64, int64) bool { return false }

func hostFree(mem []byte, _ int) error { return unix.Munmap(mem) }

func fileIno(int) (uint64, error) {
	return 0, errors.New("device memory has no file without memfd (Linux)")
}

func dupShared(int) (int, error) {
	return -1, errors.New("sharing device memory needs memfd (Linux)")
}
