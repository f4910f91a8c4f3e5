package collectives

import (
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/internal/reduce"
	"github.com/hcomm-dev/hcomm/internal/spin"
)

// The small all-reduce's lane, which the one-shot all-gather takes too (the
// same hello; each rank copies the inputs to their places where the
// all-reduce reduces them), the one-shot reduce (only the root reduces),
// the barrier (a hello without payload), the one-shot broadcast (only the
// root's hello carries a payload: laneCall.bcast), and the one-shot
// all-to-all and reduce-scatter, whose hello to each peer carries a part of
// its own (postParts). A
// one-shot all-reduce is one hello: every rank writes its header and its
// input into every peer's hello slot, records the peer's hello notify,
// waits for the peers' hellos, checks them and reduces the inputs in rank
// order. Issued through issue, it also pays
// for everything a schedule of many steps needs — a sched, the selector,
// the piece size, the pipe and gather bookkeeping, a pooled helloCall and
// the tasks' closures — which for 16 bytes between two ranks of one host is
// most of the call. The lane is the same hello without them: when the call
// finds everything in place (the channels set up, the previous collective on
// the same stream, no group open, no algorithm forced but oneshot), the
// caller encodes the header into its own slot, writes it to every peer, and
// polls for the peers' hellos as launchHello does, in the stream's next task
// run in its own goroutine. Between ranks of one host, where hellos are
// lines (ll.go), a call whose header and input pack into one (up to 32
// bytes) is packed once and stored into every peer's line; the peers' lines
// are compared with this rank's as they come (sameLine: equal packed fields
// are equal headers; only a line that differs is unpacked, for the check's
// error) and their payloads reduced where they lie.
//
// Over tcp — every peer of the call over the network (laneCall.net), and no
// more processes on the host than cores — the hello is the schedule's
// write with its notify record (one frame pair, one system call), and a
// look for a peer's hello receives what the channel's sockets hold
// (hcomm.ChannelNotifyTryWait) for up to Config.TCPSpin (st.netPoll): the
// caller itself is the progress engine, as Open MPI's is, and no stream
// goroutine is handed the call (2 tcp processes, 16-byte all-reduce 6.0–6.2
// → 5.2–5.4 µs).
//
// On the wire nothing differs from the one-shot schedule: the same header,
// sequence number, slots, lines, parities and notifies. So whether a call takes
// the lane is this rank's business alone: a rank in the lane and a rank in
// the schedule meet, and a mismatch between them (another count, another
// collective) is caught by the header check as between two schedules. A call
// whose stream is busy, or whose peers do not answer within the poll bound,
// goes on as a queued stream task exactly as a schedule's hello does.

// laneCall is one call of the lane. A state keeps one (st.lane) for the
// calls that complete in their caller's goroutine; a call that leaves work
// to its stream hands its laneCall to the task and the state makes another.
type laneCall struct {
	st    *state
	h     header
	name  string // the collective's, for errors
	in    []byte // send's bytes (the host's view: the lane runs where views are the memory)
	out   []byte // recv's
	count int64
	n     int64 // bytes of payload
	par   [helloFullMax]uint64
	flag  [helloFullMax]uint32 // the hellos' line flags, when the pairs' hellos are lines (st.ll; ll.go)
	line  [channel.LineData]byte
	next  int           // peers (st.others) whose hellos have arrived
	poll  time.Duration // the inline poll's bound; 0: look once
	opSeq uint64
	// number: first (or laneAllReduce, for a call it queues) numbers the
	// call with CountOp; false when BeginOp has (metrics or TRACE on).
	number bool
	// pay: every rank's payload of this call, this rank's own included,
	// found by finish.
	pay [helloFullMax][]byte
	// packed: the call's hello is a compact line (ll.go), x.line; the
	// peers' lines are taken into got, where finish compares and reduces
	// them without unpacking them.
	packed bool
	got    [helloFullMax][channel.LineData]byte
	// pending: first left the waits for the peers' hellos to rest.
	pending bool
	// algo: the algorithm the call's hello names, and its name.
	algo     Algorithm
	algoName string
	// part: the hello to each peer carries a payload of its own, n bytes
	// of send from n times the peer's rank on (the one-shot all-to-all's
	// block for it, the one-shot reduce-scatter's part), as helloCall's
	// blockOf does; sendPtr is send.
	part     bool
	sendPtr  device.Ptr
	sendLine [channel.LineData]byte // sendHello's room for a line
	// net: every peer is over the network (tcp), where hellos are writes
	// with a notify record and a look for a peer's hello receives what
	// its sockets hold (ChannelNotifyTryWait).
	net bool
	// recvPtr is recv; steers, the steers of the peers' hellos over tcp
	// whose payloads go straight to their places in it (steer.go): an
	// all-gather's and an all-to-all's blocks, a broadcast's data.
	recvPtr device.Ptr
	steers  helloSteers
	// stop: the stream's stop channel, which a poll over the network
	// (whose bound is Config.TCPSpin, up to a second) watches.
	stop <-chan struct{}
	// bcast: the one-shot broadcast's hello, whose payload only the
	// root's carries (x.n bytes; the others' carry none), which the other
	// ranks copy to out.
	bcast bool
	// rd: the call reads its peers' buffers where they lie (laneread.go);
	// x.in is then its hello's payload, the loan's words, and the fields
	// below are the read's.
	rd bool
	readCall

	firstFn, restFn, runFn func(stop <-chan struct{}) error // bound once
	payloadFn              func(r int) []byte
	learnFn                func(p int, payload []byte) error
	seenFn, doneFn         func() bool
}

