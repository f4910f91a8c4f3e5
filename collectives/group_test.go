package collectives_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
)

// groupRank is one rank's buffers for the group tests: float32 vectors.
type groupRank struct {
	c    *hcomm.Comm
	s    *device.Stream
	bufs map[string]device.Ptr
}

func newGroupRank(t *testing.T, c *hcomm.Comm, names ...string) *groupRank {
	t.Helper()
	s, err := c.Device().CreateStream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Destroy() })
	g := &groupRank{c: c, s: s, bufs: map[string]device.Ptr{}}
	for _, n := range names {
		p, err := c.Device().Malloc(4 * groupCount)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Device().Free(p) })
		g.bufs[n] = p
	}
	return g
}

const groupCount = 1000 // elements per buffer: several pieces of a small HCCL buffer

func (g *groupRank) fill(t *testing.T, name string, f func(i int) float32) {
	b := make([]byte, 4*groupCount)
	for i := 0; i < groupCount; i++ {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f(i)))
	}
	if err := g.c.Device().MemcpyHtoD(g.bufs[name], b); err != nil {
		t.Fatal(err)
	}
}

func (g *groupRank) check(t *testing.T, name string, f func(i int) float32) {
	t.Helper()
	b := make([]byte, 4*groupCount)
	if err := g.c.Device().MemcpyDtoH(b, g.bufs[name]); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < groupCount; i++ {
		if got, want := math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])), f(i); got != want {
			t.Errorf("rank %d %s[%d] = %v, want %v", g.c.Rank(), name, i, got, want)
			return
		}
	}
}

// TestGroupOppositeOrders: inside a group, rank 0 calls send, receive,
// all-reduce, broadcast, a nested group's send; rank 1 calls all-reduce, a
// nested group's receives, broadcast, send — the sends and receives in
// opposite orders and interleaved differently with the collectives. The
// group completes with the right data over inproc, shm and tcp.
func TestGroupOppositeOrders(t *testing.T) {
	for _, tr := range []hcommtest.Transport{hcommtest.Inproc, hcommtest.Shm, hcommtest.TCP} {
		t.Run(tr.String(), func(t *testing.T) {
			comms := hcommtest.Options{Config: &hcomm.Config{BufferSize: 8 << 10}}.New(t, 2, tr)
			rs := []*groupRank{
				newGroupRank(t, comms[0], "a", "b", "in", "red", "bc"),
				newGroupRank(t, comms[1], "a", "b", "in", "red", "bc"),
			}
			for r, g := range rs {
				g.fill(t, "a", func(i int) float32 { return float32(100*r + i) })
				g.fill(t, "b", func(i int) float32 { return float32(-100*r - i) })
				g.fill(t, "red", func(i int) float32 { return float32(r + i) })
				g.fill(t, "bc", func(i int) float32 { return float32(1000*r + i) })
			}
			f32 := hcomm.Float32
			orders := []func(g *groupRank) error{
				func(g *groupRank) error { // rank 0
					c, s := g.c, g.s
					return errors.Join(
						collectives.GroupStart(c),
						collectives.Send(g.bufs["a"], groupCount, f32, 1, c, s),
						collectives.Recv(g.bufs["in"], groupCount, f32, 1, c, s),
						collectives.AllReduce(g.bufs["red"], g.bufs["red"], groupCount, f32, hcomm.Sum, c, s, nil),
						collectives.Broadcast(g.bufs["bc"], groupCount, f32, 1, c, s, nil),
						collectives.GroupStart(c),
						collectives.Send(g.bufs["b"], groupCount, f32, 1, c, s),
						collectives.GroupEnd(c),
						collectives.GroupEnd(c))
				},
				func(g *groupRank) error { // rank 1
					c, s := g.c, g.s
					return errors.Join(
						collectives.GroupStart(c),
						collectives.AllReduce(g.bufs["red"], g.bufs["red"], groupCount, f32, hcomm.Sum, c, s, nil),
						collectives.GroupStart(c),
						collectives.Recv(g.bufs["in"], groupCount, f32, 0, c, s),
						collectives.Recv(g.bufs["b"], groupCount, f32, 0, c, s),
						collectives.GroupEnd(c),
						collectives.Broadcast(g.bufs["bc"], groupCount, f32, 1, c, s, nil),
						collectives.Send(g.bufs["a"], groupCount, f32, 0, c, s),
						collectives.GroupEnd(c))
				},
			}
			run(t, comms, func(c *hcomm.Comm) error {
				g := rs[c.Rank()]
				if err := orders[c.Rank()](g); err != nil {
					return err
				}
				return g.s.SynchronizeWithTimeout(time.Minute)
			})
			rs[0].check(t, "in", func(i int) float32 { return float32(100 + i) }) // rank 1's a
			rs[1].check(t, "in", func(i int) float32 { return float32(i) })       // rank 0's a
			rs[1].check(t, "b", func(i int) float32 { return float32(-i) })       // rank 0's b
			for _, g := range rs {
				g.check(t, "red", func(i int) float32 { return float32(1 + 2*i) })
				g.check(t, "bc", func(i int) float32 { return float32(1000 + i) })
			}
		})
	}
}

