package collectives

import (
	"encoding/binary"
	"fmt"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// The read lane: the lane (lane.go) for the calls whose schedule reads
// every peer's data straight from its send buffer (lent.go) — the direct
// all-gather, the pairwise all-to-all and the direct broadcast (every rank
// reads the root's buffer) between ranks of one process, or of one host
// whose kernel lets them read each other's memory. Their
// schedule is a hello carrying the loan (this rank's buffer addresses),
// this rank's own copy, one read and one done record per peer, and a wait
// for every peer's done: a dozen stream tasks, the loan's and the gather
// slots' bookkeeping, a count table copied by the stream. At 64 KiB
// between 2 ranks that machinery was most of the call. The read lane does
// the same in its caller's goroutine, as the stream's next task: it posts
// the hello (the same bytes: the header naming the same algorithm, the
// loan's words where the schedule's count table puts them), polls for the
// peers', checks them and learns their addresses, copies its own part,
// reads each peer's and records its done, and polls for the peers' dones.
// What the polls do not see within their bound is left to a queued task,
// as the lane does with its hellos. The gather slots' counters advance as
// openLoan's do, so a rank in the read lane and a rank in the schedule meet
// as two schedules would.

// readCall is what a call of the read lane keeps (a laneCall's, x.rd).
type readCall struct {
	send, recv device.Ptr
	es         int64 // bytes per element
	dn         int64 // bytes each rank reads of each peer's (and copies of its own)
	own        []byte
	table      []byte // the hello's payload (x.in)
	from       [helloFullMax]device.Ptr
	files      [helloFullMax]channel.PeerFile
	theirSend  [helloFullMax]int64 // the peer's send displacement for this rank (elements; the all-to-all's)
	k          [helloFullMax]uint64
	kMine      uint64 // this rank's gather slot, whose nDone every peer records once it has read
	read       bool   // finishRead ran: only the peers' dones remain
	dones      int    // peers (st.others) whose done has arrived
	pieces     uint64 // the broadcast's: the root's gather slots it counts (broadcastDirect)
	// fileOf caches where send lies in its memory file (device.FileOf)
	// while the allocations are as they were.
	fileOf  device.Ptr
	fileEp  uint64
	fileRef device.FileRef
	fileOK  bool
}

// readFits reports whether the schedule issue runs for a call of kind k,
// sel bytes and algorithm algo reads every peer's data where it lies, as
// the read lane does: the direct all-gather, the pairwise all-to-all and
// the direct broadcast whose every pair reads lent memory (loan.readFits,
// decided as lend and the schedules decide it).
func (st *state) readFits(k kind, sel int64, algo Algorithm) bool {
	size := int64(st.comm.Size())
	least := readLeast(int(size), st.allInproc)
	var block int64
	var pull bool
	switch {
	case k == kAllGather && algo == AlgoDirect:
		block = sel
		if !st.lendsDirect(block, int(size)) {
			return false
		}
		pull = st.allInproc && block < inprocPullMax
	case k == kAlltoAll && algo == AlgoPairwise:
		if 8*(3*size+loanWords) > st.lay.inline() { // the counts, the loan's words, the displacements
			return false
		}
		block = sel / size
		pull = st.allInproc && block < inprocPullMax
	case k == kBroadcast && algo == AlgoDirect:
		block, pull = sel, true // every pair that can read does (Broadcast)
		if !(st.cma || st.allInproc) || block < least || block > laneBroadcastMax {
			return false
		}
	default:
		return false
	}
	if block > laneReadMax || st.crowded && block > laneCrowdedMax {
		return false
	}
	for _, p := range st.others {
		ch := st.chans[p]
		reads := pull && ch.ReadsLent() || !ch.TakesLent() && ch.ReadsLent() // lend's choice
		if !reads || block < least && ch.Transport() != hcomm.TransportInproc {
			return false
		}
	}
	return true
}

// laneReadMax bounds the bytes the read lane reads of a peer: its call
// runs in its caller's goroutine when the stream is idle, and a larger
// read is better left to the stream, whose caller meanwhile issues what
// comes next.
const laneReadMax = 512 << 10

// laneCrowdedMax is laneReadMax where the ranks of the host outnumber its
// cores: a caller reading a peer's large block holds a core the others
// need. 4 shm processes on 2 cores, 1 MiB (256 KiB blocks): all-to-all
// 173–276 µs in the lane against 174–231 queued, all-gather 134–213
// against 124–215; at 64 KiB the lane leads (all-to-all 17.2–19.6 against
// 25.2–27.3).
const laneCrowdedMax = 64 << 10

// laneBroadcastMax bounds the broadcasts the read lane takes: beyond it,
// the root's caller, free to issue its next call while its stream waits for
// the readers, measured as fast or faster (2 ranks in process: 64 KiB 2.8–2.9
// µs in the lane against 5.5–5.7 queued, 128 KiB 4.6–9.9 against 6.4–7.5,
// 256 KiB 10.0–21.2 against 10.5–15.0).
const laneBroadcastMax = 64 << 10

// readArgs sets up x, a call of the read lane with algorithm algo, n bytes
// read from each peer (in: this rank's send, as checked): the header, the
// hello's payload, this rank's turn in the gather slots.
func (x *laneCall) readArgs(algo Algorithm, send, recv device.Ptr, in []byte, n int64) {
	st := x.st
	me, size := st.comm.Rank(), st.comm.Size()
	x.algo, x.algoName = algo, algo.String()
	x.send, x.recv, x.dn, x.es = send, recv, n, int64(x.h.dt.Size())
	x.read, x.dones = false, 0
	x.own = in
	if x.h.kind == kAlltoAll {
		x.own = in[int64(me)*n : int64(me+1)*n]
	} else {
		x.h.flags |= flagLent // lendHello's
	}
	x.pieces = 0
	if x.h.kind == kBroadcast {
		// broadcastDirect counts the root's pieces on every rank, though
		// none goes through a gather slot when every pair reads.
		per := broadcastPiece(pieceFor(kBroadcast, AlgoDirect, n, size, st.mapped, st.lay.piece), n, st.lay)
		x.pieces = uint64((n + per - 1) / per)
		if me != int(x.h.root) {
			x.dones = len(st.others) // only the root waits: for every reader's done
		}
	}
	// The payload: as countTable lays it out, the all-to-all's counts
	// first, then the loan's words (loan.words), then its displacements.
	file := device.FileRef{FD: -1}
	if send != 0 {
		if ep := device.AllocEpoch(); x.fileOf != send || x.fileEp != ep {
			f, err := st.comm.Device().FileOf(send, 1)
			x.fileOf, x.fileEp, x.fileRef, x.fileOK = send, ep, f, err == nil
		}
		if x.fileOK {
			file = x.fileRef
		}
	}
	t := x.table[:0]
	put := func(v uint64) { t = binary.LittleEndian.AppendUint64(t, v) }
	if x.h.kind == kAlltoAll {
		for range size {
			put(uint64(x.count))
		}
	}
	for _, w := range loanWordsOf(recv, send, file) {
		put(w)
	}
	if x.h.kind == kAlltoAll {
		for range 2 { // the receive displacements, then the send ones
			for p := range size {
				put(uint64(int64(p) * x.count))
			}
		}
	}
	x.table, x.in, x.n = t, t, int64(len(t))
	// openLoan's turn: this rank's slot, whose nDone every peer records
	// (claimGather: none of its earlier readers is left, laneReady), and
	// every peer's.
	x.kMine = st.gathers[me] % 2
	st.gathers[me]++
	for _, p := range st.others {
		x.k[p] = st.gathers[p] % 2
		st.gathers[p]++
	}
	st.gathers[x.h.root] += x.pieces
}

// unclaim takes back readArgs' turn in the gather slots (the call never
// ran).
func (x *laneCall) unclaim() {
	st := x.st
	st.gathers[st.comm.Rank()]--
	for _, p := range st.others {
		st.gathers[p]--
	}
	st.gathers[x.h.root] -= x.pieces
}

// learn takes peer p's send buffer address, where it lies in its memory
// file and, for the all-to-all, its send displacement for this rank, from
// its hello's payload (loan.learn's reading of the same bytes; the
// all-to-all's count for this rank is checked first, as alltoall's hello
// does).
func (x *laneCall) learn(p int, pay []byte) error {
	me, size := int(x.h.from), int(x.h.size)
	need := 8 * loanWords
	if x.h.kind == kAlltoAll {
		need += 8 * 3 * size
	}
	if len(pay) < need {
		return fmt.Errorf("rank %d's hello carries %d bytes of counts, buffer addresses and displacements, want %d", p, len(pay), need)
	}
	if x.h.kind == kAlltoAll {
		if got := int64(binary.LittleEndian.Uint64(pay[8*me:])); got != x.count {
			return fmt.Errorf("rank %d sends %d elements to rank %d, which expects %d from it", p, got, me, x.count)
		}
		pay = pay[8*size:]
	}
	_, x.from[p], x.files[p] = loanOf(pay)
	x.theirSend[p] = 0
	if x.h.kind == kAlltoAll {
		var err error
		x.theirSend[p], err = loanDisp(pay[8*loanWords+8*size:], me, p, "send displacement")
		return err
	}
	return nil
}

// finishRead checks the peers' hellos and learns their addresses, copies
// this rank's own part, then reads each peer's (peer me-1 first, as
// pairwise does) and records its done; a broadcast's receivers read the
// root's buffer, and the root reads nothing.
func (x *laneCall) finishRead(stop <-chan struct{}) error {
	st := x.st
	me, size := int(x.h.from), st.comm.Size()
	hb := st.hello.Bytes()
	end := headerSize + x.n
	off := st.lay.helloOff(me, 0)
	mine := hb[off : off+end]
	for _, p := range st.others {
		off := st.lay.helloOff(p, x.par[p])
		if err := st.checkHello(x.h, mine, hb[off:off+end], p, x.learnFn, x.n); err != nil {
			return err
		}
	}
	switch root := int(x.h.root); {
	case x.h.kind == kBroadcast && me == root:
	case x.h.kind == kBroadcast:
		if err := x.readPeer(stop, root, x.recv); err != nil {
			return err
		}
	default:
		if x.dn > 0 && x.send != x.recv.Add(int64(me)*x.dn) { // in place, the input is its place
			copy(x.out[int64(me)*x.dn:], x.own)
		}
		for r := 1; r < size; r++ {
			p := mod(me-r, size)
			if err := x.readPeer(stop, p, x.recv.Add(int64(p)*x.dn)); err != nil {
				return err
			}
		}
	}
	x.read = true
	return nil
}

// readPeer reads x.dn bytes of peer p's send buffer (from its displacement
// for this rank on) into dst, and records p's done.
func (x *laneCall) readPeer(stop <-chan struct{}, p int, dst device.Ptr) error {
	me, ch := int(x.h.from), x.st.chans[p]
	if x.dn > 0 {
		lentReads.Add(1)
		src, file := x.from[p], x.files[p]
		if src == 0 {
			return fmt.Errorf("collectives: rank %d has no send buffer address of rank %d", me, p)
		}
		src = src.Add(x.theirSend[p] * x.es)
		file.Off += x.theirSend[p] * x.es
		if err := hcomm.ReadLentNbi(stop, ch, dst, src, x.dn, file); err != nil {
			return err
		}
	}
	return hcomm.ChannelNotifyRecord(stop, ch, nDone+int(x.k[p]))
}

// drained polls for the peers' dones (every peer has read this rank's
// send buffer) for up to the lane's poll bound, reporting whether all came.
func (x *laneCall) drained() bool {
	x.pollUntil(x.doneFn)
	return x.dones == len(x.st.others)
}

// doneSeen reports whether every peer's done has arrived, taking those that
// have (x.dones counts them); a broken notify ends the poll, for drain's
// wait to name the failure.
func (x *laneCall) doneSeen() bool {
	st := x.st
	idx := nDone + int(x.kMine)
	for x.dones < len(st.others) {
		ch := st.chans[st.others[x.dones]]
		if !hcomm.ChannelNotifyPeek(ch, idx) {
			return false
		}
		ok, err := hcomm.ChannelNotifyTryWait(ch, idx)
		if err != nil {
			return true
		}
		if !ok {
			return false
		}
		x.dones++
	}
	return true
}

// drain (a queued task) waits for the dones drained did not see: the
// call's end, as drainGathers is a schedule's.
func (x *laneCall) drain(stop <-chan struct{}) error {
	st := x.st
	for ; x.dones < len(st.others); x.dones++ {
		ch := st.chans[st.others[x.dones]]
		if err := hcomm.CollectiveNotifyWait(stop, ch, nDone+int(x.kMine), 0, x.h.kind.String(), x.opSeq, x.algoName); err != nil {
			return err
		}
	}
	return nil
}

// laneAlltoAll runs AlltoAll's call in the read lane when it can (its
// blocks of block bytes read where they lie), reporting whether it did.
// The arguments and buffers have been checked (alltoall).
func laneAlltoAll(c *hcomm.Comm, s *device.Stream, o *Options, send, recv device.Ptr, count int64, dt hcomm.DataType) (bool, error) {
	block := count * int64(dt.Size())
	n := int64(c.Size())
	var h header // field by field (see laneRun)
	h.kind, h.dt, h.count = kAlltoAll, dt, count
	return laneRun(c, s, o, "AlltoAll", &h, send, recv, n*block, block, n*block)
}

// laneBroadcast runs Broadcast's call in the read lane when it can (every
// rank reads the root's buf where it lies), reporting whether it did. The
// arguments and buffer have been checked (Broadcast).
func laneBroadcast(c *hcomm.Comm, s *device.Stream, o *Options, buf device.Ptr, count int64, dt hcomm.DataType, root int) (bool, error) {
	n := count * int64(dt.Size())
	var h header // field by field (see laneRun)
	h.kind, h.dt, h.flags, h.root, h.count = kBroadcast, dt, flagRoot, int32(root), count
	return laneRun(c, s, o, "Broadcast", &h, buf, buf, n, n, n)
}
