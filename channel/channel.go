// Package channel is the contract between hcomm's channels and the
// transports that carry them (HCCL's ChannelHandle is hcomm.Channel, built on
// it). A transport moves bytes and signals to one peer (Transport, and
// WriteNotifier where it can send a write and its record together); a Dialer
// makes one end of a connection from what the rank brings (Local) and returns
// what the peer brought (Conn): its registered memory, HCCL buffer first, and
// the notify counts of both ends. Registered memory is Mem, a rank's set of it
// a Registry. The transports live in subpackages: inproc (ranks of one
// process), shm (processes of one host) and tcp (any hosts); hcomm picks one
// per channel from the protocol and where the peer runs. channeltest is the
// suite of the contract that each of them runs.
//
// The duties are split: hcomm checks every remote range against the memory
// the peer registered, and every notify index, before it asks a transport to
// act; the transport's far end checks again against what it registered
// itself (it trusts no frame), so a bad address never reaches a peer's
// memory. The errors every transport shares are the sentinels below, tested
// with errors.Is as net.ErrClosed is; each transport wraps them in an error
// that names the ranks, the channel and the operation.
package channel

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/reduce"
)

// Errors of every transport, wrapped by the errors its Transport methods and
// its Dialer's Connect return.
var (
	// ErrClosed: this end of the channel, or the Dialer, is closed.
	ErrClosed = errors.New("channel: closed")
	// ErrPeerClosed: the peer closed its end of the channel in order.
	ErrPeerClosed = errors.New("channel: peer closed the channel")
	// ErrPeerLost: the peer went away without closing its end — its process
	// died, its connection broke, or it fell silent past the transport's
	// timeout. The channel's local notifies are broken with it.
	ErrPeerLost = errors.New("channel: peer lost")
	// ErrRefused: the setup failed because one end refused the other: a
	// wrong secret, a malformed or misdirected hello, a peer that is not an
	// hcomm transport of this version.
	ErrRefused = errors.New("channel: connection refused")
)

// Mem is a registered range of device memory (HCCL's CommMem): the HCCL
// buffer, or memory registered with HcclCommMemReg.
type Mem struct {
	Tag  string
	Addr device.Ptr
	Size int64
}

// Contains reports whether [p, p+n) lies inside m.
func (m Mem) Contains(p device.Ptr, n int64) bool {
	return n >= 0 && p >= m.Addr && int64(p-m.Addr) <= m.Size && n <= m.Size-int64(p-m.Addr)
}

// Registry is a rank's set of registered memory, read by its peers' channels.
// Safe for concurrent use.
type Registry struct {
	mu   sync.RWMutex
	mems []Mem
}

// Add registers m.
func (r *Registry) Add(m Mem) {
	r.mu.Lock()
	r.mems = append(r.mems, m)
	r.mu.Unlock()
}

// Remove unregisters the range that starts at addr with tag; it reports
// whether there was one.
func (r *Registry) Remove(addr device.Ptr, tag string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, m := range r.mems {
		if m.Addr == addr && m.Tag == tag {
			r.mems = append(r.mems[:i], r.mems[i+1:]...)
			return true
		}
	}
	return false
}

// Find returns the registered range holding [p, p+n).
func (r *Registry) Find(p device.Ptr, n int64) (Mem, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, m := range r.mems {
		if m.Contains(p, n) {
			return m, true
		}
	}
	return Mem{}, false
}

// List returns a copy of the registered ranges.
func (r *Registry) List() []Mem {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return append([]Mem(nil), r.mems...)
}

// Transport moves bytes and signals to one peer. Methods run inside stream
// tasks, in the order the tasks run; they block until the operation is done at
// the far end as far as ordering requires: a NotifyRecord issued after a Write
// is seen by the peer only after the written bytes are visible there, a Read
// sees the writes issued before it, and records arrive in the order they were
// made. Two writes (or write-reduces) of one caller to the same bytes land in
// the order they were issued, with nothing between them (tcp, which sends
// them on different sockets, orders the second after the first). A range
// outside the peer's registered memory fails, at the latest at the next Fence,
// and never touches it. stop closes when the task must give up (abort).
// Package channeltest checks all of this for every transport.
type Transport interface {
	// Name is the transport's name ("inproc", "shm", "tcp").
	Name() string
	// Write copies src into the peer's memory at dst.
	Write(stop <-chan struct{}, dst device.Ptr, src []byte) error
	// Read copies the peer's memory at src into dst.
	Read(stop <-chan struct{}, dst []byte, src device.Ptr) error
	// WriteReduce computes peer[dst] = peer[dst] op src over count elements.
	WriteReduce(stop <-chan struct{}, dst device.Ptr, src []byte, count int, dt reduce.DataType, op reduce.Op) error
	// ReadReduce computes dst = dst op peer[src] over count elements.
	ReadReduce(stop <-chan struct{}, dst []byte, src device.Ptr, count int, dt reduce.DataType, op reduce.Op) error
	// NotifyRecord records the peer's notify idx on its end of the channel.
	NotifyRecord(stop <-chan struct{}, idx int) error
	// Fence returns once every earlier operation is complete at the peer.
	Fence(stop <-chan struct{}) error
	// Close releases the transport. Idempotent.
	Close() error
}

