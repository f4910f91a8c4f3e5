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
	o.Congestion, o.LocalCongestion = tcpCongestion(c.cfg.TCPCongestion, c.Size(), tcp.CheckCongestion)
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

// tcpCongestion gives the congestion control of the sockets to other hosts
// and of those to this host (tcp.Options.Congestion, LocalCongestion) for
// Config.TCPCongestion v in a communicator of n ranks, check saying whether
// this process may choose an algorithm: a name goes to both; "system" to
// neither; auto gives a 2-rank communicator's local sockets
// tcpLocalCongestion where check allows it.
func tcpCongestion(v string, n int, check func(string) error) (remote, local string) {
	switch v {
	case "system":
		return "", ""
	case "", "auto":
		if n == 2 && check(tcpLocalCongestion) == nil {
			return "", tcpLocalCongestion
		}
		return "", ""
	}
	return v, v
}

// tcpLocalCongestion is the congestion control hcomm chooses for a 2-rank
// communicator's sockets to this host. The host this project is measured
// on defaults to bbr, which paces: it releases a socket's segments on a
// timer, at the rate it estimates for the link, and over loopback that
// estimate is made anew for each connection and lands high or low launch
// by launch. cubic sends as fast as the receiver takes. 2 processes on 2
// cores, 1 MiB broadcast over tcp, eight launches interleaved with Open
// MPI's (stop 51, µs, medians): bbr 135.4 (114–170 a launch) in 256 KiB
// pieces, 177.9 (124–209) in 512 KiB; cubic 113.2 (111–117) in 256 KiB,
// 104.5 (102–109) in 512 KiB, reno 105.0; Open MPI 104.9 (and the same
// under cubic, stop 50). The other 2-process rows at 64 KiB, 1 MiB and 64
// MiB measured the same under either in 256 KiB pieces; with the two
// processes on one core, cubic in 512 KiB pieces took 152 µs, bbr 179 in
// 256 KiB and 211 in 512. Those pieces are collectives' netPiece2. reno
// measured as cubic (1 MiB, four launches: broadcast 101.8 against 102.2,
// all-reduce 166.0 against 166.7). 4 processes on 2 cores are another
// matter: at 1 MiB, bbr against cubic, medians of five, all-to-all 346
// against 468 µs, all-gather 342 against 467, all-reduce 766 against 909,
// broadcast 385 against 408, reduce-scatter 421 against 391. That loss is
// cubic's HyStart, which ends slow start when round trips grow, as they
// do on a crowded host's loopback: with it off (the tcp_cubic module's
// hystart=0, for the test) the all-gather took 293 µs against bbr's 278.
// reno, which has none, measured level with bbr there (five launches: 64
// KiB rows 1–2 % faster, 1 MiB all-gather and all-to-all 5 and 3 % slower,
// the rest level), so larger communicators keep the host's choice.
const tcpLocalCongestion = "cubic"

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
