package bootstrap

import (
	"errors"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// FreePort returns a TCP port on host that was free a moment ago, for a
// store that another process will start (a launcher's MASTER_PORT).
//
// Between this call and that process's bind the port is nobody's, and a
// port the kernel handed out for "host:0" lies in its ephemeral range, the
// range every connect() takes its local port from: on a busy host a
// connection can take it in that gap, and the store's bind then fails with
// "address in use". So the port is drawn at random from outside that range
// (below it, else above it), where only explicit binds go, and checked by
// binding it. With no room outside the range, it is the kernel's choice.
func FreePort(host string) (int, error) {
	lo, hi := ephemeralRange()
	var spans [][2]int // [first, last] candidates
	if lo-1 >= 10000 {
		spans = append(spans, [2]int{max(10000, lo/2), lo - 1})
	}
	if hi+1 <= 65535 {
		spans = append(spans, [2]int{hi + 1, 65535})
	}
	var firstErr error
	for i := 0; i < 64 && len(spans) > 0; i++ {
		s := spans[rand.IntN(len(spans))]
		p := s[0] + rand.IntN(s[1]-s[0]+1)
		l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p)))
		if err == nil {
			l.Close()
			return p, nil
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, errors.Join(err, firstErr)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ephemeralRange is the kernel's range of local ports for connect() and
// bind(":0") (Linux's net.ipv4.ip_local_port_range; its default elsewhere).
func ephemeralRange() (lo, hi int) {
	lo, hi = 32768, 60999
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return lo, hi
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return lo, hi
	}
	a, err1 := strconv.Atoi(f[0])
	z, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || a < 1 || z > 65535 || a > z {
		return lo, hi
	}
	return a, z
}
