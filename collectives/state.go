package collectives

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/internal/memcopy"
)

// Notify indices on every collective channel. Each signal kind alternates
// between two indices so that a rank can be one exchange ahead of its peer
// without two records of one index collapsing (a notify is a flag, not a
// counter).
const (
	nData  = 0 // + slot: "a piece is in your inbox slot from me"
	nAck   = 2 // + slot: "inbox slot consumed, you may write it again"
	nHello = 4 // + parity: the handshake that opens every collective
	nReady = 6 // + slot: "my gather slot holds what you may read now"
	nDone  = 8 // + slot: "I have read your gather slot"
	// The lent pipes' own (lent.go): a piece's arrival and its
	// acknowledgement, up to lentWideWindow of each, used in turn.
	nLentData = 10 // + piece mod the window: "a piece of this call is in your buffer"
	nLentAck  = nLentData + lentWideWindow
	notifyNum = nLentAck + lentWideWindow
	chanTag   = "hcomm/collectives"
)

// layout is how a rank's HCCL buffer is cut up; every rank computes the same.
//
//	[hello slots: n ranks x 2 parities x helloSlot]  a header, then inline payload
//	[flagged slots: n ranks x 2 parities x llSlot]   the low-latency hello's line and wake word (ll.go)
//	[inbox slots: n sources x 2 x piece]  pipes: a peer writes a piece, this rank consumes it
//	[gather slots: 2 x piece]             this rank publishes a piece, peers read it
//	[scratch: 1 piece]                    partial results between ring steps
type layout struct {
	helloSlot int64 // bytes of one hello slot: a 56-byte header + inline payload
	llOff     int64 // where the flagged slots start (ll.go)
	inboxOff  int64
	gatherOff int64
	piece     int64 // bytes of one inbox slot: the pipeline's piece
	gpiece    int64 // bytes of one gather slot: piece, or twice it where the buffer has room (gatherPiece)
	n         int
	bufSize   int64
}

// helloMax bounds a hello slot: payloads up to 64 KiB travel inline with
// the handshake (the one-shot algorithms), after the header.
const helloMax = 64<<10 + headerSize

// gatherPiece: a gather slot is twice the pipeline's piece where the HCCL
// buffer has room (the default's does), and the all-gather that publishes
// its input in them for its peers to read (allGatherDirect, between
// processes of a host) moves pieces of that size: half the hand-offs. 4 shm
// processes, 64 MiB all-gather, busbw GB/s: 1.93–2.47 with 512 KiB pieces
// against 2.83–3.24 with 1 MiB; the pipes' all-to-all measured slower with
// 1 MiB pieces (1.58–1.67 against 2.19–2.28), so the inbox slots keep theirs.
// The direct broadcast takes them from 8 of them up (4 shm processes, 64 MiB:
// 2.90–3.48 GB/s with 512 KiB pieces against 4.88–5.14; at 1–2 MiB the
// smaller pieces' pipelining measured as fast or faster).
//
// pieceMax is the pipeline's piece: small enough that a block of n pieces
// stays in cache from the first step of a schedule to the last, big enough to
// amortise the hand-offs.
const pieceMax = 512 << 10

func newLayout(n int, bufSize int64) (layout, error) {
	l := layout{n: n, bufSize: bufSize}
	l.helloSlot = min(helloMax, ((bufSize/4)/int64(2*n))&^63)
	l.llOff = l.helloSlot * int64(2*n)
	l.inboxOff = (l.llOff + llSlot*int64(2*n) + 4095) &^ 4095
	l.piece = min(pieceMax, ((bufSize-l.inboxOff)/int64(2*n+3))&^63)
	l.gatherOff = l.inboxOff + l.piece*int64(2*n)
	l.gpiece = l.piece
	if l.gatherOff+5*l.piece <= bufSize {
		l.gpiece = 2 * l.piece // gatherPiece
	}
	if l.helloSlot < 2*headerSize || l.piece < 64 {
		return l, fmt.Errorf("HCCL buffer of %d bytes is too small for %d ranks: the collectives need at least %d", bufSize, n, int64(4*2*n*2*headerSize)+int64(2*n*llSlot)+int64(2*n+3)*64+4096)
	}
	return l, nil
}

// helloOff is the hello slot that rank from writes into, for parity par.
func (l layout) helloOff(from int, par uint64) int64 {
	return (int64(from)*2 + int64(par)) * l.helloSlot
}

// inline is the payload a hello slot carries after its header.
func (l layout) inline() int64 { return l.helloSlot - headerSize }

