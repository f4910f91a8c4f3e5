package collectives

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/internal/spin"
)

// ErrMismatch is matched (errors.Is) by the error of a collective whose ranks
// did not all make the same call: another collective, count, data type,
// reduce op, root or algorithm. Every rank of the collective gets it, naming
// both ranks and both calls.
var ErrMismatch = errors.New("collectives: ranks called different collectives")

// kind numbers the collectives in the handshake header.
type kind uint8

const (
	kAllReduce kind = 1 + iota
	kBroadcast
	kAllGather
	kReduceScatter
	kReduce
	kScatter
	kGather
	kAlltoAll
	kAlltoAllV
	kAllGatherV
	kReduceScatterV
	kBarrier
	kSendRecv
)

var kindNames = [...]string{
	kAllReduce: "AllReduce", kBroadcast: "Broadcast", kAllGather: "AllGather",
	kReduceScatter: "ReduceScatter", kReduce: "Reduce", kScatter: "Scatter",
	kGather: "Gather", kAlltoAll: "AlltoAll", kAlltoAllV: "AlltoAllV",
	kAllGatherV: "AllGatherV", kReduceScatterV: "ReduceScatterV", kBarrier: "Barrier",
	kSendRecv: "Send/Recv",
}

func (k kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("collective(%d)", uint8(k))
}

// header opens every collective: each rank writes its own into every peer's
// hello slot, so that each rank can check that its peers made the same call
// before any data moves. The wire form is 56 bytes, little-endian, so that a
// header and 8 bytes of inline payload fill one 64-byte cache line (a small
// all-reduce's hello then costs one line's transfer per peer, not two):
//
//	0  magic "HCOL"     4  version (2)   5  kind     6  data type  7  reduce op
//	8  algorithm        9  flags         12 root     16 count      24 sequence
//	32 extra: a digest of per-rank counts (the V collectives), or, with
//	   flagWindow, the offset of the collective's buffer in the window (the
//	   V collectives take no windows)
//	40 from rank        44 rank count    48 window id (0: none)   52 zero
type header struct {
	kind  kind
	dt    hcomm.DataType
	op    hcomm.ReduceOp
	algo  Algorithm
	flags uint8 // hasOp, hasRoot
	root  int32
	count int64
	seq   uint64
	extra uint64
	from  int32
	size  int32
	win   uint32 // the symmetric window the buffers lie in (flagWindow)
	woff  int64  // their offset in it
}

const (
	headerSize    = 56
	headerVersion = 2
	flagOp        = 1  // the reduce op is part of the call
	flagRoot      = 2  // the root is part of the call
	flagWindow    = 4  // the buffers lie in a window (win, woff): peers read them in place
	flagInPlace   = 8  // with flagWindow: the call is in place (woff is the output's offset)
	flagLent      = 16 // the hello carries buffer addresses for lent writes and reads (lent.go)
	flagWide      = 32 // the lent pipes' window is lentWideWindow: no host is crowded (lent.go)
)

var headerMagic = [4]byte{'H', 'C', 'O', 'L'}

func (h header) encode(b []byte) {
	clear(b[:headerSize])
	copy(b[0:4], headerMagic[:])
	b[4] = headerVersion
	b[5] = byte(h.kind)
	b[6] = byte(h.dt)
	b[7] = byte(h.op)
	b[8] = byte(h.algo)
	b[9] = h.flags
	binary.LittleEndian.PutUint32(b[12:], uint32(h.root))
	binary.LittleEndian.PutUint64(b[16:], uint64(h.count))
	binary.LittleEndian.PutUint64(b[24:], h.seq)
	if h.flags&flagWindow != 0 {
		binary.LittleEndian.PutUint64(b[32:], uint64(h.woff))
	} else {
		binary.LittleEndian.PutUint64(b[32:], h.extra)
	}
	binary.LittleEndian.PutUint32(b[40:], uint32(h.from))
	binary.LittleEndian.PutUint32(b[44:], uint32(h.size))
	binary.LittleEndian.PutUint32(b[48:], h.win)
}

