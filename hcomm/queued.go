package hcomm

import (
	"time"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/memcopy"
	"github.com/hcomm-dev/hcomm/internal/metrics"
	"github.com/hcomm-dev/hcomm/internal/reduce"
)

// The queued data plane: the *OnThread calls, each of which checks its
// arguments and enqueues one task on the thread's stream (dataplane.go says
// what every call guarantees).

// WriteOnThread enqueues a one-sided write of n bytes from local src to the
// peer's dst (HcommWriteOnThread).
func WriteOnThread(t *Thread, ch *Channel, dst, src device.Ptr, n int64) error {
	return writeOnThread("WriteOnThread", t, ch, dst, src, n, -1)
}

// ReadOnThread enqueues a one-sided read of n bytes from the peer's src into
// local dst (HcommReadOnThread).
func ReadOnThread(t *Thread, ch *Channel, dst, src device.Ptr, n int64) error {
	const op = "ReadOnThread"
	c, err := dp(op, t, ch)
	if err != nil {
		return err
	}
	if err := c.rangesCheck(op, ch, "src", src, "dst", dst, n); err != nil {
		return err
	}
	return c.launch(op, ch.RemoteRank(), t, func(stop <-chan struct{}) error {
		b, err := c.dev.Bytes(dst, n)
		if err != nil {
			return err
		}
		return c.moved(ch, metrics.Read, n, ch.tr.Read(stop, b, src))
	})
}

// WriteReduceOnThread enqueues peer[dst] = peer[dst] op local[src] over count
// elements of dt (HcommWriteReduceOnThread).
func WriteReduceOnThread(t *Thread, ch *Channel, dst, src device.Ptr, count int64, dt DataType, rop ReduceOp) error {
	return reduceOnThread("WriteReduceOnThread", metrics.Write, t, ch, dst, src, count, dt, rop)
}

// ReadReduceOnThread enqueues local[dst] = local[dst] op peer[src] over count
// elements of dt (HcommReadReduceOnThread).
func ReadReduceOnThread(t *Thread, ch *Channel, dst, src device.Ptr, count int64, dt DataType, rop ReduceOp) error {
	return reduceOnThread("ReadReduceOnThread", metrics.Read, t, ch, dst, src, count, dt, rop)
}

// reduceOnThread checks and enqueues a one-sided reduction over count
// elements: dir metrics.Write reduces local src into the peer's dst,
// metrics.Read the peer's src into local dst.
func reduceOnThread(op, dir string, t *Thread, ch *Channel, dst, src device.Ptr, count int64, dt DataType, rop ReduceOp) error {
	c, err := dp(op, t, ch)
	if err != nil {
		return err
	}
	n, err := checkReduce(c, op, ch.RemoteRank(), count, dt, rop)
	if err != nil {
		return err
	}
	remote, local, remoteWhat, localWhat := dst, src, "dst", "src"
	if dir == metrics.Read {
		remote, local, remoteWhat, localWhat = src, dst, "src", "dst"
	}
	if err := c.rangesCheck(op, ch, remoteWhat, remote, localWhat, local, n); err != nil {
		return err
	}
	return c.launch(op, ch.RemoteRank(), t, func(stop <-chan struct{}) error {
		b, err := c.dev.Bytes(local, n)
		if err != nil {
			return err
		}
		if dir == metrics.Write {
			err = ch.tr.WriteReduce(stop, remote, b, int(count), dt, rop)
		} else {
			err = ch.tr.ReadReduce(stop, b, remote, int(count), dt, rop)
		}
		return c.moved(ch, dir, n, err)
	})
}

// ChannelNotifyRecordOnThread enqueues a record of the peer's notify
// remoteIdx on its end of ch (HcommChannelNotifyRecordOnThread).
func ChannelNotifyRecordOnThread(t *Thread, ch *Channel, remoteIdx int) error {
	const op = "ChannelNotifyRecordOnThread"
	c, err := dp(op, t, ch)
	if err != nil {
		return err
	}
	if err := c.remoteIdxCheck(op, ch, remoteIdx); err != nil {
		return err
	}
	return c.launch(op, ch.RemoteRank(), t, func(stop <-chan struct{}) error {
		return ch.tr.NotifyRecord(stop, remoteIdx)
	})
}

// ChannelNotifyWaitOnThread enqueues a wait for local notify localIdx of ch,
// which then resets (HcommChannelNotifyWaitOnThread). timeout <= 0 takes the
// communicator's ExecTimeout (HCCL_EXEC_TIMEOUT), a departure from HCCL's
// "0 waits forever" so that no wait is unbounded by accident; set ExecTimeout
// negative to wait forever.
func ChannelNotifyWaitOnThread(t *Thread, ch *Channel, localIdx int, timeout time.Duration) error {
	const op = "ChannelNotifyWaitOnThread"
	c, err := dp(op, t, ch)
	if err != nil {
		return err
	}
	n, err := c.localNotify(op, ch, localIdx)
	if err != nil {
		return err
	}
	// wait.go: times the wait, and names the collective in its error.
	return c.launchWait(op, t, ch, localIdx, n, c.execTimeout(timeout))
}

