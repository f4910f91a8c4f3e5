package collectives

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// Groups (HcclGroupStart, HcclGroupEnd; NCCL's ncclGroupStart/End).
//
// Between GroupStart(c) and GroupEnd(c), the collectives and the Send, Recv
// and BatchSendRecv calls made on c are checked and recorded, not issued.
// GroupEnd issues them as one fused operation, in an order every rank
// computes the same way: first the collectives, in the order they were
// called (as outside a group, every rank calls its collectives in the same
// order); then every send and receive of the group as one BatchSendRecv,
// which matches each pair's transfers independently of the order they were
// listed in and never waits for a receive before a send. So the sends and
// receives of a group may be called in any order on each rank — opposite
// orders on two ranks, a send to the right and a receive from the left on
// every rank of a ring — without deadlock, and interleaved with the
// collectives.
//
// Departures from NCCL: Go has no thread-local state, so a group belongs
// to the communicator, not to the calling thread: every call made on c
// while its group is open is part of it, from whatever goroutine, and a
// group spans one communicator (NCCL's may span several). Groups nest as in
// NCCL: a GroupStart inside a group deepens it, and only the outermost
// GroupEnd issues. Within a group the calls have no order among themselves:
// a collective and a send issued on the same stream may run in either order;
// what is enqueued on a stream after GroupEnd runs after all of the group's
// work on it. The calls that wait for their result (AllReduceSlice and the
// other slice forms, BarrierContext) cannot be part of a group and fail
// with ErrPara while one is open.
//
// A recorded call keeps its arguments: its buffers, stream and Options
// are used when GroupEnd issues it, so keep them unchanged (and the
// buffers allocated) until then, and the buffers until the streams are
// synchronized, as for any enqueued call.
//
// Errors: a call's own argument errors are returned by the call, as outside
// a group. An error in issuing the group is returned by GroupEnd, naming
// the call ("call 3 of the group, AllReduce: …"); the calls after it are not
// issued, and the peers' schedules are left without this rank's part, so
// their waits fail (HCCL_EXEC_TIMEOUT bounds them): abort the communicator.
// Ranks whose groups disagree — a different collective, a send without the
// matching receive — fail with ErrMismatch at their streams' next
// synchronize, as a mismatched collective does, never hang.

// group is a communicator's open group; it lives in the communicator's
// values (hcomm.Comm.Value) and is shared by every goroutine that uses the
// communicator.
type group struct {
	mu    sync.Mutex
	depth int
	// open mirrors depth > 0 for the collectives' fast path, which reads
	// it without the lock: a call made while no group is open pays one
	// atomic load, and no closure is built for it.
	open  atomic.Bool
	calls []groupCall
	items []groupItem // the sends and receives, in call order
	n     int         // calls recorded so far, collectives and sends/receives: their numbers in errors
	// issuing is set while the outermost GroupEnd issues the calls: a
	// GroupStart waits for it (issued is signalled), so that the calls
	// being issued are not recorded again in a new group.
	issuing bool
	issued  *sync.Cond
}

// groupCall is a recorded collective: issue issues it.
type groupCall struct {
	name  string
	pos   int // its position among all the calls of the group, for errors
	issue func() error
}

// groupItem is a recorded send or receive and the stream it was called on.
type groupItem struct {
	it   SendRecvItem
	s    *device.Stream
	call int // its position among all the calls of the group, for errors
}

type groupKey struct{}

func groupOf(c *hcomm.Comm) *group {
	g, _ := c.Value(groupKey{}, func() any {
		g := &group{}
		g.issued = sync.NewCond(&g.mu)
		return g
	}).(*group)
	return g
}

// GroupStart opens a group on c, or deepens the one that is open
// (HcclGroupStart): the collectives and sends and receives made on c until
// the matching GroupEnd are recorded and issued together by it. Safe for
// concurrent use. Errors: ErrPtr for a nil c; ErrUnavail for a destroyed or
// aborted communicator.
func GroupStart(c *hcomm.Comm) error {
	const name = "GroupStart"
	if c == nil {
		return collErr(c, name, hcomm.ErrPtr, nil, "nil communicator")
	}
	if err := c.Check(); err != nil {
		return err
	}
	g := groupOf(c)
	if g == nil {
		return collErr(c, name, hcomm.ErrUnavail, nil, "communicator is destroyed")
	}
	g.mu.Lock()
	for g.issuing {
		g.issued.Wait()
	}
	g.depth++
	g.open.Store(true)
	g.mu.Unlock()
	return nil
}

