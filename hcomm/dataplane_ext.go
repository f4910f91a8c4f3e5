package hcomm

import (
	"fmt"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/metrics"
	"github.com/hcomm-dev/hcomm/internal/reduce"
)

// LocalReduceToOnThread enqueues dst = a (op) b over count elements: the
// three-operand form of LocalReduceOnThread. It is an hcomm extension (HCCL's
// HcommLocalReduceOnThread only accumulates into dst): a schedule that
// combines a received piece with its own input writes the result straight
// to the output, instead of first copying the input there. dst may be the
// same memory as a or b, but must not partially overlap either.
func LocalReduceToOnThread(t *Thread, dst, a, b device.Ptr, count int64, dt DataType, rop ReduceOp) error {
	return localReduce("LocalReduceToOnThread", t, dst, a, b, count, dt, rop)
}

// localReduce checks and enqueues dst = a (op) b; a == dst is the
// accumulating form (LocalReduceOnThread).
func localReduce(op string, t *Thread, dst, a, b device.Ptr, count int64, dt DataType, rop ReduceOp) error {
	if t == nil {
		return &Error{Op: op, Rank: -1, Peer: -1, Code: ErrPtr, Msg: "nil thread"}
	}
	fail := func(code Result, err error, msg string) error {
		return &Error{Op: op, Rank: -1, Peer: -1, Code: code, Msg: msg, Err: err}
	}
	if count < 0 || !dt.Valid() || !rop.Valid() {
		return fail(ErrPara, nil, fmt.Sprintf("count %d, data type %v, op %v", count, dt, rop))
	}
	n := count * int64(dt.Size())
	dev := t.Stream().Device()
	names := [3]string{"dst", "a", "b"}
	if a == dst {
		names = [3]string{"dst", "dst", "src"}
	}
	for i, p := range [3]device.Ptr{dst, a, b} {
		if _, err := dev.Bytes(p, n); err != nil {
			return fail(ErrPara, err, names[i])
		}
	}
	return t.Stream().Launch(op, func(<-chan struct{}) error {
		d, err := dev.Bytes(dst, n)
		if err != nil {
			return err
		}
		y, err := dev.Bytes(b, n)
		if err != nil {
			return err
		}
		if a == dst {
			return reduce.Reduce(d, y, int(count), dt, rop)
		}
		x, err := dev.Bytes(a, n)
		if err != nil {
			return err
		}
		return reduce.Reduce3(d, x, y, int(count), dt, rop)
	})
}

// WriteWithNotifyOnThread enqueues a write of n bytes from local src to the
// peer's dst followed by a record of the peer's notify remoteIdx, as one task
// (HcommWriteWithNotifyOnThread, which HCCL offers on its newest parts only;
// hcomm has it on every transport). It keeps guarantee 2 of the data plane:
// the bytes are visible to the peer once its wait for the notify returns.
// A schedule saves a stream task per hand-off with it.
func WriteWithNotifyOnThread(t *Thread, ch *Channel, dst, src device.Ptr, n int64, remoteIdx int) error {
	return writeOnThread("WriteWithNotifyOnThread", t, ch, dst, src, n, remoteIdx)
}

// writeOnThread checks and enqueues a write of n bytes to the peer's dst,
// followed, when remoteIdx >= 0, by a record of the peer's notify remoteIdx
// in the same task.
func writeOnThread(op string, t *Thread, ch *Channel, dst, src device.Ptr, n int64, remoteIdx int) error {
	c, err := dp(op, t, ch)
	if err != nil {
		return err
	}
	if err := c.rangesCheck(op, ch, "dst", dst, "src", src, n); err != nil {
		return err
	}
	if remoteIdx >= ch.ch.PeerNotifyNum() {
		return c.errorf(op, ch.RemoteRank(), ErrPara, nil, "remote notify index %d is outside [0, %d) of rank %d's end of the channel",
			remoteIdx, ch.ch.PeerNotifyNum(), ch.RemoteRank())
	}
	return c.launch(op, ch.RemoteRank(), t, func(stop <-chan struct{}) error {
		b, err := c.dev.Bytes(src, n)
		if err != nil {
			return err
		}
		return c.write(stop, ch, dst, b, remoteIdx)
	})
}

// write is the body of a checked write of src to the peer's dst, queued or
// immediate, followed by a record of the peer's notify remoteIdx when that
// is not negative.
func (c *Comm) write(stop <-chan struct{}, ch *Channel, dst device.Ptr, src []byte, remoteIdx int) error {
	if wn, ok := ch.ch.Transport().(channel.WriteNotifier); ok && len(src) > 0 && remoteIdx >= 0 {
		return c.moved(ch, metrics.Write, int64(len(src)), wn.WriteWithNotify(stop, dst, src, remoteIdx))
	}
	if len(src) > 0 || remoteIdx < 0 {
		if err := c.moved(ch, metrics.Write, int64(len(src)), ch.ch.Transport().Write(stop, dst, src)); err != nil {
			return err
		}
	}
	if remoteIdx < 0 {
		return nil
	}
	return ch.ch.Transport().NotifyRecord(stop, remoteIdx)
}
