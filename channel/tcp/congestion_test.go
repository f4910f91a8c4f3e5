//go:build linux

package tcp

import (
	"net"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// sockCongestion reads the congestion control of a channel's socket.
func sockCongestion(t *testing.T, c net.Conn) string {
	t.Helper()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var name string
	var gerr error
	rc.Control(func(fd uintptr) {
		name, gerr = unix.GetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION)
	})
	if gerr != nil {
		t.Fatal(gerr)
	}
	return strings.TrimRight(name, "\x00")
}

// TestCongestionIsSet: a channel whose peer is on this host gives its
// sockets LocalCongestion, and Congestion does not reach them; reno, which
// every kernel has and lets every process choose, is the algorithm.
func TestCongestionIsSet(t *testing.T) {
	host := sockCongestion(t, connectPair(t, Options{}, Options{}, 4096, 1).t0().socks[0].nc)
	other := "cubic"
	if host == "cubic" {
		other = "reno"
	}
	if CheckCongestion(other) != nil {
		other = "reno"
	}
	if other == host {
		t.Skipf("the host's default is %s and no other algorithm may be chosen here", host)
	}
	p := connectPair(t, Options{LocalCongestion: other, Congestion: host}, Options{LocalCongestion: other}, 4096, 1)
	for i, c := range []*conn{p.t0(), p.t1()} {
		for _, s := range c.socks {
			if got := sockCongestion(t, s.nc); got != other {
				t.Errorf("rank %d's socket %d runs %s, want LocalCongestion's %s", i, s.idx, got, other)
			}
		}
	}
	// Congestion is for other hosts: these sockets keep the host's.
	p = connectPair(t, Options{Congestion: other}, Options{Congestion: other}, 4096, 1)
	for i, c := range []*conn{p.t0(), p.t1()} {
		for _, s := range c.socks {
			if got := sockCongestion(t, s.nc); got != host {
				t.Errorf("with only Congestion set, rank %d's local socket %d runs %s, want the host's %s", i, s.idx, got, host)
			}
		}
	}
}

// TestCongestionRefused: a name the kernel lacks fails NewDialer, naming it.
func TestCongestionRefused(t *testing.T) {
	for _, o := range []Options{{Congestion: "no_such_cc"}, {LocalCongestion: "no_such_cc"}} {
		d, err := NewDialer(o)
		if err == nil {
			d.Close()
			t.Fatalf("NewDialer(%+v) succeeded", o)
		}
		if !strings.Contains(err.Error(), `"no_such_cc"`) {
			t.Fatalf("NewDialer(%+v): %v, which does not name the algorithm", o, err)
		}
	}
	if err := CheckCongestion("reno"); err != nil {
		t.Fatalf("CheckCongestion(reno): %v", err)
	}
}

// addrConn is a net.Conn that only has addresses.
type addrConn struct {
	net.Conn
	l, r net.Addr
}

func (c addrConn) LocalAddr() net.Addr  { return c.l }
func (c addrConn) RemoteAddr() net.Addr { return c.r }

func TestSameHost(t *testing.T) {
	a := func(ip string) net.Addr { return &net.TCPAddr{IP: net.ParseIP(ip), Port: 1} }
	for _, c := range []struct {
		l, r string
		want bool
	}{
		{"127.0.0.1", "127.0.0.1", true},
		{"::1", "::1", true},
		{"10.0.0.5", "10.0.0.5", true},
		{"10.0.0.5", "10.0.0.6", false},
		{"fd00::1", "fd00::2", false},
	} {
		if got := sameHost(addrConn{l: a(c.l), r: a(c.r)}); got != c.want {
			t.Errorf("sameHost(%s → %s) = %v, want %v", c.l, c.r, got, c.want)
		}
	}
}
