package hcomm

import (
	"math"
	"sync"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/metrics"
)

// Immediate mode: HCCL's thread-less data-plane calls (HcommWriteNbi,
// HcommWriteWithNotifyNbi, HcommReadNbi, HcommChannelNotifyRecord,
// HcommChannelNotifyWait, HcommChannelFence;
// experimental in HCCL). They do their work in the calling goroutine, now,
// instead of enqueueing a task — made for the body of one stream task that
// runs a whole step of a schedule (Launch on the thread's stream), so that a
// latency-bound collective costs one task instead of one per transfer and
// wait. They check their arguments exactly as the *OnThread forms do, and
// keep the data plane's guarantees: a write followed by a record of the
// peer's notify on the same channel is visible to the peer once its wait
// returns.
//
// Departure from HCCL: each takes stop, the stop channel of the task it runs
// in (nil outside one), so that a stream abort or a closed device ends a
// wait or a blocked transfer as it ends a queued one.

// WriteNbi writes n bytes from local src to the peer's dst, now
// (HcommWriteNbi).
func WriteNbi(stop <-chan struct{}, ch *Channel, dst, src device.Ptr, n int64) error {
	return writeNow("WriteNbi", stop, ch, dst, src, n, -1)
}

// WriteWithNotifyNbi writes n bytes from local src to the peer's dst and then
// records the peer's notify remoteIdx, now (HcommWriteWithNotifyNbi).
func WriteWithNotifyNbi(stop <-chan struct{}, ch *Channel, dst, src device.Ptr, n int64, remoteIdx int) error {
	if remoteIdx < 0 { // writeNow's "no record"
		return errorOf(ch, "WriteWithNotifyNbi", "remote notify index %d is negative", remoteIdx)
	}
	return writeNow("WriteWithNotifyNbi", stop, ch, dst, src, n, remoteIdx)
}

// WriteLentWithNotifyNbi is WriteWithNotifyNbi into memory the peer lent
// for one operation: a range it registered (CommMemReg) after the channel
// was made, whose address it told this rank itself (a collective's hello
// carries the receive buffer's address). This rank cannot check dst — it
// knows only the ranges the peer had registered when the channel was made
// — so the peer's end checks it as the bytes arrive, and a write outside
// what the peer registered never touches its memory: over tcp it breaks
// the channel there (ErrProtocol on the peer), in one process (inproc) it
// fails here. Only a transport that checks on receipt takes it
// (Channel.TakesLent: tcp, inproc); shm refuses it with ErrNotSupport. The
// collectives use it to write a peer's block straight into the peer's
// receive buffer: over tcp its socket reads into it with no copy out of
// the HCCL buffer, in one process it is one copy instead of two. An hcomm
// extension.
func WriteLentWithNotifyNbi(stop <-chan struct{}, ch *Channel, dst, src device.Ptr, n int64, remoteIdx int) error {
	if remoteIdx < 0 { // writeLent's "no record"
		return errorOf(ch, "WriteLentWithNotifyNbi", "remote notify index %d is negative", remoteIdx)
	}
	return writeLent("WriteLentWithNotifyNbi", stop, ch, dst, src, n, remoteIdx)
}

// WriteLentNbi is WriteLentWithNotifyNbi without the record: a piece of a
// lent write whose last piece records.
func WriteLentNbi(stop <-chan struct{}, ch *Channel, dst, src device.Ptr, n int64) error {
	return writeLent("WriteLentNbi", stop, ch, dst, src, n, -1)
}

func writeLent(op string, stop <-chan struct{}, ch *Channel, dst, src device.Ptr, n int64, remoteIdx int) error {
	c, err := chanComm(op, ch)
	if err != nil {
		return err
	}
	if !ch.TakesLent() {
		return c.errorf(op, ch.RemoteRank(), ErrNotSupport, nil, "the %s channel to rank %d does not check writes on receipt (tcp does): write into the memory it registered", ch.Transport(), ch.RemoteRank())
	}
	if n < 0 {
		return c.errorf(op, ch.RemoteRank(), ErrPara, nil, "length %d is negative", n)
	}
	if dst == 0 || uint64(dst) > math.MaxUint64-uint64(n) {
		return c.errorf(op, ch.RemoteRank(), ErrPara, nil, "remote dst [%#x, +%d) is not a range", uintptr(dst), n)
	}
	// A lent write fills the peer's receive buffer, the collective's
	// output: streamed past the cache where the transport copies memory.
	return c.writeFrom(op, stop, ch, dst, src, n, remoteIdx, true)
}