// TestGroupMismatch: two ranks whose groups disagree (two sends, one
// receive) fail with ErrMismatch at their synchronize, well before
// HCCL_EXEC_TIMEOUT, instead of hanging.
func TestGroupMismatch(t *testing.T) {
	comms := initAll(t, 2, nil)
	rs := []*groupRank{newGroupRank(t, comms[0], "a", "b"), newGroupRank(t, comms[1], "a", "b")}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r, g := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, s := g.c, g.s
			err := collectives.GroupStart(c)
			if r == 0 {
				err = errors.Join(err, collectives.Send(g.bufs["a"], groupCount, hcomm.Float32, 1, c, s),
					collectives.Send(g.bufs["b"], groupCount, hcomm.Float32, 1, c, s))
			} else {
				err = errors.Join(err, collectives.Recv(g.bufs["a"], groupCount, hcomm.Float32, 0, c, s))
			}
			if err = errors.Join(err, collectives.GroupEnd(c)); err != nil {
				errs[r] = err
				return
			}
			errs[r] = s.SynchronizeWithTimeout(time.Minute)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if !errors.Is(err, collectives.ErrMismatch) {
			t.Errorf("rank %d: %v, want ErrMismatch", r, err)
		}
	}
	// A failed schedule leaves work queued (the receiving side's waits):
	// abort, as after any failed collective, so that Destroy is prompt.
	for _, c := range comms {
		c.Abort()
	}
}

// TestGroupErrors: GroupEnd without GroupStart; a slice form inside a
// group; a call whose error shows only when the group is issued, named by
// GroupEnd.
func TestGroupErrors(t *testing.T) {
	comms := initAll(t, 1, nil)
	c := comms[0]
	if err := collectives.GroupEnd(c); !errors.Is(err, hcomm.ErrPara) || !strings.Contains(err.Error(), "GroupEnd without GroupStart") {
		t.Fatalf("GroupEnd alone: %v", err)
	}
	if err := collectives.GroupStart(nil); !errors.Is(err, hcomm.ErrPtr) {
		t.Fatalf("GroupStart(nil): %v", err)
	}
	g := newGroupRank(t, c, "a")
	if collectives.GroupOpen(c) || collectives.GroupOpen(nil) {
		t.Fatal("GroupOpen before GroupStart")
	}
	if err := collectives.GroupStart(c); err != nil {
		t.Fatal(err)
	}
	if !collectives.GroupOpen(c) {
		t.Fatal("GroupOpen after GroupStart is false")
	}
	x := []float32{1, 2}
	if err := collectives.AllReduceSlice(t.Context(), c, x, x, hcomm.Sum, nil); !errors.Is(err, hcomm.ErrPara) || !strings.Contains(err.Error(), "cannot be part of") {
		t.Fatalf("AllReduceSlice in a group: %v", err)
	}
	if err := collectives.Broadcast(g.bufs["a"], 1, hcomm.Float32, 0, c, g.s, nil); err != nil {
		t.Fatal(err)
	}
	if err := collectives.BatchSendRecv(nil, c, g.s); err != nil { // a call, with no items
		t.Fatal(err)
	}
	// Oneshot over more than the HCCL buffer's slots: a local error that
	// the algorithm's check finds when the call is issued.
	if err := collectives.AllReduce(g.bufs["a"], g.bufs["a"], groupCount, hcomm.Float32, hcomm.Sum, c, g.s, &collectives.Options{Algorithm: collectives.AlgoRing + 100}); err != nil {
		t.Fatal(err)
	}
	err := collectives.GroupEnd(c)
	if !errors.Is(err, hcomm.ErrNotSupport) || !strings.Contains(err.Error(), "call 3 of the group, AllReduce") {
		t.Fatalf("GroupEnd: %v, want the third call's error named", err)
	}
	if err := g.s.SynchronizeWithTimeout(time.Minute); err != nil {
		t.Fatal(err)
	}
	if collectives.GroupOpen(c) {
		t.Fatal("GroupOpen after GroupEnd")
	}
	// The group is closed: a slice form works again.
	if err := collectives.AllReduceSlice(t.Context(), c, x, x, hcomm.Sum, nil); err != nil {
		t.Fatal(err)
	}
}

