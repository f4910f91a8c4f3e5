package tcp

import (
	"sync"
	"testing"
)

// logConn is a conn of n sockets with the data log only, for dataVector and
// noteData.
func logConn(n int) *conn {
	c := &conn{}
	c.pcond = sync.NewCond(&c.amu)
	c.drecs, c.dover, c.dsync = make([][]drec, n), make([]drec, n), make([][]uint64, n)
	for i := 0; i < n; i++ {
		c.socks = append(c.socks, &sock{idx: i})
		c.dsync[i] = make([]uint64, n)
	}
	return c
}

// send logs a data frame of n bytes at addr on socket s as dataVector and
// noteData would around its write, and reports whether it carried a vector.
func (c *conn) send(s int, addr uint64, n int) bool {
	sk := c.socks[s]
	vec := c.dataVector(sk, addr, n)
	sk.sent.Add(1)
	c.noteData(sk, sk.sent.Load(), addr, n, vec)
	return vec != nil
}

// The data log orders only what must be ordered: disjoint writes spread over
// the sockets carry no vector (the common path); a write over bytes another
// socket carried does, once; after it, that socket's frames need none for
// those bytes; one socket never needs one; the log stays bounded.
func TestDataOrderLog(t *testing.T) {
	c := logConn(4)
	for i := 0; i < 4; i++ { // one write split over the sockets
		if c.send(i, uint64(i)<<20, 1<<20) {
			t.Fatalf("chunk %d of a write carries a vector", i)
		}
	}
	if c.send(0, 0, 1<<20) {
		t.Error("a write over bytes its own socket carried carries a vector")
	}
	if !c.send(0, 1<<20, 4096) {
		t.Error("a write over bytes socket 1 carried has no vector")
	}
	if c.send(0, 1<<20, 4096) {
		t.Error("a second write over them, after an ordered one on the same socket, carries a vector")
	}
	if c.send(2, 16<<20, 4096) {
		t.Error("a write over bytes nobody carried carries a vector")
	}
	one := logConn(1)
	for i := 0; i < 100; i++ {
		if one.send(0, 0, 64) {
			t.Fatal("a one-socket channel sends a vector")
		}
	}
	// Bounded: many disjoint writes on socket 1 merge into one range, which
	// then orders a write of socket 0 inside it.
	for i := 0; i < 10*maxDrecs; i++ {
		c.send(1, 64<<20+uint64(i)*4096, 4096)
	}
	if len(c.drecs[1]) > maxDrecs {
		t.Errorf("socket 1 logs %d frames, more than %d", len(c.drecs[1]), maxDrecs)
	}
	if !c.send(0, 64<<20+4096, 8) {
		t.Error("a write inside socket 1's merged range has no vector")
	}
}