// How the lane's calls ran (state.laneRuns, for tests): all in the
// caller's goroutine; sent, then the waits left to a queued task; the
// whole call queued behind a busy stream.
const (
	laneInline = iota
	lanePending
	laneQueued
)

// lanePoll is how long a call of the lane polls for its peers' hellos in
// its caller's goroutine (0: it looks once); slices says the caller is the
// host-slice layer, which waits for the call anyway.
func (st *state) lanePoll(slices bool) time.Duration {
	switch {
	case slices:
		return slicePoll
	case st.helloPoll == 0:
		return helloPoll
	case st.helloPoll < 0 && !st.pollSet && st.ll:
		// More processes here than cores, and the hellos are lines: the
		// caller polls, yielding the core between looks.
		return laneYieldPoll
	case st.helloPoll < 0:
		return 0
	}
	return st.helloPoll
}

// laneYieldPoll bounds the lane's inline poll when the processes on this
// host outnumber its cores and the hellos are lines (ll.go), where the
// schedules' hellos do not poll at all (envHelloPoll): the poll gives the
// core away between looks (sched_yield), so a peer that needs it runs, and a
// call whose peers answer within the bound ends in its caller's goroutine
// instead of a stream task's. Measured with 4 shm processes on 2 cores, 16 B
// (BENCHMARKS.md, stop 18): 11.5 µs without the poll, 8.1–8.5 polling up to
// 5–20 µs, 7.9 up to 50 (Open MPI 7.5); the schedules' hellos (a 64 KiB
// all-reduce, a 4 KiB all-gather) measured no faster or slower polling, so
// they keep to envHelloPoll.
const laneYieldPoll = spin.Default

// lanePolls is how many times first looks for the peers' hellos without
// yielding the processor (a few hundred nanoseconds) before its polls yield
// — none where the host's ranks outnumber its cores (state.crowded): 4
// ranks in one process on 2 cores, four launches each, interleaved:
// 16-byte all-reduce 3.6–3.7 µs against 3.7–4.2 with lanePolls, 64 KiB
// all-gather 16.6–17.8 against 18.0–18.9, all-to-all 18.7–19.9 against
// 19.5–21.4, broadcast 13.9–15.1 against 15.1–16.6 (4 shm processes
// alike either way, within their launch-to-launch spread).
const lanePolls = 64

// laneCrowdedPolls replaces spin.TightPolls in a lane's wait for processes
// of a host whose ranks outnumber its cores (state.crowded): there the
// peer a lane waits for is often not running, and polls in a row only
// delay the yield that lets it run. 4 shm processes on 2 cores, five
// launches each, interleaved: 16-byte all-reduce 2.7–5.3 µs (median 3.3)
// against 5.2–7.3 (5.7) with spin.TightPolls, 64 KiB all-gather 10.9–13.0
// against 14.0–19.2, all-to-all 11.6–15.2 against 14.5–17.8; the 1 KiB
// all-gather, whose waits are the shared notify's, alike. (In every
// UntilYield of the process, the recursive doubling's and the schedules'
// waits too, the 64 KiB all-reduce measured slower: 40.7–45.5 against
// 37.1–43.5.)
const laneCrowdedPolls = 32

func newLaneCall(st *state) *laneCall {
	x := &laneCall{st: st}
	x.firstFn, x.restFn, x.runFn, x.payloadFn, x.learnFn = x.first, x.rest, x.run, x.payload, x.learn
	x.seenFn, x.doneFn = x.seen, x.doneSeen
	return x
}