// WriteNotifier is implemented by a transport that sends a write and the
// notify record that follows it together, more cheaply than Write and then
// NotifyRecord (tcp: in one system call). The data plane uses it for
// WriteWithNotify when the transport has it; the guarantee is the same: the
// bytes are visible to the peer once its wait for the record returns.
type WriteNotifier interface {
	WriteWithNotify(stop <-chan struct{}, dst device.Ptr, src []byte, idx int) error
}

// StreamWriter is implemented by a transport whose write is a memory copy
// that can skip the cache (inproc): WriteStream is Write for bytes the peer
// does not read again soon — a collective's output, written in place into
// the peer's receive buffer (hcomm.WriteLentNbi) — stored with
// non-temporal stores (internal/memcopy), which neither read the
// destination's lines first nor evict what the cache holds. A write the
// peer reads right after (a pipe slot) must not stream.
type StreamWriter interface {
	WriteStream(stop <-chan struct{}, dst device.Ptr, src []byte) error
}

// WriteVNotifier is implemented by a transport that writes a source in
// pieces — a header here, a payload there — to one range of the peer's
// memory and records a notify after it more cheaply than one write per
// piece (tcp: one frame, gathered by writev). The data plane uses it for
// WriteVWithNotify when the transport has it; the guarantee is
// WriteWithNotify's.
type WriteVNotifier interface {
	WriteVWithNotify(stop <-chan struct{}, dst device.Ptr, srcs [][]byte, idx int) error
}

// ReceiverChecker is implemented by a transport whose receiving end checks
// every write against the memory its own rank has registered when the write
// arrives (tcp: a write outside it breaks the channel before a byte is
// stored). Its writes may therefore target memory the peer registered after
// the channel was made — a receive buffer a collective lends for one call
// (hcomm.WriteLentWithNotifyNbi) — which the writing end cannot check.
// inproc implements it too: its copies check the peer's own registry as
// they run. shm, whose writes go into the peer memory mapped when the
// channel was made, does not. A Dialer (one of hcomm.InitAllOver's) that
// implements it says so of every channel it makes, before any is made
// (hcomm.Comm.TakesLentTo): the collectives choose their schedules on it.
type ReceiverChecker interface {
	ChecksOnReceipt() bool
}

// PeerReader is implemented by a transport that can read the peer's memory
// anywhere in the peer's address space, not only the ranges the peer shared
// when the channel was made: memory the peer lends for one operation (a
// collective's send buffer), whose address the peer tells this end itself.
// The kernel copies and checks the range against the peer's mappings (shm:
// process_vm_readv), so a wrong address fails the read and writes nothing
// of this process but dst. ReadsPeer reports whether the pair can — both
// ends found so at connect, so the answer is the same on both.
//
// file, when its FD is not negative, says where src lies in the peer's
// memory file (device.FileOf on the peer): a transport may then map the
// file and copy from the mapping itself, checking that the file it opens
// through the descriptor is the one the inode names; anything that does
// not check out falls back to the kernel's copy.
type PeerReader interface {
	ReadsPeer() bool
	ReadPeer(stop <-chan struct{}, dst []byte, src device.Ptr, file PeerFile) error
}

// PeerWriter is implemented by a transport that can also write memory the
// peer lends for one operation (a collective's receive buffer), on a pair
// that reads (PeerReader.ReadsPeer: the same permission). file is where dst
// lies in the peer's memory file, as for ReadPeer; the copy goes into a
// mapping of it, or through the kernel, which checks the range against the
// peer's mappings.
type PeerWriter interface {
	WritePeer(stop <-chan struct{}, dst device.Ptr, src []byte, file PeerFile) error
}

// PeerFile is device.FileRef as a peer tells it: where a range of its
// memory lies in its memory file. FD negative: none.
type PeerFile struct {
	FD  int64
	Ino uint64
	Off int64
}

// NoPeerFile is a PeerFile that names no file.
var NoPeerFile = PeerFile{FD: -1}

// Poster is implemented by a transport that stores into the peer's memory
// itself (inproc, shm): a write into one range of the peer's memory followed
// by a record of one of its notifies — the hello that opens every small
// collective, repeated call after call — can be checked once and then done
// with no check but the channel's liveness.
type Poster interface {
	// PreparePost checks [dst, dst+n) against the peer's registered memory
	// and idx against its notifies, once.
	PreparePost(dst device.Ptr, n int64, idx int) (Post, error)
}

