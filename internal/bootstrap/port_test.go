package bootstrap

import (
	"net"
	"strconv"
	"testing"
)

// FreePort's ports lie outside the kernel's ephemeral range (where a
// connect() could take them before the store binds) and can be bound.
func TestFreePortOutsideEphemeralRange(t *testing.T) {
	lo, hi := ephemeralRange()
	if lo-1 < 10000 && hi+1 > 65535 {
		t.Skipf("the ephemeral range %d-%d leaves no room", lo, hi)
	}
	seen := map[int]bool{}
	for range 20 {
		p, err := FreePort("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		if p >= lo && p <= hi {
			t.Fatalf("FreePort = %d, inside the ephemeral range %d-%d", p, lo, hi)
		}
		seen[p] = true
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("FreePort = %d, which cannot be bound: %v", p, err)
		}
		l.Close()
	}
	if len(seen) < 10 {
		t.Errorf("20 calls gave only %d ports: %v", len(seen), seen)
	}
}
