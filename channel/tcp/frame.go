package tcp

import (
	"encoding/binary"
	"fmt"

	"github.com/hcomm-dev/hcomm/internal/reduce"
)

// The framed protocol that follows the handshake on every socket of a
// channel; spec.md is its reference.

const (
	// protoVersion is the version byte of every frame header and of the
	// handshake. A receiver refuses any other value.
	protoVersion = 3
	// headerLen is the size of a frame header.
	headerLen = 32
	// maxPayload bounds the payload of one frame. A sender splits larger
	// operations into chunks of at most this size.
	maxPayload = 16 << 20
	// maxErrorText bounds the text carried by an ERROR frame.
	maxErrorText = 4096
	// maxStreams bounds the number of sockets of one channel.
	maxStreams = 64
	// maxReadLen bounds the total length one READ request may ask for.
	maxReadLen = 1 << 40
	// maxPad bounds the padding a WRITE puts between its ordering vector
	// and its data (the header's fourth byte, spec.md §2).
	maxPad = 63
	// padMin is the least data a WRITE pads for (dataPad).
	padMin = 4 << 10
)

// dataPad is the padding a WRITE of n data bytes after an ordering vector
// of vlen bytes carries, so that its data begins a multiple of 64 bytes
// after the frame's first byte: none below padMin.
//
// Why: the kernel copies a frame into the socket's buffer pages in one
// stream, from wherever the last frame left off, and at the receiver out of
// them into the destination. A frame that starts at the top of a buffer
// page — the usual case, a page whose earlier frames the receiver has read
// is reused from its start — puts data that follows a bare 32-byte header
// 32 bytes past the boundary, while the memory it is copied from and to
// starts on one: a copy whose source and destination lie a few dozen bytes
// apart modulo the 4 KiB page (16–48 ahead, or 16 behind) runs slower,
// loads and stores aliasing (BENCHMARKS.md, stop 50). Data that begins a
// whole number of cache lines into the frame lies as far from a page
// boundary as its memory does, or far enough from it.
func dataPad(vlen, n int) int {
	if n < padMin {
		return 0
	}
	return (64 - (headerLen+vlen)%64) % 64
}

// frameType is the type byte of a frame header.
type frameType uint8

// Frame types. The values are part of the wire format.
const (
	frameWrite       frameType = 1  // payload goes to the receiver's memory at addr (after size bytes of ordering vector)
	frameWriteReduce frameType = 2  // receiver[addr] = receiver[addr] op payload (after size bytes of ordering vector)
	frameRead        frameType = 3  // ask for size bytes at addr; payload: ordering vector
	frameReadResp    frameType = 4  // bytes of request id at offset addr
	frameNotify      frameType = 5  // record notify id; payload: ordering vector
	frameFence       frameType = 6  // ack id once earlier frames are applied; payload: ordering vector
	frameFenceAck    frameType = 7  // the fence id is complete
	framePing        frameType = 8  // heartbeat, nothing else
	frameError       frameType = 9  // the sender failed the channel; payload: why (text)
	frameClose       frameType = 10 // the sender closes the channel; nothing follows on this socket
)

var frameNames = [...]string{
	frameWrite: "WRITE", frameWriteReduce: "WRITE_REDUCE", frameRead: "READ", frameReadResp: "READ_RESP",
	frameNotify: "NOTIFY", frameFence: "FENCE", frameFenceAck: "FENCE_ACK", framePing: "PING",
	frameError: "ERROR", frameClose: "CLOSE",
}

func (t frameType) String() string {
	if int(t) < len(frameNames) && frameNames[t] != "" {
		return frameNames[t]
	}
	return fmt.Sprintf("frame type %d", uint8(t))
}

// header is a frame header on the wire (big-endian):
//
//	offset size field
//	0      1    version  protoVersion
//	1      1    type     frameType
//	2      1    dtype    reduce.DataType (WRITE_REDUCE), else 0
//	3      1    op       reduce.Op (WRITE_REDUCE); pad (WRITE: bytes between the ordering vector and the data, dataPad); else 0
//	4      4    length   payload bytes that follow the header
//	8      8    id       request id (READ, READ_RESP, FENCE, FENCE_ACK), notify index (NOTIFY)
//	16     8    addr     dst (WRITE, WRITE_REDUCE), src (READ), offset (READ_RESP)
//	24     8    size     total length (READ); ordering-vector bytes at the head of the payload (WRITE, WRITE_REDUCE)
//
// Fields a type does not use must be zero.
type header []byte

func (h header) version() uint8         { return h[0] }
func (h header) typ() frameType         { return frameType(h[1]) }
func (h header) dtype() reduce.DataType { return reduce.DataType(h[2]) }
func (h header) op() reduce.Op          { return reduce.Op(h[3]) }
func (h header) length() uint32         { return binary.BigEndian.Uint32(h[4:8]) }
func (h header) id() uint64             { return binary.BigEndian.Uint64(h[8:16]) }
func (h header) addr() uint64           { return binary.BigEndian.Uint64(h[16:24]) }
func (h header) size() uint64           { return binary.BigEndian.Uint64(h[24:32]) }

// pad is a WRITE's padding between its ordering vector and its data (the
// byte a WRITE_REDUCE gives its op); 0 for every other type.
func (h header) pad() uint64 {
	if h.typ() != frameWrite {
		return 0
	}
	return uint64(h[3])
}

