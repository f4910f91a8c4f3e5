package collectives

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"sync/atomic"

	"github.com/hcomm-dev/hcomm/channel"
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

// lentWrites counts the lent writes run, lentReads the lent reads,
// lentPushes the pieces pushed (lendPush), and openLoans the registrations
// not yet taken back: a test's witnesses that the lent paths were taken
// and left nothing registered.
var lentWrites, lentReads, lentPushes, openLoans atomic.Int64

// loan is one call's lending of this rank's receive buffer (to the pairs
// that write lent) and send buffer (to the pairs that read lent), and what
// it learns of the peers'.
type loan struct {
	recv      device.Ptr
	send      device.Ptr         // this rank's send buffer, which the pairs that read take their data from
	disp      []int64            // this rank's receive displacements (elements), carried in its hello; nil: none
	sdisp     []int64            // this rank's send displacements (elements), carried after disp; nil: none
	lends     []bool             // by rank: the pair's channel takes lent writes
	reads     []bool             // by rank: the pair's channel reads lent memory (shm through the kernel)
	pushes    []bool             // by rank: the pair writes into lent memory through the peer's memory file (shm: lendPush)
	copies    []bool             // by rank: a lent write is a memory copy (inproc), not a socket's
	any       bool               // some pair lends, reads or pushes
	at        []device.Ptr       // by rank: the peer's receive buffer, from its hello
	from      []device.Ptr       // by rank: the peer's send buffer, from its hello
	their     []int64            // by rank: the peer's displacement for this rank's data, from its hello (with disp)
	theirSend []int64            // by rank: the peer's send displacement for this rank (with sdisp)
	file      device.FileRef     // where send lies in its memory file (FD -1: nowhere), for the pairs that read; recv, for those that push
	files     []channel.PeerFile // by rank: where the peer's send buffer (recv, pushing) lies in its memory file, from its hello
	k         []uint64           // by rank: the gather slot whose nDone this rank's write or read records
	least     int64              // the least data a pair that reads lent memory reads so (readLeast)
	piecesTo  []int64            // lent pipes, by rank: the pieces of the call this rank sends it (setPieces)
	piecesOf  []int64            // lent pipes, by rank: the pieces of the call it sends this rank
	sentTo    []int64            // lent pipes, by rank: pieces of the call written to it so far
	recvFrom  []int64            // lent pipes, by rank: pieces of the call received from it so far
	window    int64              // lent pipes: how many pieces a pipe may have unacknowledged (lentWindow or lentWideWindow)
}

// lendWay is which way a call's pairs move the data of a loan.
type lendWay uint8

const (
	// lendWrite: a pair whose channel takes lent writes (tcp, inproc)
	// writes into the receiver's loan; one that reads lent memory (shm)
	// reads the sender's.
	lendWrite lendWay = iota
	// lendRead: a pair that reads lent memory reads, in process too.
	lendRead
	// lendPush: a pair that reads lent memory between processes (shm)
	// writes into the receiver's loan instead, through its memory file
	// (hcomm.WritePeerLentNbi: the all-gather's large inputs, shmPushMin);
	// in process, lent writes as with lendWrite.
	lendPush
)

// wayOf is lendRead when reads is set, else lendWrite.
func wayOf(reads bool) lendWay {
	if reads {
		return lendRead
	}
	return lendWrite
}

