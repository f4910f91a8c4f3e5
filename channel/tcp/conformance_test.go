package tcp

import (
	"fmt"
	"testing"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/channel/channeltest"
)

// TestConformance runs the transport suite over loopback, on one socket and
// on four with small chunks (every large operation split over the sockets),
// and on one socket with polling off (Read and Fence then sleep until the
// background reader brings the answer). A peer is lost by closing its
// sockets under it, without a CLOSE.
func TestConformance(t *testing.T) {
	for _, o := range []Options{{Streams: 1}, {Streams: 4, ChunkSize: 64 << 10}, {Streams: 1, Spin: -1}} {
		t.Run(fmt.Sprintf("streams=%d/spin=%v", o.Streams, o.Spin), func(t *testing.T) {
			channeltest.Run(t, channeltest.Config{
				Dialers: func(t channeltest.TB) (channel.Dialer, channel.Dialer) {
					return conformanceDialer(t, o), conformanceDialer(t, o)
				},
				Closes:  true,
				Goodbye: true,
				Lose: func(_ channeltest.TB, tr channel.Transport) {
					for _, s := range tr.(*conn).socks {
						s.nc.Close()
					}
				},
			})
		})
	}
}

func conformanceDialer(t channeltest.TB, o Options) *Dialer {
	t.Helper()
	o.Addr = "127.0.0.1"
	d, err := NewDialer(o)
	if err != nil {
		t.Fatalf("NewDialer: %v", err)
	}
	return d
}
