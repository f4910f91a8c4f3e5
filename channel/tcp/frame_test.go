package tcp

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/reduce"
	"github.com/hcomm-dev/hcomm/notify"
)

// nullConn is a socket that swallows writes and has nothing to read: the
// fuzzed receiver's ERROR answers go nowhere.
type nullConn struct{}

func (nullConn) Read([]byte) (int, error)         { return 0, io.EOF }
func (nullConn) Write(p []byte) (int, error)      { return len(p), nil }
func (nullConn) Close() error                     { return nil }
func (nullConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (nullConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (nullConn) SetDeadline(time.Time) error      { return nil }
func (nullConn) SetReadDeadline(time.Time) error  { return nil }
func (nullConn) SetWriteDeadline(time.Time) error { return nil }

func frameBytes(t frameType, dt reduce.DataType, op reduce.Op, id, addr, size uint64, payload []byte) []byte {
	h := make(header, headerLen)
	h.encode(t, dt, op, uint32(len(payload)), id, addr, size)
	return append(h, payload...)
}

func cat(bs ...[]byte) []byte { return bytes.Join(bs, nil) }

// FuzzFrame feeds arbitrary bytes to the receiving side of a two-socket
// channel as if they came from socket 0. Addresses of WRITE, WRITE_REDUCE
// and READ frames are taken relative to the registered buffer (so that the
// fuzzer reaches both sides of its edges). Whatever arrives, the receiver
// must not panic, must touch nothing but the registered buffer, and every
// header it accepts must encode back to the same bytes.
func FuzzFrame(f *testing.F) {
	vec := make([]byte, 16) // ordering vector of two sockets, nothing before
	// Seed corpus, one line per case:
	f.Add(frameBytes(frameWrite, 0, 0, 0, 8, 0, []byte("hello")))                             // a valid write
	f.Add(frameBytes(frameWrite, 0, 0, 0, 4096-2, 0, []byte("hello")))                        // runs past the end
	f.Add(frameBytes(frameWrite, 0, 0, 0, 1<<63, 0, []byte("x")))                             // far away
	f.Add(frameBytes(frameWriteReduce, reduce.Float32, reduce.Sum, 0, 0, 0, make([]byte, 8))) // a valid reduce
	f.Add(frameBytes(frameWriteReduce, reduce.Float32, reduce.Sum, 0, 0, 0, make([]byte, 6))) // half an element
	f.Add(frameBytes(frameWriteReduce, 42, reduce.Sum, 0, 0, 0, make([]byte, 8)))             // unknown data type
	f.Add(frameBytes(frameRead, 0, 0, 1, 0, 64, vec))                                         // a valid read
	f.Add(frameBytes(frameRead, 0, 0, 1, 0, 64, vec[:8]))                                     // short vector
	f.Add(frameBytes(frameNotify, 0, 0, 1, 0, 0, vec))                                        // a valid notify
	f.Add(frameBytes(frameNotify, 0, 0, 9, 0, 0, vec))                                        // no such notify
	f.Add(cat(frameBytes(frameNotify, 0, 0, 0, 0, 0, append(make([]byte, 15), 1)),            // waits for socket 1
		frameBytes(frameFence, 0, 0, 3, 0, 0, vec)))
	f.Add(frameBytes(frameReadResp, 0, 0, 1, 0, 0, []byte("abc")))                             // answers nothing
	f.Add(frameBytes(frameFenceAck, 0, 0, 1, 0, 0, nil))                                       // acknowledges nothing
	f.Add(frameBytes(framePing, 0, 0, 0, 0, 0, nil))                                           // heartbeat
	f.Add(frameBytes(frameError, 0, 0, 0, 0, 0, []byte("boom")))                               // the peer gives up
	f.Add(frameBytes(frameClose, 0, 0, 0, 0, 0, nil))                                          // the peer leaves
	f.Add(append([]byte{1}, frameBytes(framePing, 0, 0, 0, 0, 0, nil)[1:]...))                 // version 1, before ordered writes
	f.Add(frameBytes(frameWrite, 0, 0, 0, 8, 16, append(make([]byte, 16), "hello"...)))        // ordered write, nothing before
	f.Add(frameBytes(frameWrite, 0, 0, 0, 8, 16, append(append(make([]byte, 15), 1), 'x')))    // waits for socket 1
	f.Add(frameBytes(frameWriteReduce, reduce.Float32, reduce.Sum, 0, 0, 8, make([]byte, 16))) // vector of one socket
	f.Add(frameBytes(frameWrite, 0, 16, 0, 8, 16, append(make([]byte, 32), "hello"...)))       // ordered and padded
	f.Add(frameBytes(frameWrite, 0, 9, 0, 8, 0, []byte("hello")))                              // padded past its end
	f.Add([]byte{1, 1, 0})                                                                     // truncated header

	dev, err := device.Open(0)
	if err != nil {
		f.Fatal(err)
	}
	defer dev.Close()
	const size = 4096
	buf, _ := dev.Malloc(size)
	victim, _ := dev.Malloc(size) // not registered
	reg := &channel.Registry{}
	reg.Add(channel.Mem{Tag: "hccl buffer", Addr: buf, Size: size})
	vb, _ := dev.Bytes(victim, size)
	for i := range vb {
		vb[i] = byte(i)
	}
	want := append([]byte(nil), vb...)

	f.Fuzz(func(t *testing.T, data []byte) {
		c := &conn{log: slog.New(slog.DiscardHandler), rank: 1, peer: 0, name: "fuzz", dev: dev, reg: reg,
			hccl:     channel.Mem{Tag: "hccl buffer", Addr: buf, Size: size},
			notifies: []*notify.Notify{notify.New("n0"), notify.New("n1")}, peerNN: 2, chunk: DefaultChunkSize,
			timeout: time.Second, dead: make(chan struct{}), reads: make(map[uint64]*pendingRead),
			fences: make(map[uint64]chan struct{}), qsig: make(chan struct{}, 1)}
		c.socks = []*sock{{idx: 0, nc: nullConn{}}, {idx: 1, nc: nullConn{}}}
		c.pcond = sync.NewCond(&c.amu)
		// A data frame ordered after socket 1's frames waits for them; none
		// come, so the channel fails as a peer timeout would fail it.
		stall := time.AfterFunc(20*time.Millisecond, func() { c.fail(errors.New("fuzz: stalled"), false) })
		defer stall.Stop()
		br := bufio.NewReader(bytes.NewReader(data))
		// The receive engine is fed as reads would feed it, in pieces of
		// 1 to 7 bytes, so that frames are also taken up mid-way.
		s0 := c.socks[0]
		piece := 1 + len(data)%7
		feed := func(p []byte) (bool, error) {
			for len(p) > 0 {
				k := min(piece, len(p))
				s0.rx.buf, s0.rx.pos, s0.rx.end = p[:k], 0, k
				p = p[k:]
				if done, err := c.consume(s0); err != nil || done {
					return done, err
				}
			}
			return false, nil
		}
		for c.failure() == nil {
			h := make(header, headerLen)
			if _, err := io.ReadFull(br, h); err != nil {
				break
			}
			switch h.typ() {
			case frameWrite, frameWriteReduce, frameRead:
				h.encode(h.typ(), h.dtype(), h.op(), h.length(), h.id(), h.addr()+uint64(buf), h.size())
			}
			if h.check(2) == nil {
				g := make(header, headerLen)
				g.encode(h.typ(), h.dtype(), h.op(), h.length(), h.id(), h.addr(), h.size())
				if !bytes.Equal(g, h) {
					t.Fatalf("accepted header %x encodes back as %x", []byte(h), []byte(g))
				}
			}
			done, err := feed(h)
			for err == nil && !done && s0.rx.phase != rxHeader {
				k := s0.rx.need - s0.rx.got
				if s0.rx.phase == rxVector {
					k = s0.rx.vlen - s0.rx.vn
				}
				p := make([]byte, min(k, 4096))
				n, _ := io.ReadFull(br, p)
				if n == 0 {
					break
				}
				done, err = feed(p[:n])
			}
			if err != nil || done || s0.rx.phase != rxHeader {
				break
			}
		}
		s0.rxAbandon()
		if !bytes.Equal(vb, want) {
			t.Fatal("a frame changed memory that is not registered")
		}
	})
}

func TestHeaderRoundTrip(t *testing.T) {
	h := make(header, headerLen)
	h.encode(frameWriteReduce, reduce.BFloat16, reduce.Max, 1<<20, 7, 0xdeadbeef, 0)
	if h.version() != protoVersion || h.typ() != frameWriteReduce || h.dtype() != reduce.BFloat16 || h.op() != reduce.Max ||
		h.length() != 1<<20 || h.id() != 7 || h.addr() != 0xdeadbeef || h.size() != 0 {
		t.Fatalf("decoded %v", h)
	}
	if err := h.check(2); err == nil || !bytes.Contains([]byte(err.Error()), []byte("id 7")) {
		t.Fatalf("a WRITE_REDUCE with an id passed: %v", err)
	}
	h.encode(frameWriteReduce, reduce.BFloat16, reduce.Max, 1<<20, 0, 0xdeadbeef, 0)
	if err := h.check(2); err != nil {
		t.Fatal(err)
	}
	h.encode(frameWrite, 0, 0, maxPayload+1, 0, 0, 0)
	if err := h.check(2); err == nil {
		t.Fatal("an oversized WRITE passed")
	}
	// A WRITE's fourth byte is its padding: at most maxPad, and within the
	// payload after the ordering vector.
	for _, c := range []struct {
		pad, length, size uint64
		ok                bool
	}{
		{16, 16 + 16 + 100, 16, true},
		{maxPad, maxPad, 0, true},
		{maxPad + 1, 1000, 0, false},
		{17, 16 + 16, 16, false},
	} {
		h.encode(frameWrite, 0, reduce.Op(c.pad), uint32(c.length), 0, 0, c.size)
		if err := h.check(2); (err == nil) != c.ok {
			t.Errorf("WRITE padded %d, length %d, vector %d: %v", c.pad, c.length, c.size, err)
		}
		if h.pad() != c.pad {
			t.Errorf("pad() = %d, want %d", h.pad(), c.pad)
		}
	}
	h.encode(frameWriteReduce, reduce.Float32, reduce.Max, 64, 0, 0, 0)
	if h.pad() != 0 {
		t.Errorf("a WRITE_REDUCE's op read as padding: %d", h.pad())
	}
}

// dataPad puts a WRITE's data a multiple of 64 bytes after the frame's
// start, from padMin bytes of data up.
func TestDataPad(t *testing.T) {
	for _, vlen := range []int{0, 8, 16, 24, 32, 64, 8 * maxStreams} {
		if p := dataPad(vlen, padMin-1); p != 0 {
			t.Errorf("%d bytes of data after a vector of %d are padded by %d", padMin-1, vlen, p)
		}
		p := dataPad(vlen, padMin)
		if p < 0 || p > maxPad || (headerLen+vlen+p)%64 != 0 {
			t.Errorf("a vector of %d: padding %d puts the data at %d", vlen, p, headerLen+vlen+p)
		}
	}
}

// FuzzHello checks the Exchange message decoder: no panic, and whatever it
// accepts marshals back to the same bytes.
func FuzzHello(f *testing.F) {
	h := &hello{rank: 3, streams: 2, notifyNum: 4, addrs: []string{"10.0.0.1:5000", "127.0.0.1:5000"},
		mems: []channel.Mem{{Tag: "hccl buffer", Addr: 1 << 20, Size: 1 << 20}, {Tag: "user", Addr: 1 << 30, Size: 4096}}}
	f.Add(h.marshal())                    // valid
	f.Add(h.marshal()[:20])               // truncated
	f.Add(append(h.marshal(), 0))         // trailing byte
	f.Add([]byte("HCTP\x09\x00\x00\x01")) // future version
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseHello(b)
		if err != nil {
			return
		}
		if !bytes.Equal(m.marshal(), b) {
			t.Fatalf("hello %x re-marshals as %x", b, m.marshal())
		}
	})
}