// Post is a write and record prepared by PreparePost.
type Post interface {
	// Post copies src (at most the prepared length) to the start of the
	// range and then records the notify: WriteWithNotify without the
	// checks. It fails once either end of the channel is closed.
	Post(src []byte) error
}

// Poller is implemented by a transport whose receiving a waiting caller can
// drive (tcp). Such a transport's records arrive through its own goroutines,
// which sleep in the network poller; a waiter that sleeps too is woken
// through the host twice. Instead, hcomm's notify waits call Poll before
// they sleep: the waiter reads the channel's sockets itself for a bounded
// time, as Open MPI's progress engine polls its endpoints, and applies
// whatever arrives — its own record, and everything else the peer sent.
type Poller interface {
	// Poll receives and applies what the peer sent, without blocking, until
	// done reports true (Poll reports true), stop closes, the channel fails,
	// limit passes (when it is positive) or the transport's own bound on
	// polling does (Poll reports false: the caller then waits as it would
	// have). done is called on the polling goroutine only. Safe for
	// concurrent use.
	Poll(stop <-chan struct{}, limit time.Duration, done func() bool) bool
	// PollOnce receives and applies what the peer has sent so far, once,
	// without waiting, and reports whether it brought anything: a caller's
	// single look (hcomm.ChannelNotifyTryWait), with none of Poll's clock
	// and no closure. Safe for concurrent use.
	PollOnce() bool
}

// Steerer is implemented by a transport whose receiving end places the
// peer's writes itself (tcp). A receiver that expects one write of a known
// range of its memory — a collective's hello: a header, then a block that
// the call would copy on into its receive buffer — may ask that the write's
// bytes past the header go straight to that buffer, saving the copy.
type Steerer interface {
	// Steer arms the steer: the next write of exactly n bytes at at (this
	// end's memory) that arrives stores its first keep bytes at at and the
	// other n-keep into to, which must be n-keep bytes long. false: the
	// transport cannot now (no room, a failed channel, a range it would
	// refuse); every write lands where it is addressed, as always. While
	// the steer is armed the transport may also use to as room for a read
	// (tcp guesses that the next frame is the steered write, and reads its
	// payload there): what to holds is undefined until End, and after End
	// reports SteerUnused the caller fills it itself.
	Steer(at device.Ptr, n, keep int64, to []byte) (Steered, bool)
}

// Steered is an armed steer (Steerer.Steer). The caller must End it, and
// may not touch to until it has.
type Steered interface {
	// End withdraws the steer and reports what became of the write. After
	// the caller's wait for the record that follows the write returned, it
	// is SteerUnused (the write arrived before the steer was armed, or
	// another way: its bytes are at at) or SteerLanded (past keep, in to).
	// SteerCut, a write half in when End gave up on it or its socket
	// failed, leaves neither place whole. Nothing is stored into to once
	// End has returned.
	End() SteerResult
}

// SteerResult is what Steered.End reports.
type SteerResult uint8

const (
	SteerUnused SteerResult = iota // no write took the steer
	SteerLanded                    // a write took it and is all in
	SteerCut                       // a write took it and was cut short
)

func (r SteerResult) String() string {
	switch r {
	case SteerUnused:
		return "unused"
	case SteerLanded:
		return "landed"
	case SteerCut:
		return "cut"
	}
	return fmt.Sprintf("SteerResult(%d)", uint8(r))
}

// Clocked is implemented by a transport that keeps virtual time (channel/sim,
// the simulator's): a notify record carries the time it arrives, which a wait
// can only learn when it returns. hcomm calls NotifyWaited from the wait's
// own goroutine as soon as a wait on this end's notify idx has returned, and
// never for a wait that failed; other transports do not implement it and
// cost nothing.
type Clocked interface {
	NotifyWaited(idx int)
}

// LocalCoster is implemented by a Dialer whose transports keep virtual time:
// hcomm calls LocalWork from the stream task of each local copy or reduction
// of bytes bytes (LocalCopyOnThread, LocalReduceOnThread,
// LocalReduceToOnThread) of the rank the Dialer serves, as the task runs, so
// that the rank's clock is charged for it.
type LocalCoster interface {
	LocalWork(bytes int64)
}

// HostProcessors is implemented by a Dialer that knows how many processors
// the host of the rank it serves has (channel/sim's, from its profile):
// hcomm.InitAllOver publishes the count as the rank's, as InitAll publishes
// its process's, so that a simulated cluster is crowded (hcomm.Comm.Crowded)
// exactly when a real one of its shape would be. 0 means not known.
type HostProcessors interface {
	HostProcessors() int
}
