package hcomm

import (
	"context"
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
	return readOnThread("ReadOnThread", t, ch, dst, src, n)
}

func readOnThread(op string, t *Thread, ch *Channel, dst, src device.Ptr, n int64) error {
	c, err := dp(op, t, ch)
	if err != nil {
		return err
	}
	body, err := c.prepRead(op, ch, dst, src, n)
	if err != nil {
		return err
	}
	return c.launchAs(op, ch.RemoteRank(), t, ch.quick(), n, body)
}

// WriteReduceOnThread enqueues peer[dst] = peer[dst] op local[src] over count
// elements of dt (HcommWriteReduceOnThread).
func WriteReduceOnThread(t *Thread, ch *Channel, dst, src device.Ptr, count int64, dt DataType, rop ReduceOp) error {
	return reduceOnThread("WriteReduceOnThread", metrics.Write, t, ch, dst, src, count, dt, rop, -1)
}

// WriteReduceWithNotifyOnThread enqueues peer[dst] = peer[dst] op local[src]
// over count elements of dt followed by a record of the peer's notify
// remoteIdx, as one task (HcommWriteReduceWithNotifyOnThread, experimental
// in HCCL; hcomm has it on every transport). The reduced bytes are visible to
// the peer once its wait for the notify returns (guarantee 2).
func WriteReduceWithNotifyOnThread(t *Thread, ch *Channel, dst, src device.Ptr, count int64, dt DataType, rop ReduceOp, remoteIdx int) error {
	const op = "WriteReduceWithNotifyOnThread"
	if remoteIdx < 0 { // reduceOnThread's "no record"
		return errorOf(ch, op, "remote notify index %d is negative", remoteIdx)
	}
	return reduceOnThread(op, metrics.Write, t, ch, dst, src, count, dt, rop, remoteIdx)
}

// ReadReduceOnThread enqueues local[dst] = local[dst] op peer[src] over count
// elements of dt (HcommReadReduceOnThread).
func ReadReduceOnThread(t *Thread, ch *Channel, dst, src device.Ptr, count int64, dt DataType, rop ReduceOp) error {
	return reduceOnThread("ReadReduceOnThread", metrics.Read, t, ch, dst, src, count, dt, rop, -1)
}

// WriteNbiOnThread is WriteOnThread (HcommWriteNbiOnThread). HCCL's Nbi
// forms return before the transfer is issued to the hardware; every
// *OnThread call of hcomm already returns once its task is enqueued, so the
// two are the same.
func WriteNbiOnThread(t *Thread, ch *Channel, dst, src device.Ptr, n int64) error {
	return writeOnThread("WriteNbiOnThread", t, ch, dst, src, n, -1)
}

// ReadNbiOnThread is ReadOnThread (HcommReadNbiOnThread), as WriteNbiOnThread
// is WriteOnThread.
func ReadNbiOnThread(t *Thread, ch *Channel, dst, src device.Ptr, n int64) error {
	return readOnThread("ReadNbiOnThread", t, ch, dst, src, n)
}

// WriteWithNotifyNbiOnThread is WriteWithNotifyOnThread
// (HcommWriteWithNotifyNbiOnThread), as WriteNbiOnThread is WriteOnThread.
func WriteWithNotifyNbiOnThread(t *Thread, ch *Channel, dst, src device.Ptr, n int64, remoteIdx int) error {
	const op = "WriteWithNotifyNbiOnThread"
	if remoteIdx < 0 {
		return errorOf(ch, op, "remote notify index %d is negative", remoteIdx)
	}
	return writeOnThread(op, t, ch, dst, src, n, remoteIdx)
}

// reduceOnThread checks and enqueues a one-sided reduction over count
// elements: dir metrics.Write reduces local src into the peer's dst (then
// records the peer's notify remoteIdx when it is not negative), metrics.Read
// the peer's src into local dst.
func reduceOnThread(op, dir string, t *Thread, ch *Channel, dst, src device.Ptr, count int64, dt DataType, rop ReduceOp, remoteIdx int) error {
	c, err := dp(op, t, ch)
	if err != nil {
		return err
	}
	body, err := c.prepReduce(op, dir, ch, dst, src, count, dt, rop, remoteIdx)
	if err != nil {
		return err
	}
	return c.launchAs(op, ch.RemoteRank(), t, ch.quick(), count*int64(dt.Size()), body)
}

