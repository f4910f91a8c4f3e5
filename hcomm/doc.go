// Package hcomm is the communicator of hcomm, a collective communication
// library for Go in the style of Huawei's HCCL: a communicator of N ranks
// (Comm), channels from a rank to its peers (Channel), threads that wrap device
// streams (Thread), one-sided writes and reads into a peer's registered HCCL
// buffer, and notify record/wait handshakes — the data plane the collectives in
// package collectives are built from.
//
// Where to start: InitAll(n, nil) gives n ranks in this process. Each rank
// acquires channels (ChannelAcquire, collective between the two ends) and
// threads (ThreadAcquire), then enqueues data-plane operations
// (WriteOnThread, ChannelNotifyRecordOnThread, ChannelNotifyWaitOnThread, …)
// and synchronizes the thread's stream. examples/sample is the HCCL seed's
// Sample, step by step. For allreduce and broadcast, use package collectives.
//
// The caller's duties:
//
//  1. Both ends of a channel call ChannelAcquire (any order, within
//     Config.ConnectTimeout).
//  2. A write into a peer's buffer is paired with a notify the peer waits for;
//     the peer reads the data only after its wait (see the guarantees in
//     dataplane.go's doc, repeated on each function).
//  3. Destroy every communicator; Abort first to stop pending work at once.
//
// Names and values follow HCCL: HcclResult codes are Result, CommEngine is
// Engine, CommProtocol is Protocol, HcclDataType is DataType, HcclReduceOp is
// ReduceOp. Departures: handles are Go pointers rather than integers; timeouts
// are time.Duration; a channel wait's zero timeout means the communicator's
// HCCL_EXEC_TIMEOUT rather than forever; ProtocolAuto (HCCL's RESERVED) picks
// the transport; channels carry an extra Tag in their reuse key.
//
// Environment (code wins over each): HCCL_BUFFSIZE (MB, default 200; the HCCL
// buffer is twice this), HCCL_EXEC_TIMEOUT (s, default 1836, 0 = never),
// HCCL_CONNECT_TIMEOUT (s, default 120).
package hcomm