// laneAllReduce runs AllReduce's call in the lane when it can, reporting
// whether it did; when it did not, nothing happened and the caller issues
// the schedule. The arguments have been checked (checkArgs).
func laneAllReduce(c *hcomm.Comm, s *device.Stream, o *Options, send, recv device.Ptr, count int64, dt hcomm.DataType, op hcomm.ReduceOp) (bool, error) {
	n := count * int64(dt.Size())
	var h header // field by field (see laneRun)
	h.kind, h.dt, h.op, h.flags, h.count, h.algo = kAllReduce, dt, op, flagOp, count, AlgoOneShot
	return laneRun(c, s, o, "AllReduce", &h, send, recv, n, n, n)
}

// laneAllGather is laneAllReduce for AllGather: the same hello (the
// one-shot all-gather's: every rank's input inline in its hello to every
// peer), and each rank copies the n inputs, its own included, to their
// places in recv. A call whose buffers lie in a window is the schedule's
// (it reads windows in place).
func laneAllGather(c *hcomm.Comm, s *device.Stream, o *Options, send, recv device.Ptr, count int64, dt hcomm.DataType) (bool, error) {
	n := count * int64(dt.Size())
	var h header // field by field (see laneRun)
	h.kind, h.dt, h.count, h.algo = kAllGather, dt, count, AlgoOneShot
	return laneRun(c, s, o, "AllGather", &h, send, recv, n, n, n*int64(c.Size()))
}

// laneReduce is laneAllReduce for Reduce: the same hello, and only the
// root reduces (recv is the root's alone).
func laneReduce(c *hcomm.Comm, s *device.Stream, o *Options, send, recv device.Ptr, count int64, dt hcomm.DataType, op hcomm.ReduceOp, root int) (bool, error) {
	n := count * int64(dt.Size())
	var h header // field by field (see laneRun)
	h.kind, h.dt, h.op, h.flags, h.root, h.count, h.algo = kReduce, dt, op, flagOp|flagRoot, int32(root), count, AlgoOneShot
	outN := int64(0)
	if c.Rank() == root {
		outN = n
	}
	return laneRun(c, s, o, "Reduce", &h, send, recv, n, n, outN)
}

// laneBarrier is Barrier's call in the lane: a hello without payload.
func laneBarrier(c *hcomm.Comm, s *device.Stream) (bool, error) {
	var h header // field by field (see laneRun)
	h.kind, h.dt, h.algo = kBarrier, hcomm.Int8, AlgoOneShot
	return laneRun(c, s, nil, "Barrier", &h, 0, 0, 0, 0, 0)
}

