//go:build !linux

package shm

import (
	"context"
	"errors"

	"github.com/hcomm-dev/hcomm/channel"
)

// ErrUnsupported: the transport needs Linux (memfd, abstract unix sockets,
// futexes).
var ErrUnsupported = errors.New("shm: the shared-memory transport needs Linux")

// HostID returns "": on this system no peer is reachable through shared
// memory.
func HostID() string { return "" }

// Options configure a Dialer (see the Linux build).
type Options struct {
	Populate    bool
	NoPeerReads bool
}

// Dialer is the shared-memory Dialer; on this system NewDialer fails.
type Dialer struct{}

// NewDialer returns ErrUnsupported.
func NewDialer(Options) (*Dialer, error) { return nil, ErrUnsupported }

// Name returns "shm".
func (*Dialer) Name() string { return "shm" }

// Connect returns ErrUnsupported.
func (*Dialer) Connect(context.Context, *channel.Local, channel.Exchange) (*channel.Conn, error) {
	return nil, ErrUnsupported
}

// Close does nothing.
func (*Dialer) Close() error { return nil }
