package hcomm

import (
	"fmt"
	"time"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/memcopy"
	"github.com/hcomm-dev/hcomm/internal/metrics"
)

// The data plane (HCCL's Hcomm*OnThread). Every call checks its arguments,
// enqueues one task on the thread's stream and returns: the work happens when
// the stream reaches it, and its failure surfaces at the stream's next
// Synchronize (and through the device's exception callback).
//
// Guarantees, on every transport:
//
//  1. Operations on one thread execute in issue order; operations on different
//     threads run concurrently.
//  2. A write (or write-reduce) followed by a ChannelNotifyRecordOnThread on the
//     same thread and channel is visible to the peer once its matching
//     ChannelNotifyWaitOnThread returns.
//  3. A remote range outside the memory the peer registered (its HCCL buffer,
//     or CommMemReg memory) is rejected with ErrPara at the call, and never
//     touches the peer's memory; the peer checks again when the bytes arrive.
//  4. A wait that times out fails the stream with an error that matches
//     ErrTimeout and context.DeadlineExceeded and names the communicator, rank,
//     peer, channel and notify index.
//
// Local addresses (src of a write, dst of a read) may be any device memory of
// the communicator's device, not only registered memory: a relaxation of HCCL.

// dp checks a thread and channel pair and returns the communicator.
func dp(op string, t *Thread, ch *Channel) (*Comm, error) {
	if ch == nil || ch.comm == nil {
		return nil, &Error{Op: op, Rank: -1, Peer: -1, Code: ErrPtr, Msg: "nil channel"}
	}
	c := ch.comm
	if err := c.usable(op); err != nil {
		return nil, err
	}
	if t == nil || t.Stream() == nil {
		return nil, c.errorf(op, ch.RemoteRank(), ErrPtr, nil, "nil thread")
	}
	if t.Stream().Device() != c.dev {
		return nil, c.errorf(op, ch.RemoteRank(), ErrPtr, nil, "thread %s belongs to another device context", t.Name())
	}
	return c, nil
}

// rangesCheck checks a one-sided op's remote range against the peer's
// registered memory and its local range against this rank's device memory.
func (c *Comm) rangesCheck(op string, ch *Channel, remoteWhat string, remote device.Ptr, localWhat string, local device.Ptr, n int64) error {
	if err := c.remoteCheck(op, ch, remoteWhat, remote, n); err != nil {
		return err
	}
	return c.localCheck(op, ch.RemoteRank(), localWhat, local, n)
}

func (c *Comm) localCheck(op string, peer int, what string, p device.Ptr, n int64) error {
	if n < 0 {
		return c.errorf(op, peer, ErrPara, nil, "length %d is negative", n)
	}
	if _, err := c.dev.Bytes(p, n); err != nil {
		return c.errorf(op, peer, ErrPara, err, "local %s", what)
	}
	return nil
}

func (c *Comm) remoteCheck(op string, ch *Channel, what string, p device.Ptr, n int64) error {
	if n < 0 {
		return c.errorf(op, ch.RemoteRank(), ErrPara, nil, "length %d is negative", n)
	}
	if err := ch.ch.CheckRemote(p, n, nil); err != nil {
		return c.errorf(op, ch.RemoteRank(), ErrPara, err, "remote %s", what)
	}
	return nil
}

// launch enqueues fn on t, wrapping its error with the communicator's context.
func (c *Comm) launch(op string, peer int, t *Thread, fn func(stop <-chan struct{}) error) error {
	err := t.Stream().Launch(op, func(stop <-chan struct{}) error {
		if err := fn(stop); err != nil {
			return c.taskFailed(op, peer, err) // metrics.go: wraps, counts, logs
		}
		return nil
	})
	if err != nil {
		return c.errorf(op, peer, ResultOf(err), err, "")
	}
	return nil
}

func checkReduce(c *Comm, op string, peer int, count int64, dt DataType, rop ReduceOp) (int64, error) {
	if count < 0 {
		return 0, c.errorf(op, peer, ErrPara, nil, "count %d is negative", count)
	}
	if !dt.Valid() {
		return 0, c.errorf(op, peer, ErrNotSupport, nil, "data type %v is not supported", dt)
	}
	if !rop.Valid() {
		return 0, c.errorf(op, peer, ErrNotSupport, nil, "reduce op %v is not supported", rop)
	}
	return count * int64(dt.Size()), nil
}

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
		return c.moved(ch, metrics.Read, n, ch.ch.Transport().Read(stop, b, src))
	})
}

