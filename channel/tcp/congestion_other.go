//go:build !linux

package tcp

import (
	"errors"
	"fmt"
)

// setCongestion: only linux lets a socket choose its congestion control.
func setCongestion(fd int, name string) error {
	return fmt.Errorf("choosing a socket's congestion control: %w", errors.ErrUnsupported)
}

// CheckCongestion says whether this process may give a socket the
// congestion control algorithm name (Options.Congestion): never, here.
func CheckCongestion(name string) error { return setCongestion(-1, name) }