// flaggedOff is the flagged slot that rank from writes its flagged hellos'
// header words into, for parity par (ll.go); its wake word follows them.
func (l layout) flaggedOff(from int, par uint64) int64 {
	return l.llOff + (int64(from)*2+int64(par))*llSlot
}

// helloEnd is where the hello slots and the flagged slots end.
func (l layout) helloEnd() int64 { return l.llOff + llSlot*int64(2*l.n) }

func (l layout) inboxSlotOff(from int, k uint64) int64 {
	return l.inboxOff + (int64(from)*2+int64(k))*l.piece
}

func (l layout) gatherSlotOff(k uint64) int64 { return l.gatherOff + int64(k)*l.gpiece }

func (l layout) scratchOff() int64 { return l.gatherOff + 2*l.gpiece }

// state is what a communicator's collectives remember between calls.
type state struct {
	mu      sync.Mutex
	comm    *hcomm.Comm
	lay     layout
	buf     device.Ptr
	hello   device.View      // the host's view of buf's hello slots, mapped once (handshake.go)
	chans   []*hcomm.Channel // by peer rank; nil for self and for a peer no schedule has needed yet (need)
	peerBuf []device.Ptr     // peers' HCCL buffers, by rank, as chans
	threads map[*device.Stream]*hcomm.Thread

	seq       uint64             // collectives issued so far (the handshake's sequence number)
	hellos    []uint64           // handshakes with each peer so far (their parity)
	sent      []uint64           // pieces written into each peer's inbox
	recvd     []uint64           // pieces consumed from each peer's inbox
	acked     []uint64           // pieces written into each peer's inbox whose nAck this rank has waited for
	gathers   []uint64           // pieces each rank has published in its gather slots
	readers   [2][]int           // the ranks that read this rank's gather slot k last
	others    []int              // every rank but this one (sched.others)
	noCheck   bool               // skip the handshake's check (HCOMM_COLL_CHECK=0), for measuring its cost
	ll        bool               // hellos between ranks of one host travel as lines (ll.go; HCOMM_LL=0 turns it off)
	strict    bool               // HCCL_DETERMINISTIC=strict: reductions in rank order (ordered.go)
	multiHost bool               // ranks span hosts, some with several ranks: the two-level schedule pays
	mapped    bool               // every peer's memory is mapped (inproc, shm): a read is a memmove
	netLends  bool               // every peer whose memory is not mapped is over tcp (or the simulator's network), whose channels take lent writes (lent.go)
	cma       bool               // the peers are processes of this host, and the configuration lets pairs read lent memory (lent.go)
	allInproc bool               // every peer is a rank of this process (inproc): lent writes are copies (lent.go)
	prepared  bool               // connect has checked the layout and learnt mapped
	forced    map[kind]Algorithm // HCCL_ALGO
	costs     CostModel          // the selector's cost model (HCOMM_COST_MODEL over the defaults)
	windows   int                // windows registered so far (the next one's id - 1)
	wins      []*Window          // the live windows (window.go)

	// What undoPipes recorded: pipe counters to take back, from the tasks
	// of send/receive calls whose handshake found a mismatch. Guarded by
	// undoMu, not mu: tasks run without mu.
	undoMu  sync.Mutex
	undoing atomic.Bool
	undoS   []uint64 // st.sent to take back, per peer
	undoR   []uint64 // st.recvd to take back, per peer

	hier     *hier         // the two-level structure, made on first use
	side     *hcomm.Thread // the side thread (fork/join), made on first use
	forkEv   *device.Event // recorded on the caller's stream at the fork
	forkedEv *device.Event // recorded on the side stream after its wait on forkEv
	joinedEv *device.Event // recorded on the caller's stream after the join

	last       *device.Event // the previous collective's completion
	lastStream *device.Stream
	lastThread *hcomm.Thread // lastStream's thread (threads[lastStream]), for the lane
	lastSmall  bool          // the previous collective was one hello (launchHello may wait for it)
	helloPoll  time.Duration // HCOMM_HELLO_POLL: the inline poll's bound; negative: no inline hello
	pollSet    bool          // HCOMM_HELLO_POLL is set: callers poll for tcp peers too (overNetwork)
	crowded    bool          // the ranks of this host (its processes, or this process's ranks) outnumber its cores

	lane        *laneCall                 // the lane's call, reused while calls complete inline (lane.go)
	laneIn      laneView                  // the lane's send buffer, checked once for a run of calls
	laneOut     laneView                  // its recv buffer
	lanePosts   [][2]*hcomm.PreparedWrite // this rank's hello into each peer's slot of each parity
	linePuts    [][2]*hcomm.PreparedLine  // this rank's hello line into each peer's flagged slot of each parity (ll.go)
	laneRuns    [3]int                    // the lane's calls by how they ran (laneInline, …)
	tree        bool                      // the butterfly's rounds are a binomial tree's (treeSteps): sparse, and some host crowded (butterfly.go)
	crowdedComm bool                      // some host of the communicator has more ranks' processes than cores (hcomm.Comm.Crowded, or HCOMM_CROWDED): every rank alike
	bfSteps     []bfStep                  // this rank's butterfly rounds (butterflyWith), made on first use; read-only
	bfPeers     []int                     // their partners, in order; read-only
	dbt         *[2]btree                 // the double binary tree (dbtree.go), made on first use; read-only
	group       *group                    // c's group state (group.go), looked up once by the lane
	noLane      bool                      // HCOMM_LANE=0: every call through its schedule, to measure the lane
	remote      bool                      // a peer of the lane is in another process (lane.go)
	netPoll     time.Duration             // how long the lane polls peers over the network (Config.TCPSpin; 0: off)
	laneFit     laneFit                   // the last call the lane was found to fit (laneReady)

	own      *device.Stream // the stream of the host-slice layer
	staging  device.Ptr     // the host-slice layer's device copy of the data
	stagingN int64
	err      error

	// ownCtx is the ctx of the host-slice layer's call in progress (set
	// by getStateContext): the stream-ordered call it makes on own takes
	// no ctx, and the channel setups that call needs end with this one.
	// The layer runs one call at a time (they share staging).
	ownCtx context.Context
}

