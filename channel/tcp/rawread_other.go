//go:build !unix

package tcp

import (
	"errors"
	"net"
	"syscall"
)

// Without unix descriptors the receive engine reads through net.Conn,
// blocking, on the socket's background reader; Poll then only looks.

func rawConn(net.Conn) syscall.RawConn { return nil }

func rawRead(int, []byte) (int, error) { return 0, errors.ErrUnsupported }

func rawReadable(int) bool { return true }

// iovecs: no raw writes here.
type iovecs = struct{}

const rawWrites = false

func (s *sock) writeRaw(int) bool {
	s.werr = errors.ErrUnsupported
	return true
}

type riovecs = [3]struct{}

func rawReadv(int, *riovecs, *[3][]byte) (int, error) { return 0, errors.ErrUnsupported }
