package hcomm

import (
	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/metrics"
	"github.com/hcomm-dev/hcomm/notify"
)

// The data plane: the queued calls (HCCL's Hcomm*OnThread, queued.go) and
// the immediate ones (immediate.go). A queued call checks its arguments,
// enqueues one task on the thread's stream and returns: the work happens when
// the stream reaches it, and its failure surfaces at the stream's next
// Synchronize (and through the device's exception callback). This file holds
// what both kinds share: the checks every call makes against the channel
// (the peer's registered memory, the notify indexes of both ends) before a
// transport is asked to act, and the body of a write.
//
// Guarantees, on every transport:
//
//  1. Operations on one thread execute in issue order; operations on different
//     threads run concurrently. Two writes (or write-reduces) of one thread
//     to the same bytes of a peer land in issue order, on every transport.
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
	c, err := chanComm(op, ch)
	if err != nil {
		return nil, err
	}
	if t == nil || t.Stream() == nil {
		return nil, c.errorf(op, ch.RemoteRank(), ErrPtr, nil, "nil thread")
	}
	if t.Freed() {
		return nil, c.errorf(op, ch.RemoteRank(), ErrPtr, nil, "thread %s is freed (ThreadFree)", t.Name())
	}
	if t.Stream().Device() != c.dev {
		return nil, c.errorf(op, ch.RemoteRank(), ErrPtr, nil, "thread %s belongs to another device context", t.Name())
	}
	return c, nil
}

// chanComm checks a channel (not nil, not destroyed, its communicator
// usable) and returns its communicator.
func chanComm(op string, ch *Channel) (*Comm, error) {
	if ch == nil || ch.comm == nil {
		return nil, noRankErr(op, "", ErrPtr, nil, "nil channel")
	}
	c := ch.comm
	if err := c.usable(op); err != nil {
		return nil, err
	}
	if ch.destroyed.Load() {
		return nil, c.errorf(op, ch.remote, ErrPtr, nil, "the channel to rank %d is destroyed (ChannelDestroy)", ch.remote)
	}
	return c, nil
}

// threadErr checks threads for a call that names no channel: not nil, not
// freed.
func threadErr(op string, ts ...*Thread) error {
	for _, t := range ts {
		if t == nil || t.Stream() == nil {
			return noRankErr(op, "", ErrPtr, nil, "nil thread")
		}
		if t.Freed() {
			if c, ok := t.Owner().(*Comm); ok {
				return c.errorf(op, -1, ErrPtr, nil, "thread %s is freed (ThreadFree)", t.Name())
			}
			return noRankErr(op, "", ErrPtr, nil, "thread %s is freed (ThreadFree)", t.Name())
		}
	}
	return nil
}