// lend sets up the loan of recv (n bytes) and send for the call: the pairs
// that lend, read and push (their channels are set up: need), and recv's
// registration when any pair lends. disp and sdisp, when not nil, are this
// rank's receive and send displacements, which its hello carries so that
// each peer finds its place (AlltoAllV). Every rank of a call that may lend
// calls it and openLoan.
//
// A pair whose channel both takes lent writes and reads lent memory (inproc)
// writes, unless way is lendRead: then it reads (the broadcast; the
// all-gather and all-to-all below inprocPullMax), and nothing is
// registered. With lendPush, a pair whose channel writes lent memory (shm)
// pushes, and nothing is registered for it: the hello carries where recv
// lies in its memory file instead of where send does.
func (s *sched) lend(recv device.Ptr, n int64, disp []int64, send device.Ptr, sdisp []int64, way lendWay) *loan {
	size := s.st.comm.Size()
	ln := &loan{recv: recv, send: send, disp: disp, sdisp: sdisp, lends: make([]bool, size), reads: make([]bool, size),
		pushes: make([]bool, size), copies: make([]bool, size), at: make([]device.Ptr, size), from: make([]device.Ptr, size),
		k: make([]uint64, size), files: make([]channel.PeerFile, size), least: readLeast(size, s.st.allInproc)}
	if disp != nil {
		ln.their = make([]int64, size)
	}
	if sdisp != nil {
		ln.theirSend = make([]int64, size)
	}
	lends, reading, pushing := false, false, false
	for _, p := range s.others() {
		ch := s.st.chans[p]
		ln.copies[p] = ch != nil && ch.Transport() == hcomm.TransportInproc
		switch {
		case ch == nil:
		case way == lendRead && ch.ReadsLent():
			ln.reads[p], ln.any, reading = true, true, true
		case way == lendPush && ch.WritesPeerLent():
			ln.pushes[p], ln.any, pushing = true, true, true
		case ch.TakesLent():
			ln.lends[p], ln.any, lends = true, true, true
		case way != lendPush && ch.ReadsLent():
			ln.reads[p], ln.any, reading = true, true, true
		}
	}
	ln.file.FD = -1
	// Only the pairs that read or push use it (tcp and in-process writes
	// do not): where the buffer they reach lies in its memory file.
	at := send
	if pushing {
		at = recv
	}
	if (reading || pushing) && at != 0 {
		if f, err := s.st.comm.Device().FileOf(at, 1); err == nil {
			ln.file = f
		}
	}
	if !lends || n <= 0 || !s.ok() {
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

// loanWords is how many words of a hello come before the displacements:
// the receive and send buffers' addresses, and where send lies in its
// memory file (descriptor, inode, offset).
const loanWords = 5

// words returns what this rank's hello carries for the loan when some pair
// lends, reads or pushes: the receive and send buffers' addresses, where
// send (recv, pushing) lies in its memory file, then the receive and the
// send displacements.
func (ln *loan) words() []uint64 {
	if ln == nil || !ln.any {
		return nil
	}
	lw := loanWordsOf(ln.recv, ln.send, ln.file)
	w := lw[:]
	for _, d := range ln.disp {
		w = append(w, uint64(d))
	}
	for _, d := range ln.sdisp {
		w = append(w, uint64(d))
	}
	return w
}

// learn takes peer p's receive and send buffer addresses, and its
// displacements for this rank, from the part of its hello after the
// counts. A pair that lends or reads does so on both ends, so the peer's
// hello carries them. A peer is not trusted with them, but need not be:
// this rank writes where they say and the peer's end checks the write
// against what the peer registered (tcp, inproc), or reads where they say
// and the kernel checks the range against the peer's mappings (shm).
func (ln *loan) learn(me int) func(p int, rest []byte) error {
	return func(p int, rest []byte) error {
		if !ln.takes(p) && !(ln != nil && (ln.reads[p] || ln.pushes[p])) {
			return nil
		}
		need := 8*loanWords + 8*len(ln.their) + 8*len(ln.theirSend)
		if len(rest) < need {
			return fmt.Errorf("rank %d's hello carries %d bytes of buffer addresses and displacements, want %d (their channel lends)", p, len(rest), need)
		}
		// A null address (a rank that sends or receives nothing may pass
		// none) fails only a write or read of some bytes.
		ln.at[p], ln.from[p], ln.files[p] = loanOf(rest)
		rest = rest[8*loanWords:]
		var err error
		if ln.their != nil {
			if ln.their[p], err = loanDisp(rest, me, p, "displacement"); err != nil {
				return err
			}
		}
		if ln.theirSend != nil {
			ln.theirSend[p], err = loanDisp(rest[8*len(ln.their):], me, p, "send displacement")
		}
		return err
	}
}

// loanWordsOf is the loan's words a hello carries (loan.words, before the
// displacements): the receive and send buffers' addresses, and where send
// lies in its memory file.
func loanWordsOf(recv, send device.Ptr, file device.FileRef) [loanWords]uint64 {
	return [loanWords]uint64{uint64(recv), uint64(send), uint64(int64(file.FD)), file.Ino, uint64(file.Off)}
}

// loanOf reads loanWordsOf's words back from a peer's hello (at least
// 8*loanWords bytes). The file is a hint the peer's channel end checks
// (channel/shm): a wrong one falls back to the kernel's copy.
func loanOf(b []byte) (recv, send device.Ptr, file channel.PeerFile) {
	le := binary.LittleEndian
	return device.Ptr(le.Uint64(b)), device.Ptr(le.Uint64(b[8:])),
		channel.PeerFile{FD: int64(le.Uint64(b[16:])), Ino: le.Uint64(b[24:]), Off: int64(le.Uint64(b[32:]))}
}

// loanDisp reads peer p's displacement (what names it) for rank me from a
// hello's table of one per rank, refusing a negative one.
func loanDisp(table []byte, me, p int, what string) (int64, error) {
	d := int64(binary.LittleEndian.Uint64(table[8*me:]))
	if d < 0 {
		return 0, fmt.Errorf("rank %d's hello gives rank %d the %s %d", p, me, what, d)
	}
	return d, nil
}

// takes reports whether the pair with p lends.
func (ln *loan) takes(p int) bool { return ln != nil && ln.lends[p] }

// fits reports whether n bytes between this rank and p are written lent:
// the pair lends, and n is at most lentMax, or the lent write is a memory
// copy (inproc: any size, see lentCopy); or the pair pushes (any size).
func (ln *loan) fits(p int, n int64) bool {
	return ln.takes(p) && (n <= lentMax || ln.copies[p]) || ln != nil && ln.pushes[p]
}

// writesAll reports whether every peer in peers takes the n bytes this rank
// sends it by a lent write or a push (fits): then one task writes them all
// (writeLentAll). Where some pair does neither (a pair of processes whose
// kernel refuses it), the pairs go one by one (pairwise), that one through
// the pipes; both ends of a pair decide alike.
func (ln *loan) writesAll(peers []int, n int64) bool {
	for _, p := range peers {
		if !ln.fits(p, n) {
			return false
		}
	}
	return true
}

// pushPairwise, when a test sets it, makes the pushing all-gather go pair
// by pair (pairwise), as it does where some pair neither pushes nor takes
// lent writes.
var pushPairwise bool

// readFits reports whether the n bytes one end of the pair with p sends
// the other are read lent, from the sender's send buffer by the receiver:
// the pair reads lent memory and n is at least ln.least, or the read is a
// memory copy (inproc: any size). Both ends decide alike.
func (ln *loan) readFits(p int, n int64) bool {
	return ln != nil && ln.reads[p] && (n >= ln.least || ln.copies[p])
}

// openLoan takes this call's turn in the gather slots: this rank's own,
// whose nDone the peers record that write into the loan (those whose
// in(p) bytes fit: ln.fits, as the writer decides) or read from it (out(p)
// bytes: ln.readFits), and its count of every peer's. in or out nil: no
// such pair.
func (s *sched) openLoan(ln *loan, in, out func(p int) int64) {
	var recorders []int
	for _, p := range s.others() {
		if in != nil && ln.fits(p, in(p)) || out != nil && ln.readFits(p, out(p)) {
			recorders = append(recorders, p)
		}
	}
	s.claimGather(recorders)
	for _, p := range s.others() {
		ln.k[p] = s.nextGather(p)
	}
}

// readLent reads n bytes of peer's send buffer (from its displacement for
// this rank on, times es, when the loan carries send displacements) into
// dst, and then records the peer's nDone: one task, the address the peer's
// hello's, known when the task runs. The peer's collective ends once every
// reader has recorded (drainGathers), so its send buffer stays as it was
// until then.
func (s *sched) readLent(ln *loan, peer int, es int64, dst device.Ptr, n int64) {
	ch := s.ch(peer)
	// A read and a record, neither of which waits for the peer.
	s.launchNow("collective lent read", n, func(stop <-chan struct{}) error {
		if n > 0 {
			var off int64
			if ln.theirSend != nil {
				off = ln.theirSend[peer] * es
			}
			if err := s.readPeer(stop, ch, ln, peer, nil, off, dst, n); err != nil {
				return err
			}
		}
		return hcomm.ChannelNotifyRecord(stop, ch, nDone+int(ln.k[peer]))
	})
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
// other reads of a piece find it in the cache (the all-gather in process
// and, pushing, between processes of a host; peer after peer, the whole
// input would come from memory once a peer). A pair that pushes writes
// through the peer's memory file (hcomm.WritePeerLentNbi), the others lent
// (hcomm.WriteLentNbi).
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
	launch := s.launchStop
	if copies := s.st.allInproc; copies { // every write a copy, none waits (tcp's may)
		launch = func(name string, fn func(stop <-chan struct{}) error) {
			s.launchNow(name, int64(len(peers))*n, fn)
		}
	}
	launch("collective lent write", func(stop <-chan struct{}) error {
		lentWrites.Add(1)
		dsts := make([]device.Ptr, len(peers))
		files := make([]channel.PeerFile, len(peers)) // pushing: where dsts[i] lies in p's memory file
		for i, p := range peers {
			if dsts[i] = ln.at[p]; dsts[i] == 0 {
				return fmt.Errorf("collectives: rank %d has no receive buffer address of rank %d", me, p)
			}
			if ln.their != nil {
				dsts[i] = dsts[i].Add(ln.their[p] * es)
			}
			if files[i] = ln.files[p]; files[i].FD >= 0 {
				files[i].Off += int64(dsts[i] - ln.at[p])
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
				idx := -1 // the last piece records
				if lo+m == n {
					idx = nDone + int(ln.k[p])
				}
				var err error
				switch {
				case ln.pushes[p]:
					f := files[i]
					if f.FD >= 0 {
						f.Off += off + lo
					}
					lentPushes.Add(1)
					err = hcomm.WritePeerLentNbi(stop, chs[i], dsts[i].Add(off+lo), src.Add(lo), m, f, idx)
				case idx < 0:
					err = hcomm.WriteLentNbi(stop, chs[i], dsts[i].Add(off+lo), src.Add(lo), m)
				default:
					err = hcomm.WriteLentWithNotifyNbi(stop, chs[i], dsts[i].Add(off+lo), src.Add(lo), m, idx)
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

// readMin is the least data a pair that reads lent memory reads so
// (ln.readFits), from a peer's block or input, among more than 2 ranks of
// more than one process; less goes through the HCCL buffers. A read from a
// peer's memory file mapped here costs a copy and no system call
// (channel/shm): from 16 KiB it beat the one-shot's two copies through a
// hello (preferLent's figures); below, with 4 processes on 2 cores, the
// read lane's two hand-offs a peer (hello, done) lose to the one-shot's one
// (16 KiB: all-to-all 21–24 µs read against 12.6–14.2, all-gather 20–23
// against 9.0).
const readMin = 16 << 10

// pairReadMin is readMin between 2 ranks, and among the ranks of one
// process: there the read lane's reads win from 4 KiB (2 shm processes,
// 16 KiB: all-to-all 1.3–1.5 µs against 3.5–3.6, broadcast of 8 KiB
// 0.9–1.0 against 2.2–2.4; in process a broadcast of 4 KiB 1.0–1.2
// against 2.2–2.5), but the all-gather's one-shot lane holds to 8 KiB
// inputs (4 KiB 1.65–1.74 against 1.9–2.1 read: gatherReadMin). Between
// processes such a read goes through the peer's memory file mapped here
// only from channel/shm's peerFileMin on (4 KiB since stop 47; below, the
// kernel's copy, a system call of some 2 µs): keep the two in step.
const pairReadMin = 4 << 10

// readLeast is the least data a pair that reads lent memory reads so among
// n ranks (allInproc: all in one process). Every rank knows n and
// allInproc alike, so the pairs' two ends and the selector agree.
func readLeast(n int, allInproc bool) int64 {
	if n == 2 || allInproc {
		return pairReadMin
	}
	return readMin
}

// gatherReadMin is the least input the direct all-gather between processes
// of a host reads where it lies (preferLent): readMin, or 8 KiB between 2.
func gatherReadMin(n int) int64 {
	if n == 2 {
		return 2 * pairReadMin
	}
	return readMin
}

// shmPushMin is the least all-gather output (the whole of it, which every
// rank knows alike) that the direct all-gather between processes of a host
// pushes (lendPush): every rank writes its input into every peer's output,
// a piece to every peer before the next piece, through the peers' memory
// files, rather than every rank reading every peer's input. Pushed, an
// input comes from memory once for its n copies; read, once a reader. Where
// the outputs no longer fit in the cache that pays (AMD EPYC 2-core VM,
// stop 43, busbw out of place, launches interleaved, 4 processes): 4 MiB
// 5.6–9.7 GB/s read against 5.7–8.2 pushed, 8 MiB 8.7–10.4 against
// 8.1–9.3, 16 MiB alike (4.5–9.0 against 5.3–9.5), 32 MiB 4.7–5.2 against
// 6.1–9.1, 64 MiB 5.2–6.3 against 4.6–9.4 (medians 5.8 and 7.7, eleven
// launches each); 2 processes, 16 MiB alike, 32 MiB 7.2–7.8 against
// 9.6–11.0, 64 MiB 5.9–6.4 against 7.5–10.0. A var: tests lower it.
var shmPushMin int64 = 32 << 20

// inprocPullMax: between ranks of one process, blocks and inputs below it
// are read by their receivers (the reader copies plainly, its output left
// in its cache: memcopy.Read) rather than written by their senders (a
// streamed copy, and the spread of the all-gather's pieces, which pay from
// there on). 2 ranks in process, 64 KiB: all-gather 12.8–13.1 µs written
// against 8.0–9.7 read, all-to-all 13.5–15.1 against 9.0–11.0; 1 MiB:
// all-gather 69–76 against 78–88 (stop 21, the schedules). Since the read
// lane (laneread.go) the reads win at 1 MiB too (512 KiB blocks and
// inputs, 2 ranks, six launches interleaved: all-to-all 57–66 read against
// 70–129 written, all-gather 56–70 against 64–104; Open MPI 60–79 and
// 55–58).
const inprocPullMax = 1 << 20

// preferLent turns the selector's choice for an all-gather over tcp (or
// among the ranks of one process), up to helloFullMax ranks, with inputs
// larger than a hello carries and up to lentMax (any size in process), into
// the direct schedule, whose lent form writes each rank's input straight to
// its place in every peer's output (one write a peer, no forwarding, no
// staging). Between processes of a host whose pairs read lent memory
// (st.cma), from readMin a peer on, whatever a hello carries, it turns the
// all-gather and the broadcast into the direct schedules and the all-to-all
// into the pairwise one, whose lent forms read every peer's data straight
// from its send buffer: one copy where the one-shot's hello and the
// gather slots take two (2 processes, 64 KiB, Intel Xeon of stop 20:
// all-to-all 9.4–9.6 µs one-shot against 5.3–5.6 read; all-gather 10.5–12.2
// against 5.3–5.4; broadcast 10.5–11.0 against 6.5–6.8, 32 KiB 5.6–5.9
// against 3.8–4.6; 4 processes on 2 cores alike either way).
// st.netLends and st.cma are the same on every rank (every unmapped peer
// is tcp, or not; the configuration), so all ranks choose alike; a pair
// whose channel does neither goes through the pipes within the same
// schedule. A two-level choice (hosts) stays, and so does the broadcast
// over tcp: the root writing to every receiver measured no faster than the
// staged schedules.
func preferLent(k kind, bytes int64, n int, st *state, a Algorithm) Algorithm {
	if a == AlgoHier || n < 2 || n > helloFullMax {
		return a
	}
	if k == kAllReduce && st.directReads() && bytes/int64(n) >= arDirectMin {
		return AlgoDirect // ardirect.go
	}
	if st.cma {
		switch {
		case k == kAllGather && bytes >= gatherReadMin(n), k == kBroadcast && bytes >= readLeast(n, false):
			return AlgoDirect
		}
	}
	if st.allInproc && (k == kBroadcast && bytes >= pairReadMin || k == kAllGather && bytes >= inprocGatherMin(n)) {
		// In one process every receiver reads the root's buffer, or
		// every peer's input below inprocPullMax, the same way (the
		// one-shot at 64 KiB, 2 ranks: all-gather 12.2–13.7 µs).
		return AlgoDirect
	}
	if st.allInproc && k == kAlltoAll && (n <= runtime.NumCPU() && bytes/int64(n) >= inprocPairMin || bytes/int64(n) >= readMin) {
		// In one process, the pairwise all-to-all reads every block
		// where it lies, in the read lane (laneread.go): 2 ranks, 64 KiB
		// 2.9–3.1 µs against the one-shot's 8.7–8.9; 4 ranks on 2 cores
		// (goroutines outnumbering the cores), 64 KiB 17.0–17.8 against
		// 21.9–22.1 and 256 KiB 43–45 against 70, but alike at 16 KiB
		// and behind below.
		return AlgoPairwise
	}
	if st.cma {
		switch {
		case k == kAlltoAll && bytes/int64(n) >= readLeast(n, false):
			return AlgoPairwise
		}
	}
	if k != kAllGather || bytes <= st.lay.inline() {
		return a
	}
	if !st.mapped && st.netLends && bytes <= lentMax || st.mapped && st.lendsDirect(bytes, n) {
		return AlgoDirect
	}
	return a
}

// inprocPairMin is the least block of an all-to-all among ranks of one
// process, each with a core, that the pairwise schedule reads where it lies
// (the read lane) rather than the one-shot lane carrying it in the hellos:
// 2 ranks, 512-byte blocks 1.17–1.33 µs read against 0.98–1.05 in the
// hellos, 1 KiB alike (1.27–1.39 against 1.17–1.69), 2 KiB 1.30–1.50
// against 1.44–1.60, 4 KiB 1.24–1.40 against 1.95–2.38 (stop 25). Since
// the lane's one-shot copies its own block once (stop 46) the hellos win
// to 4 KiB blocks (AMD EPYC VM, stop 47, four launches each: 2 KiB blocks
// 0.51–0.55 µs against 0.65–0.73 read, 4 KiB 0.61–0.71 against 0.70–0.74,
// 8 KiB 0.94–0.99 against 0.72–0.79, 16 KiB 1.65–1.81 against 1.03–1.12;
// Open MPI's 2 processes 0.35–0.36 µs at 2 KiB blocks).
const inprocPairMin = 8 << 10

// inprocGatherMin is the least input of an all-gather among n ranks of one
// process that the direct schedule reads where it lies (the read lane,
// laneread.go) rather than the one-shot lane carrying it in the hellos. 2
// ranks: 2 KiB inputs 1.0–1.2 µs against 1.1–1.3, 8 KiB 1.2–1.5 against
// 2.2–2.6 (stop 25); since the lane's one-shot got leaner the hellos win
// at 2 KiB (AMD EPYC VM, stop 47, three launches each: 0.31–0.37 µs
// against 0.48–0.56 read), 4 KiB alike (0.45–0.54 against 0.50–0.52), 8
// KiB read (0.48–0.57 against 0.80–0.82); 4 ranks on 2 cores, 1 KiB
// 9.0–10.0 against 6.9–7.1, 4 KiB 11.7–12.5 against 10.1–10.3, 8 KiB
// 12.9–13.1 against 14.3–15.7. Every rank of a process sees the same
// NumCPU, so all choose alike.
func inprocGatherMin(n int) int64 {
	if n <= runtime.NumCPU() {
		return 4 << 10
	}
	return 8 << 10
}

// lendsDirect reports whether the direct all-gather of bytes a rank takes
// its lent form (every rank alike): over tcp, among the ranks of one
// process, and among n processes of a host from readLeast on, unless
// HCOMM_SHM_CMA_DISABLE (st.cma).
func (st *state) lendsDirect(bytes int64, n int) bool {
	return !st.mapped || st.allInproc || st.cma && bytes >= readLeast(n, false)
}

// openLent opens a collective among every rank (at most helloFullMax: the
// full handshake) with a hello that carries this rank's receive and send
// buffer addresses, lending recv (n bytes) to the pairs that lend and send
// to the pairs that read; in and out are openLoan's.
func (s *sched) openLent(h header, algo Algorithm, recv device.Ptr, n int64, send device.Ptr, in, out func(p int) int64, way lendWay) *loan {
	ln, ok := s.lendHello(h, algo, recv, n, send, way)
	if ok {
		s.openLoan(ln, in, out)
	}
	return ln
}

// lendHello is openLent without the turn in the gather slots: the loan,
// and the hello that carries it.
func (s *sched) lendHello(h header, algo Algorithm, recv device.Ptr, n int64, send device.Ptr, way lendWay) (*loan, bool) {
	h.algo = algo
	h.flags |= flagLent // a rank that stages instead (another HCOMM_SHM_CMA_DISABLE) fails the check
	s.need(s.others())
	if !s.ok() {
		size := s.st.comm.Size()
		return &loan{lends: make([]bool, size), reads: make([]bool, size), pushes: make([]bool, size)}, false
	}
	ln := s.lend(recv, n, nil, send, nil, way)
	words := ln.words()
	s.hello(h, s.others(), s.countTable(nil, words...), int64(8*len(words)), ln.learn(s.st.comm.Rank()))
	return ln, true
}

// Lent pipes (tcp): the sender writes each piece straight to its place in
// the receiver's lent receive buffer (hcomm.WriteLentWithNotifyNbi)
// instead of its inbox, with a notify of the lent pipes' own: piece j of
// the call records nLentData + j mod the window (loan.window: lentWindow
// or lentWideWindow, below). There is no slot to
// empty, so an acknowledgement only frees a notify for reuse (a notify is a
// flag: two records of one index with no wait between them would
// collapse), and paces the sender: the receiver acknowledges piece j, on
// nLentAck + j mod the window, when the call has a piece a window further
// on, and the sender waits for that before it writes the piece. The last
// window of pieces of a call go unacknowledged and nothing drains at its
// end: the next call's handshake is what frees their indices (the
// collectives of a communicator run one after another on every rank, so
// the receiver sends its next hello once it has waited for every piece,
// and the sender writes nothing before it has that hello, whose loan gives
// the address). Every acknowledgement the receiver records is one the
// sender waits for within the call, so none is left to record once the
// sender's call is over: the sender may destroy its communicator then.
// The pieces are counted per call (loan.sentTo, loan.recvFrom), apart from
// the staged pipes' counters, and both ends of a pair count alike: the
// schedules cut every pair's data into the same pieces (setPieces), and
// both ends decide alike whether a pair lends (ln.takes, from the channel
// they share). A rank forwards a piece from where it landed, its own
// receive buffer. Where a staged piece costs the receiver a copy out of
// its inbox for each piece it receives, a lent one costs none: the socket
// reads it into place.
//
// Against the same pipe acknowledging every piece and draining the last
// two at the end, over tcp loopback on the 2-core VM, launches interleaved
// (BENCHMARKS.md, stop 29): 2 processes, 1 MiB broadcast 141–184 µs
// against 157–193, 512 KiB 78–111 against 86–167, 4 MiB 628–691 against
// 626–1358; 4 processes 1 MiB 427–673 against 461–749, 4 MiB alike. A
// window of four pieces, with the same unacknowledged end, was slower
// then (2 processes 4 MiB 916–1307 µs, 4 processes 1 MiB 659–962): with
// more of a call in the socket at once, each 256 KiB write (whose loopback
// delivery runs the receiving side of tcp inside the sender's system
// call) took 45–80 µs instead of 28–39. It still is on a crowded host,
// but no longer between processes with a core each (lentWideWindow).

// lentWindow is how many pieces a lent pipe may have unacknowledged where
// some host of the communicator is crowded (its ranks' processes outnumber
// its cores: state.crowdedComm), and lentWideWindow where none is. Each
// acknowledgement costs its receiver a write and its sender a read, system
// calls on the sender's critical path; on a crowded host they also pace
// the sender, whose writes would otherwise fill sockets whose readers are
// waiting for a core. Over tcp loopback, 2-core AMD EPYC VM (stop 47, µs,
// launches interleaved with Open MPI's): 2 processes, broadcast of 1 MiB
// 153–164 with 8 against 172–207 with 2 (Open MPI 131–138), of 4 MiB
// 615–633 against 714–750 (Open MPI 571–632); 4 processes on the 2 cores,
// 1 MiB, broadcast 425–668 against 370–425, all-reduce 825–1017 against
// 767–909. The hello's flagWide says which: ranks that disagree about
// crowding (HCOMM_CROWDED set on some) fail the call at once.
const (
	lentWindow     = 2
	lentWideWindow = 8
)

// setPieces tells the loan how many pieces the call moves over each lent
// pair, each way, the same on both ends: bytes in pieces of per.
func (ln *loan) setPieces(bytes, per int64) {
	if ln == nil || per <= 0 {
		return
	}
	n := len(ln.lends)
	ln.piecesTo, ln.piecesOf = make([]int64, n), make([]int64, n)
	ln.sentTo, ln.recvFrom = make([]int64, n), make([]int64, n)
	for p := range n {
		ln.piecesTo[p] = pieces(bytes, per)
		ln.piecesOf[p] = ln.piecesTo[p]
	}
}

// setPairPieces is setPieces for a pair whose two ways differ: this rank
// sends peer out bytes and receives in from it, in pieces of per (the
// peer's call says the same with out and in swapped).
func (ln *loan) setPairPieces(peer int, out, in, per int64) {
	if ln == nil || per <= 0 {
		return
	}
	if ln.piecesTo == nil {
		ln.setPieces(0, per)
	}
	ln.piecesTo[peer], ln.piecesOf[peer] = pieces(out, per), pieces(in, per)
}

// openLentPipes opens a collective whose pieces go by lent pipes where the
// pair lends: it lends recv (n bytes; n 0: this rank receives nothing) and
// says so in its hello, which every rank sends every other (at most
// helloFullMax ranks). Nothing of the gather slots is counted: completion
// is the pipes'.
func (s *sched) openLentPipes(h header, algo Algorithm, recv device.Ptr, n int64) *loan {
	window := int64(lentWindow)
	if !s.st.crowdedComm {
		h.flags |= flagWide
		window = lentWideWindow
	}
	ln, _ := s.lendHello(h, algo, recv, n, 0, lendWrite)
	ln.window = window
	return ln
}

// openPipes opens a collective that moves its data through pipes, lending
// recv (n bytes) for lent pipes where some peers are over tcp, whose
// channels take lent writes (st.netLends; every rank alike): the loan, or
// nil after the plain handshake (memory mapped, or above helloFullMax
// ranks, whose butterfly handshake carries no loan). The broadcast uses it
// (openBroadcast), the tree all-reduce for its broadcast half (4 tcp
// processes on 2 cores, 1 MiB, eight launches interleaved, stop 46:
// 734–899 µs against 797–952 staged; 8 processes 1780–1884 against
// 1918–2430; 256 KiB 254–265 against 270–286; 64 KiB alike), and the
// halving-doubling all-reduce of 2 ranks, whose
// all-gather half it carries (hd.go): there the copy out of the inbox is
// on the critical path, one piece of the half after the other with
// nothing to overlap it. The ring all-reduce's all-gather by lent pipes
// measured no faster than staged over tcp (2 and 4 processes, 1 and 64 MiB: its
// receivers' copies overlap the senders' socket work, and a socket
// reading into a cold destination costs about what the copy out of a warm
// inbox does), and stays staged.
func (s *sched) openPipes(h header, algo Algorithm, recv device.Ptr, n int64) *loan {
	if st := s.st; st.mapped || !st.netLends || s.sparse() {
		s.open(h, algo)
		return nil
	}
	return s.openLentPipes(h, algo, recv, n)
}

// lentPipes counts the pieces sent by lent pipes, and lentAcks the
// acknowledgements their receivers recorded: a test's witnesses.
var lentPipes, lentAcks atomic.Int64

// sendPiece sends n bytes at src to peer: by the lent pipe, to off in the
// peer's receive buffer, when the pair lends (once the piece lentWindow
// before it is acknowledged); through the peer's inbox otherwise.
func (s *sched) sendPiece(ln *loan, peer int, off int64, src device.Ptr, n int64) {
	if !ln.takes(peer) {
		s.pipeSend(peer, src, n)
		return
	}
	j, ok := s.nextLent(ln.sentTo, ln.piecesTo, peer, "sends")
	if !ok {
		return
	}
	if j >= ln.window {
		s.wait(peer, nLentAck+int(j%ln.window)) // piece j − window is in: its notify is free again
	}
	if !s.ok() {
		return
	}
	ch, me := s.ch(peer), s.st.comm.Rank()
	s.launchStop("collective lent pipe", func(stop <-chan struct{}) error {
		dst := ln.at[peer]
		if dst == 0 {
			return fmt.Errorf("collectives: rank %d has no receive buffer address of rank %d", me, peer)
		}
		lentPipes.Add(1)
		return hcomm.WriteLentWithNotifyNbi(stop, ch, dst.Add(off), src, n, nLentData+int(j%ln.window))
	})
}

// recvLent waits for the next piece peer sends by the lent pipe (in place
// in this rank's receive buffer once the wait is over), and acknowledges it
// when the call has a piece lentWindow further on, which waits for that.
func (s *sched) recvLent(ln *loan, peer int) {
	j, ok := s.nextLent(ln.recvFrom, ln.piecesOf, peer, "receives")
	if !ok {
		return
	}
	s.wait(peer, nLentData+int(j%ln.window))
	if j+ln.window < ln.piecesOf[peer] {
		if s.ok() {
			lentAcks.Add(1)
		}
		s.record(peer, nLentAck+int(j%ln.window))
	}
}

// nextLent counts the next piece of the call on the lent pipe with peer
// (counts: ln.sentTo or ln.recvFrom; of: the call's pieces that way,
// ln.piecesTo or ln.piecesOf) and returns its number; false, the schedule
// failed, past the call's last piece (both ends cut the data alike, so only
// a bug gets there).
func (s *sched) nextLent(counts, of []int64, peer int, verb string) (int64, bool) {
	s.jitter()
	j := counts[peer]
	counts[peer]++
	if j >= of[peer] {
		s.do(fmt.Errorf("collectives: rank %d's lent pipe with rank %d %s piece %d of a call of %d", s.st.comm.Rank(), peer, verb, j, of[peer]))
		return 0, false
	}
	return j, true
}

// pairwise moves, for r = 1 … n-1, this rank's data for rank me+r and
// rank me-r's for this one: srcOf(to) gives the source, its element count
// and, for a lent pair, its byte offset in the peer's receive buffer (to
// which the peer's displacement for this rank is added when the loan
// carries displacements); dstOf(from) where the piece from that peer goes
// and its element count. A pair lends when its channel does and the data
// is at most lentMax (the counts agree on both ends, or the hello fails
// the call before any data moves).
// A lent pair's data goes whole by one write (writeLent); a pair that reads
// lent memory reads its data whole from the sender's send buffer (readLent:
// at least readMin bytes, srcOf's source being the send buffer from the
// peer's send displacement for this rank on, or its start); the others'
// piece by piece through the pipes, each piece copied out of the inbox.
func (s *sched) pairwise(ln *loan, es int64, srcOf func(to int) (src device.Ptr, count, off int64), dstOf func(from int) (dst device.Ptr, count int64)) {
	me, n := s.st.comm.Rank(), s.st.comm.Size()
	per := s.piece() / es
	for r := 1; r < n; r++ {
		to, from := mod(me+r, n), mod(me-r, n)
		src, sn, off := srcOf(to)
		dst, rn := dstOf(from)
		lentTo, lentFrom := ln.fits(to, sn*es), ln.fits(from, rn*es)
		// A pair that reads: this rank's data for to is read from send by
		// to; the data from from, this rank reads.
		readTo, readFrom := ln.readFits(to, sn*es), ln.readFits(from, rn*es)
		if lentTo {
			s.writeLent(ln, to, off, es, src, sn*es)
		}
		if readFrom {
			s.readLent(ln, from, es, dst, rn*es)
		}
		for q := int64(0); q < max(pieces(sn, per), pieces(rn, per)); q++ {
			lo := q * per
			if m := min(per, sn-lo); m > 0 && !lentTo && !readTo {
				s.pipeSend(to, src.Add(lo*es), m*es)
			}
			if m := min(per, rn-lo); m > 0 && !lentFrom && !readFrom {
				slot, done := s.pipeRecv(from)
				s.copy(dst.Add(lo*es), slot, m*es)
				done()
			}
		}
	}
}
