//go:build linux

package tcp

import (
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The socket system calls of the receive engine and of the senders, on
// linux made as raw system calls: none of them blocks (the descriptors are
// non-blocking; a call that would block returns EAGAIN, and a sender then
// waits for room in Go's network poller), so they need not tell Go's
// scheduler that the thread is in a system call. Why it matters: when
// ranks outnumber cores the kernel often takes the core from a thread in
// the middle of one of these calls; Go's monitor thread then finds the
// thread "in a system call" for longer than its 20 µs tick, hands the
// thread's processor to another thread, and the first one, back from the
// call, finds no processor and sleeps — a futex wake and a futex sleep per
// message, and a monitor that stays on its 20 µs tick in every process.
// With 16 processes on 2 cores that cost more than the messages themselves
// (channel/tcp/doc.go has the figures).

// rawWrites: senders write through writeRaw.
const rawWrites = true

// rawSysRead reads what fd holds now into p (len(p) > 0).
func rawSysRead(fd int, p []byte) (int, unix.Errno) {
	n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	return int(n), e
}

// rawSysPeek looks for one byte in fd without taking it.
func rawSysPeek(fd int) unix.Errno {
	var b [1]byte
	_, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), 1, unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
	return e
}

// writeRaw writes s.wq to the socket fd as far as it takes it now, with
// writev: false when the socket is full (RawConn.Write then waits for room
// in the network poller and calls it again), true when everything went out
// or the write failed (s.werr). The caller holds s.wmu.
func (s *sock) writeRaw(fd int) bool {
	for {
		for len(s.wq) > 0 && len(s.wq[0]) == 0 {
			s.wq = s.wq[1:]
		}
		if len(s.wq) == 0 {
			break
		}
		k := 0
		for _, b := range s.wq {
			if k == len(s.iov) {
				break
			}
			if len(b) > 0 {
				s.iov[k].Base = &b[0]
				s.iov[k].SetLen(len(b))
				k++
			}
		}
		r, _, e := unix.RawSyscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&s.iov[0])), uintptr(k))
		if e == unix.EINTR {
			continue
		}
		if e == unix.EAGAIN {
			s.clearIov()
			return false
		}
		if e != 0 {
			s.werr = os.NewSyscallError("writev", e)
			break
		}
		for n := int(r); n > 0; {
			if len(s.wq[0]) <= n {
				n -= len(s.wq[0])
				s.wq = s.wq[1:]
			} else {
				s.wq[0] = s.wq[0][n:]
				n = 0
			}
		}
	}
	s.clearIov()
	return true
}

// clearIov drops the iovecs' pointers, so that they keep no buffer alive.
func (s *sock) clearIov() { s.iov = iovecs{} }
