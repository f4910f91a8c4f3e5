package collectives

import (
	"encoding/binary"
	"errors"
	"math"
	"os"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/internal/spin"
)

// The low-latency hello. Between two ranks whose channel stores into the
// peer's memory itself (inproc, shm: channel.FlagWriter), in a communicator
// of at most helloFullMax ranks, a hello travels as a line in the spirit of
// NCCL's LL protocol and of Open MPI's shared-memory fast boxes: one cache
// line whose first word is a flag and whose other 56 bytes are the message
// (channel.PutLine: the bytes with plain stores, the flag word last with one
// release store). The receiver polls the line in its own memory
// (channel.TakeLine; the lines lie in flagged slots after the hello slots,
// layout.flaggedOff) and has the hello as soon as the flag is there. No
// notify is recorded and none is waited for: a small hello is one cache
// line's transfer, where a write and a notify are three (the header and
// payload span two lines, the notify a third, and the receiver sees the
// notify's before it asks for the others).
//
// The line holds the hello in one of two forms:
//   - compact (a hello of at most lineInline bytes of payload whose header
//     fits: no window, no counts digest, a count below 2^32): the header's
//     fields packed into 24 bytes, then the payload (lineCompact);
//   - full: the 56-byte header as the slot holds it; the payload, if any, was
//     written before into the plain hello slot after the header's place, so
//     that it is there when the flag is.
//
// The receiver expands either form into its plain hello slot (header, then
// payload), where the checks and the algorithms read a hello whichever way
// it came. A peer is not trusted: a compact line's payload length is bounded
// by the line, and the expanded header is checked as any other.
//
// The flag is the pair's hello count plus one (never 0, which zeroed memory
// holds), the same number on both sides: the two ranks of a pair count
// their hellos alike, and a slot is reused every second hello (its parity),
// so a line left from the hello two before never passes for the current one.
//
// A receiver that has polled for its spin bound without seeing the line
// sleeps on the hello notify instead, and must be woken. Before it sleeps it
// stores a wake word — flagged with the hello it waits for — into the
// sender's memory (the second cache line of its own flagged slot there); a
// sender checks that word after storing its hello and records the notify
// only when it finds it. The two sides store first and load second, with a
// full barrier between (channel.Fence on both sides: the line's flag is a
// release store), so either the receiver sees the hello before it sleeps
// or the sender sees the wake word: no wake is lost, and a rank that
// answers in time pays no notify. The lane (lane.go) stores its lines to
// every peer, then fences once and looks at every wake word. A record the
// receiver did not need (it saw the line after storing its wake word) is
// cleared before its next sleep on that notify; until then it can only
// wake a flagged wait early, which looks at the line again.
//
// Whether a pair uses lines depends only on the pair (the transport between
// them, the rank count, the memory being mapped), never on the call, so the
// two sides always agree and the handshake's mismatch check is unchanged.
// It is on by default; HCOMM_LL=0 turns it off (every hello a write and a
// notify), to measure one against the other.

// llSlot is the bytes of a flagged slot: the line (64), then the wake word
// in the second cache line.
const llSlot = 128

// llWake is where in a flagged slot the wake word lies.
const llWake = 112

// lineInline is the payload a compact line carries after its packed header.
const lineInline = channel.LineData - lineHeader

// lineHeader is the packed header's bytes in a compact line:
//
//	0 lineCompact  1 kind  2 dt  3 op  4 algo  5 flags  6 from  7 size
//	8 seq (8)  16 root (int16)  18 payload bytes  19 zero  20 count (uint32)
const lineHeader = 24

// lineCompact marks a compact line (a full one starts with the header's
// magic).
const lineCompact = 0xc1

// envLL reads HCOMM_LL: off for "0" or "off", else on.
func envLL() bool {
	v := os.Getenv("HCOMM_LL")
	return v != "0" && v != "off"
}