type stateKey struct{}

func getState(c *hcomm.Comm) (*state, error) {
	return getStateContext(context.Background(), c)
}

// getStateContext is getState for the host-slice layer: the channel setups
// of the call it is about to make on st.own end with ctx as well.
func getStateContext(ctx context.Context, c *hcomm.Comm) (*state, error) {
	st, err := lockStateContext(ctx, c)
	if err != nil {
		return nil, err
	}
	st.ownCtx = ctx
	st.mu.Unlock()
	return st, nil
}

// setupCtx returns the ctx that bounds the channel setups of a call on s
// (st.mu held): the host-slice layer's for its stream, else none beyond
// the communicator's own bounds (HCCL_CONNECT_TIMEOUT, Abort, Destroy).
func (st *state) setupCtx(s *device.Stream) context.Context {
	if s != nil && s == st.own && st.ownCtx != nil {
		return st.ownCtx
	}
	return context.Background()
}

// lockState is getState that returns with st.mu held (and does not hold it
// when it fails): a collective issues its schedule under the lock, so it
// takes it once.
func lockState(c *hcomm.Comm) (*state, error) {
	return lockStateContext(context.Background(), c)
}

// lockStateContext is lockState whose channel setup (the first
// collective's) ends with ctx too.
func lockStateContext(ctx context.Context, c *hcomm.Comm) (*state, error) {
	st, err := lockLocal(c)
	if err != nil {
		return nil, err
	}
	if err := st.connect(ctx); err != nil {
		st.mu.Unlock()
		return nil, err
	}
	return st, nil
}

// lockLocal is lockState without the channels: what a rank knows alone
// (layout, HCCL_ALGO), so that a call can be checked against it before any
// peer is involved.
func lockLocal(c *hcomm.Comm) (*state, error) {
	if err := c.Check(); err != nil {
		return nil, err
	}
	st, _ := c.Value(stateKey{}, func() any { return &state{comm: c} }).(*state)
	if st == nil {
		return nil, fmt.Errorf("communicator is destroyed")
	}
	st.mu.Lock()
	if st.err == nil && st.threads == nil {
		st.init1()
	}
	if st.err != nil {
		err := st.err
		st.mu.Unlock()
		return nil, err
	}
	// The pipe counters a mismatched send/receive advanced are taken back
	// here, between calls (pipe.go, undoPipes).
	st.settlePipes()
	return st, nil
}

// connect prepares the collectives' channels at the first collective
// (st.mu held): it checks that the HCCL buffer holds the layout and learns
// from the transports the peers would be reached by whether their memory
// is mapped (the selector needs it before any channel exists). It sets up
// no channel: a schedule does, for the peers it uses, when it first uses
// them (need). A failure is kept: every later collective returns it.
func (st *state) connect(context.Context) error {
	if st.prepared || st.comm.Size() == 1 {
		return nil
	}
	st.err = st.prepare()
	st.prepared = st.err == nil
	return st.err
}