// threadComm checks t for a call that names no channel and returns the
// communicator that acquired it.
func threadComm(op string, t *Thread) (*Comm, error) {
	if err := threadErr(op, t); err != nil {
		return nil, err
	}
	c, ok := t.Owner().(*Comm)
	if !ok {
		return nil, noRankErr(op, "", ErrPtr, nil, "thread %s was not acquired from a communicator", t.Name())
	}
	if err := c.usable(op); err != nil {
		return nil, err
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
	for _, m := range ch.remoteMems {
		if m.Contains(p, n) {
			return nil
		}
	}
	hb := ch.remoteMems[0]
	return c.errorf(op, ch.remote, ErrPara, nil, "remote %s: range [%#x, +%d) is outside the memory rank %d registered (HCCL buffer [%#x, +%d) and %d other ranges)",
		what, uintptr(p), n, ch.remote, uintptr(hb.Addr), hb.Size, len(ch.remoteMems)-1)
}

// remoteIdxCheck checks a notify index of the peer's end of ch: what a
// record names.
func (c *Comm) remoteIdxCheck(op string, ch *Channel, idx int) error {
	if idx < 0 || idx >= ch.peerNotify {
		return c.errorf(op, ch.remote, ErrPara, nil, "remote notify index %d is outside [0, %d) of rank %d's end of the channel",
			idx, ch.peerNotify, ch.remote)
	}
	return nil
}

// localNotify returns local notify idx of ch: what a wait names.
func (c *Comm) localNotify(op string, ch *Channel, idx int) (*notify.Notify, error) {
	if idx < 0 || idx >= len(ch.notifies) {
		return nil, c.errorf(op, ch.remote, ErrPara, nil, "local notify index %d is outside [0, %d)", idx, len(ch.notifies))
	}
	return ch.notifies[idx], nil
}

// launch enqueues fn on t, wrapping its error with the communicator's context.
func (c *Comm) launch(op string, peer int, t *Thread, fn func(stop <-chan struct{}) error) error {
	return c.launchAs(op, peer, t, false, 0, fn)
}

// launchAs is launch; now says that fn cannot block and moves n bytes
// (Thread.LaunchNow: it runs in the calling goroutine when the thread is
// eager and idle).
func (c *Comm) launchAs(op string, peer int, t *Thread, now bool, n int64, fn func(stop <-chan struct{}) error) error {
	body := func(stop <-chan struct{}) error {
		if err := fn(stop); err != nil {
			return c.taskFailed(op, peer, err) // metrics.go: wraps, counts, logs
		}
		return nil
	}
	var err error
	if now {
		err = t.LaunchNow(op, n, body)
	} else {
		err = t.Launch(op, body)
	}
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

// prepWrite checks a write of n bytes from local src to the peer's dst,
// followed by a record of the peer's notify remoteIdx when that is not
// negative, and returns its body.
func (c *Comm) prepWrite(op string, ch *Channel, dst, src device.Ptr, n int64, remoteIdx int) (func(stop <-chan struct{}) error, error) {
	if err := c.rangesCheck(op, ch, "dst", dst, "src", src, n); err != nil {
		return nil, err
	}
	if remoteIdx >= 0 {
		if err := c.remoteIdxCheck(op, ch, remoteIdx); err != nil {
			return nil, err
		}
	}
	return func(stop <-chan struct{}) error {
		b, err := c.dev.Bytes(src, n)
		if err != nil {
			return err
		}
		return c.write(stop, ch, dst, b, remoteIdx)
	}, nil
}

// prepRead checks a read of n bytes from the peer's src into local dst and
// returns its body.
func (c *Comm) prepRead(op string, ch *Channel, dst, src device.Ptr, n int64) (func(stop <-chan struct{}) error, error) {
	if err := c.rangesCheck(op, ch, "src", src, "dst", dst, n); err != nil {
		return nil, err
	}
	return func(stop <-chan struct{}) error {
		b, err := c.dev.Bytes(dst, n)
		if err != nil {
			return err
		}
		return c.moved(ch, metrics.Read, n, ch.tr.Read(stop, b, src))
	}, nil
}

// prepReduce checks a one-sided reduction over count elements and returns
// its body: dir metrics.Write reduces local src into the peer's dst (and
// then records the peer's notify remoteIdx when it is not negative),
// metrics.Read the peer's src into local dst.
func (c *Comm) prepReduce(op, dir string, ch *Channel, dst, src device.Ptr, count int64, dt DataType, rop ReduceOp, remoteIdx int) (func(stop <-chan struct{}) error, error) {
	n, err := checkReduce(c, op, ch.RemoteRank(), count, dt, rop)
	if err != nil {
		return nil, err
	}
	remote, local, remoteWhat, localWhat := dst, src, "dst", "src"
	if dir == metrics.Read {
		remote, local, remoteWhat, localWhat = src, dst, "src", "dst"
	}
	if err := c.rangesCheck(op, ch, remoteWhat, remote, localWhat, local, n); err != nil {
		return nil, err
	}
	if remoteIdx >= 0 {
		if err := c.remoteIdxCheck(op, ch, remoteIdx); err != nil {
			return nil, err
		}
	}
	return func(stop <-chan struct{}) error {
		b, err := c.dev.Bytes(local, n)
		if err != nil {
			return err
		}
		if dir == metrics.Write {
			err = ch.tr.WriteReduce(stop, remote, b, int(count), dt, rop)
		} else {
			err = ch.tr.ReadReduce(stop, b, remote, int(count), dt, rop)
		}
		if err = c.moved(ch, dir, n, err); err != nil || remoteIdx < 0 {
			return err
		}
		return ch.tr.NotifyRecord(stop, remoteIdx)
	}, nil
}

// prepRecord checks a record of the peer's notify remoteIdx and returns its
// body.
func (c *Comm) prepRecord(op string, ch *Channel, remoteIdx int) (func(stop <-chan struct{}) error, error) {
	if err := c.remoteIdxCheck(op, ch, remoteIdx); err != nil {
		return nil, err
	}
	return func(stop <-chan struct{}) error {
		return ch.tr.NotifyRecord(stop, remoteIdx)
	}, nil
}

// write is the body of a checked write of src to the peer's dst, queued or
// immediate, followed by a record of the peer's notify remoteIdx when that
// is not negative.
func (c *Comm) write(stop <-chan struct{}, ch *Channel, dst device.Ptr, src []byte, remoteIdx int) error {
	return c.writeHow(stop, ch, dst, src, remoteIdx, false)
}

// writeHow is write; with stream, a transport that copies memory
// (channel.StreamWriter) stores the bytes past the cache: the peer's
// output, not read again soon.
func (c *Comm) writeHow(stop <-chan struct{}, ch *Channel, dst device.Ptr, src []byte, remoteIdx int, stream bool) error {
	if sw, ok := ch.tr.(channel.StreamWriter); stream && ok && len(src) > 0 {
		if err := c.moved(ch, metrics.Write, int64(len(src)), sw.WriteStream(stop, dst, src)); err != nil {
			return err
		}
		if remoteIdx < 0 {
			return nil
		}
		return ch.tr.NotifyRecord(stop, remoteIdx)
	}
	if wn, ok := ch.tr.(channel.WriteNotifier); ok && len(src) > 0 && remoteIdx >= 0 {
		return c.moved(ch, metrics.Write, int64(len(src)), wn.WriteWithNotify(stop, dst, src, remoteIdx))
	}
	if len(src) > 0 || remoteIdx < 0 {
		if err := c.moved(ch, metrics.Write, int64(len(src)), ch.tr.Write(stop, dst, src)); err != nil {
			return err
		}
	}
	if remoteIdx < 0 {
		return nil
	}
	return ch.tr.NotifyRecord(stop, remoteIdx)
}