// Segment is a range of local memory: N bytes from Src.
type Segment struct {
	Src device.Ptr
	N   int64
}

// maxSegments bounds WriteVWithNotifyNbi's pieces.
const maxSegments = 8

// segPool recycles WriteVWithNotifyNbi's views of its segments.
var segPool = sync.Pool{New: func() any { return new([maxSegments][]byte) }}

// WriteVWithNotifyNbi writes the segments one after the other into the
// peer's memory from dst on, and then records the peer's notify remoteIdx,
// now: WriteWithNotifyNbi for a source in pieces (a header here, a payload
// there; at most 8), without copying them together first. A transport that
// can (tcp: one frame, gathered by writev) sends them as one write; the
// guarantee is WriteWithNotifyNbi's. hcomm's own (HCCL has no gathered
// write); the collectives' hellos with a payload of their own per peer use
// it.
func WriteVWithNotifyNbi(stop <-chan struct{}, ch *Channel, dst device.Ptr, segs []Segment, remoteIdx int) error {
	const op = "WriteVWithNotifyNbi"
	c, err := chanComm(op, ch)
	if err != nil {
		return err
	}
	if len(segs) == 0 || len(segs) > maxSegments {
		return c.errorf(op, ch.RemoteRank(), ErrPara, nil, "%d segments: want 1 to %d", len(segs), maxSegments)
	}
	// The segments' host views, from a pool: passed to the transport
	// through an interface, an array on the stack would be moved to the
	// heap on every call (a small collective's hellos make one a peer).
	bp := segPool.Get().(*[maxSegments][]byte)
	defer func() { *bp = [maxSegments][]byte{}; segPool.Put(bp) }()
	bufs := bp
	var total int64
	for i, sg := range segs {
		if sg.N < 0 || sg.N > 1<<62-total {
			return c.errorf(op, ch.RemoteRank(), ErrPara, nil, "segment %d: length %d is negative or makes the write too long", i, sg.N)
		}
		if sg.N == 0 {
			continue
		}
		b, err := c.dev.Bytes(sg.Src, sg.N)
		if err != nil {
			return c.errorf(op, ch.RemoteRank(), ErrPara, err, "local segment %d", i)
		}
		bufs[i] = b
		total += sg.N
	}
	if err := c.remoteCheck(op, ch, "dst", dst, total); err != nil {
		return err
	}
	if err := c.remoteIdxCheck(op, ch, remoteIdx); err != nil {
		return err
	}
	if wv, ok := ch.tr.(channel.WriteVNotifier); ok && total > 0 {
		err = c.moved(ch, metrics.Write, total, wv.WriteVWithNotify(stop, dst, bufs[:len(segs)], remoteIdx))
	} else {
		// One write per piece, the last with the record.
		at := dst
		for i, b := range bufs[:len(segs)] {
			idx := -1
			if i == len(segs)-1 {
				idx = remoteIdx
			}
			if err = c.write(stop, ch, at, b, idx); err != nil {
				break
			}
			at = at.Add(int64(len(b)))
		}
	}
	if err != nil {
		return c.taskFailed(op, ch.RemoteRank(), err)
	}
	return nil
}

func writeNow(op string, stop <-chan struct{}, ch *Channel, dst, src device.Ptr, n int64, remoteIdx int) error {
	c, err := chanComm(op, ch)
	if err != nil {
		return err
	}
	if err := c.remoteCheck(op, ch, "dst", dst, n); err != nil {
		return err
	}
	return c.writeFrom(op, stop, ch, dst, src, n, remoteIdx, false)
}