// decodeHeader parses a peer's header. It trusts nothing: a short buffer, a
// wrong magic or version is an error.
func decodeHeader(b []byte) (header, error) {
	if len(b) < headerSize {
		return header{}, fmt.Errorf("handshake header is %d bytes, want %d", len(b), headerSize)
	}
	if [4]byte(b[0:4]) != headerMagic {
		return header{}, fmt.Errorf("handshake header has magic %q, want %q (not a collective's hello, or memory overwritten)", b[0:4], headerMagic[:])
	}
	if b[4] != headerVersion {
		return header{}, fmt.Errorf("handshake header version %d, this build speaks %d", b[4], headerVersion)
	}
	h := header{
		kind:  kind(b[5]),
		dt:    hcomm.DataType(b[6]),
		op:    hcomm.ReduceOp(b[7]),
		algo:  Algorithm(b[8]),
		flags: b[9],
		root:  int32(binary.LittleEndian.Uint32(b[12:])),
		count: int64(binary.LittleEndian.Uint64(b[16:])),
		seq:   binary.LittleEndian.Uint64(b[24:]),
		from:  int32(binary.LittleEndian.Uint32(b[40:])),
		size:  int32(binary.LittleEndian.Uint32(b[44:])),
		win:   binary.LittleEndian.Uint32(b[48:]),
	}
	if h.flags&flagWindow != 0 {
		h.woff = int64(binary.LittleEndian.Uint64(b[32:]))
	} else {
		h.extra = binary.LittleEndian.Uint64(b[32:])
	}
	return h, nil
}

// call describes the call a header stands for, for errors:
// "AllReduce(count 1024, float32, sum, ring)".
func (h header) call() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%v(count %d, %v", h.kind, h.count, h.dt)
	if h.flags&flagOp != 0 {
		fmt.Fprintf(&b, ", %v", h.op)
	}
	if h.flags&flagRoot != 0 {
		fmt.Fprintf(&b, ", root %d", h.root)
	}
	if h.extra != 0 {
		fmt.Fprintf(&b, ", counts digest %#x", h.extra)
	}
	if h.flags&flagWindow != 0 {
		fmt.Fprintf(&b, ", window %d at offset %d", h.win, h.woff)
		if h.flags&flagInPlace != 0 {
			b.WriteString(" in place")
		}
	}
	if h.flags&flagLent != 0 {
		b.WriteString(", lent buffers") // the other rank stages: HCOMM_SHM_CMA_DISABLE differs
	}
	if h.flags&flagWide != 0 {
		b.WriteString(", no host crowded") // the other rank's HCOMM_CROWDED differs
	}
	fmt.Fprintf(&b, ", %v)", h.algo)
	return b.String()
}

// same reports whether two ranks' headers describe the same call.
func (h header) same(o header) bool {
	return h.kind == o.kind && h.dt == o.dt && h.flags == o.flags &&
		(h.flags&flagOp == 0 || h.op == o.op) && (h.flags&flagRoot == 0 || h.root == o.root) &&
		h.count == o.count && h.extra == o.extra && h.algo == o.algo && h.size == o.size &&
		(h.flags&flagWindow == 0 || h.win == o.win && h.woff == o.woff)
}

// digest folds per-rank counts into the header's extra field (FNV-1a), so
// that ranks passing different count arrays to a V collective disagree.
func digest(xs ...[]int64) uint64 {
	h := uint64(14695981039346656037)
	for _, s := range xs {
		for _, v := range s {
			for i := 0; i < 8; i++ {
				h ^= uint64(v>>(8*i)) & 0xff
				h *= 1099511628211
			}
		}
		h ^= 0xff
		h *= 1099511628211
	}
	return h | 1 // never 0: 0 means "no counts"
}