// TestGroupStreams: a group's sends and receives called on two streams;
// the work enqueued on either stream after GroupEnd sees their data.
func TestGroupStreams(t *testing.T) {
	comms := initAll(t, 2, nil)
	rs := []*groupRank{newGroupRank(t, comms[0], "a", "b"), newGroupRank(t, comms[1], "a", "b")}
	for r, g := range rs {
		g.fill(t, "a", func(i int) float32 { return float32(10*r + i) })
	}
	run(t, comms, func(c *hcomm.Comm) error {
		r := c.Rank()
		g := rs[r]
		s2, err := c.Device().CreateStream()
		if err != nil {
			return err
		}
		defer s2.Destroy()
		peer := 1 - r
		err = errors.Join(collectives.GroupStart(c),
			collectives.Recv(g.bufs["b"], groupCount, hcomm.Float32, peer, c, s2),
			collectives.Send(g.bufs["a"], groupCount, hcomm.Float32, peer, c, g.s),
			collectives.GroupEnd(c))
		if err != nil {
			return err
		}
		if err := s2.SynchronizeWithTimeout(time.Minute); err != nil {
			return fmt.Errorf("the receive's stream: %w", err)
		}
		return g.s.SynchronizeWithTimeout(time.Minute)
	})
	rs[0].check(t, "b", func(i int) float32 { return float32(10 + i) })
	rs[1].check(t, "b", func(i int) float32 { return float32(i) })
}

// TestGroupMismatchDestroy: a group whose ranks' sends and receives
// disagree (either way round: more sends than the peer receives, or more
// receives than the peer sends) fails with ErrMismatch on both ranks, and
// the failure ends the call's pending work at once: Destroy, without Abort,
// returns promptly, not after the execution timeout (30 s here).
//
// With midIssue, each rank issues its pipe steps only once its hello has
// found the mismatch (its stream has failed): the hello's task takes the
// pipe counters back while the call that advanced them is still being
// issued, the order a loaded machine produces now and then. The counters
// were once taken back in the middle of that call's own steps, where they
// went below zero: the sender's wait for the receiver's acknowledgements
// then looped for ever (a busy loop holding the collectives' lock), or the
// next send waited for acknowledgements that never come.
func TestGroupMismatchDestroy(t *testing.T) {
	for _, tr := range hcommtest.Transports() {
		if tr.Processes {
			continue // the ranks' buffers are driven from this process
		}
		for _, c := range []struct{ extraRecv, midIssue bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
			extraRecv := c.extraRecv
			t.Run(fmt.Sprintf("%v/extraRecv=%v/midIssue=%v", tr, extraRecv, c.midIssue), func(t *testing.T) {
				comms := hcommtest.Options{Config: &hcomm.Config{ExecTimeout: 30 * time.Second}}.New(t, 2, tr)
				rs := []*groupRank{newGroupRank(t, comms[0], "a", "b"), newGroupRank(t, comms[1], "a", "b")}
				if c.midIssue {
					holdAfterHello(t, rs)
				}
				errs := make([]error, 2)
				var wg sync.WaitGroup
				for r, g := range rs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						c, s := g.c, g.s
						err := collectives.GroupStart(c)
						switch {
						case r == 0 && !extraRecv:
							err = errors.Join(err, collectives.Send(g.bufs["a"], groupCount, hcomm.Float32, 1, c, s),
								collectives.Send(g.bufs["b"], groupCount, hcomm.Float32, 1, c, s))
						case r == 0:
							err = errors.Join(err, collectives.Send(g.bufs["a"], groupCount, hcomm.Float32, 1, c, s))
						case !extraRecv:
							err = errors.Join(err, collectives.Recv(g.bufs["a"], groupCount, hcomm.Float32, 0, c, s))
						default:
							err = errors.Join(err, collectives.Recv(g.bufs["a"], groupCount, hcomm.Float32, 0, c, s),
								collectives.Recv(g.bufs["b"], groupCount, hcomm.Float32, 0, c, s))
						}
						if err = errors.Join(err, collectives.GroupEnd(c)); err == nil {
							err = s.SynchronizeWithTimeout(time.Minute)
						}
						errs[r] = err
					}()
				}
				wg.Wait()
				collectives.SetTestIssue(nil)
				for r, err := range errs {
					if !errors.Is(err, collectives.ErrMismatch) {
						t.Errorf("rank %d: %v, want ErrMismatch", r, err)
					}
				}
				// The communicator goes on: a matching send and receive after
				// the mismatch completes promptly (nothing of the failed call is
				// left waiting on the receiving side), and the receiver has the
				// sender's data.
				rs[0].fill(t, "a", func(i int) float32 { return float32(7 + i) })
				rs[1].fill(t, "a", func(int) float32 { return -1 })
				t0 := time.Now()
				for r, g := range rs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						var err error
						if r == 0 {
							err = collectives.Send(g.bufs["a"], groupCount, hcomm.Float32, 1, g.c, g.s)
						} else {
							err = collectives.Recv(g.bufs["a"], groupCount, hcomm.Float32, 0, g.c, g.s)
						}
						if err == nil {
							err = g.s.SynchronizeWithTimeout(time.Minute)
						}
						errs[r] = err
					}()
				}
				wg.Wait()
				for r, err := range errs {
					if err != nil {
						t.Errorf("rank %d: the send/receive after the mismatch: %v", r, err)
					}
				}
				if errs[0] == nil && errs[1] == nil {
					rs[1].check(t, "a", func(i int) float32 { return float32(7 + i) })
				}
				if took := time.Since(t0); took > 3*time.Second {
					t.Errorf("the send/receive after the mismatch took %v (the execution timeout is 30 s): the failed call's receive was left waiting", took)
				}
				start := time.Now()
				for r, c := range comms {
					c.Destroy()
					if took := time.Since(start); took > 3*time.Second {
						t.Errorf("rank %d's Destroy after the mismatch returned after %v (the execution timeout is 30 s); want at once", r, took)
					}
				}
			})
		}
	}
}

