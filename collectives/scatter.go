package collectives

import (
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// Scatter enqueues on s the distribution of root's send, block p (recvCount
// elements at send + p*recvCount) to rank p's recv (HcclScatter). send is
// only read on root.
func Scatter(send, recv device.Ptr, recvCount int64, dt hcomm.DataType, root int, c *hcomm.Comm, s *device.Stream, o *Options) error {
	return rooted(c, "Scatter", kScatter, send, recv, recvCount, dt, root, s, o)
}

// rooted is the body Scatter and Gather share: the root exchanges a block
// with every other rank through the pipes.
func rooted(c *hcomm.Comm, name string, k kind, send, recv device.Ptr, count int64, dt hcomm.DataType, root int, s *device.Stream, o *Options) error {
	if err := checkArgs(c, name, count, dt, hcomm.Sum, s); err != nil {
		return err
	}
	me, n := c.Rank(), c.Size()
	if root < 0 || root >= n {
		return collErr(c, name, hcomm.ErrPara, nil, "root %d is outside [0, %d)", root, n)
	}
	es := int64(dt.Size())
	block := count * es
	sendN, recvN := block, block // Gather: every rank sends a block; root receives n
	if k == kScatter {
		sendN, recvN = 0, block
		if me == root {
			sendN = int64(n) * block
		}
	} else if me == root {
		recvN = int64(n) * block
	} else {
		recvN = 0
	}
	if err := checkBuf(c, name, "send", send, sendN); err != nil {
		return err
	}
	if err := checkBuf(c, name, "recv", recv, recvN); err != nil {
		return err
	}
	h := header{kind: k, dt: dt, flags: flagRoot, root: int32(root), count: count}
	if grouping(c) {
		o := o.copy() // the call as it was made, whatever the caller does to *o before GroupEnd
		if recordCall(c, name, func() error { return rooted(c, name, k, send, recv, count, dt, root, s, o) }) {
			return nil // group.go: GroupEnd issues it
		}
	}
	return issue(c, name, k, s, o, block, func(sc *sched, algo Algorithm) error {
		if algo != AlgoPairwise {
			return collErr(c, name, hcomm.ErrNotSupport, nil, "algorithm %v is not available for %s", algo, name)
		}
		sc.open(h, algo)
		per := sc.st.lay.piece
		if me == root {
			if k == kScatter {
				sc.copy(recv, send.Add(int64(me)*block), block)
			} else {
				sc.copy(recv.Add(int64(me)*block), send, block)
			}
		}
		for lo := int64(0); lo < block; lo += per {
			m := min(per, block-lo)
			switch {
			case me == root && k == kScatter:
				for i := 1; i < n; i++ {
					p := mod(me+i, n)
					sc.pipeSend(p, send.Add(int64(p)*block+lo), m)
				}
			case me == root: // gather
				for i := 1; i < n; i++ {
					p := mod(me+i, n)
					slot, done := sc.pipeRecv(p)
					sc.copy(recv.Add(int64(p)*block+lo), slot, m)
					done()
				}
			case k == kScatter:
				slot, done := sc.pipeRecv(root)
				sc.copy(recv.Add(lo), slot, m)
				done()
			default:
				sc.pipeSend(root, send.Add(lo), m)
			}
		}
		return nil
	})
}
