//go:build linux

package shm

import "errors"

// Errors of the transport, tested with errors.Is. Every error names the
// channel, the ranks and the operation besides.
var (
	// ErrPeerLost: the peer's process died or its end of the socket closed
	// without a goodbye. Local notifies of the channel are broken with it.
	ErrPeerLost = errors.New("shm: peer lost")
	// ErrPeerClosed: the peer closed its end of the channel.
	ErrPeerClosed = errors.New("shm: peer closed the channel")
	// ErrClosed: this end of the channel (or the Dialer) is closed.
	ErrClosed = errors.New("shm: closed")
	// ErrOutOfRange: an address range outside the memory the peer shared at
	// connect time. Nothing was copied.
	ErrOutOfRange = errors.New("shm: range outside the peer's shared memory")
	// ErrOtherHost: the peer is not on this host (its HostID differs), so it
	// cannot be reached through shared memory.
	ErrOtherHost = errors.New("shm: peer is on another host")
	// ErrRefused: the peer sent something this end cannot accept (a bad
	// hello, a range or descriptor that fails the checks, a wrong secret), or
	// refused what this end sent.
	ErrRefused = errors.New("shm: connection refused")
)