// writeFrom is the rest of an immediate write once dst is checked (or left
// to the peer): the local check of src, once, and of the notify index when
// the write records one (remoteIdx >= 0), then the write (with stream, past
// the cache where the transport copies memory: channel.StreamWriter).
func (c *Comm) writeFrom(op string, stop <-chan struct{}, ch *Channel, dst, src device.Ptr, n int64, remoteIdx int, stream bool) error {
	b, err := c.dev.Bytes(src, n)
	if err != nil {
		return c.errorf(op, ch.RemoteRank(), ErrPara, err, "local src")
	}
	if remoteIdx >= 0 {
		if err := c.remoteIdxCheck(op, ch, remoteIdx); err != nil {
			return err
		}
	}
	if err := c.writeHow(stop, ch, dst, b, remoteIdx, stream); err != nil {
		return c.taskFailed(op, ch.RemoteRank(), err)
	}
	return nil
}

// WriteFlaggedNbi stores n bytes from local src into the peer's memory at
// dst as flagged words, now: each 4 bytes of src beside flag, one atomic
// 8-byte store each (channel.FlagWriter), so that the peer, polling its own
// memory with channel.TakeFlagged for flag, sees the data without a notify —
// the data plane of a low-latency protocol. n must be a multiple of 4, dst
// 8-byte aligned, and the 2n bytes at dst inside the peer's registered
// memory; a transport without flagged words (tcp: see Channel.Flagged) is an
// ErrNotSupport error. It does not wait: the caller's protocol must keep
// the peer's words from being rewritten before the peer has taken them.
func WriteFlaggedNbi(stop <-chan struct{}, ch *Channel, dst, src device.Ptr, n int64, flag uint32) error {
	const op = "WriteFlaggedNbi"
	c, err := chanComm(op, ch)
	if err != nil {
		return err
	}
	fw, ok := ch.tr.(channel.FlagWriter)
	if !ok {
		return c.errorf(op, ch.RemoteRank(), ErrNotSupport, nil, "the %s channel to rank %d has no flagged writes (inproc and shm have)", ch.Transport(), ch.RemoteRank())
	}
	if n < 0 || n%4 != 0 || dst%8 != 0 {
		return c.errorf(op, ch.RemoteRank(), ErrPara, nil, "flagged write of %d bytes to %#x: want a non-negative multiple of 4 bytes and an 8-byte aligned address", n, uintptr(dst))
	}
	if err := c.remoteCheck(op, ch, "dst", dst, 2*n); err != nil {
		return err
	}
	b, err := c.dev.Bytes(src, n)
	if err != nil {
		return c.errorf(op, ch.RemoteRank(), ErrPara, err, "local src")
	}
	if err := c.moved(ch, metrics.Write, 2*n, fw.WriteFlagged(stop, dst, b, flag)); err != nil {
		return c.taskFailed(op, ch.RemoteRank(), err)
	}
	return nil
}

// WriteLineNbi stores n bytes (at most channel.LineData, 56) from local src
// into the line of the peer's memory at dst, now: the data with plain
// stores, then the line's first word — flag — with one release store
// (channel.PutLine), so that the peer, polling its own memory with
// channel.TakeLine for flag, sees the data without a notify: a message and
// its signal in one cache line when dst is 64-byte aligned. A protocol that
// then loads a word the peer stores, and needs the line visible first,
// calls channel.Fence between the two. dst must be
// 8-byte aligned and the channel.LineSize bytes at dst inside the peer's
// registered memory; a transport without flagged writes (tcp: see
// Channel.Flagged) is an ErrNotSupport error. It does not wait: the
// caller's protocol must keep the peer's line from being rewritten before
// the peer has taken it.
func WriteLineNbi(stop <-chan struct{}, ch *Channel, dst, src device.Ptr, n int64, flag uint32) error {
	const op = "WriteLineNbi"
	c, fw, err := lineChannel(op, ch, dst, n)
	if err != nil {
		return err
	}
	b, err := c.dev.Bytes(src, n)
	if err != nil {
		return c.errorf(op, ch.RemoteRank(), ErrPara, err, "local src")
	}
	if err := c.moved(ch, metrics.Write, n, fw.WriteLine(stop, dst, b, flag)); err != nil {
		return c.taskFailed(op, ch.RemoteRank(), err)
	}
	return nil
}

