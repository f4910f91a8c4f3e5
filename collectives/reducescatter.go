package collectives

import (
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// ReduceScatter enqueues on s the reduction of Size()*recvCount elements
// across all ranks, rank r receiving the reduced elements
// [r*recvCount, (r+1)*recvCount) in recv (HcclReduceScatter).
func ReduceScatter(send, recv device.Ptr, recvCount int64, dt hcomm.DataType, op hcomm.ReduceOp, c *hcomm.Comm, s *device.Stream, o *Options) error {
	const name = "ReduceScatter"
	if err := checkArgs(c, name, recvCount, dt, op, s); err != nil {
		return err
	}
	var h header // field by field (see laneRun)
	h.kind, h.dt, h.op, h.flags, h.count = kReduceScatter, dt, op, flagOp, recvCount
	part := recvCount * int64(dt.Size())
	n := c.Size()
	if done, err := laneRun(c, s, o, name, &h, send, recv, int64(n)*part, part, part); done { // lane.go
		return err
	}
	counts, displs := make([]int64, n), make([]int64, n)
	for p := range counts {
		counts[p], displs[p] = recvCount, int64(p)*recvCount
	}
	return reduceScatter(c, name, h, send, counts, displs, recv, dt, op, s, o)
}

// ReduceScatterV is ReduceScatter with a count per rank: rank p receives the
// reduction of the sendCounts[p] elements at send + sendDispls[p]; every rank
// passes the same sendCounts and sendDispls, and recvCount ==
// sendCounts[Rank()] (HcclReduceScatterV).
func ReduceScatterV(send device.Ptr, sendCounts, sendDispls []int64, recv device.Ptr, recvCount int64, dt hcomm.DataType, op hcomm.ReduceOp, c *hcomm.Comm, s *device.Stream, o *Options) error {
	const name = "ReduceScatterV"
	if err := checkArgs(c, name, recvCount, dt, op, s); err != nil {
		return err
	}
	if err := checkCounts(c, name, "send", sendCounts, sendDispls); err != nil {
		return err
	}
	if sendCounts[c.Rank()] != recvCount {
		return collErr(c, name, hcomm.ErrPara, nil, "recvCount %d differs from sendCounts[%d] = %d", recvCount, c.Rank(), sendCounts[c.Rank()])
	}
	h := header{kind: kReduceScatterV, dt: dt, op: op, flags: flagOp, extra: digest(sendCounts, sendDispls)}
	return reduceScatter(c, name, h, send, sendCounts, sendDispls, recv, dt, op, s, o)
}

func reduceScatter(c *hcomm.Comm, name string, h header, send device.Ptr, counts, displs []int64, recv device.Ptr, dt hcomm.DataType, op hcomm.ReduceOp, s *device.Stream, o *Options) error {
	es := int64(dt.Size())
	me, n := c.Rank(), c.Size()
	total := extent(counts, displs)
	if err := checkBuf(c, name, "send", send, total*es); err != nil {
		return err
	}
	if err := checkBuf(c, name, "recv", recv, counts[me]*es); err != nil {
		return err
	}
	if grouping(c) {
		o := o.copy() // the call as it was made, whatever the caller does to *o before GroupEnd
		if recordCall(c, name, func() error { return reduceScatter(c, name, h, send, counts, displs, recv, dt, op, s, o) }) {
			return nil // group.go: GroupEnd issues it
		}
	}
	return issue(c, name, h.kind, s, o, total*es, func(sc *sched, algo Algorithm) error {
		switch algo {
		case AlgoOneShot:
			reduceScatterOneShot(sc, h, send, recv, counts[me], displs, dt, op)
		case AlgoRD:
			reduceScatterRD(sc, h, send, recv, total, displs[me], counts[me], dt, op)
		case AlgoOrdered:
			sc.open(h, algo)
			if n == 1 {
				sc.copy(recv, send.Add(displs[me]*es), counts[me]*es)
				return nil
			}
			reduceScatterOrdered(sc, send, counts, displs, recv, dt, op)
		case AlgoHier:
			if hierRSFits(sc.st, counts[me], es) {
				sc.open(h, algo)
				reduceScatterHier(sc, s, send, recv, counts[me], dt, op)
				break
			}
			// The leaders' working space would not hold the call: the
			// flat ring (every rank knows the sizes and decides alike).
			algo = AlgoRing
			fallthrough
		case AlgoRing:
			sc.open(h, algo)
			if n == 1 {
				sc.copy(recv, send.Add(displs[me]*es), counts[me]*es)
				return nil
			}
			// Blocks of one piece per rank; shift -1 ends rank r's reduction
			// on chunk r.
			per := sc.piece() / es
			var blocks int64
			for _, x := range counts {
				blocks = max(blocks, pieces(x, per))
			}
			for b := int64(0); b < blocks; b++ {
				lo := b * per
				ringReduceScatter(sc, n-1, func(c int) (int64, int64) {
					return displs[c] + lo, max(0, min(per, counts[c]-lo))
				}, send, func(int) device.Ptr { return recv.Add(lo * es) }, dt, op)
			}
		default:
			return collErr(c, name, hcomm.ErrNotSupport, nil, "algorithm %v is not available for %s", algo, name)
		}
		return nil
	})
}

// reduceScatterOneShot: the part of this rank's input that a peer receives
// travels inline in the hello to that peer (a payload of its own per peer:
// helloCall.blockOf), so that the exchange is the handshake itself and each
// peer gets only its part; once every hello has arrived and checked out,
// each rank reduces its part of every rank's input, in rank order, into
// recv. The counts are equal (ReduceScatter: the header carries them).
func reduceScatterOneShot(sc *sched, h header, send, recv device.Ptr, cnt int64, displs []int64, dt hcomm.DataType, op hcomm.ReduceOp) {
	h.algo = AlgoOneShot
	es := int64(dt.Size())
	me, n := sc.st.comm.Rank(), sc.st.comm.Size()
	x := helloPool.Get().(*helloCall)
	x.blocks, x.blkBase, x.blkDispl, x.blkES = true, send, displs, es
	sc.helloWith(x, h, sc.others(), 0, cnt*es, nil, func(x *helloCall) error {
		if cnt == 0 {
			return nil
		}
		// This rank's own part first into its hello slot, where the peers'
		// parts are: recv may be that part of send (in place), and the
		// reduction writes recv before it reads the higher ranks' parts.
		own, err := x.dev.Map(send.Add(displs[me]*es), cnt*es)
		if err != nil {
			return err
		}
		copy(x.payload(me), own.Bytes())
		own.Unmap()
		out, err := x.dev.Map(recv, cnt*es)
		if err != nil {
			return err
		}
		defer out.Unmap()
		if err := reduceRanks(out.Bytes(), n, cnt, dt, op, x.payload); err != nil {
			return err
		}
		return out.Flush(0, cnt*es)
	})
}