// laneRun runs the call of header h (its kind, types and count set; the
// lane numbers and addresses it, and names its algorithm) in the lane when
// it can: sel bytes are what the selector weighs (issue's), n bytes of send
// go inline in the hello (the one-shot's) or are read by each peer (the
// read lane's, laneread.go), outN bytes of recv are written.
func laneRun(c *hcomm.Comm, s *device.Stream, o *Options, name string, h *header, send, recv device.Ptr, sel, n, outN int64) (bool, error) {
	if o != nil && o.level {
		return false, nil
	}
	st, _ := c.Value(stateKey{}, nil).(*state)
	if st == nil {
		return false, nil // the first collective of c: issue sets up
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.group == nil {
		st.group = groupOf(c)
	}
	if st.group.open.Load() { // an open group issues the call at GroupEnd
		return false, nil
	}
	fit := st.laneReady(s, h.kind, sel, algoOf(o))
	if fit == nil || fit.rd && (st.readers[0] != nil || st.readers[1] != nil) { // every schedule drains its readers (drainGathers)
		return false, nil
	}
	if h.kind != kAllReduce && len(st.wins) > 0 {
		if _, _, in := st.windowOf(send, n); in {
			return false, nil
		}
		if _, _, in := st.windowOf(recv, outN); in {
			return false, nil
		}
	}
	inN := n
	switch {
	case fit.rd && h.kind == kAlltoAll:
		inN = outN // every block
	case fit.part:
		inN = n * int64(c.Size()) // a part for every rank
	}
	in, err := st.laneIn.get(c, name, "send", send, inN)
	if err != nil {
		return true, err
	}
	out, err := st.laneOut.get(c, name, "recv", recv, outN)
	if err != nil {
		return true, err
	}
	t := st.lastThread // laneReady: s is lastStream
	x := st.lane
	if x == nil {
		x = newLaneCall(st)
		st.lane = x
	}
	st.seq++
	// The header's last fields set where it lies: setting them in h and
	// copying h after would load what was just stored in pieces (a load
	// that waits for the stores to reach the cache, a few nanoseconds of
	// every call; so are h and fit pointers).
	x.h, x.name = *h, name
	x.h.seq, x.h.from, x.h.size = st.seq, int32(c.Rank()), int32(c.Size())
	x.in, x.out, x.count, x.n, x.next, x.pending = in, out, h.count, n, 0, false
	x.algo, x.algoName, x.rd, x.part, x.sendPtr, x.net, x.bcast = AlgoOneShot, algoOneShot, fit.rd, fit.part, send, fit.net, fit.bcast
	x.recvPtr = recv
	if fit.rd {
		x.readArgs(fit.algo, send, recv, in, n)
	}
	x.h.algo = x.algo
	for _, p := range st.others {
		x.par[p] = st.hellos[p] % 2
		x.flag[p] = st.helloFlag(p, st.hellos[p])
		st.hellos[p]++
	}
	x.poll = st.lanePoll(s == st.own)
	if p := s.Pending(); p > 0 && st.lastSmall {
		// The small collectives before this one are still on the stream:
		// wait a moment for them, as launchHello does.
		spin.Until(max(x.poll, helloPoll), func() bool { return s.Pending() == 0 })
	}
	if x.net {
		// Over the network the caller polls for the peers' hellos as a
		// tcp wait would, for Config.TCPSpin (st.netPoll): each look
		// receives what the sockets hold, and an answer takes a round
		// trip of the sockets (7–9 µs on the development VM). Not for the
		// wait above: a stream whose task sleeps in the network poller
		// is not woken while this goroutine spins (Go's scheduler polls
		// the network when it has nothing else to run), and a caller
		// that waited that long there every call would keep it so.
		x.poll = st.netPoll
	}
	// The call is numbered (CountOp) once its hello is out; with metrics
	// or TRACE on, BeginOp numbers it now and times it with tasks of its
	// own.
	endOp := noEnd
	x.opSeq, x.number = 0, !c.TimesOps()
	if !x.number {
		x.opSeq, endOp = c.BeginOp(t, name, x.algoName)
	}
	ran, err := s.RunInline(name, x.firstFn)
	if !ran && err != nil { // the stream is unusable: nothing ran
		st.seq--
		for _, p := range st.others {
			st.hellos[p]--
		}
		if x.rd {
			x.unclaim()
		}
		endOp()
		return true, collErr(c, name, hcomm.ResultOf(err), err, "")
	}
	// A failure of the inline task is the stream's, as a queued task's
	// would be: its Synchronize reports it.
	err = nil
	switch {
	case !ran: // busy: the whole hello as a queued task, numbered now (in issue order)
		st.laneRuns[laneQueued]++
		st.lane = nil
		x.countOp()
		err = s.Launch(name, x.runFn)
	case x.pending:
		st.laneRuns[lanePending]++
		st.lane = nil
		err = s.Launch(name, x.restFn)
	default:
		st.laneRuns[laneInline]++
	}
	if err == nil {
		err = endOp()
	}
	st.lastStream, st.lastThread, st.lastSmall = s, t, true
	if err != nil {
		// A failed launch leaves the peers waiting for this rank's part:
		// the communicator's collectives are out of step.
		st.err = err
		return true, collErr(c, name, hcomm.ResultOf(err), err, "issuing the schedule")
	}
	return true, nil
}

// algoOneShot is the lane's algorithm's name, made once.
var algoOneShot = AlgoOneShot.String()

// noEnd is the end of a collective CountOp numbered.
func noEnd() error { return nil }

// laneFit remembers a call the lane fits: what laneFits found for its
// bytes and algorithm holds while the state is prepared and unbroken, since
// everything else it looks at (the channels, the layout, the selector's
// inputs) is set once when the state is prepared.
type laneFit struct {
	k     kind
	n     int64
	asked Algorithm // the Options'
	algo  Algorithm // the call's: the one-shot's, or the read lane's (rd)
	rd    bool
	part  bool // a payload of its own to each peer (laneCall.part)
	net   bool // every peer is over the network (laneCall.net)
	bcast bool // the root's payload only (laneCall.bcast)
	ok    bool
}

// laneReady reports whether a call of kind k of sel bytes (the selector's)
// on s, algo asked for by its Options, can take the lane, and how: nil when
// it cannot, else st.laneFit, which holds until the next call (st.mu held;
// an open group is checked by the caller).
func (st *state) laneReady(s *device.Stream, k kind, sel int64, algo Algorithm) *laneFit {
	switch {
	case st.err != nil, testIssue != nil, testJitter != nil:
		return nil
	case st.lastStream != s, st.lastThread == nil:
		return nil // the first call on s, or after one on another stream: begin orders them
	}
	if f := &st.laneFit; f.ok && f.k == k && f.n == sel && f.asked == algo {
		return f
	}
	f, ok := st.laneFits(k, sel, algo)
	if !ok {
		return nil
	}
	f.k, f.n, f.asked, f.ok = k, sel, algo, true
	st.laneFit = f
	return &st.laneFit
}

// laneFits reports whether the schedule that issue would run for a call of
// kind k, sel bytes and algo asked for is one the lane runs — the one-shot
// (its input inline in the hello) or a read of every peer's buffer in place
// (readFits) — every channel it needs is there, and nothing asks for the
// schedule's machinery.
func (st *state) laneFits(k kind, sel int64, algo Algorithm) (laneFit, bool) {
	c := st.comm
	size := c.Size()
	if !st.prepared || st.noLane || size < 2 || size > helloFullMax || !st.hello.Mapped() {
		return laneFit{}, false
	}
	if algo == AlgoAuto {
		algo = st.forced[k]
	}
	strict := st.strict && reduces(k)
	if k == kBarrier {
		algo = AlgoOneShot // the barrier's hello is the barrier
	} else if algo == AlgoAuto && !strict {
		// As issue chooses.
		algo = choose(k, sel, size, st.lay, st.costs, st.mapped, st.multiHost, false)
		algo = preferLent(k, sel, size, st, algo)
	}
	st.remote = false
	mapped, net := 0, 0
	for _, p := range st.peers() { // st.others, which the lane uses from here on
		ch := st.chans[p]
		switch {
		case ch == nil: // not set up yet
			return laneFit{}, false
		case ch.Flagged():
			mapped++
		case ch.Transport() == hcomm.TransportTCP:
			net++
		}
		st.remote = st.remote || ch.Transport() != hcomm.TransportInproc
	}
	if mapped+net != len(st.others) || net > 0 && (mapped > 0 || st.crowded) {
		// A peer neither mapped nor over tcp (the simulator's), or some
		// pairs' hellos lines and others writes: the schedule's.
		// And where the host's processes outnumber its cores, a caller
		// polling its sockets for a peer that is not running only delays
		// it: 3 tcp processes on 2 cores, 16-byte all-reduce 38–66 µs in
		// the lane against 22 queued (polling 5 µs: 56–65).
		return laneFit{}, false
	}
	switch {
	case (algo == AlgoOneShot || algo == AlgoAuto && strict) && (k == kAllReduce || k == kAllGather || k == kReduce || k == kBarrier): // strict picks oneshot at this size (strictAlgo)
		return laneFit{algo: AlgoOneShot, net: net > 0}, sel <= st.lay.inline()
	case algo == AlgoOneShot && !strict && (k == kAlltoAll || k == kReduceScatter):
		return laneFit{algo: AlgoOneShot, part: true, net: net > 0}, sel/int64(size) <= st.lay.inline()
	case algo == AlgoOneShot && k == kBroadcast:
		return laneFit{algo: AlgoOneShot, bcast: true, net: net > 0}, sel <= st.lay.inline()
	case net > 0:
		return laneFit{}, false // the read lane reads mapped memory
	case st.readFits(k, sel, algo):
		return laneFit{algo: algo, rd: true}, true
	}
	return laneFit{}, false
}

// post writes this rank's hello — the header, then the payload — into its
// own slot and from there into every peer's: as a line when the pairs'
// hellos are lines (ll.go; every peer of the lane's is mapped), else
// recording the peer's hello notify (a write prepared once per peer and
// parity: laneWrite).
func (x *laneCall) post(stop <-chan struct{}) error {
	st := x.st
	me := int(x.h.from)
	off := st.lay.helloOff(me, 0)
	x.steers.landed = 0
	if x.net && !x.rd && x.n >= steerMin && x.count > 0 {
		x.steer()
	}
	if x.part {
		x.packed = false
		return x.postParts(stop)
	}
	lines := st.ll && !x.net
	in := x.in
	if x.bcast && me != int(x.h.root) {
		in = nil // only the root's hello carries the data
	}
	n := int64(len(in))
	packed := lines && !x.rd && packHeader(x.line[:], x.h, in)
	if !packed || x.bcast {
		// The header and payload in this rank's slot, which finish checks
		// against and the writes (or the full line) go from. (A
		// broadcast's hellos differ in their payloads: finish compares
		// the headers in the slots, not the lines.)
		b := st.hello.Bytes()[off : off+headerSize+n]
		x.h.encode(b)
		copy(b[headerSize:], in)
		if lines && !packed {
			copy(x.line[:], b[:headerSize])
		}
	}
	x.packed = packed && !x.bcast
	if lines {
		for _, p := range st.others {
			if !packed && n > 0 {
				dst := st.peerBuf[p].Add(st.lay.helloOff(me, x.par[p]) + headerSize)
				if err := hcomm.WriteNbi(stop, st.chans[p], dst, st.buf.Add(off+headerSize), n); err != nil {
					return err
				}
			}
			if err := st.storeLine(p, x.par[p], x.flag[p], x.line[:]); err != nil {
				return err
			}
		}
		return nil
	}
	for _, p := range st.others {
		w, err := st.laneWrite(p, x.par[p])
		if err != nil {
			return err
		}
		if err := w.Do(stop, headerSize+n); err != nil {
			return err
		}
	}
	return nil
}

// postParts is post for a call whose hello to each peer carries a payload
// of its own (x.part): the header into this rank's slot — a reduce-scatter's
// own part beside it (where finish reduces it with the peers': an in-place
// reduce-scatter's recv is that part of send, which the reduction
// overwrites), an all-to-all's not (finish copies it from send to its
// place: one copy, not two) — and to each peer
// the header and the peer's part of send, as the schedule's hello sends
// them (sendHello: a line when they pack into one, else the part and then
// the header's line).
func (x *laneCall) postParts(stop <-chan struct{}) error {
	st := x.st
	me := int(x.h.from)
	off := st.lay.helloOff(me, 0)
	b := st.hello.Bytes()[off : off+headerSize+x.n]
	x.h.encode(b)
	if x.h.kind != kAlltoAll {
		copy(b[headerSize:], x.in[int64(me)*x.n:])
	}
	mine := st.buf.Add(off)
	for _, p := range st.others {
		if err := st.sendHello(stop, p, x.par[p], x.flag[p], mine, x.sendPtr.Add(int64(p)*x.n), x.n, &x.sendLine); err != nil {
			return err
		}
	}
	return nil
}

// laneWrite returns the prepared write of this rank's hello slot into
// peer's slot of parity par, preparing it on first use.
func (st *state) laneWrite(p int, par uint64) (*hcomm.PreparedWrite, error) {
	if st.lanePosts == nil {
		st.lanePosts = make([][2]*hcomm.PreparedWrite, st.comm.Size())
	}
	if w := st.lanePosts[p][par]; w != nil {
		return w, nil
	}
	me := st.comm.Rank()
	w, err := hcomm.PrepareWriteWithNotify(st.chans[p], st.peerBuf[p].Add(st.lay.helloOff(me, par)), st.buf.Add(st.lay.helloOff(me, 0)), st.lay.helloSlot, nHello+int(par))
	if err != nil {
		return nil, err
	}
	st.lanePosts[p][par] = w
	return w, nil
}

// laneView is a buffer of the lane's calls, checked once for a run of calls
// on the same buffer: while no memory has been allocated or freed since
// (device.AllocEpoch), the range found is still the same live memory.
type laneView struct {
	epoch uint64
	p     device.Ptr
	b     []byte
}

// get returns the host bytes of [p, p+n), checked as checkBuf checks a
// collective's buffer.
func (v *laneView) get(c *hcomm.Comm, op, what string, p device.Ptr, n int64) ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	if e := device.AllocEpoch(); v.p == p && v.epoch == e && int64(len(v.b)) >= n {
		return v.b[:n], nil
	}
	b, err := c.Device().Bytes(p, n)
	if err != nil {
		return nil, collErr(c, op, hcomm.ErrPara, err, "%s buffer", what)
	}
	v.epoch, v.p, v.b = device.AllocEpoch(), p, b
	return b, nil
}

