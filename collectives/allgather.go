package collectives

import (
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// AllGather enqueues on s the gathering of every rank's sendCount elements
// into every rank's recv, rank r's at element r*sendCount (HcclAllGather).
// recv holds Size()*sendCount elements. In place: send == recv +
// Rank()*sendCount elements.
func AllGather(send, recv device.Ptr, sendCount int64, dt hcomm.DataType, c *hcomm.Comm, s *device.Stream, o *Options) error {
	const name = "AllGather"
	if err := checkArgs(c, name, sendCount, dt, hcomm.Sum, s); err != nil {
		return err
	}
	if done, err := laneAllGather(c, s, o, send, recv, sendCount, dt); done { // lane.go
		return err
	}
	n := c.Size()
	counts, displs := make([]int64, n), make([]int64, n)
	for p := range counts {
		counts[p], displs[p] = sendCount, int64(p)*sendCount
	}
	h := header{kind: kAllGather, dt: dt, count: sendCount}
	return allGather(c, name, h, send, sendCount, recv, counts, displs, dt, s, o)
}

// AllGatherV is AllGather with a count per rank: rank p's sendCount elements
// land at recv + recvDispls[p] elements, and every rank passes the same
// recvCounts and recvDispls, with recvCounts[Rank()] == sendCount
// (HcclAllGatherV).
func AllGatherV(send device.Ptr, sendCount int64, recv device.Ptr, recvCounts, recvDispls []int64, dt hcomm.DataType, c *hcomm.Comm, s *device.Stream, o *Options) error {
	const name = "AllGatherV"
	if err := checkArgs(c, name, sendCount, dt, hcomm.Sum, s); err != nil {
		return err
	}
	if err := checkCounts(c, name, "recv", recvCounts, recvDispls); err != nil {
		return err
	}
	if recvCounts[c.Rank()] != sendCount {
		return collErr(c, name, hcomm.ErrPara, nil, "sendCount %d differs from recvCounts[%d] = %d", sendCount, c.Rank(), recvCounts[c.Rank()])
	}
	h := header{kind: kAllGatherV, dt: dt, count: sendCount, extra: digest(recvCounts, recvDispls)}
	h.count = 0 // ranks send different counts: the digest carries them
	return allGather(c, name, h, send, sendCount, recv, recvCounts, recvDispls, dt, s, o)
}

// checkCounts validates a V collective's per-rank counts and displacements.
func checkCounts(c *hcomm.Comm, op, what string, counts, displs []int64) error {
	if len(counts) != c.Size() || len(displs) != c.Size() {
		return collErr(c, op, hcomm.ErrPara, nil, "%sCounts has %d entries and %sDispls %d; want one per rank (%d)", what, len(counts), what, len(displs), c.Size())
	}
	for p := range counts {
		if counts[p] < 0 || displs[p] < 0 {
			return collErr(c, op, hcomm.ErrPara, nil, "%sCounts[%d] = %d, %sDispls[%d] = %d: negative", what, p, counts[p], what, p, displs[p])
		}
		if counts[p] > 1<<50 || displs[p] > 1<<50 {
			return collErr(c, op, hcomm.ErrPara, nil, "%sCounts[%d] = %d, %sDispls[%d] = %d: too large", what, p, counts[p], what, p, displs[p])
		}
	}
	return nil
}

// extent is the number of elements a buffer described by counts and
// displacements spans.
func extent(counts, displs []int64) int64 {
	var e int64
	for p := range counts {
		if counts[p] > 0 {
			e = max(e, displs[p]+counts[p])
		}
	}
	return e
}

func allGather(c *hcomm.Comm, name string, h header, send device.Ptr, sendCount int64, recv device.Ptr, counts, displs []int64, dt hcomm.DataType, s *device.Stream, o *Options) error {
	es := int64(dt.Size())
	if err := checkBuf(c, name, "send", send, sendCount*es); err != nil {
		return err
	}
	if err := checkBuf(c, name, "recv", recv, extent(counts, displs)*es); err != nil {
		return err
	}
	var maxCount int64
	for _, x := range counts {
		maxCount = max(maxCount, x)
	}
	mine := recv.Add(displs[c.Rank()] * es)
	recvBytes := extent(counts, displs) * es
	// Whether the buffers lie in a window, looked up once (under st.mu, for
	// the selector) and used by the direct schedule. AllGather only: with
	// AllGatherV a rank that sends nothing may pass any send pointer, which
	// would look like a mismatch.
	var (
		w       *Window
		off     int64
		inPlace bool
		inWin   bool
	)
	windowed := func(st *state) bool {
		w, off, inPlace, inWin = allGatherWindow(st, send, sendCount*es, recv, recvBytes, mine)
		inWin = inWin && h.kind == kAllGather
		return inWin
	}
	if grouping(c) {
		o := o.copy() // the call as it was made, whatever the caller does to *o before GroupEnd
		if recordCall(c, name, func() error { return allGather(c, name, h, send, sendCount, recv, counts, displs, dt, s, o) }) {
			return nil // group.go: GroupEnd issues it
		}
	}
	return issueWindowed(c, name, h.kind, s, o, maxCount*es, windowed, func(sc *sched, algo Algorithm) error {
		me := c.Rank()
		out := func(p int) device.Ptr { return recv.Add(displs[p] * es) }
		switch algo {
		case AlgoOneShot:
			h.algo = algo
			// The input goes from send straight into every peer's hello
			// slot or line (the same payload for each: blockOf), not
			// through this rank's own slot first: a copy less per call.
			// Every block then goes to its place in recv in the hello's
			// own task (allGatherOneShotOut), not a copy task each.
			x := helloPool.Get().(*helloCall)
			x.setBlocks(send, 0)
			x.red.recv, x.outCounts, x.outDispls, x.blkES = recv, counts, displs, es
			x.outAt = allGatherAt
			sc.helloWith(x, h, sc.others(), send, sendCount*es, nil, allGatherOneShotOut)
		case AlgoRD:
			allGatherRD(sc, h, send, recv, sendCount*es)
		case AlgoDirect:
			if inWin {
				h.flags |= flagWindow
				if inPlace {
					h.flags |= flagInPlace
				}
				h.win, h.woff = w.id, off
				sc.open(h, algo)
				// Rank p's input lies at off in its window; in place, off is
				// the output's offset and p's input is its part of the output.
				at := func(p int) int64 {
					if inPlace {
						return off + displs[p]*es
					}
					return off
				}
				sc.lendWindow(sc.others())
				// Piece by piece across the inputs, this rank's own included:
				// the ranks read piece q of every input at about the same
				// time, so that an input read by n ranks comes from memory
				// about once.
				per := sc.piece()
				var most int64
				for _, x := range counts {
					most = max(most, x*es)
				}
				for lo := int64(0); lo < most; lo += per {
					if m := min(per, sendCount*es-lo); m > 0 {
						sc.copy(out(me).Add(lo), send.Add(lo), m)
					}
					for i := 1; i < c.Size(); i++ {
						p := mod(me-i, c.Size())
						if m := min(per, counts[p]*es-lo); m > 0 {
							sc.readWindow(w, p, at(p)+lo, out(p).Add(lo), m)
						}
					}
				}
				for _, p := range sc.others() {
					sc.doneWithWindow(p)
				}
				break
			}
			if sc.st.lendsDirect(sendCount*es, c.Size()) && h.kind == kAllGather && !sc.sparse() {
				// Over tcp or in one process (lent.go): every rank's
				// input written straight to its place in every peer's
				// output; between processes of a host whose kernel lets
				// them, read straight from every peer's input, or from
				// shmPushMin on written into every peer's output.
				pull := sc.st.allInproc && sendCount*es < inprocPullMax
				push := sc.st.cma && recvBytes >= shmPushMin
				way := wayOf(pull)
				if push {
					way = lendPush
				}
				ln := sc.openLent(h, algo, recv, recvBytes, send, func(p int) int64 { return counts[p] * es }, func(int) int64 { return sendCount * es }, way)
				if (sc.st.allInproc && !pull || push && !pushPairwise && ln.writesAll(sc.others(), sendCount*es)) && sc.ok() {
					// Every pair's write a copy, or a push: each piece
					// of the input to every place before the next piece.
					sc.writeLentAll(ln, sc.others(), displs[me]*es, es, send, sendCount*es, out(me))
					break
				}
				sc.copy(out(me), send, sendCount*es)
				sc.pairwise(ln, es,
					func(int) (device.Ptr, int64, int64) { return send, sendCount, displs[me] * es },
					func(from int) (device.Ptr, int64) { return out(from), counts[from] })
				break
			}
			sc.open(h, algo)
			sc.copy(out(me), send, sendCount*es)
			allGatherDirect(sc, send, out, counts, es)
		case AlgoRing:
			sc.open(h, algo)
			sc.copy(out(me), send, sendCount*es)
			allGatherRing(sc, out, counts, es)
		case AlgoHier:
			sc.open(h, algo)
			allGatherHier(sc, s, send, recv, sendCount, dt)
		case AlgoBruck:
			sc.open(h, algo)
			sc.copy(out(me), send, sendCount*es)
			allGatherBruck(sc, out, sendCount*es)
		default:
			return collErr(c, name, hcomm.ErrNotSupport, nil, "algorithm %v is not available for %s", algo, name)
		}
		return nil
	})
}

// allGatherWindow reports whether an all-gather reads its peers' inputs from
// a window: out of place when send lies in one, in place (send is this
// rank's part of recv) when recv does. off is the offset of send, or in place
// of recv, in the window. st.mu is held.
func allGatherWindow(st *state, send device.Ptr, sendBytes int64, recv device.Ptr, recvBytes int64, mine device.Ptr) (w *Window, off int64, inPlace, ok bool) {
	if send == mine {
		w, off, ok = st.windowOf(recv, recvBytes)
		return w, off, true, ok && recvBytes > 0
	}
	w, off, ok = st.windowOf(send, sendBytes)
	return w, off, false, ok && recvBytes > 0
}

// allGatherDirect: each rank publishes its input piece by piece in its
// gather slots and every other rank reads each piece straight into its recv.
// The reads of piece q are issued after publishing piece q+1 (software
// pipelining, as in the all-reduce).
func allGatherDirect(sc *sched, send device.Ptr, out func(p int) device.Ptr, counts []int64, es int64) {
	st := sc.st
	me, n := st.comm.Rank(), st.comm.Size()
	per := sc.piece() / es
	if st.mapped {
		per = st.lay.gpiece / es // the gather slots' pieces (gatherPiece)
	}
	var rounds int64
	for _, x := range counts {
		rounds = max(rounds, pieces(x, per))
	}
	if !st.mapped {
		allGatherPush(sc, out, counts, es, per, rounds)
		return
	}
	others := sc.others()
	var reads func()
	for q := int64(0); q < rounds; q++ {
		lo := q * per
		if m := min(per, counts[me]-lo); m > 0 {
			k, slot := sc.claimGather(others)
			sc.copy(slot, send.Add(lo*es), m*es)
			sc.publish(k, others)
		}
		ks := make([]uint64, n)
		for _, p := range others {
			if counts[p]-lo > 0 {
				ks[p] = sc.nextGather(p)
			}
		}
		if reads != nil {
			reads()
		}
		reads = func() {
			for i := 1; i < n; i++ {
				p := mod(me-i, n)
				if m := min(per, counts[p]-lo); m > 0 {
					sc.readGather(p, ks[p], out(p).Add(lo*es), 0, m*es)
				}
			}
		}
	}
	if reads != nil {
		reads()
	}
}

// allGatherPush is the direct all-gather where a peer is behind a network,
// where a read is a round trip and the stream issues the n-1 reads of a piece
// one after another: each owner writes each piece of its input (already in
// its recv) into every peer's inbox, and every rank copies the peers' pieces
// out of its own — one one-way hop per piece.
func allGatherPush(sc *sched, out func(p int) device.Ptr, counts []int64, es, per, rounds int64) {
	me, n := sc.st.comm.Rank(), sc.st.comm.Size()
	for q := int64(0); q < rounds; q++ {
		lo := q * per
		if m := min(per, counts[me]-lo); m > 0 {
			for i := 1; i < n; i++ {
				sc.pipeSend(mod(me+i, n), out(me).Add(lo*es), m*es)
			}
		}
		for i := 1; i < n; i++ {
			p := mod(me-i, n)
			if m := min(per, counts[p]-lo); m > 0 {
				slot, done := sc.pipeRecv(p)
				sc.copy(out(p).Add(lo*es), slot, m*es)
				done()
			}
		}
	}
}

// allGatherRing: at step s this rank forwards rank me-s's data to its right
// neighbour and receives rank me-s-1's from its left, piece by piece through
// the inboxes, copying each received piece into recv: every link carries the
// data once (the choice over a network).
func allGatherRing(sc *sched, out func(p int) device.Ptr, counts []int64, es int64) {
	st := sc.st
	me, n := st.comm.Rank(), st.comm.Size()
	per := sc.piece() / es
	right, left := mod(me+1, n), mod(me-1, n)
	for step := 0; step < n-1; step++ {
		sp, rp := mod(me-step, n), mod(me-step-1, n)
		for q := int64(0); q < max(pieces(counts[sp], per), pieces(counts[rp], per)); q++ {
			lo := q * per
			if m := min(per, counts[sp]-lo); m > 0 {
				sc.pipeSend(right, out(sp).Add(lo*es), m*es)
			}
			if m := min(per, counts[rp]-lo); m > 0 {
				slot, done := sc.pipeRecv(left)
				sc.copy(out(rp).Add(lo*es), slot, m*es)
				done()
			}
		}
	}
}

// allGatherOneShotOut (the one-shot all-gather's then, once every hello has
// arrived and checked out) copies this rank's input from send and every
// peer's from its hello into its place in recv (x.red.recv, the counts and
// displacements x.outCounts and x.outDispls, in elements of x.blkES bytes):
// in the hello's task, where a copy task each cost the call n launches
// (and n allocations).
func allGatherOneShotOut(x *helloCall) error {
	me, es := int(x.h.from), x.blkES
	ext := extent(x.outCounts, x.outDispls) * es
	if ext == 0 {
		return nil
	}
	out, err := x.dev.Map(x.red.recv, ext)
	if err != nil {
		return err
	}
	defer out.Unmap()
	dst := out.Bytes()
	for p := range x.outCounts {
		n := x.outCounts[p] * es
		if n == 0 {
			continue
		}
		at := dst[x.outDispls[p]*es:][:n]
		if p == me {
			own, err := x.dev.Map(x.blkBase, n)
			if err != nil {
				return err
			}
			copy(at, own.Bytes())
			own.Unmap()
			continue
		}
		if !x.inPlace(p) { // steered there as it arrived (steer.go)
			copy(at, x.payload(p)) // the counts are equal: AllGatherV has no one-shot
		}
	}
	return out.Flush(0, ext)
}
