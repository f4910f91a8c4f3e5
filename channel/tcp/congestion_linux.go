//go:build linux

package tcp

import (
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// setCongestion makes fd's congestion control the algorithm name
// (TCP_CONGESTION).
func setCongestion(fd int, name string) error {
	return unix.SetsockoptString(fd, unix.IPPROTO_TCP, unix.TCP_CONGESTION, name)
}

// CheckCongestion says whether this process may give a socket the
// congestion control algorithm name (Options.Congestion): nil if it may,
// else why not, with what the host allows. It tries on a socket of its own.
func CheckCongestion(name string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := setCongestion(fd, name); err != nil {
		allowed, _ := os.ReadFile("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
		if a := strings.TrimSpace(string(allowed)); a != "" {
			return fmt.Errorf("%v (net.ipv4.tcp_allowed_congestion_control: %s)", err, a)
		}
		return err
	}
	return nil
}