// encode fills h (headerLen bytes).
func (h header) encode(t frameType, dt reduce.DataType, op reduce.Op, length uint32, id, addr, size uint64) {
	h[0] = protoVersion
	h[1] = byte(t)
	h[2] = byte(dt)
	h[3] = byte(op)
	binary.BigEndian.PutUint32(h[4:8], length)
	binary.BigEndian.PutUint64(h[8:16], id)
	binary.BigEndian.PutUint64(h[16:24], addr)
	binary.BigEndian.PutUint64(h[24:32], size)
}

func (h header) String() string {
	return fmt.Sprintf("%v v%d dtype %d op %d length %d id %d addr %#x size %d",
		h.typ(), h.version(), h[2], h[3], h.length(), h.id(), h.addr(), h.size())
}

// check validates h on its own (without looking at memory) for a channel of
// streams sockets: version, type, the fields the type leaves zero, and the
// payload length the type allows.
func (h header) check(streams int) error {
	if len(h) != headerLen {
		return fmt.Errorf("header is %d bytes, want %d", len(h), headerLen)
	}
	if h.version() != protoVersion {
		return fmt.Errorf("protocol version %d, want %d", h.version(), protoVersion)
	}
	t := h.typ()
	zero := func(what string, v uint64) error {
		if v != 0 {
			return fmt.Errorf("%v frame has %s %d, want 0", t, what, v)
		}
		return nil
	}
	noReduce := func() error {
		if err := zero("dtype", uint64(h[2])); err != nil {
			return err
		}
		return zero("op", uint64(h[3]))
	}
	vector := func() error {
		if int(h.length()) != 8*streams {
			return fmt.Errorf("%v frame carries %d bytes of ordering vector, want %d (%d sockets)", t, h.length(), 8*streams, streams)
		}
		return nil
	}
	n := uint64(h.length())
	// dataVector checks the ordering vector a WRITE or WRITE_REDUCE may
	// carry at the head of its payload, and a WRITE's padding after it, and
	// leaves n the data's length.
	dataVector := func() error {
		if v := h.size(); v != 0 && (v != 8*uint64(streams) || v > n) {
			return fmt.Errorf("%v frame carries %d bytes of ordering vector in a payload of %d, want 0 or %d (%d sockets)", t, v, n, 8*streams, streams)
		}
		n -= h.size()
		if p := h.pad(); p > maxPad || p > n {
			return fmt.Errorf("%v frame pads its data by %d bytes in a payload of %d after its ordering vector, want at most %d", t, p, n, min(n, maxPad))
		}
		n -= h.pad()
		return nil
	}
	var err error
	switch t {
	case frameWrite:
		err = firstErr(zero("dtype", uint64(h[2])), zero("id", h.id()), dataVector())
		if err == nil && n > maxPayload {
			err = fmt.Errorf("WRITE payload %d exceeds %d", n, maxPayload)
		}
		if err == nil && h.addr()+n < h.addr() {
			err = fmt.Errorf("WRITE range [%#x, +%d) wraps around", h.addr(), n)
		}
	case frameWriteReduce:
		dt, op := h.dtype(), h.op()
		switch verr := dataVector(); {
		case verr != nil:
			err = verr
		case !dt.Valid():
			err = fmt.Errorf("WRITE_REDUCE data type %d is not supported", h[2])
		case !op.Valid():
			err = fmt.Errorf("WRITE_REDUCE op %d is not supported", h[3])
		case n > maxPayload:
			err = fmt.Errorf("WRITE_REDUCE payload %d exceeds %d", n, maxPayload)
		case n%uint64(dt.Size()) != 0:
			err = fmt.Errorf("WRITE_REDUCE payload %d is not a whole number of %v elements", n, dt)
		case h.addr()+n < h.addr():
			err = fmt.Errorf("WRITE_REDUCE range [%#x, +%d) wraps around", h.addr(), n)
		default:
			err = zero("id", h.id())
		}
	case frameRead:
		err = firstErr(noReduce(), vector())
		if err == nil && h.size() > maxReadLen {
			err = fmt.Errorf("READ of %d bytes exceeds %d", h.size(), uint64(maxReadLen))
		}
		if err == nil && h.addr()+h.size() < h.addr() {
			err = fmt.Errorf("READ range [%#x, +%d) wraps around", h.addr(), h.size())
		}
	case frameReadResp:
		err = firstErr(noReduce(), zero("size", h.size()))
		if err == nil && n > maxPayload {
			err = fmt.Errorf("READ_RESP payload %d exceeds %d", n, maxPayload)
		}
	case frameNotify:
		err = firstErr(noReduce(), zero("addr", h.addr()), zero("size", h.size()), vector())
		if err == nil && h.id() > 1<<31-1 {
			err = fmt.Errorf("NOTIFY index %d is out of range", h.id())
		}
	case frameFence:
		err = firstErr(noReduce(), zero("addr", h.addr()), zero("size", h.size()), vector())
	case frameFenceAck:
		err = firstErr(noReduce(), zero("addr", h.addr()), zero("size", h.size()), zero("length", n))
	case framePing, frameClose:
		err = firstErr(noReduce(), zero("id", h.id()), zero("addr", h.addr()), zero("size", h.size()), zero("length", n))
	case frameError:
		err = firstErr(noReduce(), zero("id", h.id()), zero("addr", h.addr()), zero("size", h.size()))
		if err == nil && n > maxErrorText {
			err = fmt.Errorf("ERROR text of %d bytes exceeds %d", n, maxErrorText)
		}
	default:
		err = fmt.Errorf("unknown frame type %d", uint8(t))
	}
	return err
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}