// hello opens a collective with the ranks in peers: it writes this rank's
// header h, followed by n bytes of inline payload from src, into every peer's
// hello slot, records the peer's hello notify, waits for every peer's hello
// and checks that every peer made the same call (and, when extra is not nil,
// whatever extra checks on a peer's inline payload). It returns where a
// rank's inline payload lies in this rank's HCCL buffer (for this rank: its
// own copy). n must be at most the layout's inline size.
//
// Besides catching mismatches, the exchange is what makes the hello and
// one-shot slots safe to reuse: a rank writes into a peer's hello slot of
// parity p only after the peer has checked the hello that used it two
// collectives ago.
func (s *sched) hello(h header, peers []int, src device.Ptr, n int64, extra func(p int, payload []byte) error) helloSlots {
	return s.helloThen(h, peers, src, n, extra, nil)
}

// helloThen is hello that also runs then, in the same stream task as the
// check, once the check has passed: a schedule puts its first local step
// there (the one-shot all-reduce its reduction), so that the check costs no
// task of its own.
func (s *sched) helloThen(h header, peers []int, src device.Ptr, n int64, extra func(p int, payload []byte) error, then func(x *helloCall) error) helloSlots {
	return s.helloWith(helloPool.Get().(*helloCall), h, peers, src, n, extra, then)
}

// helloPool recycles the helloCalls: a hello's only user is its own task
// (the call's schedule keeps the helloSlots, which hold nothing of it, and a
// then or extra gets x from the task), so that a small collective allocates
// almost nothing for its handshake.
var helloPool sync.Pool

func init() {
	helloPool.New = func() any {
		x := &helloCall{pooled: true}
		x.bind()
		return x
	}
}

// release returns a pooled helloCall once its task is done with it.
func (x *helloCall) release() {
	x.endSteers() // a call that failed: its error is reported already
	if !x.pooled {
		return
	}
	runFn, firstFn, restFn := x.runFn, x.firstFn, x.restFn
	*x = helloCall{pooled: true, runFn: runFn, firstFn: firstFn, restFn: restFn}
	helloPool.Put(x)
}

// bind makes x's method values once, so that issuing a hello allocates
// none.
func (x *helloCall) bind() {
	x.runFn, x.firstFn, x.restFn = x.run, x.first, x.rest
}

// helloWith is helloThen on a helloCall the caller provides (fresh, or from
// helloPool).
func (s *sched) helloWith(x *helloCall, h header, peers []int, src device.Ptr, n int64, extra func(p int, payload []byte) error, then func(x *helloCall) error) (at helloSlots) {
	st := s.st
	me := st.comm.Rank()
	// The channels to peers met for the first time (state.go); a setup
	// that failed leaves the hello counters as they were.
	if s.need(peers); s.unset {
		x.release()
		return helloSlots{}
	}
	if h.kind != kSendRecv { // point-to-point numbers its hellos per pair
		h.seq = st.seq
	}
	h.from = int32(me)
	h.size = int32(st.comm.Size())
	// One object carries the call to the task, so that a small collective
	// allocates once here, not once per closure.
	x.h, x.peers, x.src, x.n, x.extra, x.then, x.s = h, peers, src, n, extra, then, s
	x.mine, x.dev, x.opSeq = s.mySlot(st.lay.helloOff(me, 0)), st.comm.Device(), s.opSeq
	if sz := st.comm.Size(); sz <= len(x.parBuf) {
		x.par = x.parBuf[:sz]
	} else {
		x.par = make([]uint64, sz)
	}
	if sz := st.comm.Size(); sz <= len(x.flagBuf) {
		x.flag = x.flagBuf[:sz]
	}
	for _, p := range peers {
		x.par[p] = st.hellos[p] % 2
		if f := st.helloFlag(p, st.hellos[p]); f != 0 { // ll.go
			x.ll |= 1 << p
			x.flag[p] = f
		}
		st.hellos[p]++
	}
	if n > st.lay.inline() {
		s.do(fmt.Errorf("%v: %d bytes of inline payload, the hello slots hold %d", h.kind, n, st.lay.inline()))
	}
	at = helloSlots{s: s, me: int32(me), mine: x.mine}
	if len(x.par) <= len(at.par) {
		copy(at.par[:], x.par)
	} else {
		at.big = x.par // made for this call: not x's to reuse
	}
	if !s.ok() || len(peers) == 0 && n == 0 && then == nil {
		x.release()
		return at
	}
	// The whole exchange is one stream task, in which the writes, records
	// and waits are hcomm's immediate calls: a latency-bound collective
	// (the one-shot all-reduce) then costs about one task per rank.
	// x belongs to the task from here on: a pooled x may be reset as soon
	// as the task has run (at holds nothing of it).
	s.jitter()
	s.launchHello(x)
	return at
}

