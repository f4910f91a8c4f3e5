// Package shm is the shared-memory transport: channels between ranks that
// are separate processes on one host. The peer's registered memory (its HCCL
// buffer and CommMemReg ranges) is mapped into this process, so a write is
// one copy() into the peer's pages and a notify record is one atomic on a
// word of a page both processes map, with a futex wake only when the waiter
// sleeps.
//
// # Where to start
//
// HostID tells whether a peer is on this host (compare the strings; the
// bootstrap carries them). NewDialer returns a channel.Dialer; its Connect,
// called by both ends with an Exchange that reaches the other, returns a
// channel.Conn whose Transport is a *Transport. Close the Transport to end
// the channel; Close the Dialer when no more channels are wanted.
//
// # Connecting
//
//  1. Each end describes its memory: the HCCL buffer first, then every range
//     of its Registry, each as a memfd descriptor and offset from
//     device.Share (device memory of the host backend is memfd-backed,
//     sealed against shrinking, reserved at Malloc, or committed as it is
//     touched for MallocLazy: the HCCL buffer). It also makes its
//     notify page: a sealed memfd with one 32-bit word per notify, each on a
//     64-byte line.
//  2. The ends trade a hello through the Exchange: host id, pid, ranks, and
//     from the lower rank, which listens, the name of a fresh abstract unix
//     socket (random, nothing in the file system) and a random secret.
//  3. The higher rank dials and sends the secret; each end checks the other's
//     pid with SO_PEERCRED. A caller that fails is dropped and the listener
//     keeps waiting (until ctx ends).
//  4. In turns (listener first), each end sends its description with the
//     descriptors attached (SCM_RIGHTS); the receiver checks every range
//     (sizes, overflow, the descriptor is a memory file sealed against
//     shrinking, the range lies inside it), maps it MAP_SHARED, and answers
//     READY, or REFUSE with the reason, which the other end reports.
//
// The socket stays open for the channel's life: it is how each end learns
// that the other is gone.
//
// # Memory model
//
// Conn.RemoteMems are the peer's ranges in the peer's address space: the
// addresses the data plane passes as dst/src. The transport translates them
// into its mappings after checking that the whole range lies inside one
// range the peer shared at connect; anything else fails with ErrOutOfRange
// and touches nothing. Memory the peer registers after the connect is not
// reachable through the channel (hcomm's checks refuse it first); acquire a
// new channel to reach it. A range the peer frees stays mapped here until
// Close: writes into it land in pages nobody reads, never in other memory.
//
// A notify record (NotifyRecord) is a sequentially consistent
// compare-and-swap on the peer's word, and the wait that consumes it another:
// a release and an acquire, so bytes written before a record are visible to
// the peer once its wait returns. Waits poll for 50 µs, giving the core to
// other processes (sched_yield) between polls, and then sleep on the word
// with FUTEX_WAIT, so ranks that outnumber the cores still make progress; see notify.NewShared for the word's layout. Fence is a
// memory barrier only: a write is complete at the peer when the copy returns.
//
// A notify's calls take no lock against Close (a poll would pay two atomics
// more for it), so a call racing with Close may touch its word once after
// the channel is gone: Close therefore does not unmap this end's notify
// page but maps private memory over it — the memory file is let go at once
// — and the page's addresses are unmapped when its notifies are garbage.
// A prepared line (PrepareLine: the low-latency protocol's stores into the
// peer's memory) takes no lock either: its Put checks the channel with two
// atomic loads, stores, and fences, so that the line leaves the core before
// the poll that follows. A mapping of the peer's memory that lines store
// into is retired the same way when the channel closes or the peer leaves,
// and unmapped when its last line is garbage; one without lines is unmapped
// at once.
//
// # Reading memory the peer lends
//
// Once it has mapped the peer's description, each end finds how it may read
// the peer's memory and says so in its READY: through the kernel
// (process_vm_readv of one word of the peer's HCCL buffer — Linux's
// cross-memory attach, which Open MPI's vader uses for large messages), and
// by opening the peer's descriptors (its /proc/<pid>/fd, which Yama's
// ptrace_scope 1 — Ubuntu's default — allows where it refuses
// process_vm_readv). A way is the pair's when both ends have it
// (Transport.ReadsPeer: the same answer on both). Such a pair reads memory
// the peer lends for one operation anywhere in the peer's address space
// (Transport.ReadPeer) — a collective's send buffer, whose address and
// memory file the peer's hello carries — in one copy, without the peer
// sharing it at connect: from a read-only mapping of the peer's memory file
// (peerfile.go) when the file checks out, else by process_vm_readv. The
// kernel checks the range against the peer's mappings: one that is not
// mapped there fails the read, and nothing of this process but dst is
// written. Where the kernel allows neither (ptrace_scope 2 and up, a seccomp
// profile, other users), the pair reads nothing this way and the
// collectives stage through the HCCL buffers as before.
//
// A pair that reads may also write memory the peer lends (Transport.WritePeer,
// channel.PeerWriter: the same permission) — a collective's receive buffer,
// which the peer's hello names the same way — through a writable mapping of
// the peer's memory file with a streaming copy, else by process_vm_writev.
// The kernel checks an address against the peer's mappings; nothing can
// check that the peer lent the range its hello names, so a peer that names
// another has its own memory written, which it could have written itself.
//
// # When a process dies
//
// The kernel closes a dead process's socket; the watcher goroutine of each
// of its channels in the surviving process sees the end without a goodbye
// (BYE), breaks every local notify of the channel with an error wrapping
// channel.ErrPeerLost that names the lost rank and its pid, and later
// operations on the transport fail with it. A pending wait fails at once
// instead of sitting out its timeout. A peer that closes its end cleanly
// sends BYE first: the same happens with channel.ErrPeerClosed, and this end
// then unmaps the peer's memory and notify page at once (hcomm's
// ChannelDestroy relies on it to stop sharing memory). Memory mapped from a
// dead peer stays valid (the pages live until this end
// unmaps them), so nothing faults; memfds have no name, so nothing is
// left in /dev/shm or anywhere else when either process dies.
//
// # Wire formats
//
// The hello (in the Exchange), little-endian:
//
//	"hcshm" version:u8 pid:i32 rank:i32 peer:i32 listen:u8
//	hostIDLen:u16 hostID addrLen:u16 addr secret:[16]byte
//
// Socket messages (SOCK_SEQPACKET, one message each, type byte first):
//
//	AUTH    1 secret:[16]byte                               dialer's first message
//	MEMS    2 count:u16 {addr:u64 size:u64 offset:u64 fd:u16 tagLen:u8 tag}
//	          at most 64 entries, one descriptor per non-empty range (fd is
//	          its index among the message's descriptors; 0xFFFF for none)
//	DONE    3 total:u32 notifies:u32                        + the notify page's descriptor when notifies > 0
//	READY   4 flags:u8                                      the description was mapped;
//	          flag 1: the sender could read this end's memory (process_vm_readv),
//	          flag 2: it could open this end's descriptors (/proc/<pid>/fd)
//	REFUSE  5 len:u16 text                                  why the sender gives up
//	BYE     6                                               the sender closes its end
//
// Limits: 65536 ranges, 65535 notifies, 1 TiB per range, 4 KiB of refusal
// text. A message outside them is refused, never trusted.
package shm
