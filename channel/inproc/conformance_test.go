package inproc

import (
	"testing"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/channel/channeltest"
)

// TestConformance runs the transport suite over one fabric. An inproc
// channel has no connection to end or lose: Close has nothing to tell the
// peer, and the peer-loss case does not apply.
func TestConformance(t *testing.T) {
	channeltest.Run(t, channeltest.Config{
		Dialers: func(channeltest.TB) (channel.Dialer, channel.Dialer) {
			d := NewDialer(NewFabric())
			return d, d
		},
	})
}
