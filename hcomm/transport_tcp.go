package hcomm

import (
	"fmt"
	"os"
	"strconv"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/channel/tcp"
)

// The tcp transport: one Dialer (one listener) per communicator, bound to the
// address of HCOMM_SOCKET_IFNAME's interface when it is set (else to every
// interface, advertising each address), proving the communicator's secret on
// every connection.
func init() {
	dialerMakers[TransportTCP] = func(c *Comm) (channel.Dialer, error) {
		o := tcp.Options{Secret: append([]byte(nil), c.boot.secret[:]...), Logger: c.cfg.logger}
		// HCOMM_TCP_STREAMS: sockets per channel (default 2; the two ends
		// use the smaller of their values), like NCCL_NSOCKS_PERTHREAD.
		if v := os.Getenv("HCOMM_TCP_STREAMS"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 64 {
				return nil, fmt.Errorf("HCOMM_TCP_STREAMS=%q: want an integer in [1, 64]", v)
			}
			o.Streams = n
		}
		if ip := c.boot.iface.IP; ip != nil && c.cfg.SocketIfname != "" {
			o.Addr = ip.String()
		}
		return tcp.NewDialer(o)
	}
}