// helloPoll bounds how long a stream-ordered collective's caller polls for
// its peers' hellos in its own goroutine (launchHello). The collectives
// return once their work is enqueued, so the caller may not wait for a
// peer; but a peer that makes the same call at about the same time answers
// within a microsecond or two (a cache line's round trip), and a poll that
// sees every hello completes a small collective without handing it to the
// stream's goroutine at all. A peer later than this is waited for by a
// stream task, as if the caller had not polled.
const helloPoll = 5 * time.Microsecond

// envHelloPoll reads HCOMM_HELLO_POLL, the bound of the stream-ordered
// collectives' inline poll (helloPoll unless set): a duration ("5us"), or
// 0 or "off" for no hello in the calling goroutine at all — every hello a
// queued stream task, as before the inline path (to measure one against
// the other). The host-slice layer polls for slicePoll either way, unless
// it is off. Unset, it is off too when the communicator's procs processes
// on this host outnumber its cores: a caller polling for a peer would take
// the core that peer needs to answer (4 shm processes on 2 cores, 16 B
// all-reduce: 23–33 µs polling, 12–15 µs without, measured with notifies;
// the lane, whose hellos are lines, polls there all the same: lanePoll).
func envHelloPoll(procs, cores int) (time.Duration, error) {
	v := os.Getenv("HCOMM_HELLO_POLL")
	switch v {
	case "":
		if procs > cores {
			return -1, nil
		}
		return helloPoll, nil
	case "0", "off":
		return -1, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("HCOMM_HELLO_POLL=%q: want a duration such as 5us, or off", v)
	}
	if d == 0 {
		return -1, nil
	}
	return d, nil
}

// slicePoll is helloPoll for the host-slice layer, whose caller waits for
// the collective anyway: it polls longer before the stream's goroutine takes
// over the wait (and the caller waits for that, within its ctx).
const slicePoll = spin.Default

// idleWait is how many tasks a stream may have pending, all of small
// collectives, for launchHello to wait (for the poll bound) for it to be
// idle: a deeper queue is a caller far ahead of its peers, which a wait
// per call would only slow.
const idleWait = 64

