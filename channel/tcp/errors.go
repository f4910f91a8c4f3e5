package tcp

import (
	"errors"
	"fmt"
	"strconv"
)

// Errors of the transport, tested with errors.Is, besides the ones every
// transport shares (channel.ErrClosed, ErrPeerClosed, ErrPeerLost,
// ErrRefused): a connection that broke (reset, EOF without a CLOSE frame,
// no frame within the peer timeout, a stalled send) is channel.ErrPeerLost;
// a failed handshake (wrong secret, unknown channel, a peer that is not an
// hcomm tcp transport) is channel.ErrRefused.
var (
	// ErrProtocol: a frame broke the protocol (bad header, a range outside
	// registered memory, an unknown request); the channel is dead.
	ErrProtocol = errors.New("tcp: protocol violation")
)

// Error is the error every Transport method and Connect return: which rank,
// talking to which peer, doing what, on which range, and why. Err is one of
// the sentinels above or channel's, a *device.Error with code
// device.ErrStreamAbort when a stop channel ended the call, or an underlying
// cause.
type Error struct {
	Op   string // "Write", "Read", "WriteReduce", "NotifyRecord", "Fence", "receive WRITE", "Connect", ...
	Rank int    // this end's rank
	Peer int    // the far end's rank
	Addr uint64 // the remote address involved (0: none)
	Size int64  // the bytes involved (0: none)
	Msg  string // what exactly happened
	Err  error
}

func (e *Error) Error() string {
	return "tcp: rank " + strconv.Itoa(e.Rank) + " channel to rank " + strconv.Itoa(e.Peer) + ": " + e.tail()
}

// tail is the message without the rank prefix; a cause on the same channel
// is told without repeating it.
func (e *Error) tail() string {
	s := e.Op
	if e.Addr != 0 || e.Size != 0 {
		s += fmt.Sprintf(" [%#x, +%d)", e.Addr, e.Size)
	}
	if e.Msg != "" {
		s += ": " + e.Msg
	}
	if c, ok := e.Err.(*Error); ok && c.Rank == e.Rank && c.Peer == e.Peer {
		s += ": " + c.tail()
	} else if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }
