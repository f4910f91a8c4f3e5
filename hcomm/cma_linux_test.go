//go:build linux

package hcomm_test

import (
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// shmReadsHere reports whether this process may read its own memory
// through process_vm_readv — not refused by a seccomp profile — so that two
// shm ranks of this process must find that their pair reads lent memory.
func shmReadsHere() bool {
	src, dst := []byte("hcomm"), make([]byte, 5)
	n, err := unix.ProcessVMReadv(os.Getpid(), []unix.Iovec{{Base: &dst[0], Len: 5}},
		[]unix.RemoteIovec{{Base: uintptr(unsafe.Pointer(&src[0])), Len: 5}}, 0)
	return err == nil && n == 5 && string(dst) == "hcomm"
}