// launchHello issues the hello x. When the thread's stream is idle, the
// non-blocking part — prepare, the writes to every peer — runs now, in the
// calling goroutine, as the stream's next task (device.Stream.RunInline),
// which then polls for the peers' hellos for up to the schedule's poll
// bound; if all are there it verifies them and runs then (the one-shot
// all-reduce's reduction), and the collective is done before its call
// returns. Otherwise the waits that remain, the check and then are a stream
// task queued behind it. A busy stream gets the whole hello as one queued
// task, as before. Either way the tasks are the stream's, in its order: a
// failure (a mismatch, a lost peer) fails the stream, for its Synchronize
// to report, and an abort ends the task's waits.
func (s *sched) launchHello(x *helloCall) {
	if !s.ok() {
		x.release()
		return
	}
	st := s.t.Stream()
	if s.st.helloPoll < 0 || (s.poll == 0 && !s.st.pollSet && x.overNetwork()) { // HCOMM_HELLO_POLL=off, or see overNetwork
		s.launchStop("collective hello", x.runFn) // run releases x
		return
	}
	if n := st.Pending(); n > 0 && n <= idleWait && s.afterSmall {
		// The stream is busy with the small collectives before this one,
		// which end as soon as the peers answer: a moment's wait keeps
		// this one off the queue. Without it, one late peer would send
		// every later call to the queue, for good: a caller whose calls
		// queue runs ahead of its stream, which is then never idle
		// until it synchronizes. Waiting for at most the poll bound per
		// call, the caller lets the stream drain its queue.
		spin.Until(s.pollFor(), func() bool { return st.Pending() == 0 })
	}
	ran, err := st.RunInline("collective hello", x.firstFn)
	if ran {
		s.do(nil) // counted as issued: this call can no longer be taken back
	}
	switch {
	case !ran && err != nil: // the stream is unusable: nothing ran
		x.release()
		s.do(err)
	case !ran:
		s.launchStop("collective hello", x.runFn) // run releases x
	case err == nil && x.pending:
		s.launchStop("collective hello", x.restFn) // rest releases x
		if !s.ok() {
			x.release()
		}
	default:
		// Done, or failed: a failure is the stream's now (its Synchronize
		// reports it, and the rest of the schedule is skipped), as a
		// queued task's would be.
		x.release()
	}
}

// overNetwork reports whether a peer of the hello is reached over the
// network (tcp). A stream-ordered collective's caller does not poll for
// such a peer: its hello takes longer to arrive than the poll's bound (a
// tcp one-way trip is some 10 µs here), so the poll never sees it, and a
// caller that sent inline and left the wait to the stream's goroutine was
// slower than one queued task doing both (2 processes, 16 B all-reduce,
// six interleaved pairs: 22–35 µs against 16–26 µs). The slice layer,
// whose caller waits anyway and polls for longer, still polls, and so
// does every caller when HCOMM_HELLO_POLL is set.
func (x *helloCall) overNetwork() bool {
	for _, p := range x.peers {
		if x.s.st.chans[p].Transport() == hcomm.TransportTCP {
			return true
		}
	}
	return false
}

// run (the hello's stream task) writes this rank's hello into every peer's
// slot, records the peer's hello notify, waits for every peer's hello, and
// checks them (verify).
func (x *helloCall) run(stop <-chan struct{}) error {
	defer x.release()
	if err := x.send(stop); err != nil {
		return err
	}
	return x.finish(stop)
}

// first (the hello's task, run inline by launchHello) sends the hello and
// polls for the peers' for up to the schedule's bound: when every one is
// there, it checks them and the hello is done; otherwise it sets pending,
// and rest, queued behind it, waits for the others. launchHello releases x.
func (x *helloCall) first(stop <-chan struct{}) error {
	if err := x.send(stop); err != nil {
		return err
	}
	st := x.s.st
	var ferr error
	seen := func() bool {
		for x.next < len(x.peers) {
			p := x.peers[x.next]
			if x.isFlagged(p) {
				if !st.takeFlagged(p, x.par[p], x.flag[p]) {
					return false
				}
				x.next++
				continue
			}
			ok, err := hcomm.ChannelNotifyTryWait(st.chans[p], nHello+int(x.par[p]))
			if err != nil {
				// A broken notify: the queued wait fails at once,
				// with the error that names the collective.
				return true
			}
			if !ok {
				return false
			}
			if ferr = st.hello.Fetch(x.slotOff(p), headerSize+x.n); ferr != nil {
				return true
			}
			x.next++
		}
		return true
	}
	// A peer in another process (shm) may be waiting for this core:
	// yield it between polls once a tight poll has not seen the hellos.
	// (Called directly, not through a func value, so that seen does not
	// escape: a small all-reduce allocates almost nothing.)
	remote := false
	for _, p := range x.peers {
		if st.chans[p].Transport() != hcomm.TransportInproc {
			remote = true
			break
		}
	}
	if remote {
		spin.UntilYield(x.s.pollFor(), seen)
	} else {
		spin.Until(x.s.pollFor(), seen)
	}
	if ferr != nil {
		return ferr
	}
	if x.next < len(x.peers) {
		x.pending = true
		return nil
	}
	return x.verify()
}

