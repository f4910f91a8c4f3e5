package collectives

import (
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// Broadcast enqueues on s the copy of root's count elements of dt at buf into
// every other rank's buf (HcclBroadcast). Every rank must call it with the same
// count, dt and root. Small buffers go straight from the root to every rank
// (one hop); large ones are pipelined in pieces along the ring starting at
// root, so that every link carries the data once.
func Broadcast(buf device.Ptr, count int64, dt hcomm.DataType, root int, c *hcomm.Comm, s *device.Stream, o *Options) error {
	const name = "Broadcast"
	if err := checkArgs(c, name, count, dt, hcomm.Sum, s); err != nil {
		return err
	}
	if root < 0 || root >= c.Size() {
		return collErr(c, name, hcomm.ErrPara, nil, "root %d is outside [0, %d)", root, c.Size())
	}
	n := count * int64(dt.Size())
	if err := checkBuf(c, name, "buf", buf, n); err != nil {
		return err
	}
	if done, err := laneBroadcast(c, s, o, buf, count, dt, root); done { // laneread.go
		return err
	}
	h := header{kind: kBroadcast, dt: dt, flags: flagRoot, root: int32(root), count: count}
	if grouping(c) {
		o := o.copy() // the call as it was made, whatever the caller does to *o before GroupEnd
		if recordCall(c, name, func() error { return Broadcast(buf, count, dt, root, c, s, o) }) {
			return nil // group.go: GroupEnd issues it
		}
	}
	return issue(c, name, kBroadcast, s, o, n, func(sc *sched, algo Algorithm) error {
		switch {
		case c.Size() == 1:
			sc.open(h, algo)
		case algo == AlgoOneShot:
			broadcastOneShot(sc, h, buf, n, root)
		case algo == AlgoRD:
			broadcastRD(sc, h, buf, n, root)
		case algo == AlgoDirect:
			if w, off, ok := sc.st.windowOf(buf, n); ok && n > 0 {
				h.flags |= flagWindow
				h.win, h.woff = w.id, off
				sc.open(h, algo)
				broadcastWindow(sc, w, off, buf, n, root)
				break
			}
			if (sc.st.cma || sc.st.allInproc) && n >= readLeast(c.Size(), sc.st.allInproc) && !sc.sparse() {
				// Between processes of a host that read lent memory, or
				// in one process: every other rank reads the root's buf
				// straight into its own (pairs that cannot: through the
				// gather slots).
				me := c.Rank()
				var readers func(int) int64 // the ranks that read this one's buf: the root's
				if me == root {
					readers = func(int) int64 { return n }
				}
				ln := sc.openLent(h, algo, buf, 0, buf, nil, readers, lendRead)
				if me != root && ln.readFits(root, n) {
					sc.readLent(ln, root, 1, buf, n)
				}
				broadcastDirect(sc, buf, n, root, ln)
				break
			}
			sc.open(h, algo)
			broadcastDirect(sc, buf, n, root, nil)
		case algo == AlgoTree:
			broadcastTree(sc, buf, n, root, openBroadcast(sc, h, algo, buf, n, root))
		case algo == AlgoRing:
			broadcastRing(sc, buf, n, root, openBroadcast(sc, h, algo, buf, n, root))
		case algo == AlgoHier:
			sc.open(h, algo)
			broadcastHier(sc, s, buf, count, dt, root)
		default:
			return collErr(c, name, hcomm.ErrNotSupport, nil, "algorithm %v is not available for broadcast", algo)
		}
		return nil
	})
}

// broadcastOneShot: the root's data travels inline with its hello; every
// other rank copies it out of its hello slot.
func broadcastOneShot(sc *sched, h header, buf device.Ptr, bytes int64, root int) {
	h.algo = AlgoOneShot
	me := sc.st.comm.Rank()
	var inline int64
	if me == root {
		inline = bytes
	}
	hs := sc.hello(h, sc.others(), buf, inline, nil)
	if me != root {
		sc.copy(buf, hs.at(root), bytes)
	}
}

// broadcastDirect: the root puts each piece in one of its gather slots and
// every other rank reads it from there straight into its buf: one copy per
// rank, which beats forwarding along a ring wherever a read is a memmove.
// With a loan (ln not nil), the ranks whose pair with the root reads lent
// memory have read buf whole from the root's (readLent) and take no piece;
// every rank still counts the root's pieces, so that the gather slots'
// counts stay the same on every rank whichever way each pair went.
func broadcastDirect(sc *sched, buf device.Ptr, bytes int64, root int, ln *loan) {
	me := sc.st.comm.Rank()
	per := broadcastPiece(sc.piece(), bytes, sc.st.lay)
	var readers []int
	for p := 0; p < sc.st.comm.Size(); p++ {
		if p != root && !ln.readFits(p, bytes) {
			readers = append(readers, p)
		}
	}
	for lo := int64(0); lo < bytes; lo += per {
		m := min(per, bytes-lo)
		switch {
		case me == root && len(readers) == 0:
			sc.st.gathers[me]++ // a piece nobody takes: counted, not copied
		case me == root:
			k, slot := sc.claimGather(readers)
			sc.copy(slot, buf.Add(lo), m)
			sc.publish(k, readers)
		case ln.readFits(root, bytes):
			sc.nextGather(root)
		default:
			sc.readGather(root, sc.nextGather(root), buf.Add(lo), 0, m)
		}
	}
}

// broadcastPiece is broadcastDirect's piece for bytes, per the schedule's:
// from 8 gather slots' worth, long enough that the pipeline's start is a
// small part, the gather slots' pieces, half the hand-offs (gatherPiece).
// The read lane counts the root's pieces by it too (laneread.go).
func broadcastPiece(per, bytes int64, l layout) int64 {
	if bytes >= 8*l.gpiece {
		return l.gpiece
	}
	return per
}

// broadcastWindow: buf lies at off in window w on every rank; every other
// rank reads the root's buf in place, straight into its own (one copy per
// receiver, none by the root), then tells the root it is done, and the
// root's collective ends once all have (drainGathers).
func broadcastWindow(sc *sched, w *Window, off int64, buf device.Ptr, bytes int64, root int) {
	if sc.st.comm.Rank() == root {
		sc.lendWindow(sc.others())
		return
	}
	sc.readWindow(w, root, off, buf, bytes)
	sc.doneWithWindow(root)
}

// openBroadcast opens a broadcast that goes through pipes (the tree, the
// ring) and returns its loan: where some peers are over tcp, whose pairs
// lend (st.netLends), every rank but the root lends buf, and its parent
// writes each piece straight to its place there (lent pipes, lent.go) —
// the staged pipes' copy out of the inbox, a piece a rank, is gone.
// Over tcp, interleaved with the staged form (Intel Xeon, stop 21): 2
// processes 1 MiB 276–326 µs staged, 159–259 lent; 4 processes 1 MiB
// 758–1043 against 740–807, 4 MiB 2.77–3.34 ms against 2.32–2.58; 64 KiB
// alike. Otherwise, or above helloFullMax ranks (the butterfly's handshake
// carries no loan), the plain handshake and no loan.
func openBroadcast(sc *sched, h header, algo Algorithm, buf device.Ptr, bytes int64, root int) *loan {
	if sc.st.comm.Rank() == root {
		bytes = 0
	}
	return sc.openPipes(h, algo, buf, bytes)
}

// broadcastRing: pieces flow root -> root+1 -> ... -> root-1 through the
// pipes; each rank forwards a piece from its inbox before copying it out,
// or, where the pair lends (ln), from where it landed in buf. Every link
// carries the data once: the choice where a read crosses a network.
func broadcastRing(sc *sched, buf device.Ptr, bytes int64, root int, ln *loan) {
	st := sc.st
	me, n := st.comm.Rank(), st.comm.Size()
	pos := mod(me-root, n)
	right, left := mod(me+1, n), mod(me-1, n)
	per := sc.piece()
	ln.setPieces(bytes, per)
	for lo := int64(0); lo < bytes; lo += per {
		m := min(per, bytes-lo)
		if pos == 0 {
			sc.sendPiece(ln, right, lo, buf.Add(lo), m)
			continue
		}
		if ln.takes(left) {
			sc.recvLent(ln, left)
			if pos < n-1 {
				sc.sendPiece(ln, right, lo, buf.Add(lo), m)
			}
			continue
		}
		slot, done := sc.pipeRecv(left)
		if pos < n-1 {
			sc.sendPiece(ln, right, lo, slot, m)
		}
		sc.copy(buf.Add(lo), slot, m)
		done()
	}
}