// flagged reports whether the hellos with peer travel as lines.
func (st *state) flagged(peer int) bool {
	return st.ll && st.comm.Size() <= helloFullMax && st.chans[peer].Flagged()
}

// helloFlag is the flag of the pair's hello number count (counted from
// 0) when the pair's hellos are lines, else 0 (a write with a notify).
func (st *state) helloFlag(peer int, count uint64) uint32 {
	if !st.flagged(peer) {
		return 0
	}
	return uint32(count%(1<<32-1)) + 1
}

// packLine packs an encoded header hdr and its payload into a compact line's
// data (line, channel.LineData bytes), reporting false — line untouched —
// when they do not fit one.
func packLine(line, hdr, payload []byte) bool {
	h, err := decodeHeader(hdr)
	return err == nil && packHeader(line, h, payload)
}

// packHeader is packLine from the header itself.
func packHeader(line []byte, h header, payload []byte) bool {
	_ = line[channel.LineData-1]
	if len(payload) > lineInline || h.flags&flagWindow != 0 || h.extra != 0 || h.win != 0 ||
		h.count < 0 || h.count > math.MaxUint32 || h.root != int32(int16(h.root)) ||
		h.from < 0 || h.from > 255 || h.size < 0 || h.size > 255 {
		return false
	}
	le := binary.LittleEndian
	line[0] = lineCompact
	line[1], line[2], line[3], line[4], line[5] = byte(h.kind), byte(h.dt), byte(h.op), byte(h.algo), h.flags
	line[6], line[7] = byte(h.from), byte(h.size)
	le.PutUint64(line[8:], h.seq)
	le.PutUint16(line[16:], uint16(int16(h.root)))
	line[18], line[19] = byte(len(payload)), 0
	le.PutUint32(line[20:], uint32(h.count))
	copy(line[lineHeader:], payload)
	return true
}

// sameLine reports whether a peer's compact line (from rank from) carries the
// call whose compact line is mine: every packed field equal but the sender.
// Equal lines mean equal headers (header.encode's bytes are a function of
// the packed fields), which is what the hello's check would find.
func sameLine(mine, theirs []byte, from int) bool {
	_, _ = mine[lineHeader-1], theirs[lineHeader-1]
	le := binary.LittleEndian
	const notFrom = ^(uint64(0xff) << 48) // byte 6 of the first word
	return theirs[0] == lineCompact && theirs[6] == byte(from) &&
		le.Uint64(mine)&notFrom == le.Uint64(theirs)&notFrom &&
		le.Uint64(mine[8:]) == le.Uint64(theirs[8:]) && le.Uint64(mine[16:]) == le.Uint64(theirs[16:])
}

// unpackLine expands a line's data into a hello slot: the header (encoded
// as header.encode would), then a compact line's payload.
func unpackLine(slot, line []byte) {
	_, _ = line[channel.LineData-1], slot[headerSize+lineInline-1]
	if line[0] != lineCompact {
		copy(slot[:headerSize], line[:headerSize])
		return
	}
	le := binary.LittleEndian
	clear(slot[:headerSize])
	copy(slot[0:4], headerMagic[:])
	slot[4] = headerVersion
	copy(slot[5:10], line[1:6])
	le.PutUint32(slot[12:], uint32(int32(int16(le.Uint16(line[16:])))))
	copy(slot[16:20], line[20:24])
	copy(slot[24:32], line[8:16])
	le.PutUint32(slot[40:], uint32(line[6]))
	le.PutUint32(slot[44:], uint32(line[7]))
	n := min(int(line[18]), lineInline)
	copy(slot[headerSize:headerSize+n], line[lineHeader:lineHeader+n])
}

