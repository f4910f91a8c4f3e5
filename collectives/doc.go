// Package collectives implements collective operations — today AllReduce and
// Broadcast — as schedules of hcomm's data-plane operations only
// (WriteOnThread, notify record/wait, LocalCopy/LocalReduce), so that they run
// unchanged on every transport.
//
// Two layers: the stream-ordered calls, like HcclAllReduce(send, recv, count,
// dtype, op, comm, stream), enqueue on a device stream and return; the
// host-slice calls (AllReduceSlice, BroadcastSlice) take Go slices of any
// number type and a context, and return when the result is in place.
//
// Algorithms: a one-shot exchange through every peer's HCCL buffer for small
// messages (one hand-off deep), and a ring — reduce-scatter then all-gather,
// pipelined in pieces through two slots of each neighbour's HCCL buffer — for
// large ones, so buffers of any size pass through an HCCL buffer of any size.
// Every rank reduces in the same order, so results are bit-identical on all
// ranks.
//
// The caller's duties: every rank calls the same collectives in the same
// order with the same count, type, op and root; collectives of one
// communicator are issued from one goroutine at a time (calls on different
// streams are ordered by an event, as NCCL orders them).
package collectives