// holdAfterHello holds each rank's issuing, from the step after its first
// (the hello) on, until the rank's stream has failed: the hello's task has
// found the mismatch and run to its end before the rank issues its pipe
// steps. For a call whose groups disagree; the hook is removed at the
// test's end, or by SetTestIssue(nil) once the call is issued.
func holdAfterHello(t *testing.T, rs []*groupRank) {
	var mu sync.Mutex
	steps := make([]int, len(rs))
	collectives.SetTestIssue(func(rank int) {
		mu.Lock()
		steps[rank]++
		first := steps[rank] == 1
		mu.Unlock()
		if first {
			return
		}
		for deadline := time.Now().Add(10 * time.Second); rs[rank].s.PeekError() == nil; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Errorf("rank %d: its stream has not failed 10 s after its hello was issued", rank)
				return
			}
		}
	})
	t.Cleanup(func() { collectives.SetTestIssue(nil) })
}

// TestSendRecvSideFailureReachesCaller: a receive runs on the side thread; when
// it fails (here: its buffer was freed before the copy ran), the failure
// reaches the caller's stream, whose Synchronize reports it, instead of the
// receive returning with no data. (The sender then waits in vain for the
// receiver's acknowledgement and fails after the execution timeout.)
func TestSendRecvSideFailureReachesCaller(t *testing.T) {
	comms := hcommtest.Options{Config: &hcomm.Config{ExecTimeout: 2 * time.Second}}.New(t, 2, hcommtest.Transports()[0])
	rs := []*groupRank{newGroupRank(t, comms[0], "a"), newGroupRank(t, comms[1])}
	d := comms[1].Device()
	buf, err := d.Malloc(4 * groupCount)
	if err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	if err := rs[1].s.Launch("gate", func(<-chan struct{}) error { <-gate; return nil }); err != nil {
		t.Fatal(err)
	}
	sent := make(chan error, 1)
	go func() {
		err := collectives.Send(rs[0].bufs["a"], groupCount, hcomm.Float32, 1, rs[0].c, rs[0].s)
		if err == nil {
			err = rs[0].s.SynchronizeWithTimeout(time.Minute)
		}
		sent <- err
	}()
	if err := collectives.Recv(buf, groupCount, hcomm.Float32, 0, rs[1].c, rs[1].s); err != nil {
		t.Fatal(err)
	}
	if err := d.Free(buf); err != nil {
		t.Fatal(err)
	}
	close(gate)
	err = rs[1].s.SynchronizeWithTimeout(time.Minute)
	if err == nil || !strings.Contains(err.Error(), "not in any live allocation") {
		t.Errorf("receiver's Synchronize: %v, want the side thread's failure (its buffer was freed)", err)
	}
	<-sent
}
