package collectives

import (
	"encoding/binary"
	"fmt"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// AlltoAll enqueues on s the exchange in which rank r sends its block p
// (sendCount elements at send + p*sendCount) to rank p, which stores it at
// recv + r*recvCount (HcclAlltoAll). sendType must equal recvType and
// sendCount recvCount: hcomm does not convert.
func AlltoAll(send device.Ptr, sendCount int64, sendType hcomm.DataType, recv device.Ptr, recvCount int64, recvType hcomm.DataType, c *hcomm.Comm, s *device.Stream, o *Options) error {
	const name = "AlltoAll"
	if err := checkArgs(c, name, sendCount, sendType, hcomm.Sum, s); err != nil {
		return err
	}
	if sendType != recvType || sendCount != recvCount {
		return collErr(c, name, hcomm.ErrPara, nil, "send is %d x %v, recv %d x %v: they must be equal", sendCount, sendType, recvCount, recvType)
	}
	n := c.Size()
	laneTried := false
	if !grouping(c) {
		// The lane first (laneread.go), before the count tables, which
		// it does not need: its calls then allocate nothing here. The
		// buffers are checked as alltoall checks them.
		bytes := int64(n) * sendCount * int64(sendType.Size())
		if err := checkBuf(c, name, "send", send, bytes); err != nil {
			return err
		}
		if err := checkBuf(c, name, "recv", recv, bytes); err != nil {
			return err
		}
		if bytes == 0 || send >= recv.Add(bytes) || recv >= send.Add(bytes) {
			if done, err := laneAlltoAll(c, s, o, send, recv, sendCount, sendType); done {
				return err
			}
			laneTried = true
		}
	}
	counts, displs := make([]int64, n), make([]int64, n)
	for p := range counts {
		counts[p], displs[p] = sendCount, int64(p)*sendCount
	}
	h := header{kind: kAlltoAll, dt: sendType, count: sendCount}
	return alltoall(c, name, h, send, counts, displs, recv, counts, displs, sendType, s, o, laneTried)
}

// AlltoAllV is AlltoAll with counts and displacements per peer: rank r sends
// sendCounts[p] elements at send + sdispls[p] to rank p, and receives
// recvCounts[p] elements from rank p at recv + rdispls[p] (HcclAlltoAllV).
// Rank r's sendCounts[p] must equal rank p's recvCounts[r]; the handshake
// checks it.
func AlltoAllV(send device.Ptr, sendCounts, sdispls []int64, sendType hcomm.DataType, recv device.Ptr, recvCounts, rdispls []int64, recvType hcomm.DataType, c *hcomm.Comm, s *device.Stream, o *Options) error {
	const name = "AlltoAllV"
	if err := checkArgs(c, name, 0, sendType, hcomm.Sum, s); err != nil {
		return err
	}
	if sendType != recvType {
		return collErr(c, name, hcomm.ErrPara, nil, "sendType %v differs from recvType %v: hcomm does not convert", sendType, recvType)
	}
	if err := checkCounts(c, name, "send", sendCounts, sdispls); err != nil {
		return err
	}
	if err := checkCounts(c, name, "recv", recvCounts, rdispls); err != nil {
		return err
	}
	h := header{kind: kAlltoAllV, dt: sendType}
	return alltoall(c, name, h, send, sendCounts, sdispls, recv, recvCounts, rdispls, sendType, s, o, false)
}

// alltoall issues AlltoAll (h.kind kAlltoAll) or AlltoAllV; laneTried: the
// caller has offered the call to the lane already, which declined.
func alltoall(c *hcomm.Comm, name string, h header, send device.Ptr, sc_, sd []int64, recv device.Ptr, rc, rd []int64, dt hcomm.DataType, s *device.Stream, o *Options, laneTried bool) error {
	es := int64(dt.Size())
	if err := checkBuf(c, name, "send", send, extent(sc_, sd)*es); err != nil {
		return err
	}
	if err := checkBuf(c, name, "recv", recv, extent(rc, rd)*es); err != nil {
		return err
	}
	// No in-place form (as HCCL's and MPI's without MPI_IN_PLACE): a
	// peer's block may land in the receive buffer before this rank's block
	// for another peer has left the same bytes.
	if sn, rn := extent(sc_, sd)*es, extent(rc, rd)*es; sn > 0 && rn > 0 && send < recv.Add(rn) && recv < send.Add(sn) {
		return collErr(c, name, hcomm.ErrPara, nil, "send [%#x, +%d) and recv [%#x, +%d) overlap: %s has no in-place form", uintptr(send), sn, uintptr(recv), rn, name)
	}
	me, n := c.Rank(), c.Size()
	if grouping(c) {
		o := o.copy() // the call as it was made, whatever the caller does to *o before GroupEnd
		if recordCall(c, name, func() error { return alltoall(c, name, h, send, sc_, sd, recv, rc, rd, dt, s, o, false) }) {
			return nil // group.go: GroupEnd issues it
		}
	}
	if h.kind == kAlltoAll && !laneTried {
		if done, err := laneAlltoAll(c, s, o, send, recv, h.count, dt); done { // laneread.go
			return err
		}
	}
	return issue(c, name, h.kind, s, o, extent(sc_, sd)*es, func(sched *sched, algo Algorithm) error {
		h := h // the call's own: h, never written out here, stays off the heap
		switch {
		case algo == AlgoOneShot && h.kind == kAlltoAll:
			alltoAllOneShot(sched, h, send, recv, sc_[0]*es)
			return nil
		case algo == AlgoBruck && h.kind == kAlltoAll:
			// Equal counts everywhere: the header carries them, and the
			// handshake (the butterfly above helloFullMax ranks, whose
			// partners are Bruck's) checks them; no table to every peer.
			sched.open(h, algo)
			alltoAllBruck(sched, send, recv, sc_[0]*es)
			return nil
		case algo == AlgoHier && h.kind == kAlltoAll && hierA2AFits(sched.st, sc_[0]*es*int64(n)):
			sched.open(h, algo)
			alltoAllHier(sched, s, send, recv, sc_[0]*es)
			return nil
		case algo == AlgoHier && h.kind == kAlltoAll:
			// One host, hosts of different sizes, or more than the
			// leaders' working space holds: the flat schedule (every rank
			// knows the shape and the sizes, and decides alike).
			algo = AlgoPairwise
		case algo != AlgoPairwise:
			return collErr(c, name, hcomm.ErrNotSupport, nil, "algorithm %v is not available for %s", algo, name)
		}
		h.algo = algo
		// AlltoAll (not V: a peer's displacements are not known here) from a
		// window: every rank's block for this rank lies at this rank's
		// displacement in the peer's send buffer, read in place.
		w, off, windowed := sched.st.windowOf(send, extent(sc_, sd)*es)
		windowed = windowed && h.kind == kAlltoAll && sched.st.mapped && extent(sc_, sd) > 0
		if windowed {
			h.flags |= flagWindow
			h.win, h.woff = w.id, off
		}
		// The hello carries this rank's send counts, so that each peer checks
		// them against its receive counts.
		if sched.sparse() {
			// The butterfly first, as every collective above helloFullMax
			// ranks (so that any mismatch reaches every rank), and the
			// channels to every peer once it is enqueued: a rank whose
			// peers made another call (AlltoAll on Bruck, which sets up
			// only its partners) fails with the butterfly's ErrMismatch
			// instead of waiting in a setup they never join.
			sched.butterfly(h, sched.others())
		} else {
			sched.need(sched.others()) // before countTable enqueues: a failed setup takes the call back
		}
		// Over tcp and in one process a peer's block goes straight into
		// this rank's receive buffer, and between processes of a host
		// this rank reads it straight from the peer's send buffer
		// (lent.go); the hello then carries the buffers' addresses and
		// the displacements after the counts, when they fit.
		var ln *loan
		if !windowed && sched.ok() && int64(8*(3*n+loanWords)) <= sched.st.lay.inline() { // the counts, the loan's words, the displacements
			// In one process the blocks below inprocPullMax are read (every
			// rank alike: the AlltoAll's blocks are the same everywhere, a
			// V form's are not, and it writes).
			pull := sched.st.allInproc && h.kind == kAlltoAll && sc_[0]*es < inprocPullMax
			ln = sched.lend(recv, extent(rc, rd)*es, rd, send, sd, wayOf(pull))
		}
		words := ln.words()
		table := sched.countTable(sc_, words...)
		// Above helloFullMax ranks the counts' hello with every peer, after
		// the butterfly, checks what only a pair can.
		learn := ln.learn(me)
		sched.hello(h, sched.others(), table, int64(8*(n+len(words))), func(p int, payload []byte) error {
			if len(payload) < 8*n {
				return fmt.Errorf("rank %d's hello carries %d bytes of counts, want %d", p, len(payload), 8*n)
			}
			if got := int64(binary.LittleEndian.Uint64(payload[8*me:])); got != rc[p] {
				return fmt.Errorf("rank %d sends %d elements to rank %d, which expects %d from it", p, got, me, rc[p])
			}
			return learn(p, payload[8*n:])
		})
		if windowed {
			sched.lendWindow(sched.others())
		}
		if ln != nil {
			sched.openLoan(ln, func(p int) int64 { return rc[p] * es }, func(p int) int64 { return sc_[p] * es })
		}
		sched.copy(recv.Add(rd[me]*es), send.Add(sd[me]*es), min(sc_[me], rc[me])*es)
		if windowed {
			for r := 1; r < n; r++ {
				from := mod(me-r, n)
				sched.readWindow(w, from, off+sd[me]*es, recv.Add(rd[from]*es), rc[from]*es)
			}
			for _, p := range sched.others() {
				sched.doneWithWindow(p)
			}
			return nil
		}
		// A lent pair's block goes whole to its place (the peer's
		// displacement for this rank, from its hello); the others' through
		// the pipes.
		sched.pairwise(ln, es,
			func(to int) (device.Ptr, int64, int64) { return send.Add(sd[to] * es), sc_[to], 0 },
			func(from int) (device.Ptr, int64) { return recv.Add(rd[from] * es), rc[from] })
		return nil
	})
}

// alltoAllOneShot: every rank's block for a peer travels inline in its
// hello to that peer (a payload of its own per peer: helloCall.blockOf), so
// that the exchange is the handshake itself; once every hello has arrived
// and checked out (the header carries the count, equal everywhere), each rank
// copies the peers' blocks out of its hello slots, and its own from send,
// into recv. One hand-off deep, where pairwise takes a count table, the
// handshake, and a write, a wait and a copy per piece and peer.
func alltoAllOneShot(sc *sched, h header, send, recv device.Ptr, block int64) {
	h.algo = AlgoOneShot
	x := helloPool.Get().(*helloCall)
	x.setBlocks(send, block)
	x.red.recv, x.outAt = recv, alltoAllAt
	sc.helloWith(x, h, sc.others(), 0, block, nil, alltoAllOneShotOut)
}

// alltoAllOneShotOut (the one-shot all-to-all's then, once every hello has
// arrived and checked out) copies this rank's own block from send and
// every peer's from its hello into recv (x.red.recv), but for those steered
// there as they arrived. A function, not a
// closure over the call's arguments: those are x's, and a closure would
// cost every call an allocation.
func alltoAllOneShotOut(x *helloCall) error {
	block := x.n
	if block == 0 {
		return nil
	}
	me, n := int(x.h.from), int64(x.s.st.comm.Size())
	out, err := x.dev.Map(x.red.recv, n*block)
	if err != nil {
		return err
	}
	defer out.Unmap()
	dst := out.Bytes()
	own, err := x.dev.Map(x.blockOf(me), block)
	if err != nil {
		return err
	}
	copy(dst[int64(me)*block:], own.Bytes())
	own.Unmap()
	for _, p := range x.peers {
		if !x.inPlace(p) { // steered there as it arrived (steer.go)
			copy(dst[int64(p)*block:], x.payload(p))
		}
	}
	return out.Flush(0, n*block)
}

// countTable copies counts (one int64 per rank, little-endian), and then
// extra, into this rank's scratch slot by a stream task (a previous call's
// hello, still queued, may be reading the slot), for a hello to carry. On
// an eager thread whose stream is idle the task runs now, so that the hello
// after it may too.
func (s *sched) countTable(counts []int64, extra ...uint64) device.Ptr {
	p := s.mySlot(s.st.lay.scratchOff())
	b := make([]byte, 8*(len(counts)+len(extra)))
	for i, v := range counts {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(v))
	}
	for i, v := range extra {
		binary.LittleEndian.PutUint64(b[8*(len(counts)+i):], v)
	}
	dev := s.st.comm.Device()
	s.launchNow("collective count table", int64(len(b)), func(<-chan struct{}) error { return dev.MemcpyHtoD(p, b) })
	return p
}