func (st *state) init1() {
	c := st.comm
	st.threads = make(map[*device.Stream]*hcomm.Thread)
	st.hellos = make([]uint64, c.Size())
	st.sent = make([]uint64, c.Size())
	st.recvd = make([]uint64, c.Size())
	st.acked = make([]uint64, c.Size())
	st.gathers = make([]uint64, c.Size())
	// Made once at their full length: tasks of earlier collectives read
	// the entries need filled in before, while need fills in others.
	st.chans = make([]*hcomm.Channel, c.Size())
	st.peerBuf = make([]device.Ptr, c.Size())
	buf, size, _ := c.GetHcclBuffer()
	st.buf = buf
	st.lay, _ = newLayout(c.Size(), size)
	st.mapped = true // until prepare finds a peer whose memory is not
	st.netLends = true
	st.allInproc = true
	st.multiHost = multiHost(c)
	st.noCheck = os.Getenv("HCOMM_COLL_CHECK") == "0"
	st.strict = c.Config().Deterministic == hcomm.DeterministicStrict
	st.forced, st.err = envAlgo()
	if st.err == nil {
		// The processors this host's ranks share: runtime.NumCPU, or the
		// union of the ranks' sets where a launcher bound each to its share.
		cpus := c.HostProcessors()
		st.helloPoll, st.err = envHelloPoll(c.ProcessesHere(), cpus) // handshake.go
		st.pollSet = os.Getenv("HCOMM_HELLO_POLL") != ""
		st.crowded = c.ProcessesHere() > cpus || c.ProcessesHere() == 1 && c.Size() > cpus
		here := c.ProcessesHere() // one rank a process, or every rank in this one
		if here == 1 {
			here = c.Size()
		}
		memcopy.ShareCores(here, cpus)
		st.netPoll = max(c.Config().TCPSpin, 0) // negative: polling off
	}
	if st.err == nil {
		st.crowdedComm, st.err = envCrowded(c.Crowded()) // select.go
	}
	if st.err == nil {
		st.tree, st.err = envTree(c.Size() > helloFullMax && st.crowdedComm) // butterfly.go
	}
	if st.err == nil {
		st.costs, st.err = envCostModel()
	}
	if st.err == nil && st.lay.helloSlot > 0 {
		// The buffer stays allocated until the communicator is destroyed,
		// after its streams' work: the handshake's tasks read and write
		// its hello slots through this view, without a lookup each.
		st.hello, st.err = c.Device().Map(buf, st.lay.helloEnd())
		// Flagged words are polled in place: only where the view is the
		// memory itself (not HCOMM_DEVICE_VIEW=copy, not an accelerator's).
		st.ll = st.err == nil && st.hello.Mapped() && envLL()
	}
	st.noLane = os.Getenv("HCOMM_LANE") == "0" // lane.go
}

// prepare is connect's work, after init1.
func (st *state) prepare() error {
	c := st.comm
	if _, err := newLayout(c.Size(), st.lay.bufSize); err != nil {
		return err
	}
	for p := 0; p < c.Size(); p++ {
		if p == c.Rank() {
			continue
		}
		tr, err := c.TransportTo(p, hcomm.ProtocolAuto)
		if err != nil {
			return err
		}
		if tr != hcomm.TransportInproc && tr != hcomm.TransportShm {
			st.mapped = false
			// tcp, or the simulator's network (hcomm.Comm.TakesLentTo).
			st.netLends = st.netLends && c.TakesLentTo(p)
		}
		st.allInproc = st.allInproc && tr == hcomm.TransportInproc
	}
	// Whether the pairs can read is their channels' (ReadsLent), known
	// once they are made; the schedules that would read are chosen on
	// what every rank knows alike, and a pair that cannot goes through
	// the HCCL buffers within them.
	st.cma = st.mapped && !st.allInproc && !c.Config().ShmCMADisable
	return nil
}