// GroupEnd closes the group GroupStart opened on c (HcclGroupEnd). Inside
// an enclosing group it only closes this level. The outermost GroupEnd
// issues the group's calls: its collectives in the order they were called,
// then all its sends and receives as one BatchSendRecv (see the package's
// groups section). It returns once the work is enqueued, as the calls do.
// Errors: ErrPara when no group is open; an issuing error naming the call.
func GroupEnd(c *hcomm.Comm) error {
	const name = "GroupEnd"
	if c == nil {
		return collErr(c, name, hcomm.ErrPtr, nil, "nil communicator")
	}
	g := groupOf(c)
	if g == nil {
		return collErr(c, name, hcomm.ErrUnavail, nil, "communicator is destroyed")
	}
	g.mu.Lock()
	if g.depth == 0 {
		g.mu.Unlock()
		return collErr(c, name, hcomm.ErrPara, nil, "no group is open (GroupEnd without GroupStart)")
	}
	g.depth--
	g.open.Store(g.depth > 0)
	if g.depth > 0 {
		g.mu.Unlock()
		return nil
	}
	calls, items := g.calls, g.items
	g.calls, g.items, g.n = nil, nil, 0
	g.issuing = true
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.issuing = false
		g.issued.Broadcast()
		g.mu.Unlock()
	}()
	// The group is closed (depth 0): the calls below are issued, not
	// recorded again.
	for _, call := range calls {
		if err := call.issue(); err != nil {
			return groupErr(c, call.pos, call.name, err)
		}
	}
	return issueGroupP2P(c, items)
}

// GroupOpen reports whether a group is open on c (HcclGroupStatusGet):
// whether the collectives and sends and receives called on c now are
// recorded for a GroupEnd rather than issued. False for a nil or destroyed
// communicator. Safe for concurrent use.
func GroupOpen(c *hcomm.Comm) bool {
	if c == nil {
		return false
	}
	g := groupOf(c)
	if g == nil {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.depth > 0
}

// groupErr is GroupEnd's error for call i of the group.
func groupErr(c *hcomm.Comm, i int, name string, err error) error {
	return collErr(c, "GroupEnd", hcomm.ResultOf(err), err, "call %d of the group, %s", i+1, name)
}

// grouping reports, without a lock, whether a group is open on c: the
// collectives call it before they build what recordCall records, so that a
// call outside a group allocates nothing for groups.
func grouping(c *hcomm.Comm) bool {
	g := groupOf(c)
	return g != nil && g.open.Load()
}

// recordCall records a collective in c's open group and reports whether it
// did; issue issues it at GroupEnd.
func recordCall(c *hcomm.Comm, name string, issue func() error) bool {
	g := groupOf(c)
	if g == nil {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.depth == 0 {
		return false
	}
	g.calls = append(g.calls, groupCall{name: name, pos: g.n, issue: issue})
	g.n++
	return true
}

// recordItems records sends and receives, checked by BatchSendRecv, in c's
// open group and reports whether it did.
func recordItems(c *hcomm.Comm, items []SendRecvItem, s *device.Stream) bool {
	g := groupOf(c)
	if g == nil {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.depth == 0 {
		return false
	}
	for _, it := range items {
		g.items = append(g.items, groupItem{it: it, s: s, call: g.n})
	}
	g.n++
	return true
}

// inGroup returns an error when a group is open on c: op, which waits for
// its result, cannot be part of one.
func inGroup(c *hcomm.Comm, op string) error {
	if !grouping(c) {
		return nil
	}
	g := groupOf(c)
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.depth > 0 {
		return collErr(c, op, hcomm.ErrPara, nil, "a group is open on the communicator: %s waits for its result and cannot be part of one (call GroupEnd first)", op)
	}
	return nil
}

// issueGroupP2P issues a group's sends and receives as one BatchSendRecv on
// the stream of the first of them. The other streams the items were called
// on join it: the batch waits for the work enqueued on them before
// GroupEnd, and the work they get after GroupEnd waits for the batch.
func issueGroupP2P(c *hcomm.Comm, items []groupItem) error {
	if len(items) == 0 {
		return nil
	}
	s := items[0].s
	batch := make([]SendRecvItem, len(items))
	var others []*device.Stream
	for i, gi := range items {
		batch[i] = gi.it
		if gi.s != s && !containsStream(others, gi.s) {
			others = append(others, gi.s)
		}
	}
	fail := func(err error) error {
		return collErr(c, "GroupEnd", hcomm.ResultOf(err), err, "the group's %d sends and receives (calls %d to %d)", len(items), items[0].call+1, items[len(items)-1].call+1)
	}
	if err := joinStreams(c, others, s); err != nil {
		return fail(err)
	}
	if err := BatchSendRecv(batch, c, s); err != nil {
		return fail(err)
	}
	for _, o := range others {
		if err := joinStreams(c, []*device.Stream{s}, o); err != nil {
			return fail(err)
		}
	}
	return nil
}

func containsStream(ss []*device.Stream, s *device.Stream) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// joinStreams makes the work enqueued on to from now on wait for the work
// enqueued on each of from so far.
func joinStreams(c *hcomm.Comm, from []*device.Stream, to *device.Stream) error {
	for _, f := range from {
		e, err := c.Device().CreateEvent()
		if err != nil {
			return err
		}
		err = e.Record(f)
		if err == nil {
			err = to.WaitEvent(e)
		}
		// An event destroyed while its captured work is pending is
		// released when the work completes; the wait keeps what it holds.
		if derr := e.Destroy(); err == nil {
			err = derr
		}
		if err != nil {
			return fmt.Errorf("ordering the group's streams: %w", err)
		}
	}
	return nil
}