// linePut returns the prepared line of this rank's flagged slot of parity
// par in peer's memory, preparing it on first use.
func (st *state) linePut(p int, par uint64) (*hcomm.PreparedLine, error) {
	if st.linePuts == nil {
		st.linePuts = make([][2]*hcomm.PreparedLine, st.comm.Size())
	}
	if l := st.linePuts[p][par]; l != nil {
		return l, nil
	}
	l, err := hcomm.PrepareLine(st.chans[p], st.peerBuf[p].Add(st.lay.flaggedOff(st.comm.Rank(), par)))
	if err != nil {
		return nil, err
	}
	st.linePuts[p][par] = l
	return l, nil
}

// putLine stores a line's data into peer p's flagged slot of parity par with
// flag, and wakes p if it sleeps for it.
func (st *state) putLine(stop <-chan struct{}, p int, par uint64, flag uint32, line []byte) error {
	if err := st.storeLine(p, par, flag, line); err != nil {
		return err
	}
	channel.Fence() // the line visible before the wake word is looked at
	return st.wakeIfAsked(stop, p, par, flag)
}

// storeLine is putLine without the wake: its caller calls channel.Fence and
// then wakeIfAsked before it may wait for anything (the lane's post).
func (st *state) storeLine(p int, par uint64, flag uint32, line []byte) error {
	l, err := st.linePut(p, par)
	if err != nil {
		return err
	}
	return l.Put(line, flag)
}

// wakeIfAsked records peer p's hello notify of parity par when p stored the
// wake word of the hello flagged flag (it may be asleep waiting for it).
func (st *state) wakeIfAsked(stop <-chan struct{}, p int, par uint64, flag uint32) error {
	var w [4]byte
	off := st.lay.flaggedOff(p, par) + llWake
	if !channel.TakeFlagged(w[:], st.hello.Bytes()[off:off+8], flag) {
		return nil
	}
	// The peer stored its wake word and then, looking again, may have
	// found the hello, finished and closed its end: a wake that finds the
	// peer gone is not needed (a peer lost while it sleeps fails its own
	// wait, and this rank learns of the loss from its own).
	if err := hcomm.ChannelNotifyRecord(stop, st.chans[p], nHello+int(par)); err != nil && !errors.Is(err, channel.ErrPeerClosed) && !errors.Is(err, channel.ErrPeerLost) {
		return err
	}
	return nil
}

// sendHello writes this rank's hello — a header at src and n bytes of
// payload at payload (src+headerSize when it follows the header, another
// place for a payload of its own per peer) — into peer's slot of parity par:
// as a line (flag) when the pair's hellos are lines, else as a write with
// the hello notify. line is the caller's room to pack a line in (a field
// of its call: on the stack it would be moved to the heap, the channel's
// line putter being an interface).
func (s *sched) sendHello(stop <-chan struct{}, p int, par uint64, flag uint32, src, payload device.Ptr, n int64, line *[channel.LineData]byte) error {
	return s.st.sendHello(stop, p, par, flag, src, payload, n, line)
}

// sendHello is sched.sendHello, for the lane (lane.go), which has no sched.
func (st *state) sendHello(stop <-chan struct{}, p int, par uint64, flag uint32, src, payload device.Ptr, n int64, line *[channel.LineData]byte) error {
	dst := st.peerBuf[p].Add(st.lay.helloOff(st.comm.Rank(), par))
	if flag == 0 && (n == 0 || payload == src.Add(headerSize)) {
		return hcomm.WriteWithNotifyNbi(stop, st.chans[p], dst, src, headerSize+n, nHello+int(par))
	}
	if flag == 0 {
		// The header from this rank's slot, the payload from elsewhere (the
		// all-to-all's block for p): one gathered write (tcp: one frame).
		segs := [2]hcomm.Segment{{Src: src, N: headerSize}, {Src: payload, N: n}}
		return hcomm.WriteVWithNotifyNbi(stop, st.chans[p], dst, segs[:], nHello+int(par))
	}
	hb := st.hello.Bytes()
	off := int64(src - st.buf)
	hdr := hb[off : off+headerSize]
	*line = [channel.LineData]byte{}
	packed := false
	if n <= lineInline {
		in := hb[off+headerSize : off+headerSize+n]
		if payload != src.Add(headerSize) {
			// A payload of its own for p (the all-to-all's block), in
			// this rank's memory, which the host sees in place (the
			// hellos are lines only where it does).
			b, err := st.comm.Device().Bytes(payload, n)
			if err != nil {
				return err
			}
			in = b
		}
		packed = packLine(line[:], hdr, in)
	}
	if !packed {
		if n > 0 {
			if err := hcomm.WriteNbi(stop, st.chans[p], dst.Add(headerSize), payload, n); err != nil {
				return err
			}
		}
		copy(line[:], hdr)
	}
	return st.putLine(stop, p, par, flag, line[:])
}