// ChannelFenceOnThread enqueues a fence: the channel operations before it are
// complete at the peer before those after it start (HcommChannelFenceOnThread).
func ChannelFenceOnThread(t *Thread, ch *Channel) error {
	const op = "ChannelFenceOnThread"
	c, err := dp(op, t, ch)
	if err != nil {
		return err
	}
	return c.launch(op, ch.RemoteRank(), t, func(stop <-chan struct{}) error {
		return ch.tr.Fence(stop)
	})
}

// ThreadNotifyRecordOnThread enqueues on t a record of dst's notify idx
// (HcommThreadNotifyRecordOnThread).
func ThreadNotifyRecordOnThread(t, dst *Thread, idx int) error {
	if t == nil || dst == nil {
		return noRankErr("ThreadNotifyRecordOnThread", "", ErrPtr, nil, "nil thread")
	}
	if err := t.NotifyRecord(dst, idx); err != nil {
		return noRankErr("ThreadNotifyRecordOnThread", "", ErrPara, err, "")
	}
	return nil
}

// ThreadNotifyWaitOnThread enqueues on t a wait for its notify idx, which then
// resets (HcommThreadNotifyWaitOnThread). timeout <= 0 waits forever, as in HCCL.
func ThreadNotifyWaitOnThread(t *Thread, idx int, timeout time.Duration) error {
	if t == nil {
		return noRankErr("ThreadNotifyWaitOnThread", "", ErrPtr, nil, "nil thread")
	}
	if err := t.NotifyWait(idx, timeout); err != nil {
		return noRankErr("ThreadNotifyWaitOnThread", "", ErrPara, err, "")
	}
	return nil
}

// LocalCopyOnThread enqueues a copy of n bytes of device memory from src to dst
// (HcommLocalCopyOnThread).
func LocalCopyOnThread(t *Thread, dst, src device.Ptr, n int64) error {
	if t == nil {
		return noRankErr("LocalCopyOnThread", "", ErrPtr, nil, "nil thread")
	}
	// The same checks as a device-to-device MemcpyAsync, then a streaming
	// copy: a local copy in a schedule is usually the move of a result into
	// the caller's output, which is not read again soon (internal/memcopy).
	dev := t.Stream().Device()
	for _, r := range []struct {
		what string
		p    device.Ptr
	}{{"dst", dst}, {"src", src}} {
		if _, err := dev.Bytes(r.p, n); err != nil || n < 0 {
			return noRankErr("LocalCopyOnThread", "", ErrPara, err, "%s range [%#x, +%d)", r.what, uintptr(r.p), n)
		}
	}
	return t.Stream().Launch("LocalCopyOnThread", func(<-chan struct{}) error {
		d, err := dev.Bytes(dst, n)
		if err != nil {
			return err
		}
		s, err := dev.Bytes(src, n)
		if err != nil {
			return err
		}
		if dst < src.Add(n) && src < dst.Add(n) {
			copy(d, s) // overlapping: memmove semantics
		} else {
			memcopy.Stream(d, s)
		}
		return nil
	})
}

// LocalReduceOnThread enqueues dst = dst op src over count elements of dt
// (HcommLocalReduceOnThread).
func LocalReduceOnThread(t *Thread, dst, src device.Ptr, count int64, dt DataType, rop ReduceOp) error {
	return localReduce("LocalReduceOnThread", t, dst, dst, src, count, dt, rop)
}

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
		return noRankErr(op, "", ErrPtr, nil, "nil thread")
	}
	if count < 0 || !dt.Valid() || !rop.Valid() {
		return noRankErr(op, "", ErrPara, nil, "count %d, data type %v, op %v", count, dt, rop)
	}
	n := count * int64(dt.Size())
	dev := t.Stream().Device()
	names := [3]string{"dst", "a", "b"}
	if a == dst {
		names = [3]string{"dst", "dst", "src"}
	}
	for i, p := range [3]device.Ptr{dst, a, b} {
		if _, err := dev.Bytes(p, n); err != nil {
			return noRankErr(op, "", ErrPara, err, "%s", names[i])
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
	if remoteIdx < 0 { // writeOnThread's "no record"
		return errorOf(ch, "WriteWithNotifyOnThread", "remote notify index %d is negative", remoteIdx)
	}
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
	if remoteIdx >= 0 {
		if err := c.remoteIdxCheck(op, ch, remoteIdx); err != nil {
			return err
		}
	}
	return c.launch(op, ch.RemoteRank(), t, func(stop <-chan struct{}) error {
		b, err := c.dev.Bytes(src, n)
		if err != nil {
			return err
		}
		return c.write(stop, ch, dst, b, remoteIdx)
	})
}