// ChannelNotifyRecordOnThread enqueues a record of the peer's notify
// remoteIdx on its end of ch (HcommChannelNotifyRecordOnThread).
func ChannelNotifyRecordOnThread(t *Thread, ch *Channel, remoteIdx int) error {
	const op = "ChannelNotifyRecordOnThread"
	c, err := dp(op, t, ch)
	if err != nil {
		return err
	}
	body, err := c.prepRecord(op, ch, remoteIdx)
	if err != nil {
		return err
	}
	return c.launchAs(op, ch.RemoteRank(), t, ch.quick(), 0, body)
}

// ChannelNotifyWaitOnThread enqueues a wait for local notify localIdx of ch,
// which then resets (HcommChannelNotifyWaitOnThread). timeout <= 0 takes the
// communicator's ExecTimeout (HCCL_EXEC_TIMEOUT), a departure from HCCL's
// "0 waits forever" so that no wait is unbounded by accident; set ExecTimeout
// negative to wait forever.
func ChannelNotifyWaitOnThread(t *Thread, ch *Channel, localIdx int, timeout time.Duration) error {
	return channelNotifyWaitOnThread("ChannelNotifyWaitOnThread", t, ch, localIdx, func(c *Comm) time.Duration {
		return c.execTimeout(timeout)
	})
}

// ChannelNotifyWaitOnThreadWithDefaultTimeout is ChannelNotifyWaitOnThread
// with the communicator's notify wait timeout: the one SetNotifyWaitTimeOut
// set, HCCL_EXEC_TIMEOUT until then
// (HcommChannelNotifyWaitOnThreadWithDefaultTimeout).
func ChannelNotifyWaitOnThreadWithDefaultTimeout(t *Thread, ch *Channel, localIdx int) error {
	return channelNotifyWaitOnThread("ChannelNotifyWaitOnThreadWithDefaultTimeout", t, ch, localIdx, (*Comm).notifyWaitTimeout)
}

