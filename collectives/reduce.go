package collectives

import (
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// Reduce enqueues on s the reduction of count elements across all ranks into
// root's recv (HcclReduce). recv is only written on root.
func Reduce(send, recv device.Ptr, count int64, dt hcomm.DataType, op hcomm.ReduceOp, root int, c *hcomm.Comm, s *device.Stream, o *Options) error {
	const name = "Reduce"
	if err := checkArgs(c, name, count, dt, op, s); err != nil {
		return err
	}
	if root < 0 || root >= c.Size() {
		return collErr(c, name, hcomm.ErrPara, nil, "root %d is outside [0, %d)", root, c.Size())
	}
	es := int64(dt.Size())
	if err := checkBuf(c, name, "send", send, count*es); err != nil {
		return err
	}
	me, n := c.Rank(), c.Size()
	if me == root {
		if err := checkBuf(c, name, "recv", recv, count*es); err != nil {
			return err
		}
	}
	if done, err := laneReduce(c, s, o, send, recv, count, dt, op, root); done { // lane.go
		return err
	}
	h := header{kind: kReduce, dt: dt, op: op, flags: flagOp | flagRoot, root: int32(root), count: count}
	if grouping(c) {
		o := o.copy() // the call as it was made, whatever the caller does to *o before GroupEnd
		if recordCall(c, name, func() error { return Reduce(send, recv, count, dt, op, root, c, s, o) }) {
			return nil // group.go: GroupEnd issues it
		}
	}
	return issue(c, name, kReduce, s, o, count*es, func(sc *sched, algo Algorithm) error {
		switch algo {
		case AlgoOneShot:
			h.algo = algo
			hs := sc.hello(h, sc.others(), send, count*es, nil)
			switch {
			case me != root || count == 0:
			case n == 1:
				sc.copy(recv, send, count*es)
			default:
				sc.reduceTo(recv, hs.at(0), hs.at(1), count, dt, op)
				for p := 2; p < n; p++ {
					sc.reduce(recv, hs.at(p), count, dt, op)
				}
			}
		case AlgoRD:
			reduceRD(sc, h, send, recv, count, dt, op, root)
		case AlgoTree, AlgoRing, AlgoOrdered:
			sc.open(h, algo)
			switch {
			case n == 1:
				sc.copy(recv, send, count*es)
			case algo == AlgoTree:
				reduceTree(sc, send, recv, count, dt, op, root)
			case algo == AlgoRing:
				reduceRing(sc, send, recv, count, dt, op, root)
			default:
				reduceOrdered(sc, send, recv, count, dt, op, root)
			}
		default:
			return collErr(c, name, hcomm.ErrNotSupport, nil, "algorithm %v is not available for %s", algo, name)
		}
		return nil
	})
}

// reduceRing: the all-reduce's blocked ring reduce-scatter, after which the
// root alone reads every rank's result from its gather slot. After the ring,
// rank p holds piece p+1.
func reduceRing(sc *sched, send, recv device.Ptr, count int64, dt hcomm.DataType, op hcomm.ReduceOp, root int) {
	n := sc.st.comm.Size()
	reduceBlocks(sc, send, recv, count, dt, root, func(p int) int { return mod(p+1, n) },
		func(cnt int64, in, slot device.Ptr) {
			ringReduceScatter(sc, 0, func(c int) (int64, int64) { return chunk(cnt, n, c) }, in,
				func(int) device.Ptr { return slot }, dt, op)
		})
}

// reduceBlocks is a Reduce made of a reduce-scatter over blocks of n pieces:
// rs reduces the block of cnt elements at in, leaving this rank's piece in
// slot (its gather slot), and piece(p) is the piece rank p holds then; the
// root alone reads every rank's piece from its slot, one block behind.
func reduceBlocks(sc *sched, send, recv device.Ptr, count int64, dt hcomm.DataType, root int,
	piece func(p int) int, rs func(cnt int64, in, slot device.Ptr)) {
	st := sc.st
	me, n := st.comm.Rank(), st.comm.Size()
	es := int64(dt.Size())
	block := int64(n) * (st.lay.piece / es)
	var readers []int
	if me != root {
		readers = []int{root}
	}
	var gather func()
	for base := int64(0); base < count; base += block {
		cnt := min(block, count-base)
		k, slot := sc.claimGather(readers)
		rs(cnt, send.Add(base*es), slot)
		sc.publish(k, readers)
		// Every rank counts every publish, reader or not: the gather slot
		// counters must agree on all ranks for the collectives that follow.
		ks := make([]uint64, n)
		for p := 0; p < n; p++ {
			if p != me {
				ks[p] = sc.nextGather(p)
			}
		}
		var next func()
		if me == root {
			out := recv.Add(base * es)
			off, c := chunk(cnt, n, piece(me))
			sc.copy(out.Add(off*es), slot, c*es)
			next = func() {
				for i := 1; i < n; i++ {
					p := mod(me-i, n)
					off, c := chunk(cnt, n, piece(p))
					sc.readGather(p, ks[p], out.Add(off*es), 0, c*es)
				}
			}
		}
		if gather != nil {
			gather()
		}
		gather = next
	}
	if gather != nil {
		gather()
	}
}
