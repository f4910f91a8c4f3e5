package tcp

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
)

// This file holds the two setup messages: the hello each end sends through
// channel.Exchange, and the per-socket handshake that proves the secret.

const (
	helloMagic   = "HCTP"
	maxAddrs     = 64
	maxAddrLen   = 256
	maxMems      = 4096
	maxTagLen    = 256
	nonceLen     = 16
	challengeLen = 32
	macLen       = sha256.Size
)

// hello is what one end of a channel tells the other through Exchange.
type hello struct {
	rank      int
	streams   int
	nonce     [nonceLen]byte // names the channel at the accepting end
	notifyNum int
	addrs     []string // where the sender's listener can be reached
	mems      []channel.Mem
}

func (m *hello) marshal() []byte {
	b := make([]byte, 0, 64+32*len(m.mems))
	b = append(b, helloMagic...)
	b = append(b, protoVersion, 0)
	b = binary.BigEndian.AppendUint16(b, uint16(m.streams))
	b = binary.BigEndian.AppendUint32(b, uint32(m.rank))
	b = append(b, m.nonce[:]...)
	b = binary.BigEndian.AppendUint32(b, uint32(m.notifyNum))
	b = binary.BigEndian.AppendUint16(b, uint16(len(m.addrs)))
	for _, a := range m.addrs {
		b = binary.BigEndian.AppendUint16(b, uint16(len(a)))
		b = append(b, a...)
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(m.mems)))
	for _, mem := range m.mems {
		b = binary.BigEndian.AppendUint64(b, uint64(mem.Addr))
		b = binary.BigEndian.AppendUint64(b, uint64(mem.Size))
		b = binary.BigEndian.AppendUint16(b, uint16(len(mem.Tag)))
		b = append(b, mem.Tag...)
	}
	return b
}

// wire reads a message that came from a peer; every read is bounds-checked
// and the first failure sticks.
type wire struct {
	b   []byte
	err error
}

func (w *wire) take(n int, what string) []byte {
	if w.err != nil {
		return nil
	}
	if n < 0 || n > len(w.b) {
		w.err = fmt.Errorf("hello is truncated at %s (need %d bytes, %d left)", what, n, len(w.b))
		return nil
	}
	p := w.b[:n]
	w.b = w.b[n:]
	return p
}

func (w *wire) u16(what string) int {
	if p := w.take(2, what); p != nil {
		return int(binary.BigEndian.Uint16(p))
	}
	return 0
}

func (w *wire) u32(what string) uint32 {
	if p := w.take(4, what); p != nil {
		return binary.BigEndian.Uint32(p)
	}
	return 0
}

func (w *wire) u64(what string) uint64 {
	if p := w.take(8, what); p != nil {
		return binary.BigEndian.Uint64(p)
	}
	return 0
}

func (w *wire) fail(format string, args ...any) {
	if w.err == nil {
		w.err = fmt.Errorf(format, args...)
	}
}

// parseHello decodes and validates a peer's hello.
func parseHello(b []byte) (*hello, error) {
	w := &wire{b: b}
	if string(w.take(len(helloMagic), "magic")) != helloMagic && w.err == nil {
		w.fail("hello does not start with %q: the peer is not an hcomm tcp transport", helloMagic)
	}
	if v := w.take(2, "version"); v != nil && (v[0] != protoVersion || v[1] != 0) {
		w.fail("hello has protocol version %d (flags %d), want %d", v[0], v[1], protoVersion)
	}
	m := &hello{}
	m.streams = w.u16("streams")
	if w.err == nil && (m.streams < 1 || m.streams > maxStreams) {
		w.fail("hello asks for %d sockets, want 1..%d", m.streams, maxStreams)
	}
	rank := w.u32("rank")
	if rank > 1<<30 {
		w.fail("hello names rank %d", rank)
	}
	m.rank = int(rank)
	copy(m.nonce[:], w.take(nonceLen, "nonce"))
	nn := w.u32("notify count")
	if nn > 1<<20 {
		w.fail("hello announces %d notifies, more than %d", nn, 1<<20)
	}
	m.notifyNum = int(nn)
	na := w.u16("address count")
	if na > maxAddrs {
		w.fail("hello lists %d addresses, more than %d", na, maxAddrs)
	}
	for i := 0; i < na && w.err == nil; i++ {
		l := w.u16("address length")
		if l > maxAddrLen {
			w.fail("hello address %d is %d bytes long", i, l)
		}
		m.addrs = append(m.addrs, string(w.take(l, "address")))
	}
	nm := w.u32("memory count")
	if nm > maxMems {
		w.fail("hello lists %d memory ranges, more than %d", nm, maxMems)
	}
	for i := 0; i < int(nm) && w.err == nil; i++ {
		addr, size := w.u64("memory address"), w.u64("memory size")
		tl := w.u16("tag length")
		if tl > maxTagLen {
			w.fail("hello memory %d has a %d-byte tag", i, tl)
		}
		tag := string(w.take(tl, "tag"))
		if w.err == nil && (size > 1<<62 || addr+size < addr) {
			w.fail("hello memory %d [%#x, +%d) is not a valid range", i, addr, size)
		}
		m.mems = append(m.mems, channel.Mem{Tag: tag, Addr: device.Ptr(addr), Size: int64(size)})
	}
	if w.err == nil && len(w.b) != 0 {
		w.fail("hello has %d trailing bytes", len(w.b))
	}
	if w.err != nil {
		return nil, w.err
	}
	if len(m.mems) == 0 {
		return nil, errors.New("hello lists no memory (the HCCL buffer comes first)")
	}
	if len(m.addrs) == 0 {
		return nil, errors.New("hello lists no listener address")
	}
	return m, nil
}