// seen reports whether every peer's hello has arrived, taking the records
// of those that have (x.next counts them).
func (x *laneCall) seen() bool {
	st := x.st
	if x.net {
		select {
		case <-x.stop: // aborted: the queued wait fails at once
			return true
		default:
		}
	}
	for x.next < len(st.others) {
		p := st.others[x.next]
		if x.packed {
			if !channel.TakeLine(x.got[p][:], st.peerLine(p, x.par[p]), x.flag[p]) {
				return false
			}
			x.next++
			continue
		}
		if st.ll && !x.net {
			if !st.takeFlagged(p, x.par[p], x.flag[p]) {
				return false
			}
			x.next++
			continue
		}
		idx := nHello + int(x.par[p])
		if !x.net && !hcomm.ChannelNotifyPeek(st.chans[p], idx) {
			// Not yet (a peer lost meanwhile breaks the notify, and the
			// wait rest queues after the poll names the loss).
			return false
		}
		ok, err := hcomm.ChannelNotifyTryWait(st.chans[p], idx)
		if err != nil {
			return true // a broken notify: rest's wait fails at once, naming the collective
		}
		if !ok {
			return false
		}
		if err := st.hello.Fetch(st.lay.helloOff(p, x.par[p]), headerSize+x.n); err != nil {
			return true
		}
		x.next++
	}
	return true
}

