package collectives

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/internal/memcopy"
)

// Loans: a receive buffer written by the peers in place (tcp, in process).
//
// A staged exchange moves each piece twice on the receiving side: the
// socket's bytes land in the receiver's HCCL buffer (a pipe slot), and the
// receiver copies them out into its receive buffer, a piece at a time, each
// piece acknowledged before its slot is written again. Over a transport whose
// receiving end checks every write as it arrives (tcp: channel.ReceiverChecker),
// the receiver can instead lend its receive buffer for the call: it registers
// the buffer (CommMemReg) before its hello goes out, the hello carries the
// buffer's address, and each peer writes its whole block straight to its
// place there (hcomm.WriteLentWithNotifyNbi), the socket reading into it, and
// records the receiver's nDone — the notify a window's reader records to the
// window's owner (window.go), in the same slot counting. The receiver waits
// for every lender's nDone at the collective's end (drainGathers), and only
// then takes the registration back. No pipe slot, no acknowledgement per
// piece, no copy: what Open MPI's tcp transport does for a large message,
// whose bytes it reads into the posted receive buffer.
//
// Whether a pair lends is a property of their channel, which both ends share,
// so both decide alike without a word; a pair whose channel does not (shm)
// stays staged. Between ranks of one process (inproc, whose copies check
// the peer's registry as they run) a lent write is a plain copy into the
// peer's receive buffer: one copy where the pipes take two. Every rank of the call takes its turn in the gather
// slots whichever way its pairs go (openLoan), so that the slot counters stay
// the same on every rank. A peer is not trusted with the address it sends:
// this rank writes where the peer said, and the peer's end checks it against
// what the peer registered. The registration is taken back by a task after
// the collective's drains; a schedule that fails before it leaves the buffer
// registered until the communicator is destroyed (a failed schedule leaves
// the communicator unusable anyway).

// lentWrites counts the lent writes run, and openLoans the registrations
// not yet taken back: a test's witnesses that the lent path was taken and
// left nothing registered.
var lentWrites, openLoans atomic.Int64

// loan is one call's lending of this rank's receive buffer, and what it
// learns of the peers'.
type loan struct {
	recv   device.Ptr
	disp   []int64      // this rank's receive displacements (elements), carried in its hello; nil: none
	lends  []bool       // by rank: the pair's channel takes lent writes
	copies []bool       // by rank: a lent write is a memory copy (inproc), not a socket's
	any    bool         // some pair does
	at     []device.Ptr // by rank: the peer's receive buffer, from its hello
	their  []int64      // by rank: the peer's displacement for this rank's data, from its hello (with disp)
	k      []uint64     // by rank: the gather slot whose nDone this rank's write records
}

// lend sets up the loan of recv (n bytes) for the call: the pairs that lend
// (their channels are set up: need), and recv's registration when any pair
// does. disp, when not nil, are this rank's receive displacements, which
// its hello carries so that each peer finds its place (AlltoAllV). Every
// rank of a call that may lend calls it and openLoan.
func (s *sched) lend(recv device.Ptr, n int64, disp []int64) *loan {
	size := s.st.comm.Size()
	ln := &loan{recv: recv, disp: disp, lends: make([]bool, size), copies: make([]bool, size), at: make([]device.Ptr, size), k: make([]uint64, size)}
	if disp != nil {
		ln.their = make([]int64, size)
	}
	for _, p := range s.others() {
		if ch := s.st.chans[p]; ch != nil && ch.TakesLent() {
			ln.lends[p], ln.any = true, true
			if ch.Transport() == hcomm.TransportInproc {
				ln.copies[p] = true
			}
		}
	}
	if !ln.any || n <= 0 || !s.ok() {
		return ln
	}
	c := s.st.comm
	tag := fmt.Sprintf("%s/lent/%d", chanTag, s.opSeq)
	h, err := c.CommMemReg(tag, recv, n)
	if err != nil {
		s.do(err)
		return ln
	}
	openLoans.Add(1)
	s.atEnd = append(s.atEnd, func(<-chan struct{}) error {
		openLoans.Add(-1)
		return c.CommMemDereg(h)
	})
	return ln
}

// words returns what this rank's hello carries for the loan when some pair
// lends: the receive buffer's address, then the displacements.
func (ln *loan) words() []uint64 {
	if ln == nil || !ln.any {
		return nil
	}
	w := []uint64{uint64(ln.recv)}
	for _, d := range ln.disp {
		w = append(w, uint64(d))
	}
	return w
}

