package collectives

import (
	"fmt"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// Options tune one collective call. The zero value (or nil) lets hcomm choose.
type Options struct {
	Algorithm Algorithm
}

func algoOf(o *Options) Algorithm {
	if o == nil {
		return AlgoAuto
	}
	return o.Algorithm
}

func collErr(c *hcomm.Comm, op string, code hcomm.Result, err error, format string, args ...any) error {
	return &hcomm.Error{Op: op, Comm: c.Name(), Rank: c.Rank(), Peer: -1, Code: code, Msg: fmt.Sprintf(format, args...), Err: err}
}

// checkArgs validates what every rank can check alone.
func checkArgs(c *hcomm.Comm, op string, count int64, dt hcomm.DataType, rop hcomm.ReduceOp, s *device.Stream) error {
	if err := c.Check(); err != nil {
		return err
	}
	switch {
	case count < 0:
		return collErr(c, op, hcomm.ErrPara, nil, "count %d is negative", count)
	case !dt.Valid():
		return collErr(c, op, hcomm.ErrNotSupport, nil, "data type %v is not supported", dt)
	case !rop.Valid():
		return collErr(c, op, hcomm.ErrNotSupport, nil, "reduce op %v is not supported", rop)
	case s == nil:
		return collErr(c, op, hcomm.ErrPtr, nil, "nil stream")
	case s.Device() != c.Device():
		return collErr(c, op, hcomm.ErrPtr, nil, "stream belongs to another device context than the communicator")
	}
	return nil
}

func checkBuf(c *hcomm.Comm, op, what string, p device.Ptr, n int64) error {
	if n == 0 {
		return nil
	}
	if _, err := c.Device().Bytes(p, n); err != nil {
		return collErr(c, op, hcomm.ErrPara, err, "%s buffer", what)
	}
	return nil
}

// AllReduce enqueues on s the reduction of count elements of dt with op
// across all ranks; every rank's recv receives the result (HcclAllReduce).
// send == recv is in-place. Every rank must call it, in the same order as its
// other collectives, with the same count, dt and op. It returns once the work
// is enqueued; synchronize s to wait for it. Results are identical on every
// rank (every rank reduces in the same order).
func AllReduce(send, recv device.Ptr, count int64, dt hcomm.DataType, op hcomm.ReduceOp, c *hcomm.Comm, s *device.Stream, o *Options) error {
	const name = "AllReduce"
	if err := checkArgs(c, name, count, dt, op, s); err != nil {
		return err
	}
	n := count * int64(dt.Size())
	if err := checkBuf(c, name, "send", send, n); err != nil {
		return err
	}
	if err := checkBuf(c, name, "recv", recv, n); err != nil {
		return err
	}
	return issue(c, name, s, o, n, func(sc *sched, algo Algorithm) error {
		switch {
		case count == 0:
		case c.Size() == 1:
			sc.copy(recv, send, n)
		case algo == AlgoOneShot:
			allReduceOneShot(sc, send, recv, count, dt, op)
		case algo == AlgoRing:
			allReduceRing(sc, send, recv, count, dt, op)
		default:
			return collErr(c, name, hcomm.ErrNotSupport, nil, "algorithm %v is not available for allreduce", algo)
		}
		return nil
	})
}

// issue runs the part every collective shares: set up (first call), order
// after the previous collective, pick the algorithm for the message of n
// bytes, issue the schedule, and record the completion.
func issue(c *hcomm.Comm, name string, s *device.Stream, o *Options, n int64, body func(sc *sched, algo Algorithm) error) error {
	st, err := getState(c)
	if err != nil {
		return collErr(c, name, hcomm.ResultOf(err), err, "setting up the collective channels")
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	algo := algoOf(o)
	if algo == AlgoAuto {
		algo = AlgoRing
		if n <= st.lay.oneSlot {
			algo = AlgoOneShot
		}
	}
	if algo == AlgoOneShot && n > st.lay.oneSlot && c.Size() > 1 {
		return collErr(c, name, hcomm.ErrPara, nil, "oneshot takes at most %d bytes per rank with this HCCL buffer, got %d", st.lay.oneSlot, n)
	}
	t, err := st.begin(s)
	if err != nil {
		return collErr(c, name, hcomm.ResultOf(err), err, "")
	}
	sc := &sched{st: st, t: t}
	if err := body(sc, algo); err != nil {
		return err
	}
	if sc.err == nil {
		sc.do(st.end(s))
	}
	if sc.err != nil {
		st.err = sc.err // a half-issued schedule leaves the peers out of step
		return collErr(c, name, hcomm.ResultOf(sc.err), sc.err, "issuing the schedule")
	}
	return nil
}

// allReduceOneShot: every rank writes its input into a slot of every peer's
// HCCL buffer and signals; once all peers' inputs have arrived, each rank
// reduces the n inputs in rank order into recv. One hand-off deep.
func allReduceOneShot(sc *sched, send, recv device.Ptr, count int64, dt hcomm.DataType, op hcomm.ReduceOp) {
	st := sc.st
	c := st.comm
	me, n := c.Rank(), c.Size()
	bytes := count * int64(dt.Size())
	par := make([]uint64, n)
	for p := 0; p < n; p++ {
		if p == me {
			continue
		}
		par[p] = st.pairSeq[p] % 2
		st.pairSeq[p]++
		sc.write(p, sc.peerSlot(p, st.lay.oneSlotOff(me, par[p])), send, bytes)
		sc.record(p, nOne+int(par[p]))
	}
	// This rank's own input goes to its own slot first: in-place, recv is
	// overwritten before the input would be read.
	mine := sc.mySlot(st.lay.oneSlotOff(me, 0))
	sc.copy(mine, send, bytes)
	for p := 0; p < n; p++ {
		if p != me {
			sc.wait(p, nOne+int(par[p]))
		}
	}
	src := func(p int) device.Ptr {
		if p == me {
			return mine
		}
		return sc.mySlot(st.lay.oneSlotOff(p, par[p]))
	}
	sc.copy(recv, src(0), bytes)
	for p := 1; p < n; p++ {
		sc.reduce(recv, src(p), count, dt, op)
	}
}

// allReduceRing: reduce-scatter then all-gather around the ring, each step's
// chunk moved in pieces through the neighbour's two ring slots, so that the
// write of one piece overlaps the reduction of the previous one.
func allReduceRing(sc *sched, send, recv device.Ptr, count int64, dt hcomm.DataType, op hcomm.ReduceOp) {
	es := int64(dt.Size())
	per := sc.st.lay.pieceMax / es
	sc.copy(recv, send, count*es)
	at := func(elem int64) device.Ptr { return recv.Add(elem * es) }
	// reduce-scatter: after step s this rank holds the partial sums of chunk me-s-1.
	ringSteps(sc, count, per, es, 0, at, func(dst, slot device.Ptr, cnt int64) {
		sc.reduce(dst, slot, cnt, dt, op)
	})
	// all-gather: pass the reduced chunks on around the ring.
	ringSteps(sc, count, per, es, 1, at, func(dst, slot device.Ptr, cnt int64) {
		sc.copy(dst, slot, cnt*es)
	})
}

// ringSteps runs n-1 ring steps: at step s this rank sends chunk me+shift-s
// and receives chunk me+shift-s-1, piece by piece, consuming each received
// piece with consume(dst, slot, elements).
func ringSteps(sc *sched, count, per, es int64, shift int, at func(int64) device.Ptr, consume func(dst, slot device.Ptr, cnt int64)) {
	me, n := sc.st.comm.Rank(), sc.st.comm.Size()
	for step := 0; step < n-1; step++ {
		sOff, sCnt := chunk(count, n, mod(me+shift-step, n))
		rOff, rCnt := chunk(count, n, mod(me+shift-step-1, n))
		ps, pr := pieces(sCnt, per), pieces(rCnt, per)
		for q := int64(0); q < ps || q < pr; q++ {
			lo := q * per
			if q < ps {
				sc.sendPiece(at(sOff+lo), min(per, sCnt-lo)*es)
			}
			if q < pr {
				slot, done := sc.recvPiece()
				consume(at(rOff+lo), slot, min(per, rCnt-lo))
				done()
			}
		}
	}
}