// rest (a stream task behind first) waits for the hellos first did not see,
// and checks them all.
func (x *helloCall) rest(stop <-chan struct{}) error {
	defer x.release()
	return x.finish(stop)
}

// send writes the header and payload into this rank's slot and from there
// into every peer's (sendHello: as flagged words, or with the peer's hello
// notify).
func (x *helloCall) send(stop <-chan struct{}) error {
	if err := x.prepare(); err != nil {
		return err
	}
	if x.outAt != nil && x.n >= steerMin {
		x.steer() // steer.go
	}
	for _, p := range x.peers {
		payload := x.mine.Add(headerSize)
		if x.blocks {
			payload = x.blockOf(p)
		}
		if err := x.s.sendHello(stop, p, x.par[p], x.flagOf(p), x.mine, payload, x.n, &x.line); err != nil { // ll.go
			return err
		}
	}
	return nil
}

// finish waits for the hellos of peers[x.next:] and checks every peer's.
func (x *helloCall) finish(stop <-chan struct{}) error {
	st := x.s.st
	for _, p := range x.peers[x.next:] {
		if err := st.awaitHello(stop, p, x.par[p], x.flagOf(p), opTag{x.h.kind, x.opSeq, x.h.algo}); err != nil { // ll.go
			return err
		}
		// The peer's hello has landed in device memory: make it visible
		// to the host's view of the slot (nothing to move on the host
		// backend, a copy on an accelerator's).
		if err := st.hello.Fetch(x.slotOff(p), headerSize+x.n); err != nil {
			return err
		}
	}
	return x.verify()
}

// helloCall is one hello in flight: what its stream tasks need.
type helloCall struct {
	h       header
	peers   []int
	src     device.Ptr
	n       int64
	extra   func(p int, payload []byte) error
	then    func(x *helloCall) error
	s       *sched
	par     []uint64 // hello parity with each peer (parBuf for up to 8 ranks)
	parBuf  [8]uint64
	ll      uint16   // bit p: the hello with peer p travels as flagged words (ll.go)
	flag    []uint32 // their flags, by peer (flagBuf; up to helloFullMax ranks)
	flagBuf [helloFullMax]uint32
	mine    device.Ptr
	dev     *device.Device
	opSeq   uint64                           // the collective's number from BeginOp, for wait errors
	runFn   func(stop <-chan struct{}) error // x.run, made once
	firstFn func(stop <-chan struct{}) error // x.first
	restFn  func(stop <-chan struct{}) error // x.rest
	next    int                              // peers[:next] have been seen (first's poll)
	pending bool                             // first left peers[next:] to rest

	pooled bool       // from helloPool: released when run ends
	red    reduceArgs // the one-shot all-reduce's call (reduceInline)
	// blocks, when set, says that each peer's hello carries a payload of
	// its own (n bytes: the one-shot all-to-all's block for that peer), in
	// place of src's, which then is not copied into this rank's slot: peer
	// p's lies at blkBase + p·blkStep, or blkBase + blkDispl[p]·blkES when
	// blkDispl is not nil (blockOf). Fields rather than a function value:
	// a closure would cost every call an allocation.
	blocks   bool
	blkBase  device.Ptr
	blkStep  int64
	blkDispl []int64
	blkES    int64
	// outCounts and outDispls are the one-shot all-gather's output
	// layout, in elements of blkES bytes (allGatherOneShotOut).
	outCounts, outDispls []int64
	// outAt, when set, says where then copies peer p's payload: send
	// steers each peer's there as it arrives, where the channel can
	// (hcomm.ChannelSteer: tcp), and landed tells then which are in place
	// already (steer.go). Not with extra, which reads the payload from the
	// slot.
	outAt  func(x *helloCall, p int) device.Ptr
	steers helloSteers
	line   [channel.LineData]byte // sendHello's room for a line
}

