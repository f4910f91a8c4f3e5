//go:build linux

package shm

import "errors"

// Errors of the transport, tested with errors.Is, besides the ones every
// transport shares (channel.ErrClosed, ErrPeerClosed, ErrPeerLost,
// ErrRefused): a peer whose process died or whose socket closed without a
// goodbye is channel.ErrPeerLost; a hello, range or descriptor that fails
// the checks, a wrong secret, or a refusal from the peer is
// channel.ErrRefused. Every error names the channel, the ranks and the
// operation besides.
var (
	// ErrOutOfRange: an address range outside the memory the peer shared at
	// connect time; nothing was copied. From ReadPeer: a range that is not
	// mapped in the peer's process (dst may hold what came before the hole).
	ErrOutOfRange = errors.New("shm: range outside the peer's shared memory")
	// ErrOtherHost: the peer is not on this host (its HostID differs), so it
	// cannot be reached through shared memory.
	ErrOtherHost = errors.New("shm: peer is on another host")
	// ErrNoPeerReads: ReadPeer on a pair whose ends could not read each
	// other's memory through the kernel at connect (Transport.ReadsPeer).
	ErrNoPeerReads = errors.New("shm: the kernel does not let this pair read each other's memory")
)
