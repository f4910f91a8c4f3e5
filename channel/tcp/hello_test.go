package tcp

import (
	"bytes"
	"encoding/binary"
	"os"
	"regexp"
	"strconv"
	"testing"
)

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
		t.Errorf("proof starts %x, want the magic and version 1", field(0, 5))
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