// need sets up the collective channels to those of peers this rank has
// none to yet (st.mu held), all in one ChannelAcquire: the two ends of a
// pair need each other in the same collective, and the setups of one call
// run concurrently, so no order of the peers on the two ends can deadlock
// (one setup at a time could: a ring whose every rank waits for its right
// neighbour, which waits for its own). The setups end with ctx,
// HCCL_CONNECT_TIMEOUT, Abort, Destroy and a lost rank. A failure is kept
// (every later collective returns it), except one that ctx ended on a
// usable communicator: the next collective that needs those peers starts
// their setup again (the channel layer starts over the pairs it gave up).
func (st *state) need(ctx context.Context, peers []int) error {
	c := st.comm
	missing := 0
	for _, p := range peers {
		if st.chans[p] == nil {
			missing++
		}
	}
	if missing == 0 {
		return nil
	}
	descs := hcomm.ChannelDescInit(missing)
	j := 0
	for _, p := range peers {
		if st.chans[p] != nil {
			continue
		}
		descs[j].RemoteRank = p
		descs[j].NotifyNum = notifyNum
		descs[j].Tag = chanTag
		j++
	}
	chs, err := c.ChannelAcquireContext(ctx, hcomm.EngineCPUTS, descs)
	if err != nil {
		if ctx.Err() == nil || c.Check() != nil {
			st.err = err
		}
		return err
	}
	for _, ch := range chs {
		p, size, err := c.ChannelGetHcclBuffer(ch)
		if err != nil {
			st.err = err
			return err
		}
		if size != st.lay.bufSize {
			st.err = fmt.Errorf("rank %d's HCCL buffer is %d bytes, this rank's %d: every rank must use the same HCCL_BUFFSIZE", ch.RemoteRank(), size, st.lay.bufSize)
			return st.err
		}
		st.peerBuf[ch.RemoteRank()] = p
		st.chans[ch.RemoteRank()] = ch
	}
	return nil
}

// need sets up this rank's channels to peers before the schedule first
// uses them (see state.need); hello calls it for its peers, and a schedule
// that reaches a peer it did not greet calls it before its first operation
// with that peer. A setup that fails before the schedule enqueued anything
// leaves the peers in step (issue takes the collective back): the next
// collective may try again when ctx ended it.
func (s *sched) need(peers []int) {
	if !s.ok() {
		return
	}
	ctx := s.ctx
	if ctx == nil {
		ctx = context.Background()
	}
	if err := s.st.need(ctx, peers); err != nil {
		s.do(err)
		s.unset = s.issued == 1 // this failure is the first call do saw
	}
}

// channels returns how many collective channels this rank has set up so
// far: the peers its schedules have needed (need).
func (st *state) channels() int {
	n := 0
	for _, ch := range st.chans {
		if ch != nil {
			n++
		}
	}
	return n
}

// Close releases the host-slice layer's resources and its staging memory
// (called by Comm.Destroy and Comm.Suspend).
func (st *state) Close() error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.own != nil {
		st.own.Destroy()
		st.own = nil
	}
	if st.staging != 0 { // Comm.Suspend closes the state to release memory
		st.comm.Device().Free(st.staging)
		st.staging, st.stagingN = 0, 0
	}
	if st.last != nil {
		st.last.Destroy()
	}
	if st.hier != nil {
		st.hier.close()
		st.hier = nil
	}
	for _, e := range []*device.Event{st.forkEv, st.forkedEv, st.joinedEv} {
		if e != nil {
			e.Destroy()
		}
	}
	return nil
}

// thread returns the thread wrapping s, creating it on first use, and orders
// this collective after the previous one when that ran on another stream.
func (st *state) begin(s *device.Stream) (*hcomm.Thread, error) {
	t, ok := st.threads[s]
	if !ok {
		var err error
		t, err = st.comm.ThreadAcquireWithStream(hcomm.EngineCPUTS, s, 0)
		if err != nil {
			return nil, err
		}
		st.threads[s] = t
	}
	// Order this collective after the previous one when that ran on another
	// stream. The event is recorded only now, on that stream: it then holds
	// the previous collective and whatever followed it there — more than
	// needed, never less — and a run of collectives on one stream records
	// nothing.
	if st.lastStream != nil && st.lastStream != s {
		if st.last == nil {
			e, err := st.comm.Device().CreateEventWithFlags(device.EventDisableTiming)
			if err != nil {
				return nil, err
			}
			st.last = e
		}
		// A record that fails means the caller destroyed that stream, which
		// it may only do once the stream's work is done: nothing to wait for.
		if err := st.last.Record(st.lastStream); err == nil {
			if err := s.WaitEvent(st.last); err != nil {
				return nil, err
			}
		}
	}
	return t, nil
}

// end notes the stream the collective ran on, for the next begin.
func (st *state) end(s *device.Stream) error {
	st.lastStream, st.lastThread = s, st.threads[s]
	return nil
}

