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
// Across processes and hosts: rank 0 calls GetRootInfo and hands
// RootInfo.String() to every rank, each of which calls InitRootInfo
// (HcclGetRootInfo, HcclCommInitRootInfo); or every rank calls
// InitClusterInfo with HCCL's rank table (HcclCommInitClusterInfo); or
// InitFromEnv under torchrun, mpirun, srun or `hcomm run`. Rank 0 serves a
// small bootstrap store that every connection must prove the communicator's
// secret to; the ranks publish where they run, and each channel then picks
// its transport: inproc for a peer in this process, shm for one on this host,
// tcp otherwise (ProtocolAuto; HCCS, SIO, HCCS_ONLY go over inproc or shm,
// PCIE over shm, ROCE and the UB protocols over tcp). HCOMM_TRANSPORT
// (inproc|shm|tcp) forces one, HCOMM_SHM_DISABLE=1 rules shm out, and
// HCOMM_SOCKET_IFNAME picks the network interface (NCCL_SOCKET_IFNAME's
// syntax); each is also a Config field. When a rank is lost, every other
// rank's pending operations fail (ErrRankLost, or the transport's or
// HCCL_EXEC_TIMEOUT's error naming the rank) and Destroy still returns
// promptly; a stopped rank, rank 0 included, is found within
// HCOMM_LIVENESS_TIMEOUT. Revoke stops every rank's work on a communicator
// (ErrRevoked); Shrink makes a new communicator of the survivors, rank 0 or
// not among them, without a relaunch; LostRanks lists the ranks known lost
// (shrink.md: the protocol). init.go, env.go, ranktable.go and transport.go
// say more.
//
// Every call that blocks for other ranks has a form that takes a context
// first, as net.Dialer.DialContext: InitRootInfoContext,
// InitClusterInfoContext, InitFromEnvContext, ChannelAcquireContext and
// SplitContext (the plain forms call them with context.Background()). The
// configured HCCL_CONNECT_TIMEOUT still bounds them; a context that ends
// first fails the call with an *Error matching context.Canceled or
// context.DeadlineExceeded, and Error.Timeout reports a timeout. Abort ends
// a ChannelAcquire or Split that waits for its peers.
//
// Immediate mode (immediate.go): WriteNbi, WriteWithNotifyNbi,
// ChannelNotifyRecord and ChannelNotifyWait are HCCL's thread-less calls
// (HcommWriteNbi, HcommChannelNotifyWait, …): they do their work in the
// calling goroutine, with the same checks and guarantees as the *OnThread
// forms. A schedule launches one stream task (Stream.Launch) whose body
// makes them, so that a step of many transfers and waits costs one task:
// the collectives' handshake is one task per rank, which is what makes a
// small all-reduce cheap.
//
// Batches (batch.go): BatchTransferOnThread issues an array of transfers on
// one channel (HCCL's HcommBatchTransferDesc) as one task, every descriptor
// checked before any runs; BatchModeStart and BatchModeEnd cache a thread's
// queued calls and submit them as one task. Resources have their release
// calls: ChannelDestroy (the peer sees the channel closed), ThreadFree, and
// the queries ChannelQuery and GetNotifyNumInThread; ThreadSynchronize waits
// for a thread's work.
//
// The files, by concern: comm.go (Comm, InitAll, Abort, Destroy, Value),
// channel.go (ChannelDesc, Channel, ChannelAcquire, ChannelDestroy),
// thread.go (ThreadAcquire, ThreadFree, ThreadSynchronize), memreg.go
// (CommMemReg), dataplane.go (the data plane's guarantees and the checks
// every call makes), queued.go (the *OnThread calls), immediate.go (the Nbi
// calls), batch.go (BatchTransferOnThread, batch mode), wait.go (notify waits and the hang
// diagnosis), optag.go (BeginOp), errors.go (Error, Result), transport.go
// (which transport carries a channel), init.go, env.go and ranktable.go
// (joining across processes), subcomm.go (CreateSubComm, Split), health.go
// (a lost rank), revoke.go (Revoke), shrink.go and agree.go (Shrink),
// grow.go (GrowToken, Grow, JoinContext: newcomers join a running
// communicator), suspend.go (Suspend, Resume), elastic.go (the ranks' side
// of `hcomm run --elastic`), state.go (GetStatus, RegCommStateCallback:
// Ready, Suspending, Error, Destroyed), names.go (CommGetHandleWithName,
// GetErrorString), metrics.go, log.go and trace.go (observability: the
// Prometheus series, logging, the timeline Config.TraceDir writes).
//
// Names and values follow HCCL: HcclResult codes are Result, CommEngine is
// Engine, CommProtocol is Protocol, HcclDataType is DataType, HcclReduceOp is
// ReduceOp. Departures: handles are Go pointers rather than integers; timeouts
// are time.Duration; a channel wait's zero timeout means the communicator's
// HCCL_EXEC_TIMEOUT rather than forever; ProtocolAuto (HCCL's RESERVED) picks
// the transport; channels carry an extra Tag in their reuse key.
//
// Environment (code wins over each): HCCL_BUFFSIZE (MB, default 200; the HCCL
// buffer is twice this, committed as it is touched), HCCL_EXEC_TIMEOUT (s, default 1836, 0 = never),
// HCCL_CONNECT_TIMEOUT (s, default 120), HCOMM_LIVENESS_TIMEOUT (s, default
// 10), HCCL_DETERMINISTIC (false, true or strict; see Determinism),
// HCOMM_TRANSPORT, HCOMM_SHM_DISABLE, HCOMM_SHM_CMA_DISABLE,
// HCOMM_SOCKET_IFNAME, HCOMM_TRACE (Config.TraceDir); for InitFromEnv and InitClusterInfo also MASTER_ADDR,
// MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, HCOMM_MASTER_ADDR,
// HCOMM_ROOT_PORT and HCOMM_SECRET.
package hcomm
