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
	return issue(c, name, s, o, n, func(sc *sched, algo Algorithm) error {
		switch {
		case count == 0 || c.Size() == 1:
		case algo == AlgoOneShot:
			broadcastOneShot(sc, buf, n, root)
		case algo == AlgoRing:
			broadcastRing(sc, buf, n, root)
		default:
			return collErr(c, name, hcomm.ErrNotSupport, nil, "algorithm %v is not available for broadcast", algo)
		}
		return nil
	})
}

// broadcastOneShot: the root writes into a slot of every peer and signals;
// each peer copies out and acknowledges, and the root waits for the acks so
// that the slot is free before it is written again.
func broadcastOneShot(sc *sched, buf device.Ptr, bytes int64, root int) {
	st := sc.st
	me, n := st.comm.Rank(), st.comm.Size()
	if me == root {
		par := make([]uint64, n)
		for p := 0; p < n; p++ {
			if p == me {
				continue
			}
			par[p] = st.pairSeq[p] % 2
			st.pairSeq[p]++
			sc.write(p, sc.peerSlot(p, st.lay.oneSlotOff(me, par[p])), buf, bytes)
			sc.record(p, nOne+int(par[p]))
		}
		for p := 0; p < n; p++ {
			if p != me {
				sc.wait(p, nOne+int(par[p]))
			}
		}
		return
	}
	par := st.pairSeq[root] % 2
	st.pairSeq[root]++
	sc.wait(root, nOne+int(par))
	sc.copy(buf, sc.mySlot(st.lay.oneSlotOff(root, par)), bytes)
	sc.record(root, nOne+int(par))
}

// broadcastRing: pieces flow root -> root+1 -> ... -> root-1; each rank
// forwards a piece from its ring slot before copying it out.
func broadcastRing(sc *sched, buf device.Ptr, bytes int64, root int) {
	st := sc.st
	me, n := st.comm.Rank(), st.comm.Size()
	pos := mod(me-root, n)
	per := st.lay.pieceMax
	for lo := int64(0); lo < bytes; lo += per {
		m := min(per, bytes-lo)
		if pos == 0 {
			sc.sendPiece(buf.Add(lo), m)
			continue
		}
		slot, done := sc.recvPiece()
		if pos < n-1 {
			sc.sendPiece(slot, m)
		}
		sc.copy(buf.Add(lo), slot, m)
		done()
	}
}
