package hcomm

import (
	"fmt"
	"time"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/metrics"
)

// Batches: HcommBatchTransferOnThread, an array of transfers on one channel
// issued as one stream task, and HcommBatchModeStart/End, which cache every
// queued call of a thread and submit them together. Both keep the checks and
// guarantees of the single calls; what they save is the per-call cost of a
// stream task (an enqueue, a wake-up of the stream's goroutine, a completion),
// which is most of the cost of a small transfer.

// TransferType is the kind of one transfer of a batch (HcommTransferType).
// The values are HCCL's; TransferNotifyWait is an hcomm extension.
type TransferType int32

// Transfer types.
const (
	TransferInvalid               TransferType = -1 // HCOMM_TRANSFER_TYPE_INVALID
	TransferWrite                 TransferType = 0  // Len bytes from local Src to the peer's Dst
	TransferWriteReduce           TransferType = 1  // peer[Dst] = peer[Dst] op local[Src] over Count elements
	TransferWriteWithNotify       TransferType = 2  // TransferWrite, then a record of the peer's notify NotifyIdx
	TransferWriteReduceWithNotify TransferType = 3  // TransferWriteReduce, then a record of the peer's notify NotifyIdx
	TransferRead                  TransferType = 4  // Len bytes from the peer's Src into local Dst
	TransferReadReduce            TransferType = 5  // local[Dst] = local[Dst] op peer[Src] over Count elements
	TransferNotifyRecord          TransferType = 6  // a record of the peer's notify NotifyIdx
	// TransferNotifyWait waits for local notify NotifyIdx of the channel
	// (then resets it) within Timeout, as ChannelNotifyWaitOnThread does. It
	// is an hcomm extension — HCCL's batch has no wait — so that one batch
	// can be a whole step of a schedule (send, then wait for the peer's
	// answer). Its value lies outside HCCL's range, where a later HCCL type
	// cannot collide with it.
	TransferNotifyWait TransferType = 64
)

var transferNames = map[TransferType]string{
	TransferInvalid: "INVALID", TransferWrite: "WRITE", TransferWriteReduce: "WRITE_REDUCE",
	TransferWriteWithNotify: "WRITE_WITH_NOTIFY", TransferWriteReduceWithNotify: "WRITE_REDUCE_WITH_NOTIFY",
	TransferRead: "READ", TransferReadReduce: "READ_REDUCE", TransferNotifyRecord: "NOTIFY_RECORD",
	TransferNotifyWait: "NOTIFY_WAIT",
}

// String returns HCCL's name of the type without its prefix ("WRITE").
func (t TransferType) String() string {
	if s, ok := transferNames[t]; ok {
		return s
	}
	return fmt.Sprintf("TransferType(%d)", int32(t))
}

// TransferDesc is one transfer of a batch (HcommBatchTransferDesc). HCCL's
// is a type and a union of one struct per type; hcomm's is flat, and each
// type reads the fields its constant names: Len for WRITE, READ and
// WRITE_WITH_NOTIFY; Count, DataType and ReduceOp for the reduce types;
// NotifyIdx for the types that record (the peer's notify) and for
// NOTIFY_WAIT (the local notify); Timeout for NOTIFY_WAIT (<= 0: the
// communicator's ExecTimeout, as ChannelNotifyWaitOnThread). Dst and Src
// are as in the single calls: the peer's address for the side a transfer
// writes or reads remotely, a local device address for the other.
type TransferDesc struct {
	Type      TransferType
	Dst, Src  device.Ptr
	Len       int64
	Count     int64
	DataType  DataType
	ReduceOp  ReduceOp
	NotifyIdx int
	Timeout   time.Duration
}

// BatchTransferOnThread enqueues the transfers descs describe on ch, in
// order, as one task of t (HcommBatchTransferOnThread). Every descriptor is
// checked as its single call checks it, and all of them before any is
// enqueued: a bad descriptor anywhere fails the call with an error naming
// its index, and nothing of the batch runs — HCCL's semantics ("cached,
// submitted together"). When the task runs, the first transfer that fails
// ends it, and the transfers after it do not run. Each transfer keeps the
// guarantees of its single call: a write followed by a record is visible to
// the peer once its wait returns. An empty batch is ErrPara.
//
// The batch costs one stream task however many transfers it holds, where
// the single calls cost one each (BenchmarkBatchTransfer).
func BatchTransferOnThread(t *Thread, ch *Channel, descs []TransferDesc) error {
	const op = "BatchTransferOnThread"
	c, err := dp(op, t, ch)
	if err != nil {
		return err
	}
	if len(descs) == 0 || len(descs) > 1<<20 {
		return c.errorf(op, ch.RemoteRank(), ErrPara, nil, "descriptor count %d is outside (0, %d]", len(descs), 1<<20)
	}
	tag := c.opOf(t)
	bodies := make([]func(stop <-chan struct{}) error, len(descs))
	for i, d := range descs {
		if bodies[i], err = c.prepTransfer(op, ch, d, tag); err != nil {
			return c.errorf(op, ch.RemoteRank(), ResultOf(err), err, "descriptor %d (%v); nothing of the batch was enqueued", i, d.Type)
		}
	}
	return c.launch(op, ch.RemoteRank(), t, func(stop <-chan struct{}) error {
		for i, body := range bodies {
			if err := body(stop); err != nil {
				return fmt.Errorf("descriptor %d (%v): %w", i, descs[i].Type, err)
			}
		}
		return nil
	})
}

