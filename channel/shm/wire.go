//go:build linux

package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The wire formats of the transport; doc.go describes them for people. Every
// integer is little-endian (both ends run on one host). A decoder checks every
// length against the bytes it has and never panics (FuzzDecodeHello,
// FuzzDecodeMsg).

const (
	// helloMagic opens every exchange message.
	helloMagic = "hcshm"
	// protoVersion is the version of both formats; a peer with another is
	// refused.
	protoVersion = 2
	// secretLen is the length of the listener's secret, which the dialing
	// end proves it knows before anything else crosses the socket.
	secretLen = 16
	// maxHostID bounds the host identity string.
	maxHostID = 4096
	// maxAddr bounds the socket name.
	maxAddr = 107
	// maxMems bounds the number of registered ranges one end may describe.
	maxMems = 1 << 16
	// memsPerMsg bounds the entries, and so the descriptors, of one MEMS
	// message (the kernel passes at most 253 descriptors per message).
	memsPerMsg = 64
	// maxNotifies bounds the notify count of one end (thread.MaxNotifies).
	maxNotifies = 65535
	// maxText bounds the reason a REFUSE message carries.
	maxText = 4096
	// maxMsg bounds one socket message: a MEMS message of memsPerMsg
	// entries with the longest tags fits.
	maxMsg = 64 << 10
	// maxRange bounds the size of one described range (1 TiB, device's bound
	// on one allocation).
	maxRange = 1 << 40
	// noFD marks a MEMS entry that carries no descriptor (an empty range).
	noFD = 0xFFFF
)

// hello is what one end puts in the Exchange.
type hello struct {
	HostID string
	PID    int32
	Rank   int32
	Peer   int32 // the rank the sender connects to
	Listen bool  // the sender listens at Addr; the other end dials
	Addr   string
	Secret [secretLen]byte
}

func appendString16(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// encode writes h:
//
//	"hcshm" version:u8 pid:i32 rank:i32 peer:i32 listen:u8
//	hostIDLen:u16 hostID addrLen:u16 addr secret:[16]
func (h *hello) encode() []byte {
	b := append([]byte(helloMagic), protoVersion)
	b = binary.LittleEndian.AppendUint32(b, uint32(h.PID))
	b = binary.LittleEndian.AppendUint32(b, uint32(h.Rank))
	b = binary.LittleEndian.AppendUint32(b, uint32(h.Peer))
	listen := byte(0)
	if h.Listen {
		listen = 1
	}
	b = append(b, listen)
	b = appendString16(b, h.HostID)
	b = appendString16(b, h.Addr)
	return append(b, h.Secret[:]...)
}

// reader takes fields off a message, remembering the first shortfall.
type reader struct {
	b   []byte
	err error
}

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b) {
		r.err = fmt.Errorf("message ends %d bytes early", n-len(r.b))
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) u8() uint8 {
	if v := r.take(1); v != nil {
		return v[0]
	}
	return 0
}

func (r *reader) u16() uint16 {
	if v := r.take(2); v != nil {
		return binary.LittleEndian.Uint16(v)
	}
	return 0
}

