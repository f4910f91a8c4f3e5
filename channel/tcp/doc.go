// Package tcp is the channel transport between ranks on any hosts: framed
// one-sided writes, reads, write-reduces, notify records and fences over one
// or more TCP sockets per channel (hcomm's ROCE and UB protocols map here).
//
// # Where to start
//
// NewDialer opens the listener of a rank (Options: the address to bind, the
// sockets per channel, the secret, the peer timeout); its Connect implements
// channel.Dialer: it trades a hello with the peer through the
// channel.Exchange it is given (listener addresses, a random channel nonce,
// the registered memory, the notify count), then the lower rank dials the
// channel's sockets and the higher rank accepts them on its listener,
// matching them to the channel by the nonce. Every socket proves the shared
// secret both ways (HMAC-SHA256 over random challenges; the secret never
// travels). Connect returns a channel.Conn whose Transport is the channel and
// whose Notifies are this end's notifies, set by the peer's NotifyRecord.
//
// The wire format is written down in spec.md beside this file; frame.go holds
// the header, hello.go the setup messages, conn.go the channel's state and
// life (start, failure, Close); send.go, recv.go, order.go and liveness.go
// hold its sending, receiving, ordering across sockets and heartbeats.
//
// # How ordering works
//
// A Write returns once its bytes are handed to the kernel, and a large write
// is split into chunks that travel on all the channel's sockets at once, so a
// later frame on another socket may arrive before the write is complete.
// Order is restored at the receiver without waiting at the sender:
//
//  1. The sender counts the frames it writes on each socket.
//  2. A NOTIFY, READ or FENCE frame carries the ordering vector: the count of
//     every socket at the moment it was sent, which covers every frame of
//     every operation that returned before it.
//  3. The receiver counts, per socket, the frames it has read and applied.
//     It acts on an ordered frame only once each socket's applied count has
//     reached the frame's vector; until then the frame is parked, and every
//     applied frame re-examines the parked ones.
//
// So a write followed by a NotifyRecord on one thread is visible at the peer
// when the matching wait returns, a Read sees the writes issued before it,
// and Fence (answered only when its vector is reached) returns once every
// earlier operation is applied at the peer. Operations issued concurrently
// on different threads are not ordered with each other. Two writes of one
// thread to the same bytes land in issue order too: a WRITE or WRITE_REDUCE
// that overlaps a frame of another socket not yet known to be applied before
// it carries the ordering vector as well, and the peer's reader applies it
// only once the vector is reached (order.go; the common path carries none).
//
// WriteWithNotify (channel.WriteNotifier, what hcomm's WriteWithNotify calls
// use) sends a write that fits one frame and its NOTIFY in one system call
// on one socket, the NOTIFY's vector counting the WRITE: the peer reads both
// with one wake-up. The frames are the ones above; only the system calls are
// fewer (the 8-byte all-reduce of 2 processes: 50–60 → 37–48 µs).
//
// # Receiving: readers and pollers
//
// Each socket has a background reader that sleeps in Go's network poller
// until bytes arrive, and a receive engine (rx.go) that turns bytes into
// applied frames whatever reads brought them: a frame may come in over many
// reads. A payload of 16 KiB or more is read by the kernel straight into
// its destination, all but the part that came with its header (a read
// that begins a frame asks for little more than a short frame), so that
// each byte of a long write is copied once on this side. A caller that waits for the peer — hcomm's notify waits through
// Poll (channel.Poller), Read, ReadReduce and Fence — does not sleep at
// once: until Options.Spin (hcomm: Config.TCPSpin, HCOMM_TCP_SPIN; default
// 200 µs) has passed without a byte read, it reads the channel's sockets
// itself, with non-blocking reads on the descriptors that bypass the
// network poller, and applies whatever comes, as Open MPI's progress engine
// polls its endpoints — so a long message is polled to its end however
// long it takes to arrive. A sleeping
// waiter is woken through the host — the network poller's thread, the
// reader goroutine, then the waiter — which costs 30–70 µs a message on the
// small machines hcomm is measured on; a polling one sees the bytes as the
// kernel has them. A per-socket receive token keeps the two apart: only its
// holder reads, and every holder reads until the kernel has nothing more
// before it lets go, so the network poller sees every arrival after that
// and wakes the reader for it (progress.go). A Read, ReadReduce or Fence
// whose poll gave up sleeps in naps with Options.Nap (50 µs doubling to
// 10 ms, a look at the sockets after each): the network poller runs only
// when a processor is idle or every 10 ms, so a waiter in a process that
// keeps its processors busy would otherwise see its answer that late
// (hcomm's notify waits nap the same way, hcomm/wait.go). A caller that looks once and
// goes on (hcomm.ChannelNotifyTryWait, which the small collectives' lane
// calls in its own poll loop) uses PollOnce: one pass over the sockets,
// with no clock and no allocation. A look of Poll stops at the socket that
// brought what it waits for (a lone thread's small frames go out on the
// first socket, lockSock), and reads the others only every fourth look
// unless the last full look found bytes on them: a waiter's idle looks
// then cost one read, not one a socket.
//
// A receiver that knows where an expected write's payload goes next may
// have it put there (Steer, channel.Steerer; hcomm.ChannelSteer): the
// one-shot all-to-all's and all-gather's hellos, a header that stays in
// the hello slot and a block that the call would copy from there into its
// receive buffer. A read that starts a frame into an empty buffer while a
// steer is armed guesses that the frame is the steered write: one readv
// puts the bytes before the payload into the buffer, the payload into the
// steer's memory and what follows into the buffer; a guess that misses
// moves the bytes back, as one read would have left them. A steered write
// found in the buffer instead is copied there from it, once. Either way the
// block is copied once on this side, by the kernel or by the engine, where
// it was copied twice (4 tcp processes on 2 cores, 64 KiB all-to-all, eight
// launches interleaved: 49.1 µs against 51.2 as before, Open MPI 50.3; two
// hellos in three or four are steered, the rest having been read before
// their call armed the steer, and every guess hit). The wire protocol does
// not change.
//
// A write that a stop may end (hcomm's stream tasks) is watched: once it
// has waited watchDelay for the kernel to take its bytes, a watchdog looks
// at the stop and kills the channel when it closes, since half a frame
// cannot be taken back. The watchdog is armed only when the first,
// non-blocking attempt leaves bytes behind (liveness.go), which almost no
// small frame does.
//
// Between looks a poller yields to its process's goroutines, and, when the
// communicator's processes on the host are as many as its processors or
// more (Options.Yield), to the host's other threads (sched_yield) — where
// each of those processes has a processor, only once the poll has lasted
// Options.Tight (hcomm: 20 µs) or read part of a message, since a look
// with a yield is two system calls and takes twice as long to see a small
// message. A poller
// that finds it lost its processor between two looks (50 µs) sleeps at
// once: on a host with more runnable threads than processors, a sleeper the
// network poller wakes is scheduled ahead of a spinner. Measured on the
// 2-core VM the repository is developed on, with about 30 runnable threads
// of other jobs (load average 27–40), the measuring processes at nice -15,
// 16-byte all-reduce and the 8-byte round trip of hcomm bench p2p over tcp
// (hcomm run -n N, GOMAXPROCS 1 per rank):
//
//	p2p round trip, 2 processes (µs)   p50     p10    min
//	  HCOMM_TCP_SPIN=0 (no polling)    86–119  43–52  35
//	  HCOMM_TCP_SPIN=200us             27–39   25–31  14–24
//	  pingpong tcpspin (C, same minute) 17 (p50), pingpong tcp 20 (p50)
//
//	all-reduce 16 B, mean µs (CPU s of the whole run)   spin 0        spin 200us
//	  2 processes, 3000 iterations                     67–298 (1.3–1.5)  107–155 (0.9–1.1)
//	  4 processes, 1000 iterations                     495–702 (2.6–2.9) 846–1163 (1.8–2.0)
//	  8 processes, 500 iterations                      1590–2757 (5.8–6.3) 2260–3250 (4.1–4.3)
//
// The means on a host that loaded are set by the iterations that waited for
// a processor; the medians show the polling path. Polling cost no extra
// CPU: the runs took less processor time with it (reads that find nothing
// and yields cost less than the network poller's wake-ups). Oversubscribed
// runs (4 and 8 processes on 2 cores) never stalled, but their means were
// 1.2–1.7 times those without polling on that loaded host; the figures of a
// quiet host are in BENCHMARKS.md once measured there, and HCOMM_TCP_SPIN=0
// is the setting to compare against.
//
// # System calls that Go's scheduler does not count
//
// On linux the engine's socket calls — the pollers' and readers'
// non-blocking reads, the background reader's one-byte peek, the senders'
// writev — are raw system calls (rawsys_linux.go): none of them blocks,
// so none tells Go's scheduler that its thread entered a system call. With
// Go's counted calls, a thread that
// the kernel preempted inside one (routine when ranks outnumber cores) was
// seen "in a system call" by the runtime's monitor for longer than its
// 20 µs tick: the monitor gave the thread's processor to another thread,
// and the first, back from the call, found none and slept — a futex wake
// and a futex sleep per message, and a monitor that stayed on its 20 µs
// tick in every process. A sender whose socket is full still waits for
// room in the network poller (RawConn.Write, which honours the write
// deadlines that the liveness watch and Close set). Measured on the 2-core VM with
// strace -c on one rank of a 64 B all-reduce (recursive doubling): per
// all-reduce, 8.4 sleeps of the monitor and 2 futex calls before (16
// processes), 0.6 and 0.1 after (32 processes); the all-reduce among 16
// processes went from 2.9 ms to 0.6–0.8 ms, and 16 and 32 processes from
// 0.33–0.77 of Open MPI's speed at 64 KiB and 1 MiB to 0.84–1.33
// (BENCHMARKS.md, stop 15).
//
// # Failure
//
// The receiver trusts nothing: every header is validated (version, type,
// lengths, unused fields) and every address range must lie inside memory the
// receiving rank registered, before a byte of it is touched. A bad frame
// kills the channel: the receiver logs why, sends the peer an ERROR frame
// saying so and closes the sockets. A dead channel (protocol error, reset,
// EOF, no frame for Options.PeerTimeout while both ends send heartbeats, a
// send stuck as long) breaks every local notify with an *Error naming the
// peer, and every pending and later call returns that error. The monitor
// that tells (a tick every quarter of the timeout) watches counts the data
// path keeps anyway — reads that brought bytes, frames sent, writes begun
// and ended — and notes the tick at which each last moved, so that a frame
// reads no clock; silence is measured from that tick, never early and at
// most a tick late, and a socket that sent nothing since the last tick
// sends a heartbeat (every other tick when idle).
//
// Transport calls take a stop channel (a stream abort). A call waiting for
// the peer (Read, ReadReduce, Fence) returns at once when stop closes and the
// channel lives on. A call whose frames are still going out when stop closes
// (the peer stopped reading and the kernel buffers are full) returns within
// a few milliseconds and kills the channel, since half a frame cannot be
// recalled.
package tcp