// prepTransfer checks one descriptor of a batch and returns its body.
func (c *Comm) prepTransfer(op string, ch *Channel, d TransferDesc, tag opTag) (func(stop <-chan struct{}) error, error) {
	switch d.Type {
	case TransferWrite:
		return c.prepWrite(op, ch, d.Dst, d.Src, d.Len, -1)
	case TransferWriteWithNotify:
		if d.NotifyIdx < 0 {
			return nil, c.errorf(op, ch.remote, ErrPara, nil, "remote notify index %d is negative", d.NotifyIdx)
		}
		return c.prepWrite(op, ch, d.Dst, d.Src, d.Len, d.NotifyIdx)
	case TransferWriteReduce:
		return c.prepReduce(op, metrics.Write, ch, d.Dst, d.Src, d.Count, d.DataType, d.ReduceOp, -1)
	case TransferWriteReduceWithNotify:
		if d.NotifyIdx < 0 {
			return nil, c.errorf(op, ch.remote, ErrPara, nil, "remote notify index %d is negative", d.NotifyIdx)
		}
		return c.prepReduce(op, metrics.Write, ch, d.Dst, d.Src, d.Count, d.DataType, d.ReduceOp, d.NotifyIdx)
	case TransferRead:
		return c.prepRead(op, ch, d.Dst, d.Src, d.Len)
	case TransferReadReduce:
		return c.prepReduce(op, metrics.Read, ch, d.Dst, d.Src, d.Count, d.DataType, d.ReduceOp, -1)
	case TransferNotifyRecord:
		return c.prepRecord(op, ch, d.NotifyIdx)
	case TransferNotifyWait:
		n, err := c.localNotify(op, ch, d.NotifyIdx)
		if err != nil {
			return nil, err
		}
		timeout, idx := c.execTimeout(d.Timeout), d.NotifyIdx
		return func(stop <-chan struct{}) error {
			return c.awaitNotify(op, ch, idx, n, timeout, tag, stop)
		}, nil
	}
	return nil, c.errorf(op, ch.remote, ErrPara, nil, "transfer type %v is not one of HCCL's (0-6) or NOTIFY_WAIT (%d)", d.Type, int32(TransferNotifyWait))
}

// BatchModeStart opens batch mode on t (HcommBatchModeStart): until
// BatchModeEnd, every queued call on t (the *OnThread calls, thread
// notifies, local copies and reduces, BeginOp's timing) is checked at the
// call as usual but cached instead of enqueued, and BatchModeEnd submits
// the cache as one stream task that runs the calls in issue order; the first
// that fails ends the task and the rest do not run. Work launched straight
// on the thread's stream (Stream().Launch) is not cached: it runs before
// the batch. ThreadSynchronize and ChannelDrainOnThread refuse a thread in
// batch mode, since they would wait for work that is not submitted.
//
// Departure: HCCL binds batch mode to the calling OS thread, which Go does
// not expose; hcomm binds it to the thread handle t, and Start and End must
// name the same t and tag ("" for HCCL's temporary batch, its NULL). A
// second Start on t before End fails, as does an End whose tag differs (the
// batch then stays open). ThreadFree drops an open batch uncommitted.
func BatchModeStart(t *Thread, tag string) error {
	const op = "BatchModeStart"
	c, err := threadComm(op, t)
	if err != nil {
		return err
	}
	if err := t.BeginBatch(tag); err != nil {
		return c.errorf(op, -1, ErrPara, err, "")
	}
	return nil
}

// BatchModeEnd closes the batch BatchModeStart opened on t with tag and
// submits its calls as one stream task (HcommBatchModeEnd); see
// BatchModeStart. An empty batch submits nothing.
func BatchModeEnd(t *Thread, tag string) error {
	const op = "BatchModeEnd"
	c, err := threadComm(op, t)
	if err != nil {
		return err
	}
	if err := t.EndBatch(tag); err != nil {
		return c.errorf(op, -1, ErrPara, err, "")
	}
	return nil
}