// fork returns the side thread, ordered after everything enqueued on s so
// far: a schedule puts there what must not wait behind its main thread (the
// receives of BatchSendRecv). A failure on s before the fork makes the side
// thread skip the forked work (Stream.WaitEvent passes failures on), so that
// no receive of a failed call waits for data that never comes.
//
// A failure the side thread still holds would make it skip this call's work.
// The join of the call it belongs to takes it, unless that join did not run
// (the caller's stream failed before it, so that call is known to have
// failed and its stream reports it): then fork, once the caller's stream has
// passed the previous fork (so the side's wait on it ends at once), waits for
// the side's wait and for that join's turn to have passed, then for the side
// to have skipped the rest of its queue, and drops the failure. Only a failure
// makes the caller wait here.
func (st *state) fork(s *device.Stream) (*hcomm.Thread, error) {
	if st.side == nil {
		ts, err := st.comm.ThreadAcquire(hcomm.EngineCPUTS, 1, 0)
		if err != nil {
			return nil, err
		}
		st.side = ts[0]
		dev := st.comm.Device()
		if st.forkEv, err = dev.CreateEventWithFlags(device.EventDisableTiming); err != nil {
			return nil, err
		}
		if st.joinedEv, err = dev.CreateEventWithFlags(device.EventDisableTiming); err != nil {
			return nil, err
		}
		if st.forkedEv, err = dev.CreateEventWithFlags(device.EventDisableTiming); err != nil {
			return nil, err
		}
	}
	side := st.side.Stream()
	// Once the caller's stream has passed the previous fork, the side
	// thread's wait on it ends at once: let it, so that a failure it passes
	// on is seen here.
	if st.forkEv.Query() == nil {
		st.forkedEv.Synchronize(context.Background()) // a failure here is the side stream's, looked at next
		if side.PeekError() != nil {
			st.joinedEv.Synchronize(context.Background()) // its failure is the caller's to see on its stream
			if side.PeekError() != nil {
				if err := side.Synchronize(context.Background()); err != nil {
					st.comm.Logger().Debug("collectives: dropping the side thread's failure: its call failed before its join", "err", err)
				}
			}
		}
	}
	if err := st.forkEv.Record(s); err != nil {
		return nil, err
	}
	if err := side.WaitEvent(st.forkEv); err != nil {
		return nil, err
	}
	if err := st.forkedEv.Record(side); err != nil {
		return nil, err
	}
	return st.side, nil
}

// join orders what comes after on s after everything enqueued on the side
// thread so far, and brings the side thread's failure to s: the join task
// takes it from the side stream (so that the side thread runs the next
// collective's work) and fails with it, and s's Synchronize reports it.
func (st *state) join(s *device.Stream) error {
	if err := st.afterSide(s, "collectives join"); err != nil {
		return err
	}
	return st.joinedEv.Record(s)
}

// afterSide enqueues on s a task that waits for everything enqueued on the
// side thread so far, then takes the side stream's unreported failure
// (Stream.TakeError) and fails with it. The wait gives up when s is aborted
// or its device closed.
func (st *state) afterSide(s *device.Stream, name string) error {
	side := st.side.Stream()
	// A fresh event per call: the task reads it when it runs, and the next
	// collective may record again before then.
	ev, err := st.comm.Device().CreateEventWithFlags(device.EventDisableTiming)
	if err != nil {
		return err
	}
	if err := ev.Record(side); err != nil {
		ev.Destroy()
		return err
	}
	err = s.Launch(name, func(stop <-chan struct{}) error {
		defer ev.Destroy()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			select {
			case <-stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		// The captured side work's failure, if any, is the side stream's
		// own, which TakeError returns below.
		if err := ev.Synchronize(ctx); err != nil && ctx.Err() != nil {
			return fmt.Errorf("%s: stream aborted while waiting for the side thread: %w", name, err)
		}
		return side.TakeError()
	})
	if err != nil {
		ev.Destroy()
	}
	return err
}

// InlineBytes returns how many bytes per rank the one-shot algorithms carry
// inline with the handshake on this communicator (it depends on the HCCL
// buffer size and the rank count); the selector picks them up to that size.
func InlineBytes(c *hcomm.Comm) int64 {
	_, size, err := c.GetHcclBuffer()
	if err != nil {
		return 0
	}
	l, err := newLayout(c.Size(), size)
	if err != nil {
		return 0
	}
	return l.inline()
}