// learn takes peer p's receive buffer address, and its displacement for
// this rank, from the part of its hello after the counts. A peer is not
// trusted with them, but need not be: this rank writes where they say, and
// the peer's end checks the write against what the peer registered.
func (ln *loan) learn(me int) func(p int, rest []byte) error {
	return func(p int, rest []byte) error {
		if !ln.takes(p) {
			return nil
		}
		need := 8
		if ln.their != nil {
			need += 8 * len(ln.their)
		}
		if len(rest) < need {
			return fmt.Errorf("rank %d's hello carries %d bytes of receive buffer address and displacements, want %d (their channel takes lent writes)", p, len(rest), need)
		}
		// A null address (a rank that receives nothing may pass none)
		// fails only a write of some bytes (writeLent).
		ln.at[p] = device.Ptr(binary.LittleEndian.Uint64(rest))
		if ln.their != nil {
			d := int64(binary.LittleEndian.Uint64(rest[8+8*me:]))
			if d < 0 {
				return fmt.Errorf("rank %d's hello gives rank %d the displacement %d", p, me, d)
			}
			ln.their[p] = d
		}
		return nil
	}
}

// takes reports whether the pair with p lends.
func (ln *loan) takes(p int) bool { return ln != nil && ln.lends[p] }

// fits reports whether n bytes between this rank and p go lent: the pair
// lends, and n is at most lentMax, or the lent write is a memory copy
// (inproc: any size, see lentCopy).
func (ln *loan) fits(p int, n int64) bool {
	return ln.takes(p) && (n <= lentMax || ln.copies[p])
}

// openLoan takes this call's turn in the gather slots: this rank's own,
// whose nDone the peers that write into the loan record (those whose
// bytes(p) fit: ln.fits, as the writer decides), and its count of every
// peer's.
func (s *sched) openLoan(ln *loan, bytes func(p int) int64) {
	var writers []int
	for _, p := range s.others() {
		if ln.fits(p, bytes(p)) {
			writers = append(writers, p)
		}
	}
	s.claimGather(writers)
	for _, p := range s.others() {
		ln.k[p] = s.nextGather(p)
	}
}

// writeLent writes n bytes at src into peer's receive buffer, off bytes in
// (plus, with displacements, the peer's displacement for this rank times
// es), and records the peer's nDone, in one task: the address is the peer's
// hello's, known when the task runs.
func (s *sched) writeLent(ln *loan, peer int, off, es int64, src device.Ptr, n int64) {
	s.writeLentAll(ln, []int{peer}, off, es, src, n, src)
}