// blockOf returns the payload of the hello to peer p (x.blocks).
func (x *helloCall) blockOf(p int) device.Ptr {
	if x.blkDispl != nil {
		return x.blkBase.Add(x.blkDispl[p] * x.blkES)
	}
	return x.blkBase.Add(int64(p) * x.blkStep)
}

// setBlocks gives each peer p's hello the payload at base + p·step (step
// 0: the same payload for every peer).
func (x *helloCall) setBlocks(base device.Ptr, step int64) {
	x.blocks, x.blkBase, x.blkStep = true, base, step
}

// reduceArgs is what the one-shot all-reduce's reduction needs.
type reduceArgs struct {
	recv  device.Ptr
	count int64
	dt    hcomm.DataType
	op    hcomm.ReduceOp
}

// isFlagged reports whether the hello with peer p travels as flagged words.
func (x *helloCall) isFlagged(p int) bool { return x.ll&(1<<p) != 0 }

// flagOf returns the flag of the hello with peer p, 0 when not flagged.
func (x *helloCall) flagOf(p int) uint32 {
	if !x.isFlagged(p) {
		return 0
	}
	return x.flag[p]
}

// slotOff returns the offset of the hello slot that rank's hello arrives in
// (for this rank: the one it writes from) in the hello region.
func (x *helloCall) slotOff(rank int) int64 {
	if int32(rank) == x.h.from {
		return x.s.st.lay.helloOff(rank, 0)
	}
	return x.s.st.lay.helloOff(rank, x.par[rank])
}

// slot returns rank's hello slot in the host's view of the hello region,
// mapped at setup. Its bytes are the device's as of the last Fetch of the
// slot (run fetches each peer's once its hello has arrived); bytes written to
// it reach the device at Flush (prepare flushes this rank's).
func (x *helloCall) slot(rank int) []byte {
	off, n := x.slotOff(rank), x.s.st.lay.helloSlot
	return x.s.st.hello.Bytes()[off : off+n : off+n]
}

// payload returns rank's inline payload, as slot does its hello.
func (x *helloCall) payload(rank int) []byte {
	return x.slot(rank)[headerSize : headerSize+x.n]
}

// helloSlots says where each rank's inline payload of one hello lies in
// this rank's HCCL buffer (for this rank: its own copy). It is made when the
// hello is issued and holds nothing of the helloCall, which its task may
// recycle as soon as it has run. The zero value (a hello that was not
// issued) gives 0.
type helloSlots struct {
	s    *sched
	me   int32
	mine device.Ptr
	par  [helloFullMax]uint64 // the hello's parity with each rank
	big  []uint64             // par, above helloFullMax ranks
}

// at returns where rank's inline payload lies.
func (a helloSlots) at(rank int) device.Ptr {
	if a.s == nil {
		return 0
	}
	if int32(rank) == a.me {
		return a.mine.Add(headerSize)
	}
	par := a.big
	if par == nil {
		par = a.par[:]
	}
	return a.s.mySlot(a.s.st.lay.helloOff(rank, par[rank])).Add(headerSize)
}

// prepare (a stream task) writes the header and inline payload into this
// rank's own hello slot, from which they are written to every peer.
func (x *helloCall) prepare() error {
	me := int(x.h.from)
	b := x.slot(me)[:headerSize+x.n]
	x.h.encode(b)
	if x.n > 0 && !x.blocks {
		in, err := x.dev.Map(x.src, x.n)
		if err != nil {
			return err
		}
		copy(b[headerSize:], in.Bytes())
		in.Unmap()
	}
	return x.s.st.hello.Flush(x.slotOff(me), headerSize+x.n)
}

// verify (a stream task, after every peer's hello arrived) checks the
// peers' headers against this rank's, then runs then.
func (x *helloCall) verify() error {
	st := x.s.st
	if err := x.endSteers(); err != nil { // steer.go
		return err
	}
	mine := x.slot(int(x.h.from))[:headerSize]
	for _, p := range x.peers {
		if err := st.checkHello(x.h, mine, x.slot(p), p, x.extra, x.n); err != nil {
			return err
		}
	}
	if x.then != nil {
		return x.then(x)
	}
	return nil
}

