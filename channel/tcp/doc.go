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
// # Failure
//
// The receiver trusts nothing: every header is validated (version, type,
// lengths, unused fields) and every address range must lie inside memory the
// receiving rank registered, before a byte of it is touched. A bad frame
// kills the channel: the receiver logs why, sends the peer an ERROR frame
// saying so and closes the sockets. A dead channel (protocol error, reset,
// EOF, no frame for Options.PeerTimeout while both ends send heartbeats, a
// send stuck as long) breaks every local notify with an *Error naming the
// peer, and every pending and later call returns that error.
//
// Transport calls take a stop channel (a stream abort). A call waiting for
// the peer (Read, ReadReduce, Fence) returns at once when stop closes and the
// channel lives on. A call whose frames are still going out when stop closes
// (the peer stopped reading and the kernel buffers are full) returns within
// a few milliseconds and kills the channel, since half a frame cannot be
// recalled.
package tcp