// lineChannel checks a line write of n bytes to the peer's dst.
func lineChannel(op string, ch *Channel, dst device.Ptr, n int64) (*Comm, channel.FlagWriter, error) {
	c, err := chanComm(op, ch)
	if err != nil {
		return nil, nil, err
	}
	fw, ok := ch.tr.(channel.FlagWriter)
	if !ok {
		return nil, nil, c.errorf(op, ch.RemoteRank(), ErrNotSupport, nil, "the %s channel to rank %d has no line writes (inproc and shm have)", ch.Transport(), ch.RemoteRank())
	}
	if n < 0 || n > channel.LineData || dst%8 != 0 {
		return nil, nil, c.errorf(op, ch.RemoteRank(), ErrPara, nil, "line write of %d bytes to %#x: want at most %d bytes and an 8-byte aligned address", n, uintptr(dst), channel.LineData)
	}
	if err := c.remoteCheck(op, ch, "dst", dst, channel.LineSize); err != nil {
		return nil, nil, err
	}
	return c, fw, nil
}

// PreparedLine is WriteLineNbi checked once, for a line a protocol stores
// into call after call (the low-latency hello's). Each Put checks only that
// the communicator and the channel are usable, and takes no lock: over shm
// the mapping of the peer's memory that it stores into stays addressable
// while the PreparedLine is reachable — after the channel closes, as
// private memory that no longer holds the peer's — and goes when it is
// garbage, so drop a PreparedLine with its channel. An hcomm extension.
type PreparedLine struct {
	ch  *Channel
	put channel.LinePut
}

// PrepareLine checks a line write to the peer's dst as WriteLineNbi does.
func PrepareLine(ch *Channel, dst device.Ptr) (*PreparedLine, error) {
	const op = "PrepareLine"
	c, fw, err := lineChannel(op, ch, dst, 0)
	if err != nil {
		return nil, err
	}
	put, err := fw.PrepareLine(dst)
	if err != nil {
		return nil, c.taskFailed(op, ch.RemoteRank(), err)
	}
	return &PreparedLine{ch: ch, put: put}, nil
}

// Put stores src (at most channel.LineData bytes) into the prepared line,
// then flag, now.
func (l *PreparedLine) Put(src []byte, flag uint32) error {
	const op = "PreparedLine.Put"
	c, err := chanComm(op, l.ch)
	if err != nil {
		return err
	}
	if err := c.moved(l.ch, metrics.Write, int64(len(src)), l.put.Put(src, flag)); err != nil {
		return c.taskFailed(op, l.ch.RemoteRank(), err)
	}
	return nil
}

// ReadNbi reads n bytes from the peer's src into local dst, now
// (HcommReadNbi).
func ReadNbi(stop <-chan struct{}, ch *Channel, dst, src device.Ptr, n int64) error {
	const op = "ReadNbi"
	c, err := chanComm(op, ch)
	if err != nil {
		return err
	}
	body, err := c.prepRead(op, ch, dst, src, n)
	if err != nil {
		return err
	}
	if err := body(stop); err != nil {
		return c.taskFailed(op, ch.RemoteRank(), err)
	}
	return nil
}