// steer arms the steers of the peers' hellos whose payloads finish would
// copy to recv.
func (x *laneCall) steer() {
	st := x.st
	switch {
	case x.bcast:
		if root := int(x.h.root); root != int(x.h.from) {
			x.steers.arm(st, root, x.par[root], x.n, x.recvPtr)
		}
	case x.h.kind == kAllGather || x.h.kind == kAlltoAll:
		for _, p := range st.others {
			x.steers.arm(st, p, x.par[p], x.n, x.recvPtr.Add(int64(p)*x.n))
		}
	}
}

// endSteers ends the call's steers (helloSteers.end); every exit of its
// tasks does, so that nothing lands in recv after the call.
func (x *laneCall) endSteers() error {
	if x.steers.armed == 0 {
		return nil
	}
	return x.steers.end(x.st, x.name, int(x.h.from), x.n)
}

// first (run inline) sends the hello and polls for the peers' for up to
// x.poll: when all are there it checks them and reduces; otherwise it sets
// pending and the caller queues rest behind it.
func (x *laneCall) first(stop <-chan struct{}) (err error) {
	defer func() {
		if err != nil || !x.pending {
			x.endSteers()
		}
	}()
	x.stop = stop
	if err := x.post(stop); err != nil {
		return err
	}
	// The peers that sleep for this rank's hello are woken first (a fence
	// and a look at their wake words), and the call numbered, before the
	// poll: measured against the same after it, 2 ranks in one process,
	// 1 KiB all-gather 0.70–0.77 µs against 0.81–0.91, 16 B all-reduce
	// alike. seen gives up early on a broken notify, leaving x.next short:
	// the queued wait names the loss.
	if err := x.wake(stop); err != nil {
		return err
	}
	x.countOp()
	x.pollUntil(x.seenFn)
	if x.next < len(x.st.others) {
		x.pending = true
		return nil
	}
	if !x.rd {
		return x.finish()
	}
	if err := x.finishRead(stop); err != nil {
		return err
	}
	x.pending = !x.drained()
	return nil
}