// The socket handshake (spec.md, "Handshake"):
//
//	acceptor → dialer: challenge = magic, version, 32 random bytes
//	dialer → acceptor: proof = magic, version, channel nonce, socket index,
//	                   socket count, dialer rank, 32 random bytes, HMAC
//	acceptor → dialer: verdict = status byte, HMAC over the dialer's bytes
const (
	challengeSize = len(helloMagic) + 1 + challengeLen
	proofSize     = len(helloMagic) + 1 + nonceLen + 2 + 2 + 4 + challengeLen + macLen
	verdictSize   = 1 + macLen
)

// proof is the dialer's message of the socket handshake.
type proof struct {
	nonce     [nonceLen]byte
	index     int
	streams   int
	rank      int
	challenge [challengeLen]byte
	mac       [macLen]byte
}

func (p *proof) marshal() []byte {
	b := make([]byte, 0, proofSize)
	b = append(b, helloMagic...)
	b = append(b, protoVersion)
	b = append(b, p.nonce[:]...)
	b = binary.BigEndian.AppendUint16(b, uint16(p.index))
	b = binary.BigEndian.AppendUint16(b, uint16(p.streams))
	b = binary.BigEndian.AppendUint32(b, uint32(p.rank))
	b = append(b, p.challenge[:]...)
	return append(b, p.mac[:]...)
}

func parseProof(b []byte) (*proof, error) {
	if len(b) != proofSize {
		return nil, fmt.Errorf("proof is %d bytes, want %d", len(b), proofSize)
	}
	if string(b[:4]) != helloMagic {
		return nil, errors.New("proof has a bad magic: not an hcomm tcp peer")
	}
	if b[4] != protoVersion {
		return nil, fmt.Errorf("proof has protocol version %d, want %d", b[4], protoVersion)
	}
	p := &proof{}
	b = b[5:]
	copy(p.nonce[:], b)
	b = b[nonceLen:]
	p.index = int(binary.BigEndian.Uint16(b))
	p.streams = int(binary.BigEndian.Uint16(b[2:]))
	p.rank = int(binary.BigEndian.Uint32(b[4:]))
	b = b[8:]
	copy(p.challenge[:], b)
	copy(p.mac[:], b[challengeLen:])
	return p, nil
}

// dialMAC is the dialer's proof of the secret: it covers the acceptor's
// challenge, so it cannot be replayed on another socket.
func dialMAC(secret []byte, challenge []byte, p *proof) []byte {
	m := hmac.New(sha256.New, secret)
	io.WriteString(m, "hcomm tcp dial v1")
	m.Write(challenge)
	m.Write(p.nonce[:])
	var b [8]byte
	binary.BigEndian.PutUint16(b[0:], uint16(p.index))
	binary.BigEndian.PutUint16(b[2:], uint16(p.streams))
	binary.BigEndian.PutUint32(b[4:], uint32(p.rank))
	m.Write(b[:])
	return m.Sum(nil)
}

// acceptMAC is the acceptor's answer: proof that it holds the secret too.
func acceptMAC(secret []byte, p *proof) []byte {
	m := hmac.New(sha256.New, secret)
	io.WriteString(m, "hcomm tcp accept v1")
	m.Write(p.challenge[:])
	m.Write(p.nonce[:])
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], uint16(p.index))
	m.Write(b[:])
	return m.Sum(nil)
}