// ReadLentNbi reads n bytes of the peer's memory at src into local dst,
// now: memory the peer lent for one operation — its address in the peer's
// address space, which the peer told this rank itself (a collective's
// hello carries its send buffer's), registered or not. This rank cannot
// check src; the kernel checks it against the peer's mappings, and a range
// that is not mapped there fails the read (dst is this rank's and checked
// here; nothing else is written). Only a channel that reads lent memory
// takes it (Channel.ReadsLent: shm, where the kernel allows it); others
// refuse it with ErrNotSupport. The peer must not change or free the range
// until told the read is done (the collectives record a notify of the
// peer's after it). The collectives use it to read a peer's block straight
// from the peer's send buffer into the receive buffer: one copy between
// processes where staging through the HCCL buffers takes two. An hcomm
// extension.
//
// file, when its FD is not negative, is where src lies in the peer's
// memory file (device.FileOf on the peer, carried with the address): the
// channel may map the file and copy from it, faster than the kernel's copy
// for large ranges (channel/shm). Pass channel.NoPeerFile when the peer
// gave none.
func ReadLentNbi(stop <-chan struct{}, ch *Channel, dst, src device.Ptr, n int64, file channel.PeerFile) error {
	const op = "ReadLentNbi"
	c, err := chanComm(op, ch)
	if err != nil {
		return err
	}
	pr, ok := ch.tr.(channel.PeerReader)
	if !ok || !pr.ReadsPeer() {
		return c.errorf(op, ch.RemoteRank(), ErrNotSupport, nil, "the %s channel to rank %d cannot read memory the peer lends (shm can where the kernel lets it): read from memory it registered", ch.Transport(), ch.RemoteRank())
	}
	if n < 0 {
		return c.errorf(op, ch.RemoteRank(), ErrPara, nil, "length %d is negative", n)
	}
	if n == 0 {
		return nil
	}
	if src == 0 || uint64(src) > math.MaxUint64-uint64(n) {
		return c.errorf(op, ch.RemoteRank(), ErrPara, nil, "remote src [%#x, +%d) is not a range", uintptr(src), n)
	}
	b, err := c.dev.Bytes(dst, n)
	if err != nil {
		return c.errorf(op, ch.RemoteRank(), ErrPara, err, "local dst")
	}
	if err := c.moved(ch, metrics.Read, n, pr.ReadPeer(stop, b, src, file)); err != nil {
		return c.taskFailed(op, ch.RemoteRank(), err)
	}
	return nil
}

// WritePeerLentNbi writes n bytes at src (local) into memory the peer lent
// for one operation at dst (its address in the peer, from the peer: a
// collective's hello carries its receive buffer's), and then, when
// remoteIdx is not negative, records the peer's notify remoteIdx: ReadLentNbi's
// mirror, for a channel that writes lent memory (Channel.WritesPeerLent:
// shm where the kernel allows it); others refuse it with ErrNotSupport.
// file, when its FD is not negative, is where dst lies in the peer's memory
// file (device.FileOf on the peer): the channel maps it writable and streams
// the bytes in; otherwise the kernel copies them (process_vm_writev),
// checking the range against the peer's mappings. Nothing can check that
// the peer lent what it named: a peer that names another range of its own
// memory has it written. The collectives' all-gather between processes of
// a host uses it to write each input straight into every peer's output, a
// piece to every peer before the next piece, so that the input is read from
// memory once. An hcomm extension.
func WritePeerLentNbi(stop <-chan struct{}, ch *Channel, dst, src device.Ptr, n int64, file channel.PeerFile, remoteIdx int) error {
	const op = "WritePeerLentNbi"
	c, err := chanComm(op, ch)
	if err != nil {
		return err
	}
	pw, ok := ch.tr.(channel.PeerWriter)
	if !ok || !ch.ReadsLent() {
		return c.errorf(op, ch.RemoteRank(), ErrNotSupport, nil, "the %s channel to rank %d cannot write memory the peer lends (shm can where the kernel lets it): write into memory it registered", ch.Transport(), ch.RemoteRank())
	}
	if n < 0 {
		return c.errorf(op, ch.RemoteRank(), ErrPara, nil, "length %d is negative", n)
	}
	if remoteIdx >= 0 {
		if err := c.remoteIdxCheck(op, ch, remoteIdx); err != nil {
			return err
		}
	}
	if n > 0 {
		if dst == 0 || uint64(dst) > math.MaxUint64-uint64(n) {
			return c.errorf(op, ch.RemoteRank(), ErrPara, nil, "remote dst [%#x, +%d) is not a range", uintptr(dst), n)
		}
		b, err := c.dev.Bytes(src, n)
		if err != nil {
			return c.errorf(op, ch.RemoteRank(), ErrPara, err, "local src")
		}
		if err := c.moved(ch, metrics.Write, n, pw.WritePeer(stop, dst, b, file)); err != nil {
			return c.taskFailed(op, ch.RemoteRank(), err)
		}
	}
	if remoteIdx < 0 {
		return nil
	}
	if err := ch.tr.NotifyRecord(stop, remoteIdx); err != nil {
		return c.taskFailed(op, ch.RemoteRank(), err)
	}
	return nil
}

