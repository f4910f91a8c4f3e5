package inproc

import (
	"testing"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/channel/channeltest"
)

// TestConformance runs the transport suite over one fabric. Close ends
// both ends' calls and waits (the peer sees ErrPeerClosed); an inproc
// channel has no connection to lose, so the peer-loss case does not apply.
func TestConformance(t *testing.T) {
	channeltest.Run(t, channeltest.Config{
		Dialers: func(channeltest.TB) (channel.Dialer, channel.Dialer) {
			d := NewDialer(NewFabric())
			return d, d
		},
		Closes:  true,
		Goodbye: true,
	})
}