// WriteReduceOnThread enqueues peer[dst] = peer[dst] op local[src] over count
// elements of dt (HcommWriteReduceOnThread).
func WriteReduceOnThread(t *Thread, ch *Channel, dst, src device.Ptr, count int64, dt DataType, rop ReduceOp) error {
	const op = "WriteReduceOnThread"
	c, err := dp(op, t, ch)
	if err != nil {
		return err
	}
	n, err := checkReduce(c, op, ch.RemoteRank(), count, dt, rop)
	if err != nil {
		return err
	}
	if err := c.rangesCheck(op, ch, "dst", dst, "src", src, n); err != nil {
		return err
	}
	return c.launch(op, ch.RemoteRank(), t, func(stop <-chan struct{}) error {
		b, err := c.dev.Bytes(src, n)
		if err != nil {
			return err
		}
		return c.moved(ch, metrics.Write, n, ch.ch.Transport().WriteReduce(stop, dst, b, int(count), dt, rop))
	})
}

// ReadReduceOnThread enqueues local[dst] = local[dst] op peer[src] over count
// elements of dt (HcommReadReduceOnThread).
func ReadReduceOnThread(t *Thread, ch *Channel, dst, src device.Ptr, count int64, dt DataType, rop ReduceOp) error {
	const op = "ReadReduceOnThread"
	c, err := dp(op, t, ch)
	if err != nil {
		return err
	}
	n, err := checkReduce(c, op, ch.RemoteRank(), count, dt, rop)
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
		return c.moved(ch, metrics.Read, n, ch.ch.Transport().ReadReduce(stop, b, src, int(count), dt, rop))
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
	if remoteIdx < 0 || remoteIdx >= ch.ch.PeerNotifyNum() {
		return c.errorf(op, ch.RemoteRank(), ErrPara, nil, "remote notify index %d is outside [0, %d) of rank %d's end of the channel",
			remoteIdx, ch.ch.PeerNotifyNum(), ch.RemoteRank())
	}
	return c.launch(op, ch.RemoteRank(), t, func(stop <-chan struct{}) error {
		return ch.ch.Transport().NotifyRecord(stop, remoteIdx)
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
	n, err := ch.ch.Notify(localIdx)
	if err != nil {
		return c.errorf(op, ch.RemoteRank(), ErrPara, err, "")
	}
	// metrics.go: times the wait, and names the collective in its error.
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
		return ch.ch.Transport().Fence(stop)
	})
}

// ThreadNotifyRecordOnThread enqueues on t a record of dst's notify idx
// (HcommThreadNotifyRecordOnThread).
func ThreadNotifyRecordOnThread(t, dst *Thread, idx int) error {
	if t == nil || dst == nil {
		return &Error{Op: "ThreadNotifyRecordOnThread", Rank: -1, Peer: -1, Code: ErrPtr, Msg: "nil thread"}
	}
	if err := t.NotifyRecord(dst, idx); err != nil {
		return &Error{Op: "ThreadNotifyRecordOnThread", Rank: -1, Peer: -1, Code: ErrPara, Err: err}
	}
	return nil
}

// ThreadNotifyWaitOnThread enqueues on t a wait for its notify idx, which then
// resets (HcommThreadNotifyWaitOnThread). timeout <= 0 waits forever, as in HCCL.
func ThreadNotifyWaitOnThread(t *Thread, idx int, timeout time.Duration) error {
	if t == nil {
		return &Error{Op: "ThreadNotifyWaitOnThread", Rank: -1, Peer: -1, Code: ErrPtr, Msg: "nil thread"}
	}
	if err := t.NotifyWait(idx, timeout); err != nil {
		return &Error{Op: "ThreadNotifyWaitOnThread", Rank: -1, Peer: -1, Code: ErrPara, Err: err}
	}
	return nil
}

// LocalCopyOnThread enqueues a copy of n bytes of device memory from src to dst
// (HcommLocalCopyOnThread).
func LocalCopyOnThread(t *Thread, dst, src device.Ptr, n int64) error {
	if t == nil {
		return &Error{Op: "LocalCopyOnThread", Rank: -1, Peer: -1, Code: ErrPtr, Msg: "nil thread"}
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
			return &Error{Op: "LocalCopyOnThread", Rank: -1, Peer: -1, Code: ErrPara, Msg: fmt.Sprintf("%s range [%#x, +%d)", r.what, uintptr(r.p), n), Err: err}
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
