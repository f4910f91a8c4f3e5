package collectives

import (
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// allReduceHD is recursive halving-doubling (Rabenseifner's all-reduce,
// HCCL's H-D_R): log2(n) steps of reduce-scatter in which partners at
// distance 2^i exchange half of what they still hold, then the same steps
// backwards as an all-gather. Fewer steps than the ring (2 log2 n against
// 2(n-1)), the same bytes per rank: the choice for mid-size messages on many
// ranks, where the ring's step count costs more than its bandwidth saves.
//
// Rank counts that are not powers of two fold first: with n = 2^k + r, each
// odd rank below 2r hands its input to the even rank before it, which
// reduces both, and sits out; the 2^k others run the exchange; the result is
// handed back at the end.
//
// All data crosses through the pipes; partial results live in recv. With a
// loan (ln, 2 ranks over tcp: openPipes), the all-gather half goes by lent
// pipes instead: each rank writes its reduced half straight to its place in
// the other's recv — a region the other gave away in the first half and
// never touches again, its bytes already handed to the kernel — and the
// copy out of the inbox, the whole half on every rank, is gone. 2
// processes over tcp, five to eight launches each, interleaved, µs
// (BENCHMARKS.md, stop 30): 128 KiB 57–61 against 64–72 staged, 256 KiB 86–101 against
// 97–105, 512 KiB 151–162 against 169–183, 1 MiB 331–404 (median 345)
// against 361–378 (373), both in 256 KiB pieces (tuning.go), 4 MiB
// 1351–1560 against 1416–1578.
func allReduceHD(sc *sched, send, recv device.Ptr, count int64, dt hcomm.DataType, op hcomm.ReduceOp, ln *loan) {
	st := sc.st
	me, n := st.comm.Rank(), st.comm.Size()
	es := int64(dt.Size())
	if n == 1 {
		sc.copy(recv, send, count*es)
		return
	}
	pow := 1
	for pow*2 <= n {
		pow *= 2
	}
	r := n - pow
	// real maps a virtual rank of the power-of-two group to its rank.
	real := func(v int) int {
		if v < r {
			return 2 * v
		}
		return v + r
	}
	virt := -1
	switch {
	case me < 2*r && me%2 == 1: // folds into me-1 and waits for the result
		sc.stream(me-1, send, count*es)
		sc.receive(me-1, recv, count*es, nil)
		return
	case me < 2*r:
		virt = me / 2
		sc.receive(me+1, recv, count*es, func(dst, slot device.Ptr, off, m int64) {
			sc.reduceTo(dst, send.Add(off), slot, m/es, dt, op)
		})
		send = recv // from here on the partial result is the input
	default:
		virt = me - r
	}
	// Reduce-scatter by recursive halving: at step mask, keep the half on
	// this rank's side of the bit and send the other half to the partner.
	lo, hi := int64(0), count
	type seg struct{ lo, hi int64 }
	var kept []seg
	first := true
	for mask := pow / 2; mask >= 1; mask /= 2 {
		partner := real(virt ^ mask)
		mid := lo + (hi-lo)/2
		keepLo, keepHi, giveLo, giveHi := lo, mid, mid, hi
		if virt&mask != 0 {
			keepLo, keepHi, giveLo, giveHi = mid, hi, lo, mid
		}
		src := recv
		if first {
			src = send
		}
		sc.exchange(partner, src.Add(giveLo*es), (giveHi-giveLo)*es, recv.Add(keepLo*es), (keepHi-keepLo)*es,
			func(dst, slot device.Ptr, off, m int64) {
				sc.reduceTo(dst, src.Add(keepLo*es+off), slot, m/es, dt, op)
			})
		first = false
		kept = append(kept, seg{lo, hi})
		lo, hi = keepLo, keepHi
	}
	// All-gather by recursive doubling: the same partners in reverse, each
	// sending what it holds and receiving the partner's half.
	for i, mask := len(kept)-1, 1; mask < pow; i, mask = i-1, mask*2 {
		partner := real(virt ^ mask)
		outer := kept[i]
		oLo, oHi := outer.lo, lo
		if lo == outer.lo {
			oLo, oHi = hi, outer.hi
		}
		if ln.takes(partner) {
			sc.exchangeLent(ln, partner, recv, lo*es, (hi-lo)*es, (oHi-oLo)*es)
		} else {
			sc.exchange(partner, recv.Add(lo*es), (hi-lo)*es, recv.Add(oLo*es), (oHi-oLo)*es, nil)
		}
		lo, hi = outer.lo, outer.hi
	}
	if me < 2*r {
		sc.stream(me+1, recv, count*es)
	}
}

// exchangeLent is exchange by the lent pipe with peer, whose recv and this
// rank's have the same layout: this rank's out bytes at off in buf go to
// off in the peer's recv, and the peer's in bytes land in place in buf, the
// pieces interleaved as exchange's.
func (s *sched) exchangeLent(ln *loan, peer int, buf device.Ptr, off, out, in int64) {
	per := s.piece()
	ln.setPairPieces(peer, out, in, per)
	for o := int64(0); o < out || o < in; o += per {
		if o < out {
			s.sendPiece(ln, peer, off+o, buf.Add(off+o), min(per, out-o))
		}
		if o < in {
			s.recvLent(ln, peer)
		}
	}
}

// stream sends n bytes at src to peer through its inbox, piece by piece.
func (s *sched) stream(peer int, src device.Ptr, n int64) {
	per := s.piece()
	for off := int64(0); off < n; off += per {
		s.pipeSend(peer, src.Add(off), min(per, n-off))
	}
}

// receive consumes n bytes from peer's pipe into dst, piece by piece:
// consume(dst+off, slot, off, bytes) when given, else a copy.
func (s *sched) receive(peer int, dst device.Ptr, n int64, consume func(dst, slot device.Ptr, off, m int64)) {
	per := s.piece()
	for off := int64(0); off < n; off += per {
		m := min(per, n-off)
		slot, done := s.pipeRecv(peer)
		if consume != nil {
			consume(dst.Add(off), slot, off, m)
		} else {
			s.copy(dst.Add(off), slot, m)
		}
		done()
	}
}

// exchange sends sn bytes at src to peer while receiving rn bytes from it
// into dst, interleaving the pieces so that two ranks exchanging with each
// other never wait on each other's full inbox.
func (s *sched) exchange(peer int, src device.Ptr, sn int64, dst device.Ptr, rn int64, consume func(dst, slot device.Ptr, off, m int64)) {
	per := s.piece()
	for off := int64(0); off < sn || off < rn; off += per {
		if off < sn {
			s.pipeSend(peer, src.Add(off), min(per, sn-off))
		}
		if off < rn {
			m := min(per, rn-off)
			slot, done := s.pipeRecv(peer)
			if consume != nil {
				consume(dst.Add(off), slot, off, m)
			} else {
				s.copy(dst.Add(off), slot, m)
			}
			done()
		}
	}
}