// pollUntil polls cond until it is true, for up to the lane's poll bound
// (seen and doneSeen also end it at a broken notify: their counts tell the
// caller what came). A peer making the same call answers within a cache
// line's round trip: a tight poll first, before the polls that yield (the
// core to other processes, when some peer is one: st.remote).
func (x *laneCall) pollUntil(cond func() bool) {
	tight := lanePolls
	if x.st.crowded {
		tight = 0 // the peer is often not running: yield from the first look
	}
	if x.net && x.poll <= 0 {
		cond() // tcp polling is off (HCOMM_TCP_SPIN=0): one look
		return
	}
	for i := 0; i < tight; i++ {
		if cond() {
			return
		}
	}
	switch {
	case x.poll <= 0:
	case x.st.remote && x.st.crowded:
		spin.UntilYieldN(x.poll, laneCrowdedPolls, cond)
	case x.st.remote:
		spin.UntilYield(x.poll, cond)
	default:
		spin.Until(x.poll, cond)
	}
}

// countOp numbers the call with CountOp, once, unless BeginOp has.
func (x *laneCall) countOp() {
	if x.number {
		x.opSeq, _ = x.st.comm.CountOp(x.name, x.algoName)
		x.number = false
	}
}

// rest (a queued task behind first) waits for the hellos first did not
// see, checks them all and reduces.
func (x *laneCall) rest(stop <-chan struct{}) error {
	defer x.endSteers()
	st := x.st
	if x.rd && x.read {
		return x.drain(stop) // first read: only the peers' dones remain
	}
	for ; x.next < len(st.others); x.next++ {
		p := st.others[x.next]
		if err := st.awaitHello(stop, p, x.par[p], x.flag[p], opTag{x.h.kind, x.opSeq, x.algo}); err != nil {
			return err
		}
		// The line stays as it came until this rank's next hello to p.
		if x.packed && !channel.TakeLine(x.got[p][:], st.peerLine(p, x.par[p]), x.flag[p]) {
			return collErr(st.comm, x.name, hcomm.ErrInternal, nil, "rank %d's hello line went between its arrival and its reading", p)
		}
		if err := st.hello.Fetch(st.lay.helloOff(p, x.par[p]), headerSize+x.n); err != nil {
			return err
		}
	}
	if x.rd {
		if err := x.finishRead(stop); err != nil {
			return err
		}
		return x.drain(stop)
	}
	return x.finish()
}

// run (a queued task: the stream was busy) is the whole call.
func (x *laneCall) run(stop <-chan struct{}) error {
	defer x.endSteers()
	if err := x.post(stop); err != nil {
		return err
	}
	if err := x.wake(stop); err != nil {
		return err
	}
	return x.rest(stop)
}