func (r *reader) u32() uint32 {
	if v := r.take(4); v != nil {
		return binary.LittleEndian.Uint32(v)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if v := r.take(8); v != nil {
		return binary.LittleEndian.Uint64(v)
	}
	return 0
}

func (r *reader) str16(limit int, what string) string {
	n := int(r.u16())
	if r.err == nil && n > limit {
		r.err = fmt.Errorf("%s is %d bytes, at most %d", what, n, limit)
		return ""
	}
	return string(r.take(n))
}

// end fails when bytes are left over.
func (r *reader) end() error {
	if r.err == nil && len(r.b) != 0 {
		r.err = fmt.Errorf("%d unexpected bytes at the end of the message", len(r.b))
	}
	return r.err
}

// decodeHello reads a peer's exchange message.
func decodeHello(b []byte) (*hello, error) {
	if len(b) < len(helloMagic)+1 || string(b[:len(helloMagic)]) != helloMagic {
		return nil, errors.New("not a shared-memory transport hello (the peer runs another transport?)")
	}
	if v := b[len(helloMagic)]; v != protoVersion {
		return nil, fmt.Errorf("peer speaks version %d of the shared-memory transport, this end %d", v, protoVersion)
	}
	r := &reader{b: b[len(helloMagic)+1:]}
	h := &hello{}
	h.PID = int32(r.u32())
	h.Rank = int32(r.u32())
	h.Peer = int32(r.u32())
	switch l := r.u8(); l {
	case 0, 1:
		h.Listen = l == 1
	default:
		if r.err == nil {
			r.err = fmt.Errorf("listen flag %d, want 0 or 1", l)
		}
	}
	h.HostID = r.str16(maxHostID, "host id")
	h.Addr = r.str16(maxAddr, "socket name")
	copy(h.Secret[:], r.take(secretLen))
	if err := r.end(); err != nil {
		return nil, fmt.Errorf("bad hello: %w", err)
	}
	if h.PID <= 0 {
		return nil, fmt.Errorf("bad hello: pid %d", h.PID)
	}
	if h.Listen && h.Addr == "" {
		return nil, errors.New("bad hello: the listening end names no socket")
	}
	return h, nil
}

// msgType is the first byte of every socket message.
type msgType uint8

// Socket message types; the values are part of the wire format.
const (
	msgAuth   msgType = 1 // dialer -> listener: secret, proving who connects
	msgMems   msgType = 2 // registered ranges, one descriptor each
	msgDone   msgType = 3 // end of a description: notify count (+ the notify page)
	msgReady  msgType = 4 // the sender mapped the peer's description
	msgRefuse msgType = 5 // the sender refuses the peer's description: why
	msgBye    msgType = 6 // the sender closes its end; nothing follows
)

var msgNames = [...]string{msgAuth: "AUTH", msgMems: "MEMS", msgDone: "DONE", msgReady: "READY", msgRefuse: "REFUSE", msgBye: "BYE"}

func (t msgType) String() string {
	if int(t) < len(msgNames) && msgNames[t] != "" {
		return msgNames[t]
	}
	return fmt.Sprintf("message type %d", uint8(t))
}

// memEntry is one registered range in a MEMS message.
type memEntry struct {
	Addr   uint64 // in the sender's address space
	Size   uint64
	Offset uint64 // of Addr in the descriptor's file
	FD     uint16 // index of the descriptor among the message's; noFD when Size is 0
	Tag    string
}

// msg is one decoded socket message.
type msg struct {
	Type   msgType
	Secret [secretLen]byte // AUTH
	Mems   []memEntry      // MEMS
	Total  uint32          // DONE: ranges described in all
	Notify uint32          // DONE: notifies (words on the page; a descriptor when > 0)
	Text   string          // REFUSE
	Flags  uint8           // READY: readyReads, readyFiles
}

// READY's flags.
const (
	// readyReads: the sender read a word of this end's memory through the
	// kernel (process_vm_readv) at connect; a pair whose ends both say so
	// reads memory the peer lends for one operation (Transport.ReadPeer).
	readyReads uint8 = 1
	// readyFiles: the sender could open this end's descriptors
	// (/proc/<pid>/fd), so that it may map the memory files they hold —
	// allowed where process_vm_readv is not (Yama's ptrace_scope 1 restricts
	// attaching, not reading a process's descriptors).
	readyFiles uint8 = 2
)

// encode writes m:
//
//	AUTH    type secret:[16]
//	MEMS    type count:u16 {addr:u64 size:u64 offset:u64 fd:u16 tagLen:u8 tag}...
//	DONE    type total:u32 notify:u32
//	READY   type flags:u8
//	REFUSE  type textLen:u16 text
//	BYE     type
func (m *msg) encode() []byte {
	b := []byte{byte(m.Type)}
	switch m.Type {
	case msgAuth:
		b = append(b, m.Secret[:]...)
	case msgMems:
		b = binary.LittleEndian.AppendUint16(b, uint16(len(m.Mems)))
		for _, e := range m.Mems {
			b = binary.LittleEndian.AppendUint64(b, e.Addr)
			b = binary.LittleEndian.AppendUint64(b, e.Size)
			b = binary.LittleEndian.AppendUint64(b, e.Offset)
			b = binary.LittleEndian.AppendUint16(b, e.FD)
			b = append(b, byte(len(e.Tag)))
			b = append(b, e.Tag...)
		}
	case msgDone:
		b = binary.LittleEndian.AppendUint32(b, m.Total)
		b = binary.LittleEndian.AppendUint32(b, m.Notify)
	case msgReady:
		b = append(b, m.Flags)
	case msgRefuse:
		t := m.Text
		if len(t) > maxText {
			t = t[:maxText]
		}
		b = appendString16(b, t)
	}
	return b
}

// decodeMsg reads a socket message that came with nfd descriptors, checking
// each field on its own (ranges against memory are checked by the caller).
func decodeMsg(b []byte, nfd int) (*msg, error) {
	if len(b) == 0 {
		return nil, errors.New("empty message")
	}
	m := &msg{Type: msgType(b[0])}
	r := &reader{b: b[1:]}
	wantFDs := 0
	switch m.Type {
	case msgAuth:
		copy(m.Secret[:], r.take(secretLen))
	case msgMems:
		n := int(r.u16())
		if r.err == nil && (n == 0 || n > memsPerMsg) {
			return nil, fmt.Errorf("MEMS message with %d entries, want 1 to %d", n, memsPerMsg)
		}
		used := make(map[uint16]bool)
		for i := 0; i < n && r.err == nil; i++ {
			e := memEntry{Addr: r.u64(), Size: r.u64(), Offset: r.u64(), FD: r.u16()}
			e.Tag = string(r.take(int(r.u8())))
			if r.err != nil {
				break
			}
			switch {
			case e.Size > maxRange:
				return nil, fmt.Errorf("MEMS entry %d: size %d exceeds %d", i, e.Size, uint64(maxRange))
			case e.Size == 0 && e.FD != noFD:
				return nil, fmt.Errorf("MEMS entry %d: an empty range with a descriptor", i)
			case e.Size > 0 && e.Addr == 0:
				return nil, fmt.Errorf("MEMS entry %d: [nil, +%d)", i, e.Size)
			case e.Addr+e.Size < e.Addr:
				return nil, fmt.Errorf("MEMS entry %d: range [%#x, +%d) wraps around", i, e.Addr, e.Size)
			case e.Offset > maxRange || e.Offset+e.Size < e.Offset:
				return nil, fmt.Errorf("MEMS entry %d: file offset %d out of bounds", i, e.Offset)
			case e.Size > 0 && int(e.FD) >= nfd:
				return nil, fmt.Errorf("MEMS entry %d: descriptor %d of %d received", i, e.FD, nfd)
			case e.Size > 0 && used[e.FD]:
				return nil, fmt.Errorf("MEMS entry %d: descriptor %d used twice", i, e.FD)
			}
			if e.Size > 0 {
				used[e.FD] = true
				wantFDs++
			}
			m.Mems = append(m.Mems, e)
		}
	case msgDone:
		m.Total = r.u32()
		m.Notify = r.u32()
		if r.err == nil && m.Total > maxMems {
			return nil, fmt.Errorf("DONE describes %d ranges, at most %d", m.Total, maxMems)
		}
		if r.err == nil && m.Notify > maxNotifies {
			return nil, fmt.Errorf("DONE has %d notifies, at most %d", m.Notify, maxNotifies)
		}
		if m.Notify > 0 {
			wantFDs = 1
		}
	case msgReady:
		m.Flags = r.u8()
		if r.err == nil && m.Flags&^(readyReads|readyFiles) != 0 {
			return nil, fmt.Errorf("READY with unknown flags %#x", m.Flags)
		}
	case msgBye:
	case msgRefuse:
		m.Text = r.str16(maxText, "refusal")
	default:
		return nil, fmt.Errorf("unknown message type %d", b[0])
	}
	if err := r.end(); err != nil {
		return nil, fmt.Errorf("bad %v message: %w", m.Type, err)
	}
	if nfd != wantFDs {
		return nil, fmt.Errorf("%v message came with %d descriptors, want %d", m.Type, nfd, wantFDs)
	}
	return m, nil
}