// ChannelFence returns once the operations made on ch before it are
// complete at the peer (HcommChannelFence), in the calling goroutine.
func ChannelFence(stop <-chan struct{}, ch *Channel) error {
	const op = "ChannelFence"
	c, err := chanComm(op, ch)
	if err != nil {
		return err
	}
	if err := ch.tr.Fence(stop); err != nil {
		return c.taskFailed(op, ch.RemoteRank(), err)
	}
	return nil
}

// ChannelNotifyRecord records the peer's notify remoteIdx on its end of ch,
// now (HcommChannelNotifyRecord).
func ChannelNotifyRecord(stop <-chan struct{}, ch *Channel, remoteIdx int) error {
	const op = "ChannelNotifyRecord"
	c, err := chanComm(op, ch)
	if err != nil {
		return err
	}
	if err := c.remoteIdxCheck(op, ch, remoteIdx); err != nil {
		return err
	}
	if err := ch.tr.NotifyRecord(stop, remoteIdx); err != nil {
		return c.taskFailed(op, ch.RemoteRank(), err)
	}
	return nil
}

// ChannelNotifyWait waits, in the calling goroutine, for local notify
// localIdx of ch and then resets it (HcommChannelNotifyWait). timeout <= 0
// takes the communicator's ExecTimeout, as ChannelNotifyWaitOnThread does.
func ChannelNotifyWait(stop <-chan struct{}, ch *Channel, localIdx int, timeout time.Duration) error {
	return notifyWaitNow("ChannelNotifyWait", stop, ch, localIdx, timeout, opTag{})
}

// CollectiveNotifyWait is ChannelNotifyWait for the collective numbered seq
// by BeginOp (op, algo as given there), for the libraries built on hcomm: a
// wait that lasts publishes where this rank is, and a timeout names the
// collective and says where the other ranks are, as they do for a queued
// wait issued between BeginOp and its end.
func CollectiveNotifyWait(stop <-chan struct{}, ch *Channel, localIdx int, timeout time.Duration, op string, seq uint64, algo string) error {
	return notifyWaitNow("ChannelNotifyWait", stop, ch, localIdx, timeout, opTag{op: op, algo: algo, seq: seq})
}

// ChannelNotifyTryWait is the non-blocking twin of ChannelNotifyWait: it
// reports whether local notify localIdx of ch is recorded and, when it is,
// resets it, as the wait would have; it never waits (over a transport whose
// waiters receive for themselves, tcp, it first takes in what the sockets
// hold, once). A caller polls with it
// for a short, bounded time before it commits to a wait (the collectives
// poll their handshake so in the calling goroutine, and enqueue the wait
// only when a peer is late). A notify broken by the loss of the peer is the
// error ChannelNotifyWait would return; so are bad arguments. A poll that
// finds the record counts in the metrics as a wait that took no time (the
// polls that found nothing are the caller's to account for), and is never
// published as where this rank waits. Safe for concurrent use.
func ChannelNotifyTryWait(ch *Channel, localIdx int) (bool, error) {
	const op = "ChannelNotifyTryWait"
	c, err := chanComm(op, ch)
	if err != nil {
		return false, err
	}
	n, err := c.localNotify(op, ch, localIdx)
	if err != nil {
		return false, err
	}
	found := n.TryReset()
	if p, ok := ch.tr.(channel.Poller); ok && !found && p.PollOnce() {
		// A transport whose waiters receive for themselves (tcp): take
		// in what has arrived, once, as a wait's poll would.
		found = n.TryReset()
	}
	if found {
		if clk, ok := ch.tr.(channel.Clocked); ok {
			clk.NotifyWaited(localIdx) // as a wait that returns (awaitNotify)
		}
		if c.cfg.metrics != nil {
			c.cfg.metrics.ObserveWait(ch.Transport(), 0)
		}
		return true, nil
	}
	if n.Broken() == nil {
		return false, nil
	}
	// A broken notify fails a wait at once: its error says which peer was
	// lost, as the wait's would.
	if err := c.awaitNotify(op, ch, localIdx, n, 0, opTag{}, nil); err != nil {
		return false, c.taskFailed(op, ch.RemoteRank(), err)
	}
	return true, nil // recorded after all, before the break
}