// sameHello reports whether the header b is mine but for the sender's rank,
// which must be p: seven words compared (the from field, bytes 40-43, is
// the low half of the sixth).
func sameHello(b, mine []byte, p int) bool {
	const from = 40
	le := binary.LittleEndian
	_, _ = b[headerSize-1], mine[headerSize-1]
	return le.Uint64(b[0:]) == le.Uint64(mine[0:]) && le.Uint64(b[8:]) == le.Uint64(mine[8:]) &&
		le.Uint64(b[16:]) == le.Uint64(mine[16:]) && le.Uint64(b[24:]) == le.Uint64(mine[24:]) &&
		le.Uint64(b[32:]) == le.Uint64(mine[32:]) && le.Uint64(b[48:]) == le.Uint64(mine[48:]) &&
		le.Uint32(b[from+4:]) == le.Uint32(mine[from+4:]) && le.Uint32(b[from:]) == uint32(p)
}

// checkHello checks the hello in peer p's slot b (a header, then n bytes of
// payload) against this rank's call h, whose header is mine, and, when extra
// is not nil, the payload with it.
func (st *state) checkHello(h header, mine, b []byte, p int, extra func(p int, payload []byte) error, n int64) error {
	// The common case: the peer's header is this rank's, byte for byte,
	// but for the sender's rank. Anything else is decoded and compared
	// field by field (same ignores what the call does not use, such as a
	// broadcast's reduce op). With the check off (HCOMM_COLL_CHECK=0) the
	// header is taken as it is, but what the payload carries beyond it —
	// the buffer addresses of a loan — is still read: the schedule needs
	// it.
	if st.noCheck || extra == nil && sameHello(b, mine, p) {
		return st.helloExtra(h, b, p, extra, n)
	}
	me, comm := int(h.from), st.comm
	got, err := decodeHeader(b)
	if err == nil && got.from != int32(p) {
		err = fmt.Errorf("the hello in rank %d's slot says it is from rank %d", p, got.from)
	}
	if err != nil {
		return &hcomm.Error{Op: h.kind.String(), Comm: comm.Name(), Rank: me, Peer: p, Code: hcomm.ErrInternal, Err: err}
	}
	if !got.same(h) || got.seq != h.seq {
		return &hcomm.Error{Op: h.kind.String(), Comm: comm.Name(), Rank: me, Peer: p, Code: hcomm.ErrPara, Err: ErrMismatch,
			Msg: fmt.Sprintf("collective mismatch: rank %d called %s as its collective #%d, rank %d called %s as its #%d",
				me, h.call(), h.seq, p, got.call(), got.seq)}
	}
	return st.helloExtra(h, b, p, extra, n)
}

// helloExtra runs extra, when not nil, on peer p's inline payload of n
// bytes in its hello b (checkHello's last step).
func (st *state) helloExtra(h header, b []byte, p int, extra func(p int, payload []byte) error, n int64) error {
	if extra == nil {
		return nil
	}
	if err := extra(p, b[headerSize:headerSize+n]); err != nil {
		return &hcomm.Error{Op: h.kind.String(), Comm: st.comm.Name(), Rank: int(h.from), Peer: p, Code: hcomm.ErrPara, Err: ErrMismatch,
			Msg: fmt.Sprintf("collective mismatch at #%d (%s): %v", h.seq, h.call(), err)}
	}
	return nil
}

// open runs the handshake without inline payload: with every peer, or
// above helloFullMax ranks the butterfly (butterfly.go).
func (s *sched) open(h header, algo Algorithm) {
	h.algo = algo
	if s.sparse() {
		s.butterfly(h, s.schedulePeers(h, algo))
		return
	}
	s.hello(h, s.others(), 0, 0, nil)
}