// wake wakes the peers that sleep for this rank's hello, which post stored
// as lines without looking (ll.go: storeLine): one fence for them all, then
// each peer's wake word. post's caller calls it before it waits for
// anything. (The parts' hellos look as each is stored, as the schedule's
// do.)
func (x *laneCall) wake(stop <-chan struct{}) error {
	st := x.st
	if !st.ll || x.net || x.part {
		return nil // writes with their notify records, or sendHello's own wakes
	}
	channel.Fence()
	for _, p := range st.others {
		if err := st.wakeIfAsked(stop, p, x.par[p], x.flag[p]); err != nil {
			return err
		}
	}
	return nil
}

// finish checks the peers' headers and reduces every rank's payload, in
// rank order, into recv (an all-gather's: copies each to its place).
func (x *laneCall) finish() error {
	st := x.st
	me, size := int(x.h.from), st.comm.Size()
	if err := x.endSteers(); err != nil {
		return err
	}
	if x.packed {
		// This rank's payload as the line carries it: a copy, which an
		// in-place call's reduction may overwrite recv under.
		x.pay[me] = x.line[lineHeader : lineHeader+x.n]
		for _, p := range st.others {
			if !st.noCheck && !sameLine(x.line[:], x.got[p][:], p) {
				if err := x.mismatch(p); err != nil {
					return err
				}
				continue
			}
			x.pay[p] = x.got[p][lineHeader : lineHeader+x.n]
		}
	} else {
		hb := st.hello.Bytes()
		end := headerSize + x.n
		off := st.lay.helloOff(me, 0)
		mine := hb[off : off+end]
		x.pay[me] = mine[headerSize:]
		for _, p := range st.others {
			off := st.lay.helloOff(p, x.par[p])
			theirs := hb[off : off+end]
			if !st.noCheck {
				if err := st.checkHello(x.h, mine, theirs, p, nil, x.n); err != nil {
					return err
				}
			}
			x.pay[p] = theirs[headerSize:]
		}
	}
	if x.count == 0 {
		return nil
	}
	if x.bcast {
		if root := int(x.h.root); root != me && !x.steers.in(root) {
			copy(x.out, x.pay[root])
		}
		return nil
	}
	if x.h.kind == kReduce && me != int(x.h.root) {
		return nil // the root reduces
	}
	if x.h.kind == kAllGather || x.h.kind == kAlltoAll {
		// Every rank's input (or block for this rank) to its place, this
		// rank's from its own hello's copy (an in-place all-gather's input
		// is its place) — an all-to-all's (which has no in-place form)
		// from send, which postParts did not copy into the slot.
		if x.h.kind == kAlltoAll {
			x.pay[me] = x.in[int64(me)*x.n : int64(me+1)*x.n]
		}
		for r := 0; r < size; r++ {
			if !x.steers.in(r) { // steered there as it arrived
				copy(x.out[int64(r)*x.n:], x.pay[r])
			}
		}
		return nil
	}
	return reduceRanks(x.out, size, x.count, x.h.dt, x.h.op, x.payloadFn)
}

// mismatch checks peer p's line that differs from this rank's as the
// hello's check does, from the slots: this rank's header encoded into its
// own, p's line unpacked into p's, for the error that names what differs.
// Should the check pass after all, p's payload is the one unpacked.
func (x *laneCall) mismatch(p int) error {
	st := x.st
	hb := st.hello.Bytes()
	end := headerSize + x.n
	off := st.lay.helloOff(int(x.h.from), 0)
	mine := hb[off : off+end]
	x.h.encode(mine)
	poff := st.lay.helloOff(p, x.par[p])
	theirs := hb[poff : poff+st.lay.helloSlot]
	unpackLine(theirs, x.got[p][:])
	if err := st.checkHello(x.h, mine, theirs[:end], p, nil, x.n); err != nil {
		return err
	}
	x.pay[p] = theirs[headerSize:end]
	return nil
}

// payload returns rank r's payload of the call finish checked.
func (x *laneCall) payload(r int) []byte { return x.pay[r] }

// reduceRanks sets dst to the n ranks' inputs combined in rank order
// (in(r) is rank r's, count elements of dt): every rank that reduces the
// same inputs this way gets the same bits.
func reduceRanks(dst []byte, n int, count int64, dt hcomm.DataType, op hcomm.ReduceOp, in func(r int) []byte) error {
	if n == 1 {
		copy(dst, in(0))
		return nil
	}
	if err := reduce.Reduce3(dst, in(0), in(1), int(count), dt, op); err != nil {
		return err
	}
	for p := 2; p < n; p++ {
		if err := reduce.Reduce(dst, in(p), int(count), dt, op); err != nil {
			return err
		}
	}
	return nil
}
