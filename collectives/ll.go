package collectives

import (
	"errors"
	"os"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/internal/spin"
)

// The low-latency hello. Between two ranks whose channel stores into the
// peer's memory itself (inproc, shm: channel.FlagWriter), in a communicator
// of at most helloFullMax ranks, a hello travels as flagged words in the
// spirit of NCCL's LL protocol: the sender copies the inline payload into
// the peer's hello slot, then stores its 56-byte header there as 14 words of
// 4 data bytes and a 4-byte flag, each word one atomic store; the receiver
// polls the words in its own memory (channel.TakeFlagged; the words lie in
// flagged slots after the hello slots, layout.flaggedOff) and has the header
// — and, since the payload was stored before it, the payload — as soon as
// every word carries the flag. No notify is recorded and none is waited for:
// a hand-off is the words' two cache lines.
//
// The flag is the pair's hello count plus one (never 0, which zeroed memory
// holds), the same number on both sides: the two ranks of a pair count
// their hellos alike, and a slot is reused every second hello (its parity),
// so words left from the hello two before never pass for the current one.
//
// A receiver that has polled for its spin bound without seeing the words
// sleeps on the hello notify instead, and must be woken. Before it sleeps it
// stores a wake word — flagged with the hello it waits for — into the
// sender's memory (beside the flagged words of its own hellos to it); a sender checks that word after storing its hello and
// records the notify only when it finds it. The two sides store first and
// load second (sequentially consistent atomics), so either the receiver sees
// the hello before it sleeps or the sender sees the wake word: no wake is
// lost, and a rank that answers in time pays no notify. A record the
// receiver did not need (it saw the words after storing its wake word) is
// cleared before its next sleep on that notify; until then it can only wake
// a flagged wait early, which looks at the words again.
//
// Whether a pair uses it depends only on the pair (the transport between
// them, the rank count, the memory being mapped), never on the call, so the
// two sides always agree and the handshake's mismatch check is unchanged.
// It is off unless HCOMM_LL=1: measured here (BENCHMARKS.md, stop 13) it
// gains nothing at 2 ranks and loses a quarter with 4 processes on 2 cores
// against the write and the notify, whose record and wait are already one
// cache line each on these transports; it stays for the machines and the
// rank counts where a notify costs more, and to measure one against the
// other.

// llSlot is the bytes of a flagged slot: the header's flagged words (112),
// the wake word (8), rounded to two cache lines.
const llSlot = 128

// llWake is where in a flagged slot the wake word lies.
const llWake = 2 * headerSize

// envLL reads HCOMM_LL: on for "1" or "on", else off.
func envLL() bool {
	v := os.Getenv("HCOMM_LL")
	return v == "1" || v == "on"
}

// flagged reports whether the hellos with peer travel as flagged words.
func (st *state) flagged(peer int) bool {
	return st.ll && st.comm.Size() <= helloFullMax && st.chans[peer].Flagged()
}

// helloFlag is the flag of the pair's hello number count (counted from
// 0) when the pair's hellos are flagged, else 0 (a write with a notify).
func (st *state) helloFlag(peer int, count uint64) uint32 {
	if !st.flagged(peer) {
		return 0
	}
	return uint32(count%(1<<32-1)) + 1
}

// sendHello writes this rank's hello — a header at src and n bytes of
// payload at payload (src+headerSize when it follows the header, another
// place for a payload of its own per peer) — into peer's slot of parity par:
// as flagged words (flag) when the pair's hellos are flagged, else as a
// write with the hello notify.
func (s *sched) sendHello(stop <-chan struct{}, p int, par uint64, flag uint32, src, payload device.Ptr, n int64) error {
	st := s.st
	dst := s.peerSlot(p, st.lay.helloOff(st.comm.Rank(), par))
	if flag == 0 && (n == 0 || payload == src.Add(headerSize)) {
		return hcomm.WriteWithNotifyNbi(stop, st.chans[p], dst, src, headerSize+n, nHello+int(par))
	}
	if flag == 0 {
		// The header from this rank's slot, the payload from elsewhere (the
		// all-to-all's block for p): one gathered write (tcp: one frame).
		segs := [2]hcomm.Segment{{Src: src, N: headerSize}, {Src: payload, N: n}}
		return hcomm.WriteVWithNotifyNbi(stop, st.chans[p], dst, segs[:], nHello+int(par))
	}
	if n > 0 {
		if err := hcomm.WriteNbi(stop, st.chans[p], dst.Add(headerSize), payload, n); err != nil {
			return err
		}
	}
	me := st.comm.Rank()
	if err := hcomm.WriteFlaggedNbi(stop, st.chans[p], s.peerSlot(p, st.lay.flaggedOff(me, par)), src, headerSize, flag); err != nil {
		return err
	}
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

// takeFlagged reports whether peer's flagged hello of parity par has
// arrived, copying its header into the plain part of the slot (where the
// checks read it) when it has.
func (st *state) takeFlagged(p int, par uint64, flag uint32) bool {
	off, fl := st.lay.helloOff(p, par), st.lay.flaggedOff(p, par)
	b := st.hello.Bytes()
	return channel.TakeFlagged(b[off:off+headerSize], b[fl:fl+2*headerSize], flag)
}

// awaitHello waits for peer's hello of parity par: for the hello notify
// when flag is 0, else for the flagged words — polling for the spin bound,
// then sleeping on the hello notify behind a wake word (see above) — until
// the hello is there or the wait fails (the exec timeout, naming where the
// ranks are; a lost peer; stop). op names the collective for the errors.
func (s *sched) awaitHello(stop <-chan struct{}, p int, par uint64, flag uint32, op opTag) error {
	st := s.st
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
	wake := s.peerSlot(p, st.lay.flaggedOff(me, par)+llWake)
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
		if err := hcomm.WriteFlaggedNbi(stop, st.chans[p], wake, s.mySlot(st.lay.helloOff(me, 0)), 4, flag); err != nil {
			return failed(err)
		}
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
