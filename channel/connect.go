package channel

import (
	"context"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/notify"
)

// Local is what a rank brings to a channel it acquires: its identity, its
// device, its registered memory (HCCL buffer first) and the number of notifies
// its end of the channel needs.
type Local struct {
	Comm      string // communicator name, for errors
	Rank      int
	Peer      int
	Device    *device.Device
	Registry  *Registry // live registrations; the far end of a transport checks against it
	HCCLBuf   Mem
	NotifyNum int
	// Name names the channel in errors and notify names
	// ("comm X rank 0 channel to rank 1 (HCCS)").
	Name string
}

// Exchange swaps one message with the peer of the channel being set up: it
// sends mine and returns the peer's message. Both ends call it the same
// number of times, in the same order (it is a rendezvous: the bootstrap
// carries it, keyed by the channel). A transport uses it to trade addresses,
// secrets and memory descriptions before it opens its own connection.
type Exchange func(ctx context.Context, mine []byte) (theirs []byte, err error)

// Conn is a connected end of a channel, as a Dialer returns it.
type Conn struct {
	Transport Transport
	// Notifies are this end's notifies (NotifyNum of them): the peer's
	// NotifyRecord sets them, local waits wait on them. A transport that keeps
	// notifies in shared memory makes them itself.
	Notifies []*notify.Notify
	// PeerNotifyNum is the number of notifies at the far end.
	PeerNotifyNum int
	// RemoteMems is the peer's registered memory at connect time, its HCCL
	// buffer first, in the peer's address space (what write/read dst/src
	// addresses refer to).
	RemoteMems []Mem
}

// Dialer makes one kind of transport (inproc, shm, tcp). hcomm picks a Dialer
// per channel from the protocol and where the peer is, then calls Connect on
// both ends; each end's Connect runs Exchange with the other's.
type Dialer interface {
	// Name is the transport's name ("inproc", "shm", "tcp").
	Name() string
	// Connect sets up this end of the channel described by local. It returns
	// once both ends are connected, or with an error when ctx ends first
	// (HCCL_CONNECT_TIMEOUT) or the peer refuses.
	Connect(ctx context.Context, local *Local, ex Exchange) (*Conn, error)
	// Close releases what the Dialer holds for all its channels (listeners).
	// Idempotent; channels it made are closed separately.
	Close() error
}
