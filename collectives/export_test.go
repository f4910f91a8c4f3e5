package collectives

import "github.com/hcomm-dev/hcomm/hcomm"

// SetTestJitter sets the hook that runs before each step of every schedule
// (testJitter), for the determinism tests; nil removes it. Call it only while
// no collective runs.
func SetTestJitter(f func(rank int)) { testJitter = f }

// SetTestIssue sets the hook that runs on the issuing goroutine before each
// step of every schedule (testIssue); nil removes it. Call it only while no
// collective runs.
func SetTestIssue(f func(rank int)) { testIssue = f }

// CollChannels returns how many channels the collectives of c's rank have
// set up so far (the peers their schedules needed).
func CollChannels(c *hcomm.Comm) int {
	st, err := lockLocal(c)
	if err != nil {
		return -1
	}
	defer st.mu.Unlock()
	return st.channels()
}

// LaneRuns returns how c's all-reduces that took the lane ran (lane.go):
// all in the caller's goroutine, with the waits left to a queued task, the
// whole call queued behind a busy stream.
func LaneRuns(c *hcomm.Comm) (inline, pending, queued int) {
	st, err := lockLocal(c)
	if err != nil {
		return -1, -1, -1
	}
	defer st.mu.Unlock()
	return st.laneRuns[laneInline], st.laneRuns[lanePending], st.laneRuns[laneQueued]
}

// PieceBytes is the pipes' piece of c's HCCL buffer.
func PieceBytes(c *hcomm.Comm) int64 {
	st, err := lockLocal(c)
	if err != nil {
		return -1
	}
	defer st.mu.Unlock()
	return st.lay.piece
}

// LentWrites returns how many lent writes (lent.go) have run, and how many
// loans are still registered.
func LentWrites() (writes, open int64) { return lentWrites.Load(), openLoans.Load() }

// SteersLanded counts the hello payloads steered into place (steer.go).
func SteersLanded() int64 { return steersLanded.Load() }

// SteerMin is the smallest hello payload steered.
const SteerMin = steerMin

// NetPiece bounds the pipes' piece where some peer is behind a network.
const NetPiece = netPiece

// NetPiece2 is NetPiece between 2 ranks.
const NetPiece2 = netPiece2

// LentPipes counts the pieces sent by lent pipes (tcp).
func LentPipes() int64 { return lentPipes.Load() }

// LentAcks counts the acknowledgements the lent pipes' receivers recorded.
func LentAcks() int64 { return lentAcks.Load() }

// LentWindow is how many pieces a lent pipe may have unacknowledged among
// the ranks of c: lentWindow where some host is crowded, lentWideWindow
// where none is (-1: c has no collective state).
func LentWindow(c *hcomm.Comm) int64 {
	st, err := lockLocal(c)
	if err != nil {
		return -1
	}
	defer st.mu.Unlock()
	if st.crowdedComm {
		return lentWindow
	}
	return lentWideWindow
}

// LentReads counts the lent reads run (shm, through the kernel).
func LentReads() int64 { return lentReads.Load() }

// ReadMin is the least data a pair reads lent.
const ReadMin = readMin

// PairReadMin is pairReadMin: readMin between 2 ranks and in one process.
const PairReadMin = pairReadMin

// InprocPullMax: in process, what is read rather than written lent.
const InprocPullMax = inprocPullMax

// ScheduleCrowded returns whether c's collectives choose the schedules of a
// crowded communicator (HCOMM_CROWDED, or Comm.Crowded), and whether their
// handshake runs down the binomial tree.
func ScheduleCrowded(c *hcomm.Comm) (crowded, tree bool, err error) {
	st, err := lockLocal(c)
	if err != nil {
		return false, false, err
	}
	defer st.mu.Unlock()
	return st.crowdedComm, st.tree, nil
}

// ArDirectMin is the least block the selector gives the direct all-reduce.
const ArDirectMin = arDirectMin

// RefuseDirectReads makes the pairs for which refuse is true unable to
// read for the direct all-reduce until the returned function runs.
func RefuseDirectReads(refuse func(me, p int) bool) func() {
	directRefused = refuse
	return func() { directRefused = nil }
}

// HelloFullMax is the most ranks whose hellos go to every peer.
const HelloFullMax = helloFullMax

// LentPushes counts the pieces pushed into peers' outputs (lendPush).
func LentPushes() int64 { return lentPushes.Load() }

// SetShmPushMin sets the least all-gather output that is pushed between
// processes of a host, and returns a func that sets it back.
func SetShmPushMin(v int64) func() {
	old := shmPushMin
	shmPushMin = v
	return func() { shmPushMin = old }
}

// PushPairByPair makes the pushing all-gather go pair by pair, as where
// some pair can neither push nor take lent writes, and returns a func that
// sets it back.
func PushPairByPair() func() {
	pushPairwise = true
	return func() { pushPairwise = false }
}
