package tcp

import (
	"runtime"
	"sync/atomic"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
)

// This file holds steering (channel.Steerer): a receiver that expects one
// write of a known range — a collective's hello, a header and then a block
// that the call copies on into its receive buffer — may ask that the write's
// bytes after the header go straight where the call would copy them. The
// receive engine places every byte itself, so a write it recognises as the
// expected one costs nothing more, and the call saves a copy of the block.
//
// A steer is a slot of the conn's table, owned in turn by the caller that
// armed it and by the receive engine that took it, handed over by atomic
// state changes: the engine writes into the caller's memory only while the
// slot says it may (steerWriting, or steerPeeking for a guessing read), and
// End, which gives the memory back, waits out such a write — a copy, or a
// read that does not block — and makes sure no later one starts.

// maxSteers is how many steers a channel holds armed or in use at once: a
// collective arms one per peer, so one call, or a few on different streams.
// Steer reports false when they are all taken.
const maxSteers = 8

// A steer's states.
const (
	steerFree      uint32 = iota // unused
	steerArming                  // Steer is filling it in
	steerArmed                   // waiting for the write (the receive engine may take it)
	steerTaken                   // a write's payload is coming in through it
	steerWriting                 // the receive engine is storing into to
	steerLanded                  // the write's payload is all in: End reports it
	steerCut                     // the socket failed with the write half in: End frees it
	steerCancelled               // End gave up on it half in: the engine frees it
	steerPeeking                 // the receive engine is looking at it, or reading into to a frame that may be its write (readSteered)
)

// steer is one slot of conn.steers.
type steer struct {
	state atomic.Uint32
	owner *conn
	at, n uint64 // the write steered: exactly n bytes at local address at
	keep  int    // its first keep bytes go to at as usual
	to    []byte // and the n-keep after them here
}

// Steer arms a slot for the next write of exactly n bytes at at, whose bytes
// from keep on are to go to to instead. It reports false when the channel
// has no slot free, is failed, or the arguments do not describe such a
// write of this end's memory: the write then lands at at as any other.
func (c *conn) Steer(at device.Ptr, n, keep int64, to []byte) (channel.Steered, bool) {
	if keep < 0 || keep >= n || int64(len(to)) != n-keep || c.failure() != nil {
		return nil, false
	}
	if _, err := c.local(uint64(at), uint64(n)); err != nil {
		return nil, false
	}
	for i := range c.steers {
		t := &c.steers[i]
		if !t.state.CompareAndSwap(steerFree, steerArming) {
			continue
		}
		t.at, t.n, t.keep, t.to = uint64(at), uint64(n), int(keep), to
		c.nsteer.Add(1)
		t.state.Store(steerArmed)
		return t, true
	}
	return nil, false
}

// End withdraws the steer and reports what became of the write.
func (t *steer) End() channel.SteerResult {
	for {
		switch t.state.Load() {
		case steerArmed:
			if t.state.CompareAndSwap(steerArmed, steerArming) {
				t.owner.nsteer.Add(-1)
				t.release()
				return channel.SteerUnused
			}
		case steerLanded:
			t.release()
			return channel.SteerLanded
		case steerCut:
			t.release()
			return channel.SteerCut
		case steerTaken:
			// The write is still coming in: the caller gives up on it
			// (a failed call). The engine frees the slot when it is done
			// with the frame, and writes nothing more into to.
			if t.state.CompareAndSwap(steerTaken, steerCancelled) {
				return channel.SteerCut
			}
		case steerWriting, steerPeeking:
			runtime.Gosched() // a copy or a read that does not block
		default:
			return channel.SteerUnused // not armed (End twice)
		}
	}
}

// release frees the slot; its caller owns it (Arming, Landed or Cut).
func (t *steer) release() {
	t.to = nil
	t.state.Store(steerFree)
}

// take returns the armed steer for a write of n bytes at at, now the
// receive engine's, or nil. The caller holds the socket's rtok.
func (c *conn) take(at uint64, n int) *steer {
	if c.nsteer.Load() == 0 {
		return nil
	}
	for i := range c.steers {
		// The slot is looked at only once held (steerPeeking), so that an
		// End and a new Steer cannot change it under the look.
		t := &c.steers[i]
		if t.state.Load() != steerArmed || !t.state.CompareAndSwap(steerArmed, steerPeeking) {
			continue
		}
		if t.at == at && t.n == uint64(n) {
			t.state.Store(steerTaken)
			c.nsteer.Add(-1)
			return t
		}
		t.state.Store(steerArmed)
	}
	return nil
}

// hold lets the receive engine store into t.to, until let; false: End gave
// up on t, whose slot the engine then frees, and the rest of the frame is
// dropped.
func (t *steer) hold() bool {
	if t.state.CompareAndSwap(steerTaken, steerWriting) {
		return true
	}
	t.release() // Cancelled: End is gone
	return false
}

// let ends hold.
func (t *steer) let() { t.state.Store(steerTaken) }

