//go:build unix

package tcp

import (
	"net"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// rawConn returns the descriptor access of a socket the receive engine reads
// without Go's network poller (nil: it reads through nc, blocking).
func rawConn(nc net.Conn) syscall.RawConn {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// rawRead reads what the socket fd holds now, without waiting: the
// descriptor is non-blocking (Go's net package makes it so), and no bytes
// is errWouldBlock.
func rawRead(fd int, p []byte) (int, error) {
	for {
		n, e := rawSysRead(fd, p)
		switch e {
		case 0:
			return n, nil
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return 0, errWouldBlock
		}
		return 0, os.NewSyscallError("read", e)
	}
}

// rawReadable reports whether a read of the socket fd would not block now:
// bytes are there, or its end, or an error (a one-byte peek that leaves the
// byte in the socket).
func rawReadable(fd int) bool {
	for {
		e := rawSysPeek(fd)
		if e == unix.EINTR {
			continue
		}
		return e != unix.EAGAIN
	}
}

// iovecs is a sender's vector of buffers for writev (rawsys_linux.go).
type iovecs = [maxParts + 4]unix.Iovec

// riovecs is the receive engine's vector of buffers for readv (rawReadv).
type riovecs = [3]unix.Iovec

// rawReadv reads what the socket fd holds now into the non-empty buffers of
// bufs in turn, as rawRead does into one.
func rawReadv(fd int, iov *riovecs, bufs *[3][]byte) (int, error) {
	k := 0
	for _, b := range bufs {
		if len(b) > 0 {
			iov[k].Base = &b[0]
			iov[k].SetLen(len(b))
			k++
		}
	}
	defer func() { *iov = riovecs{} }()
	for {
		n, _, e := unix.RawSyscall(unix.SYS_READV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(k))
		switch e {
		case 0:
			return int(n), nil
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return 0, errWouldBlock
		}
		return 0, os.NewSyscallError("readv", e)
	}
}