func notifyWaitNow(op string, stop <-chan struct{}, ch *Channel, localIdx int, timeout time.Duration, tag opTag) error {
	c, err := chanComm(op, ch)
	if err != nil {
		return err
	}
	n, err := c.localNotify(op, ch, localIdx)
	if err != nil {
		return err
	}
	if err := c.awaitNotify(op, ch, localIdx, n, c.execTimeout(timeout), tag, stop); err != nil {
		return c.taskFailed(op, ch.RemoteRank(), err)
	}
	return nil
}

func errorOf(ch *Channel, op, format string, args ...any) error {
	if ch == nil || ch.comm == nil {
		return noRankErr(op, "", ErrPtr, nil, "nil channel")
	}
	return ch.comm.errorf(op, ch.RemoteRank(), ErrPara, nil, format, args...)
}

// ChannelNotifyPeek reports whether local notify localIdx of ch is
// recorded, without taking the record: a poll's look, one load of the
// notify's word, for a caller that polls many times and takes the record
// with ChannelNotifyTryWait once it is there (that call makes the checks;
// this one only refuses an index the channel does not have, and a
// transport whose records its waiters must pull in themselves, tcp, is
// only ever seen recorded by ChannelNotifyTryWait). An hcomm extension.
func ChannelNotifyPeek(ch *Channel, localIdx int) bool {
	if ch == nil || localIdx < 0 || localIdx >= len(ch.notifies) {
		return false
	}
	return ch.notifies[localIdx].IsSet()
}

// PreparedWrite is WriteWithNotifyNbi checked once, for a write a protocol
// repeats call after call from the same local range into the same range of
// the peer's memory, followed by a record of the same notify: the hello that
// opens every small collective. Prepare checks what WriteWithNotifyNbi
// checks; each Do checks only that the communicator and the channel are
// usable, and over a transport that stores into the peer's memory itself
// (inproc, shm: channel.Poster) it is a copy and a record. An hcomm
// extension. The local range must stay allocated while the prepared write
// is used (the communicator's HCCL buffer, say).
type PreparedWrite struct {
	ch   *Channel
	dst  device.Ptr
	src  []byte
	idx  int
	post channel.Post // nil: the transport has none, Do writes as WriteWithNotifyNbi
}

// PrepareWriteWithNotify checks a write of up to n bytes from local src to
// the peer's dst followed by a record of the peer's notify remoteIdx.
func PrepareWriteWithNotify(ch *Channel, dst, src device.Ptr, n int64, remoteIdx int) (*PreparedWrite, error) {
	const op = "PrepareWriteWithNotify"
	c, err := chanComm(op, ch)
	if err != nil {
		return nil, err
	}
	if err := c.remoteCheck(op, ch, "dst", dst, n); err != nil {
		return nil, err
	}
	b, err := c.dev.Bytes(src, n)
	if err != nil {
		return nil, c.errorf(op, ch.RemoteRank(), ErrPara, err, "local src")
	}
	if err := c.remoteIdxCheck(op, ch, remoteIdx); err != nil {
		return nil, err
	}
	w := &PreparedWrite{ch: ch, dst: dst, src: b, idx: remoteIdx}
	if p, ok := ch.tr.(channel.Poster); ok {
		if w.post, err = p.PreparePost(dst, n, remoteIdx); err != nil {
			return nil, c.taskFailed(op, ch.RemoteRank(), err)
		}
	}
	return w, nil
}

// Do writes the first n bytes of the prepared range and records the notify,
// now. stop is the stop channel of the task it runs in, as for
// WriteWithNotifyNbi.
func (w *PreparedWrite) Do(stop <-chan struct{}, n int64) error {
	const op = "PreparedWrite.Do"
	c, err := chanComm(op, w.ch)
	if err != nil {
		return err
	}
	if n < 0 || n > int64(len(w.src)) {
		return c.errorf(op, w.ch.RemoteRank(), ErrPara, nil, "length %d is outside the prepared [0, %d]", n, len(w.src))
	}
	if w.post == nil {
		err = c.write(stop, w.ch, w.dst, w.src[:n], w.idx)
	} else {
		err = c.moved(w.ch, metrics.Write, n, w.post.Post(w.src[:n]))
	}
	if err != nil {
		return c.taskFailed(op, w.ch.RemoteRank(), err)
	}
	return nil
}
