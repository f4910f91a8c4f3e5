package tcp

import (
	"bytes"
	"encoding/binary"
	"os"
	"regexp"
	"strconv"
	"testing"
)

// The tests of this file tie spec.md to the code.

// TestHandshakeLayout ties the handshake's sizes to spec.md §1.2 and checks
// that a proof puts each field at the offset the spec's field order gives it.
func TestHandshakeLayout(t *testing.T) {
	spec, err := os.ReadFile("spec.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		msg  string
		size int
	}{{"challenge", challengeSize}, {"proof", proofSize}} {
		m := regexp.MustCompile(`\*\*` + c.msg + `\*\*, \S+ → \S+ \((\d+) bytes\)`).FindSubmatch(spec)
		if m == nil {
			t.Errorf("spec.md gives no size for the %s", c.msg)
			continue
		}
		if n, _ := strconv.Atoi(string(m[1])); n != c.size {
			t.Errorf("spec.md says the %s is %d bytes; the code sends %d", c.msg, n, c.size)
		}
	}
	if m := regexp.MustCompile("`0` is followed by\\s+`HMAC-SHA256\\(secret, \"hcomm tcp accept v1\"[^`]*` \\((\\d+)\\)").FindSubmatch(spec); m == nil {
		t.Error("spec.md gives no size for the verdict's MAC")
	} else if n, _ := strconv.Atoi(string(m[1])); 1+n != verdictSize {
		t.Errorf("spec.md says the verdict is 1 + %d bytes; the code sends %d", n, verdictSize)
	}

	// magic (4), version (1), nonce (16), index (2), streams (2), rank (4),
	// Cd (32), MAC (32): the spec's order.
	p := &proof{index: 0x0102, streams: 0x0304, rank: 0x05060708}
	for i := range p.nonce {
		p.nonce[i] = 0xa0 + byte(i)
	}
	for i := range p.challenge {
		p.challenge[i] = 0xc0 + byte(i)
	}
	for i := range p.mac {
		p.mac[i] = 0xe0 - byte(i)
	}
	b := p.marshal()
	if len(b) != proofSize || proofSize != 93 {
		t.Fatalf("proof is %d bytes, proofSize %d; the spec's fields add up to 93", len(b), proofSize)
	}
	field := func(off, n int) []byte { return b[off : off+n] }
	if string(field(0, 4)) != helloMagic || b[4] != protoVersion {
		t.Errorf("proof starts %x, want the magic and version %d", field(0, 5), protoVersion)
	}
	if !bytes.Equal(field(5, 16), p.nonce[:]) {
		t.Errorf("nonce at 5: %x", field(5, 16))
	}
	if got := binary.BigEndian.Uint16(field(21, 2)); got != 0x0102 {
		t.Errorf("socket index at 21: %#x", got)
	}
	if got := binary.BigEndian.Uint16(field(23, 2)); got != 0x0304 {
		t.Errorf("streams at 23: %#x", got)
	}
	if got := binary.BigEndian.Uint32(field(25, 4)); got != 0x05060708 {
		t.Errorf("rank at 25: %#x", got)
	}
	if !bytes.Equal(field(29, 32), p.challenge[:]) {
		t.Errorf("Cd at 29: %x", field(29, 32))
	}
	if !bytes.Equal(field(61, 32), p.mac[:]) {
		t.Errorf("MAC at 61: %x", field(61, 32))
	}
	q, err := parseProof(b)
	if err != nil || *q != *p {
		t.Errorf("parseProof(marshal(p)) = %+v, %v; want p back", q, err)
	}
}

// TestChunkSize checks the chunk size of a split operation against spec.md
// §3: c = min(C, max(⌈n / streams⌉ rounded up to 4 KiB, 256 KiB)).
func TestChunkSize(t *testing.T) {
	const K, M = 1 << 10, 1 << 20
	for _, c := range []struct {
		n, streams, chunk, want int
	}{
		{300 * K, 2, M, 256 * K},          // past 256 KiB: split, chunks of at least 256 KiB
		{600 * K, 2, M, 300 * K},          // one chunk per socket
		{601 * K, 2, M, 304 * K},          // ⌈300.5 KiB⌉ rounded up to 4 KiB
		{4 * M, 2, M, M},                  // no chunk over C
		{600 * K, 1, M, 600 * K},          // one socket, under C: one frame
		{3 * M, 1, M, M},                  // one socket, over C: chunks of C
		{100 * K, 4, 64 * K, 64 * K},      // C under 256 KiB
		{10 * M, 4, 16 * M, 10 * M / 4},   // C over the share
		{1, 4, M, 256 * K},                // tiny: one frame
		{256*K + 1, 4, M, 256 * K},        // just past 256 KiB: two frames
		{64*M + 3, 64, M, M},              // many sockets
		{8*M + 8, 3, 16 * M, 683 * 4 * K}, // ⌈(8 MiB + 8) / 3⌉ = 2796206, rounded up to 4 KiB
	} {
		cn := &conn{chunk: c.chunk, socks: make([]*sock, c.streams)}
		if got := cn.chunkSize(c.n); got != c.want || got%8 != 0 {
			t.Errorf("n %d, %d sockets, C %d: chunk %d, want %d (a multiple of 8)", c.n, c.streams, c.chunk, got, c.want)
		}
	}
}
