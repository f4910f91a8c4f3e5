// Package collectives implements hcomm's collective operations as schedules
// of the data-plane operations only (WriteOnThread, ReadOnThread, notify
// record/wait, LocalCopy, LocalReduce/LocalReduceTo), so that they run
// unchanged on every transport.
//
// # Where to start
//
// The stream-ordered calls follow HCCL's signatures and enqueue on a device
// stream: AllReduce, Broadcast, Reduce, AllGather, AllGatherV, ReduceScatter,
// ReduceScatterV, Scatter, Gather, AlltoAll, AlltoAllV, Barrier, Send, Recv
// and BatchSendRecv. Synchronize the stream to wait. The host-slice layer
// (AllReduceSlice, BroadcastSlice, AllGatherSlice, ReduceScatterSlice,
// ReduceSlice, AlltoAllSlice, BarrierContext) takes Go slices of any number
// type and a context and returns when the result is in place.
//
// GroupStart and GroupEnd (group.go) fuse the calls made on a communicator
// between them, so that ranks may order their sends and receives
// differently; CommSymWinRegister and the other HCCL-named window calls
// (symwin.go) are RegisterWindow's windows under HCCL's names.
//
// # The handshake
//
// Every collective opens with a hello: each rank writes a 56-byte header —
// collective, count, data type, reduce op, root, algorithm, sequence number
// — into a slot of every peer's HCCL buffer, waits for every peer's, and
// checks them. A rank that called something else gets an error matching
// ErrMismatch that names both ranks and both calls, on every rank, instead of
// a hang or wrong data. Small messages travel inline in the hello (the
// one-shot algorithms), so the check costs no extra hand-off there. The
// whole exchange — header, writes, records, waits, check, and the one-shot
// all-reduce's reduction — is one stream task per rank, made of hcomm's
// immediate calls (WriteWithNotifyNbi, CollectiveNotifyWait): an 8-byte
// all-reduce costs each rank one task and two allocations (its state is
// recycled). Set HCOMM_COLL_CHECK=0 to skip the comparison (the exchange
// stays: it is what makes slot reuse safe); BENCHMARKS.md gives its cost.
// Between ranks of one host (inproc, shm; up to helloFullMax ranks) a hello
// travels as a line instead of a write and a notify (ll.go: a flag word and
// 56 bytes in one cache line — a small call's header packed with its
// payload — polled in place, with a wake word for a receiver that sleeps);
// HCOMM_LL=0 turns it off.
//
// A small all-reduce, all-gather, all-to-all, reduce-scatter, broadcast,
// reduce or barrier whose call finds everything in place takes the lane
// (lane.go): the one-shot hello without a schedule, its
// writes prepared once (hcomm.PrepareWriteWithNotify), its buffers checked
// once per allocation epoch, the peers' notifies polled with a load. It is
// the one-shot schedule on the wire, so whether a call takes it is each
// rank's own business; HCOMM_LANE=0 turns it off. Over tcp (every peer over
// the network, no more processes on the host than cores) its hellos are
// frames and each look receives what the sockets hold, for up to
// Config.TCPSpin. The all-gather, all-to-all
// and broadcast whose schedules read their peers' buffers in place (lent.go)
// take a lane of their own, the read lane (laneread.go): hello, checks, own
// copy, reads and done records in the caller, the peers' dones polled there.
// Where the host's ranks outnumber its cores a lane's poll yields the core
// from its first look (between processes after a few dozen looks,
// laneCrowdedPolls), not after a few hundred: the peer it waits for is
// then often one that needs the core.
//
// On an idle stream the hello runs in the calling goroutine
// (device.Stream.RunInline) and polls for the peers' for a few
// microseconds (HCOMM_HELLO_POLL). While the schedule is issued its thread
// is eager (hcomm.Thread's SetEager): as long as the stream stays idle, the
// steps that cannot block, up to eagerMax (16 KiB) — copies, reductions,
// and over mapped memory writes, reads and records — run in the caller as the
// stream's next task, and a wait polls there for the same bound before it
// is queued. A small all-gather, broadcast or all-to-all between ranks of
// one process is then done when its call returns, no goroutine woken.
//
// Above helloFullMax (8) ranks a hello to every peer costs each rank 2(n-1)
// messages per collective; there every collective opens with the butterfly
// instead (butterfly.go): log2(n) rounds in which each rank trades hellos
// with its recursive-doubling partner, two more where n is not a power of
// two. A rank that finds a difference goes on with its rounds, its hellos
// poisoned and carrying both headers, so that after the last round every
// rank of a mismatched collective knows of it and fails with ErrMismatch
// naming both calls. Where some host's ranks outnumber its cores
// (hcomm.Comm.Crowded) the rounds are a binomial tree's instead (treeSteps):
// hellos up to rank 0 and back down, 2(n-1) messages a collective rather
// than n·log2(n), a difference heard by rank 0 on the way up and told to
// every rank on the way down (HCOMM_HANDSHAKE forces either form;
// HCOMM_CROWDED=0 or 1 overrides whether the communicator counts as
// crowded for every schedule choice that asks). Which
// handshake runs depends on the rank count and on what every rank
// published at init alone, so every rank runs the same one.
//
// # Algorithms
//
// Each collective has the schedules Algorithms lists; the selector picks the
// one of least modelled time (cost.go: each schedule's cost as a formula of
// the rank count, the size and the link class's α, o, β and γ, CostModel,
// HCOMM_COST_MODEL), after a few measured rules the model does not capture;
// HCCL_ALGO overrides it for all
// ranks ("level0:NA;level1:ring" or per collective
// "allreduce=level0:NA;level1:ring/allgather=level0:NA;level1:fullmesh"), and
// Options.Algorithm overrides it per call (every rank must pick the same; the
// handshake checks).
//
//   - oneshot: data inline with the hello, one hand-off: small messages
//     among up to helloFullMax ranks.
//   - rd: recursive doubling, the data inline in the butterfly handshake:
//     log2(n) hand-offs for the whole collective (all-reduce, broadcast,
//     reduce, reduce-scatter, all-gather of small messages among many
//     ranks, and the all-reduce, broadcast, all-gather and reduce-scatter
//     among 4 or 8 ranks over a network). The input is sent and reduced where it lies
//     and the last round reduces straight into the output; an all-gather's
//     round carries only the blocks its sender holds so far, and the
//     reduce-scatter among a power-of-two count of ranks halves (each
//     round sends the half of its range the partner keeps).
//   - ring: pieces through each neighbour's inbox slots; every link carries
//     the data once. The all-reduce runs a ring reduce-scatter on blocks of
//     n pieces, so that a block stays in cache from its first step to its
//     last, and then every rank reads the others' results straight from their
//     HCCL buffers (one copy per receiver, not a write and a copy) — or, where
//     a peer is behind a network and a read is a round trip, every rank
//     writes its result into every peer's inbox.
//   - hd: recursive halving-doubling (HCCL's H-D_R), folding rank counts that
//     are not powers of two; all-reduce up to a few MiB.
//   - hier: two levels (HCCL's level0/level1) over the hosts Comm.HostOf
//     tells apart, each level a collective on a sub-communicator that
//     picks its own algorithm. All-reduce: reduce within each host over
//     shared memory, all-reduce among one rank per host over the network,
//     broadcast within each host; picked when ranks span hosts. All-gather:
//     the host's blocks within it, the hosts' among the leaders, the whole
//     output within each host. Broadcast: within the root's host, among the
//     leaders, within every other host. Reduce-scatter: the whole input
//     reduced to the leader, reduce-scattered among the leaders, scattered
//     within each host (the flat ring where the leaders' HCCL buffers
//     cannot hold the host's sum). All-to-all: the host's send buffers
//     gathered to the leader, packed per host (m·m blocks, where hosts
//     hold m consecutive ranks each), exchanged among the leaders, sorted
//     into the ranks' receive orders and scattered (the flat schedule for
//     other host shapes, and where the leaders' HCCL buffers cannot hold
//     the host's send buffers twice). The all-gather, broadcast,
//     reduce-scatter and all-to-all are picked across hosts where the cost
//     model finds them cheaper than the flat choice (mid sizes).
//   - tree: a binomial tree, pipelined in pieces, log2(n) hops (broadcast,
//     reduce, and all-reduce as a reduce then a broadcast); picked for
//     small and mid-size messages over a network, and for the all-reduce
//     above the inline size among more than 8 ranks of a crowded host
//     (crowdedChoice: there a collective costs the processor time of all
//     its messages, of which the tree sends fewest).
//   - dbtree: the double binary tree (NCCL's), all-reduce: half the
//     message up and down each of two binary trees whose inner ranks are
//     the other's leaves, in pieces. By name only: the two trees' pieces
//     are issued in turn on the call's one stream, so a rank's wait in one
//     tree holds up its part in the other, and they do not flow as two
//     independent pipelines (NCCL runs them on separate channels); the
//     selector never picks it.
//   - bruck: ⌈log2 n⌉ rounds at distances 1, 2, 4, … through the pipes.
//     The all-gather: all-gathers above the inline size over a network.
//     The all-to-all: each round sends the blocks whose index has that
//     bit set, about half the data, packed in pieces, so log2 n hand-offs
//     where pairwise takes n-1 — all-to-alls of small blocks among many
//     ranks.
//   - direct: every rank reads each piece straight from its owner's HCCL
//     buffer (broadcast, all-gather); the choice wherever a read is a
//     memmove (inproc, shm). Over a network the all-gather's owner writes
//     each piece into every reader's inbox instead (AllGatherV's only
//     algorithm). The all-reduce's: where ranks read each other's memory
//     (in one process; shm with reads, below), each rank reduces its
//     block of the result from every rank's send buffer where it lies and
//     then reads every other block from its owner's recv — each byte
//     crosses once, by its reader, where the staged schedules write it
//     into an inbox first; chosen from blocks (count/n) of 256 KiB
//     (ardirect.go has the figures); elsewhere a forced direct all-reduce
//     runs the ring.
//   - pairwise: n-1 rounds of exchanges (all-to-all and its V form,
//     scatter, gather); all-to-alls of large blocks.
//   - ordered: every rank sends piece p of its input to rank p, which reduces
//     it from all ranks' pieces in rank order, then the results are gathered
//     (all-reduce, reduce-scatter, reduce): the algorithm of
//     HCCL_DETERMINISTIC=strict.
//
// # Tuning
//
// The selector's size thresholds and the pipelines' piece sizes are data:
// tuning.go holds one row per collective, transport class (mapped: inproc,
// shm; network: tcp), band of rank counts and range of sizes, each citing
// the measurement that put it there. choose reads the algorithm from the
// first row that matches a call, and every pipelined schedule its piece
// (bounded by the HCCL buffer's slot). BenchmarkTuning measures every
// algorithm and piece the table decides between, and BENCHMARKS.md
// ("Retuning the selector") says how to read its output into the table on
// another machine.
//
// # Determinism
//
// Every rank reduces in the same order, so results are bit-identical on all
// ranks; and every schedule fixes that order when it is issued — each step
// waits for one named peer, never for whichever arrives first — so the same
// inputs, rank count, sizes and configuration give the same bits run after
// run, whatever the timing (HCCL_DETERMINISTIC=true, hcomm.DeterministicOn,
// which therefore costs nothing; it holds with the level off too). What
// differs between algorithms is the order itself: the ring, halving-doubling, recursive doubling,
// the tree and the two-level schedule each associate a floating-point sum
// their own way, so a change of algorithm, transport (through the selector),
// rank count or size may change the last bits.
//
// HCCL_DETERMINISTIC=strict (hcomm.DeterministicStrict, hcomm's addition to
// HCCL's true and false) fixes the order too: every element is reduced as
// ((x0 op x1) op x2) op … op x(n-1), in rank order, each step rounded to the
// data type, so that every algorithm and transport gives the same bits — the
// bits a sequential loop over the ranks gives. The selector then picks
// oneshot (which reduces the inline inputs in rank order) where the data
// fits inline among up to helloFullMax ranks, and ordered elsewhere; a reducing collective forced onto another
// algorithm, by Options.Algorithm or HCCL_ALGO, fails with
// hcomm.ErrNotSupport naming the algorithm. Ordered moves the same bytes per
// rank as the ring, to every peer instead of the neighbours;
// BenchmarkAllReduceDeterministic measures what it costs. Ranks that disagree
// on the level choose different algorithms above the inline size, which the
// handshake reports as ErrMismatch. NaN payloads are outside the guarantee:
// a NaN result is NaN, but which NaN is not specified.
//
// # Symmetric windows (zero copy)
//
// RegisterWindow registers device memory on every rank at once (NCCL's
// symmetric window, ncclCommWindowRegister). When a Broadcast, AllGather or
// AlltoAll (not the V forms) finds its buffers at the same offset of a
// window on every rank,
// and the peers' memory is mapped (inproc, shm; with the direct algorithm,
// or pairwise for AlltoAll), each rank reads the root's or its peers' buffers
// in place instead of through their HCCL buffers: one copy per receiver and
// none by the owner. The handshake carries the window and offset, so ranks
// that disagree get ErrMismatch before any byte is read. `hcomm bench -R 1`
// measures it; BENCHMARKS.md has the figures.
//
// # Lent receive buffers (tcp, in process)
//
// Over tcp, whose receiving end checks every write as it arrives, a
// pairwise AlltoAll or AlltoAllV and a direct AllGather (the selector's
// choice over tcp up to 8 ranks for inputs from above the inline size to
// 512 KiB) need no window: each rank registers its receive buffer for the
// call, its hello carries the buffer's address (and, for the V form, its
// displacements), and each peer writes its block whole to its place there
// (hcomm.WriteLentWithNotifyNbi), the socket reading straight into it — no
// pipe slot, no acknowledgement per piece, no copy out of the HCCL buffer.
// Blocks up to 512 KiB go lent (larger ones measured faster staged).
// Between ranks of one process (inproc, whose copies check the peer's
// registry as they run) the all-to-all's blocks and the all-gather's inputs
// go the same way at every size: one copy instead of two, streamed past the
// cache (channel.StreamWriter: the copy neither reads the destination's
// lines first nor evicts what the cache holds), and the all-gather writes
// each piece of its input to every peer before the next piece, so that the
// input comes from memory once. A pair whose channel neither checks on
// receipt nor reads lent memory (below) stays staged within the same call.
// The Broadcast's tree and ring over tcp lend every receiver's buffer too,
// and go by lent pipes: each piece is written straight to its place in the
// receiver's buffer with a notify of the lent pipes' own, acknowledged only
// when the sender waits for it (a piece a window further on: 8 pieces
// where no host is crowded, so that a call of up to 2 MiB has no
// acknowledgement, 2 where one is), and forwarded from there — the staged
// pipes' copy of every piece out of the inbox is gone (2 processes, 1 MiB:
// 276–326 µs staged against 159–259 lent, interleaved), and so is the wait
// at a call's end for its last pieces' acknowledgements. The halving-doubling AllReduce of 2 ranks over tcp
// sends its all-gather half the same way, each rank's reduced half straight
// to its place in the other's recv (2 processes, 256 KiB: 86–101 µs
// against 97–105 staged; 1 MiB: 331–404, median 345, against 361–378,
// median 373). The tree AllReduce, which a crowded host's tcp ranks run
// (4 processes and more), sends its broadcast half the same way, its reduce
// half staged (4 processes on 2 cores, 1 MiB: 734–900 µs against 797–952
// staged, interleaved). Over a network the pipes move pieces of at most 256 KiB,
// 512 KiB between 2 ranks (netPiece, netPiece2, tuning.go), lent or staged.
// An AlltoAll or AlltoAllV
// whose send and receive buffers overlap is refused (ErrPara): there is no
// in-place form. lent.go has the protocol.
//
// # Lent send buffers (shm)
//
// Between processes of one host the reader does the work: each rank's hello
// carries its send buffer's address and where that buffer lies in its
// memory file (device.FileOf), and each peer reads its data straight from
// there into its own output (hcomm.ReadLentNbi): the pairwise AlltoAll and
// AlltoAllV's blocks, the direct AllGather's inputs, the direct Broadcast's
// buffer, the direct AllReduce's inputs and reduced blocks (its hello
// carries where recv lies too), from 16 KiB a peer on (readMin; between 2 processes from 4 KiB,
// the all-gather's inputs from 8 KiB: readLeast) — which the selector then prefers
// over the one-shot, the ring and the gather slots, whose staging takes two
// copies. The shm channel maps the peer's memory file read-only, after
// checking it is the file the peer named and sealed against shrinking, and
// keeps the mapping for the next call (channel/shm's "Reading memory the
// peer lends"); where it cannot, the kernel copies (process_vm_readv, as
// Open MPI's vader does). Each reader then records the owner's nDone, and
// the owner's collective ends only once every reader has: its send buffer
// stays as it was until then. Whether a pair reads is its channel's
// (Channel.ReadsLent, agreed by both ends at connect); a pair that cannot
// (a ptrace policy, another user) is staged within the same call — but in
// the direct all-reduce, which needs every pair to read: a rank with such a
// pair runs the ring instead, so that where the kernel refuses every pair
// the call runs as the ring, and where it refuses only some every rank's
// call fails at once with ErrMismatch naming the direct schedule and the
// ring (HCOMM_SHM_CMA_DISABLE=1 or HCCL_ALGO then choose for all).
// The direct AllGather whose output is 32 MiB or more (shmPushMin) turns
// the other way: each rank's hello carries where its receive buffer lies in
// its memory file, and each rank writes its input into every peer's output
// (hcomm.WritePeerLentNbi, through a writable mapping of the peer's file), a
// piece (at most 256 KiB) to every peer before the next, so that an input comes
// from memory once for all its copies instead of once for each reader (4
// processes, 64 MiB: 4.6–9.4 GB/s busbw, median 7.7, against 5.2–6.3, median
// 5.8, read); each writer records the receiver's nDone after its last piece,
// and the receiver's collective ends once every writer has.
// HCOMM_SHM_CMA_DISABLE=1 (Config.ShmCMADisable) turns reading off; ranks
// that disagree on it get ErrMismatch ("lent buffers") at the first call
// that would read, not a hang.
//
// Between ranks of one process the same reads are plain copies: the direct
// Broadcast's receivers read the root's buffer (from 16 KiB), and the
// direct AllGather's inputs and the pairwise AlltoAll's blocks below 1 MiB
// (inprocPullMax) are read by their receivers, whose outputs then stay in
// their caches (above, the senders' streamed writes win). A read copies
// plainly while source and output fit in the reader's share of its core's
// L2 cache — half the cache, divided among the ranks that share a core,
// never less than 512 KiB (internal/memcopy's ReadPlainMax, from sysfs) —
// and streams past the cache beyond (2 ranks in process, 1 MiB broadcast:
// 44–48 µs plain against 56–95 streamed on a core with 2 MiB of L2).
//
// # Device memory and the host
//
// Schedules move data only through hcomm's data plane and device copies; the
// few places where this package's own host code reads or writes device
// memory go through device.Device.Map and keep its view contract (fetch
// before reading what device work wrote, flush before device work reads what
// the host wrote), so that they hold on a backend whose memory the host
// cannot address:
//
//   - the handshake (handshake.go) maps the hello slots of the HCCL buffer
//     once; each hello task writes its header and inline payload into its own
//     slot and flushes it before the writes to the peers, and fetches each
//     peer's slot once that peer's notify has arrived, before checking it;
//   - the one-shot all-reduce's reduction (reduceInline) runs the reduction
//     kernels on the host, over the fetched hello slots, into a view of recv
//     that it flushes;
//   - the count tables of AlltoAll(V) and BatchSendRecv are stream copies from
//     host memory (MemcpyHtoDAsync);
//   - the host-slice layer (AllReduceSlice, …) stages the caller's slices in a
//     device buffer with MemcpyHtoD and copies results back with MemcpyDtoH;
//     device memory never aliases a Go slice;
//   - buffer arguments are checked with CheckRange, which touches nothing.
//
// What still assumes host-addressable memory lies below this package:
// hcomm's data plane (LocalCopy, LocalReduce and the channel reads and writes
// run with the processor over device.Device.Bytes) and the transports under
// it; the device package's documentation lists them. HCOMM_DEVICE_VIEW=copy
// makes every view a copy, as on an accelerator, and the tests run the
// collectives that way too (views_test.go).
//
// # The caller's duties
//
//  1. Every rank calls the same collectives in the same order with the same
//     count, type, op and root (the handshake reports a breach).
//  2. Collectives of one communicator are issued from one goroutine at a
//     time; calls on different streams are ordered by an event, as NCCL
//     orders them.
//  3. A buffer is not touched while a collective that uses it is pending on
//     its stream.
package collectives
