//go:build linux

package shm

import (
	"testing"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/channel/channeltest"
)

// TestConformance runs the transport suite with both ends in this process
// (each its own device context; the memory is still shared through memory
// files and mapped a second time). A peer is lost by closing its socket
// under it, without a goodbye, as its process's death would.
func TestConformance(t *testing.T) {
	channeltest.Run(t, channeltest.Config{
		Dialers: func(t channeltest.TB) (channel.Dialer, channel.Dialer) {
			return conformanceDialer(t), conformanceDialer(t)
		},
		Closes:  true,
		Goodbye: true,
		Lose: func(_ channeltest.TB, tr channel.Transport) {
			tr.(*Transport).conn.Close()
		},
	})
}

func conformanceDialer(t channeltest.TB) *Dialer {
	t.Helper()
	d, err := NewDialer(Options{})
	if err != nil {
		t.Fatalf("NewDialer: %v", err)
	}
	return d
}