// peerLine is the line in this rank's memory that peer p's hellos of parity
// par arrive in.
func (st *state) peerLine(p int, par uint64) []byte {
	fl := st.lay.flaggedOff(p, par)
	return st.hello.Bytes()[fl : fl+channel.LineSize]
}

// takeFlagged reports whether peer's hello line of parity par has arrived,
// expanding it into the plain slot (where the checks read it) when it has.
func (st *state) takeFlagged(p int, par uint64, flag uint32) bool {
	fl := st.lay.flaggedOff(p, par)
	b := st.hello.Bytes()
	var line [channel.LineData]byte
	if !channel.TakeLine(line[:], b[fl:fl+channel.LineSize], flag) {
		return false
	}
	off := st.lay.helloOff(p, par)
	unpackLine(b[off:off+st.lay.helloSlot], line[:])
	return true
}

// awaitHello waits for peer's hello of parity par: for the hello notify
// when flag is 0, else for the line — polling for the spin bound, then
// sleeping on the hello notify behind a wake word (see above) — until the
// hello is there or the wait fails (the exec timeout, naming where the
// ranks are; a lost peer; stop). op names the collective for the errors.
func (st *state) awaitHello(stop <-chan struct{}, p int, par uint64, flag uint32, op opTag) error {
	idx := nHello + int(par)
	if flag == 0 {
		return hcomm.CollectiveNotifyWait(stop, st.chans[p], idx, 0, op.kind.String(), op.seq, op.algo.String())
	}
	take := func() bool { return st.takeFlagged(p, par, flag) }
	if st.chans[p].Transport() == hcomm.TransportInproc {
		if spin.Until(spin.Default, take) {
			return nil
		}
	} else if spin.UntilYield(spin.Default, take) { // the peer may need this core
		return nil
	}
	me := st.comm.Rank()
	wake := st.peerBuf[p].Add(st.lay.flaggedOff(me, par) + llWake)
	// A peer may send its hello and close its end of the channel before
	// this rank looks (it destroyed its communicator once its stream was
	// done): a failure on the channel is the wait's only when the hello
	// is not there either.
	failed := func(err error) error {
		if take() {
			return nil
		}
		return err
	}
	for {
		if take() {
			return nil
		}
		// A record left by a wake this rank did not need; an error is the
		// peer's loss or end (a broken notify), named.
		if _, err := hcomm.ChannelNotifyTryWait(st.chans[p], idx); err != nil {
			return failed(err)
		}
		// The wake word's data is immaterial (this rank's first hello
		// slot); its flag says which hello this rank sleeps for.
		if err := hcomm.WriteFlaggedNbi(stop, st.chans[p], wake, st.buf.Add(st.lay.helloOff(me, 0)), 4, flag); err != nil {
			return failed(err)
		}
		channel.Fence() // the wake word visible before the line is looked at
		if take() {
			return nil
		}
		if err := hcomm.CollectiveNotifyWait(stop, st.chans[p], idx, 0, op.kind.String(), op.seq, op.algo.String()); err != nil {
			return failed(err)
		}
	}
}

// opTag names a collective in a wait's errors.
type opTag struct {
	kind kind
	seq  uint64
	algo Algorithm
}