// landed marks t's write all in (the receive engine's finish).
func (t *steer) landed() {
	if !t.state.CompareAndSwap(steerTaken, steerLanded) {
		t.release() // Cancelled
	}
}

// cut marks t's write cut short: its socket receives nothing more.
func (t *steer) cut() {
	if !t.state.CompareAndSwap(steerTaken, steerCut) {
		t.release() // Cancelled
	}
}

// put stores b, the bytes of the payload in hand from r.got on, where they
// go: the sink, and past a steer's keep, the steer's memory (a steer
// given up on drops the rest of the frame).
func (r *rx) put(b []byte) {
	t := r.steer
	if t == nil {
		if r.sink != nil {
			copy(r.sink[r.got:], b)
		}
		return
	}
	at := r.got
	if at < t.keep {
		k := copy(r.sink[at:t.keep], b)
		b, at = b[k:], at+k
	}
	if len(b) == 0 {
		return
	}
	if !t.hold() {
		r.steer, r.sink = nil, nil
		return
	}
	copy(t.to[at-t.keep:], b)
	t.let()
}

// peekable returns an armed steer of c, now steerPeeking, for the read the
// receive engine is about to make of s when that read starts a frame into
// an empty buffer (readSteered); nil otherwise.
func (c *conn) peekable(s *sock, direct bool) *steer {
	r := &s.rx
	if direct || r.phase != rxHeader || r.hn != 0 || s.rc == nil || c.nsteer.Load() == 0 {
		return nil
	}
	for i := range c.steers {
		t := &c.steers[i]
		if t.state.CompareAndSwap(steerArmed, steerPeeking) {
			return t
		}
	}
	return nil
}

// readSteered reads s with one readv, guessing that the next frame is t's
// write: the bytes the write puts before its payload (its header, ordering
// vector and padding, and the keep bytes) into the buffer, the payload into
// t.to, and what follows into the buffer after them. When the frame is t's
// write, its payload is then where it goes, copied once, by the kernel:
// the frame's first bytes are applied here, and the payload counted in.
// When it is not, the bytes read into t.to are moved back into the buffer
// after the first, as one read into the buffer would have left them, and t
// is armed again. Either way r.buf[r.pos:r.end] is then what is left to
// apply. It returns the bytes read and the most it asked for; an error of
// its read (n 0), or of applying the frame's first bytes. The caller holds
// s.rtok; t is steerPeeking.
func (c *conn) readSteered(s *sock, t *steer) (n, asked int, err error) {
	r := &s.rx
	vlen := 0
	if len(c.socks) > 1 {
		vlen = 8 * len(c.socks)
	}
	pad := dataPad(vlen, int(t.n))
	hl := headerLen + vlen + pad + t.keep
	// The payload's part read into t.to, and the tail after it, leave
	// room to move the bytes back into the buffer when the guess is wrong.
	tail := min(headerLen+8*maxStreams+directRead, len(r.buf)-hl)
	m := min(len(t.to), len(r.buf)-hl-tail)
	if tail <= 0 || m < directRead/4 {
		t.state.Store(steerArmed)
		n, err = s.readSome(r.buf[:min(len(r.buf), headerLen+8*maxStreams+directRead)])
		r.pos, r.end = 0, n
		return n, headerLen + 8*maxStreams + directRead, err
	}
	asked = hl + m + tail
	n, err = s.readSomeV(r.buf[:hl], t.to[:m], r.buf[hl:hl+tail])
	if n <= hl {
		t.state.Store(steerArmed)
		r.pos, r.end = 0, n
		return n, asked, err
	}
	k := min(n-hl, m)  // payload bytes in t.to
	rest := n - hl - k // bytes after them, at r.buf[hl:]
	h := header(r.buf[:headerLen])
	if h.typ() != frameWrite || h.addr() != t.at || int(h.size()) != vlen || int(h.pad()) != pad || int(h.length()) != vlen+pad+int(t.n) {
		// Another frame: the stream as one read would have left it.
		copy(r.buf[hl+k:hl+k+rest], r.buf[hl:hl+rest])
		copy(r.buf[hl:hl+k], t.to[:k])
		t.state.Store(steerArmed)
		r.pos, r.end = 0, n
		return n, asked, nil
	}
	t.state.Store(steerTaken)
	c.nsteer.Add(-1)
	r.pre = t
	r.pos, r.end = 0, hl
	if _, err = c.consume(s); err != nil {
		if r.steer != t { // not taken by the frame: the socket is done
			r.pre = nil
			t.cut()
		}
		return n, asked, err
	}
	if r.phase != rxBody || r.steer != t || r.got != t.keep {
		// consume stopped short of the payload (it cannot, for a header
		// that checked out above): give the steer up, unapplied.
		if r.steer != t {
			r.pre = nil
			t.cut()
		}
		return n, asked, c.protocolErr(s, h, "a steered write stopped before its payload")
	}
	r.got += k
	r.pos, r.end = hl, hl+rest
	if r.got == r.need {
		err = c.finish(s)
	}
	return n, asked, err
}