// writeLentAll is writeLent of one input to every peer in peers, in one
// task, and, when own is not src, this rank's own copy of it into own
// (streamed: an output): piece by piece, each piece written to every place
// before the next, so that the input is read from memory once and the
// other reads of a piece find it in the cache (the in-process all-gather;
// peer after peer, the whole input would come from memory once a peer).
func (s *sched) writeLentAll(ln *loan, peers []int, off, es int64, src device.Ptr, n int64, own device.Ptr) {
	if n == 0 {
		for _, p := range peers {
			s.record(p, nDone+int(ln.k[p]))
		}
		return
	}
	chs := make([]*hcomm.Channel, len(peers))
	for i, p := range peers {
		chs[i] = s.ch(p)
	}
	dev, me := s.st.comm.Device(), s.st.comm.Rank()
	// In pieces of at most 256 KiB, one after the other: tcp splits a
	// longer write over its sockets with a goroutine each, which measured
	// slower and twice as variable here (2 ranks, 1 MiB all-gather: 187–241
	// µs against 179–348).
	per := min(s.piece(), 256<<10)
	s.launchStop("collective lent write", func(stop <-chan struct{}) error {
		lentWrites.Add(1)
		dsts := make([]device.Ptr, len(peers))
		for i, p := range peers {
			if dsts[i] = ln.at[p]; dsts[i] == 0 {
				return fmt.Errorf("collectives: rank %d has no receive buffer address of rank %d", me, p)
			}
			if ln.their != nil {
				dsts[i] = dsts[i].Add(ln.their[p] * es)
			}
		}
		var from, mine []byte
		if own != src {
			var err error
			if from, err = dev.Bytes(src, n); err != nil {
				return err
			}
			if mine, err = dev.Bytes(own, n); err != nil {
				return err
			}
		}
		for lo := int64(0); lo < n; lo += per {
			m := min(per, n-lo)
			if mine != nil {
				memcopy.Stream(mine[lo:lo+m], from[lo:lo+m])
			}
			for i, p := range peers {
				var err error
				if lo+m < n {
					err = hcomm.WriteLentNbi(stop, chs[i], dsts[i].Add(off+lo), src.Add(lo), m)
				} else {
					err = hcomm.WriteLentWithNotifyNbi(stop, chs[i], dsts[i].Add(off+lo), src.Add(lo), m, nDone+int(ln.k[p]))
				}
				if err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// lentMax bounds the bytes one lent write carries (an all-to-all block,
// an all-gather input). Measured over tcp here (BENCHMARKS.md, stop 16),
// 2 and 4 ranks: blocks of 64 KiB to 512 KiB ran 1.3–1.7× faster lent
// than staged, 1 MiB blocks about the same, 2 MiB blocks 10–30 % slower
// (the pipes keep both directions' pieces going at once).
const lentMax = 512 << 10

// lentCopy: between ranks of one process a lent write is a memory copy, of
// any size, streamed past the cache (channel.StreamWriter): the peer's
// receive buffer is the collective's output. Measured here, 4 ranks in one
// process, 64 MiB (16 MiB blocks and inputs), busbw, three runs each:
// all-to-all 1.96–2.12 GB/s staged against 3.55–3.58 lent (at
// BenchmarkAlltoAllFloor, the copies alone), all-gather 2.76–3.36 against
// 3.46–4.08; 2 ranks, 16 MiB all-gather 2.66–4.72 against 10.6–11.0. Before
// the lent copy streamed it was bounded at 4 MiB: a plain copy reads every
// destination line before it writes it, and one such copy measured no
// faster than the pipes' two from 16 MiB blocks up (17–22 ms against
// 18–19), the pipes' second pass reading its slot from the cache.

// preferLent turns the selector's choice for an all-gather over tcp (or
// among the ranks of one process), up to helloFullMax ranks, with inputs
// larger than a hello carries and up to lentMax (any size in process),
// into the direct schedule, whose lent form writes each rank's
// input straight to its place in every peer's output (one write a peer, no
// forwarding, no staging). st.netLends is the same on every rank (every
// unmapped peer is tcp, or not), so all ranks choose alike; a pair whose
// channel does not lend (shm between ranks of one host) goes through the
// pipes within the same schedule. A two-level choice (hosts) stays, and so
// does the broadcast: the root
// writing to every receiver measured no faster than the staged schedules.
func preferLent(k kind, bytes int64, n int, st *state, a Algorithm) Algorithm {
	if k != kAllGather || a == AlgoHier || n < 2 || n > helloFullMax || bytes <= st.lay.inline() {
		return a
	}
	if !st.mapped && st.netLends && bytes <= lentMax || st.allInproc {
		return AlgoDirect
	}
	return a
}

// lendsDirect reports whether the direct all-gather takes
// its lent form (every rank alike): over tcp, or among the ranks of one
// process.
func (st *state) lendsDirect() bool {
	return !st.mapped || st.allInproc
}

// openLent opens a collective among every rank (at most helloFullMax: the
// full handshake) with a hello that carries this rank's receive buffer
// address, lending recv (n bytes) to the pairs that lend; bytes is
// openLoan's.
func (s *sched) openLent(h header, algo Algorithm, recv device.Ptr, n int64, bytes func(p int) int64) *loan {
	h.algo = algo
	s.need(s.others())
	if !s.ok() {
		return &loan{lends: make([]bool, s.st.comm.Size())}
	}
	ln := s.lend(recv, n, nil)
	words := ln.words()
	s.hello(h, s.others(), s.countTable(nil, words...), int64(8*len(words)), ln.learn(s.st.comm.Rank()))
	s.openLoan(ln, bytes)
	return ln
}

// pairwise moves, for r = 1 … n-1, this rank's data for rank me+r and
// rank me-r's for this one: srcOf(to) gives the source, its element count
// and, for a lent pair, its byte offset in the peer's receive buffer (to
// which the peer's displacement for this rank is added when the loan
// carries displacements); dstOf(from) where the piece from that peer goes
// and its element count. A pair lends when its channel does and the data
// is at most lentMax (the counts agree on both ends, or the hello fails
// the call before any data moves).
// A lent pair's data goes whole by one write (writeLent); the others' piece
// by piece through the pipes, each piece copied out of the inbox.
func (s *sched) pairwise(ln *loan, es int64, srcOf func(to int) (src device.Ptr, count, off int64), dstOf func(from int) (dst device.Ptr, count int64)) {
	me, n := s.st.comm.Rank(), s.st.comm.Size()
	per := s.piece() / es
	for r := 1; r < n; r++ {
		to, from := mod(me+r, n), mod(me-r, n)
		src, sn, off := srcOf(to)
		dst, rn := dstOf(from)
		lentTo, lentFrom := ln.fits(to, sn*es), ln.fits(from, rn*es)
		if lentTo {
			s.writeLent(ln, to, off, es, src, sn*es)
		}
		for q := int64(0); q < max(pieces(sn, per), pieces(rn, per)); q++ {
			lo := q * per
			if m := min(per, sn-lo); m > 0 && !lentTo {
				s.pipeSend(to, src.Add(lo*es), m*es)
			}
			if m := min(per, rn-lo); m > 0 && !lentFrom {
				slot, done := s.pipeRecv(from)
				s.copy(dst.Add(lo*es), slot, m*es)
				done()
			}
		}
	}
}
