package hcomm

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/channel/tcp"
)

// The tcp transport: one Dialer (one listener) per communicator, bound to the
// address of HCOMM_SOCKET_IFNAME's interface when it is set (else to every
// interface, advertising each address), proving the communicator's secret on
// every connection.
func newTCPDialer(c *Comm) (channel.Dialer, error) {
	o := tcp.Options{Secret: append([]byte(nil), c.boot.secret[:]...), Logger: c.cfg.logger, Spin: c.cfg.TCPSpin}
	// HCOMM_TCP_STREAMS: sockets per channel (the two ends use the
	// smaller of their values), like NCCL_NSOCKS_PERTHREAD. Default 2,
	// or 1 in a process that runs Go on one processor (GOMAXPROCS=1, as
	// hcomm run gives each rank when ranks fill the host): a second
	// socket's sender and reader then only take turns with the first,
	// and cost a goroutine hand-off per piece (BENCHMARKS.md: 2
	// processes on 2 cores, 64 MiB all-reduce, 1.83 GB/s with one socket
	// against 1.50 with two, medians of ten).
	o.Streams = defaultStreams(runtime.GOMAXPROCS(0))
	o.Yield, o.Tight = tcpYield(c.procsHere(), c.HostProcessors())
	o.Nap = c.naps() // a one-sided Read's answer and a Fence's naps as the notify waits do (wait.go)
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

// defaultStreams is the sockets per tcp channel when HCOMM_TCP_STREAMS is
// unset, for a process running Go on procs processors (0: the tcp package's
// default).
func defaultStreams(procs int) int {
	if procs == 1 {
		return 1
	}
	return 0
}

// tcpTight is how long a tcp poll looks for a message's first bytes
// without yielding to the host's other threads when the host has a
// processor for each of the communicator's processes (tcp.Options.Tight):
// about two of a small message's round trips on the VM hcomm is measured
// on. A waiter whose peer is later, or whose message has begun to arrive,
// yields as before, so a host whose other jobs load its processors still
// gives each rank its turn (2 processes on 2 cores, each core also running
// a busy loop, 16-byte all-reduce: 63 µs median of four launches with it,
// 95 without; a noisy measure, 33–139 µs a launch).
const tcpTight = 20 * time.Microsecond

// tcpYield says how a tcp poll on a host with cpus processors and here of
// the communicator's processes yields: to the host's other threads when
// the processes are as many as the processors or more, and, when they are
// exactly as many (a processor each), only after tcpTight.
func tcpYield(here, cpus int) (yield bool, tight time.Duration) {
	if here == cpus {
		return true, tcpTight
	}
	return here > cpus, 0
}

// procsHere counts the processes that hold ranks of the communicator on
// this host (this one included): as many of them as processors or more,
// and a tcp waiter that polls yields its processor to the host's other
// threads between looks (tcp.Options.Yield). Measured with 2 processes on
// 2 cores under load, 16-byte all-reduce: 107–154 µs yielding, 212–555 µs
// not (channel/tcp's documentation has the figures).
func (c *Comm) procsHere() int {
	me := c.boot.peers[c.rank]
	seen := map[string]bool{}
	for _, p := range c.boot.peers {
		if p.Host == me.Host {
			seen[p.Proc] = true
		}
	}
	return len(seen)
}