// channelNotifyWaitOnThread checks and enqueues a wait for local notify
// localIdx of ch, bounded by timeout(c) of the channel's communicator, taken
// when the wait is enqueued (the two forms differ in that bound only).
func channelNotifyWaitOnThread(op string, t *Thread, ch *Channel, localIdx int, timeout func(c *Comm) time.Duration) error {
	c, err := dp(op, t, ch)
	if err != nil {
		return err
	}
	n, err := c.localNotify(op, ch, localIdx)
	if err != nil {
		return err
	}
	// wait.go: times the wait, and names the collective in its error.
	return c.launchWait(op, t, ch, localIdx, n, timeout(c))
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

// FenceOnThread enqueues a fence of every channel of the thread's
// communicator (HcommFenceOnThread, HCCL's "data-plane fence" of a thread):
// the channel operations the thread issued before it are complete at their
// peers before those after it start. Departure: HCCL fences what the
// thread's engine has outstanding; hcomm does not track which channels a
// thread used, and fences the channels the communicator holds when the task
// runs (on shm and inproc a fence costs nothing, on tcp one round trip per
// channel). Use ChannelFenceOnThread to fence one channel.
func FenceOnThread(t *Thread) error {
	const op = "FenceOnThread"
	c, err := threadComm(op, t)
	if err != nil {
		return err
	}
	return c.launch(op, -1, t, func(stop <-chan struct{}) error {
		c.mu.Lock()
		chs := make([]*Channel, 0, len(c.channels))
		for _, ch := range c.channels {
			chs = append(chs, ch)
		}
		c.mu.Unlock()
		for _, ch := range chs {
			if err := ch.tr.Fence(stop); err != nil {
				return c.errorf(op, ch.RemoteRank(), ResultOf(err), err, "fencing the channel to rank %d", ch.RemoteRank())
			}
		}
		return nil
	})
}

// ChannelDrainOnThread enqueues a fence of ch on t and blocks until every
// task queued on t before it has run and the channel's operations are
// complete at the peer (HcommChannelDrainOnThread, "a blocking wait for all
// tasks"). It returns the first failure of the thread's work since its last
// synchronization, as ThreadSynchronize does; the wait is bounded by the
// tasks' own timeouts (a notify wait's is HCCL_EXEC_TIMEOUT).
func ChannelDrainOnThread(t *Thread, ch *Channel) error {
	const op = "ChannelDrainOnThread"
	c, err := dp(op, t, ch)
	if err != nil {
		return err
	}
	if t.Batching() {
		return c.errorf(op, ch.RemoteRank(), ErrPara, nil, "thread %s is in batch mode: a drain cannot wait for work that is not submitted (call BatchModeEnd first)", t.Name())
	}
	if err := c.launch(op, ch.RemoteRank(), t, func(stop <-chan struct{}) error {
		return ch.tr.Fence(stop)
	}); err != nil {
		return err
	}
	return c.threadSync(context.Background(), op, t)
}

// ThreadNotifyRecordOnThread enqueues on t a record of dst's notify idx
// (HcommThreadNotifyRecordOnThread).
func ThreadNotifyRecordOnThread(t, dst *Thread, idx int) error {
	if err := threadErr("ThreadNotifyRecordOnThread", t, dst); err != nil {
		return err
	}
	if err := t.NotifyRecord(dst, idx); err != nil {
		return noRankErr("ThreadNotifyRecordOnThread", "", ErrPara, err, "")
	}
	return nil
}

// ThreadNotifyWaitOnThread enqueues on t a wait for its notify idx, which then
// resets (HcommThreadNotifyWaitOnThread). timeout <= 0 waits forever, as in HCCL.
func ThreadNotifyWaitOnThread(t *Thread, idx int, timeout time.Duration) error {
	if err := threadErr("ThreadNotifyWaitOnThread", t); err != nil {
		return err
	}
	if err := t.NotifyWait(idx, timeout); err != nil {
		return noRankErr("ThreadNotifyWaitOnThread", "", ErrPara, err, "")
	}
	return nil
}

// ThreadNotifyWaitOnThreadWithDefaultTimeout is ThreadNotifyWaitOnThread with
// the notify wait timeout of the communicator that acquired t (set by
// SetNotifyWaitTimeOut, HCCL_EXEC_TIMEOUT until then)
// (HcommThreadNotifyWaitOnThreadWithDefaultTimeout).
func ThreadNotifyWaitOnThreadWithDefaultTimeout(t *Thread, idx int) error {
	const op = "ThreadNotifyWaitOnThreadWithDefaultTimeout"
	c, err := threadComm(op, t)
	if err != nil {
		return err
	}
	timeout := c.notifyWaitTimeout()
	if timeout <= 0 {
		timeout = 0 // forever
	}
	if err := t.NotifyWait(idx, timeout); err != nil {
		return c.errorf(op, -1, ErrPara, err, "")
	}
	return nil
}

// LocalCopyOnThread enqueues a copy of n bytes of device memory from src to dst
// (HcommLocalCopyOnThread).
func LocalCopyOnThread(t *Thread, dst, src device.Ptr, n int64) error {
	if err := threadErr("LocalCopyOnThread", t); err != nil {
		return err
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
	c, _ := t.Owner().(*Comm)
	return t.LaunchNow("LocalCopyOnThread", n, func(<-chan struct{}) error {
		c.chargeLocal(n) // the simulator's clock (custom.go)
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
	if err := threadErr(op, t); err != nil {
		return err
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
	c, _ := t.Owner().(*Comm)
	return t.LaunchNow(op, n, func(<-chan struct{}) error {
		c.chargeLocal(n) // the simulator's clock (custom.go)
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
	body, err := c.prepWrite(op, ch, dst, src, n, remoteIdx)
	if err != nil {
		return err
	}
	return c.launchAs(op, ch.RemoteRank(), t, ch.quick(), n, body)
}
