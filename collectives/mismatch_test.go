package collectives_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
)

// mismatchCall is what one rank of a mismatch test calls, on its stream and
// a buffer of 4 MiB.
type mismatchCall func(c *hcomm.Comm, s *device.Stream, buf device.Ptr) error

// mismatchCase is one way for a rank to call differently from the others:
// the odd rank calls odd, the others usual, and every rank's error names
// want.
type mismatchCase struct {
	name       string
	odd, usual mismatchCall
	want       string // in the error of every rank
}

// mismatchCases differ in the collective, the count (within the same
// algorithm, and one that makes the selector pick another), the data type,
// the reduce op and the root.
func mismatchCases() []mismatchCase {
	allreduce := func(count int64, dt hcomm.DataType, op hcomm.ReduceOp) mismatchCall {
		return func(c *hcomm.Comm, s *device.Stream, buf device.Ptr) error {
			return collectives.AllReduce(buf, buf, count, dt, op, c, s, nil)
		}
	}
	alltoall := func(count int64) mismatchCall {
		return func(c *hcomm.Comm, s *device.Stream, buf device.Ptr) error {
			return collectives.AlltoAll(buf, count, hcomm.Float32, buf.Add(1<<20), count, hcomm.Float32, c, s, nil)
		}
	}
	bcast := func(root int) mismatchCall {
		return func(c *hcomm.Comm, s *device.Stream, buf device.Ptr) error {
			return collectives.Broadcast(buf, 64, hcomm.Float32, root, c, s, nil)
		}
	}
	return []mismatchCase{
		{"collective", func(c *hcomm.Comm, s *device.Stream, buf device.Ptr) error {
			return collectives.AllGather(buf, buf.Add(1<<20), 64, hcomm.Float32, c, s, nil)
		}, allreduce(64, hcomm.Float32, hcomm.Sum), "AllGather"},
		{"count", allreduce(65, hcomm.Float32, hcomm.Sum), allreduce(64, hcomm.Float32, hcomm.Sum), "count 65"},
		{"count-across-algorithms", allreduce(100000, hcomm.Float32, hcomm.Sum), allreduce(64, hcomm.Float32, hcomm.Sum), "count 100000"},
		{"dtype", allreduce(64, hcomm.Int32, hcomm.Sum), allreduce(64, hcomm.Float32, hcomm.Sum), "int32"},
		{"op", allreduce(64, hcomm.Float32, hcomm.Max), allreduce(64, hcomm.Float32, hcomm.Sum), "max"},
		{"root", bcast(2), bcast(0), "root 2"},
		// The one-shot all-to-all's hello carries a block, its header the
		// count: another count, or the V form, is a mismatch too.
		{"alltoall-count", alltoall(65), alltoall(64), "count 65"},
		{"alltoall-v", func(c *hcomm.Comm, s *device.Stream, buf device.Ptr) error {
			n := int64(c.Size())
			counts, displs := make([]int64, n), make([]int64, n)
			for p := range counts {
				counts[p], displs[p] = 64, int64(p)*64
			}
			return collectives.AlltoAllV(buf, counts, displs, hcomm.Float32, buf.Add(1<<20), counts, displs, hcomm.Float32, c, s, nil)
		}, alltoall(64), "AlltoAllV"},
	}
}

// runMismatch runs tc on comms, rank odd making the odd call, and returns
// every rank's error: how its stream's synchronize ended or, with
// callMayFail, the ErrMismatch its call itself returned. It fails the test
// unless every rank's error matches ErrMismatch and names rank odd and
// tc.want, within 10 s (the communicators' execution timeout must be 20 s:
// the detection must not wait for it). Without callMayFail, a call that
// fails fails the test.
func runMismatch(t *testing.T, comms []*hcomm.Comm, odd int, tc mismatchCase, callMayFail bool) []error {
	t.Helper()
	return runMismatchAfter(t, comms, odd, tc, callMayFail, nil)
}

// runMismatchAfter is runMismatch whose ranks first make the call first
// (when not nil) on the same stream and buffer, all alike, and wait for it.
func runMismatchAfter(t *testing.T, comms []*hcomm.Comm, odd int, tc mismatchCase, callMayFail bool, first mismatchCall) []error {
	t.Helper()
	start := time.Now()
	errs := make([]error, len(comms))
	run(t, comms, func(c *hcomm.Comm) error {
		s, err := c.Device().CreateStream()
		if err != nil {
			return err
		}
		defer s.Destroy()
		buf, err := c.Device().Malloc(4 << 20)
		if err != nil {
			return err
		}
		defer c.Device().Free(buf)
		if first != nil {
			if err := first(c, s, buf); err != nil {
				return err
			}
			if err := s.SynchronizeWithTimeout(time.Minute); err != nil {
				return err
			}
		}
		f := tc.usual
		if c.Rank() == odd {
			f = tc.odd
		}
		if err := f(c, s, buf); err != nil {
			if !callMayFail || !errors.Is(err, collectives.ErrMismatch) {
				return err
			}
			errs[c.Rank()] = err
			return nil
		}
		errs[c.Rank()] = s.SynchronizeWithTimeout(time.Minute)
		return nil
	})
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the mismatch took %v to surface; the timeout was 20s and detection must not wait for it", d)
	}
	t.Logf("rank 0: %v", errs[0])
	for r, err := range errs {
		if !errors.Is(err, collectives.ErrMismatch) {
			t.Errorf("rank %d: %v; want an error matching ErrMismatch", r, err)
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, tc.want) || !strings.Contains(msg, fmt.Sprintf("rank %d", odd)) {
			t.Errorf("rank %d: %q does not name rank %d and %q", r, msg, odd, tc.want)
		}
	}
	return errs
}

// TestMismatchIsAnErrorOnEveryRank: one rank makes a different call from the
// others — another collective, count, data type, reduce op or root — and
// every rank's stream fails with ErrMismatch naming both calls, well within
// the execution timeout (no rank waits for data that will not come).
func TestMismatchIsAnErrorOnEveryRank(t *testing.T) {
	for _, tc := range mismatchCases() {
		t.Run(tc.name, func(t *testing.T) {
			comms := initAll(t, 3, &hcomm.Config{ExecTimeout: 20 * time.Second})
			for r, err := range runMismatch(t, comms, 1, tc, false) {
				var he *hcomm.Error
				if errors.Is(err, collectives.ErrMismatch) && (!errors.As(err, &he) || he.Rank != r) {
					t.Errorf("rank %d: error %v is not an *hcomm.Error of rank %d", r, err, r)
				}
			}
		})
	}
}

// TestMismatchedAlgorithm: ranks forced to different algorithms disagree in
// the handshake instead of waiting for each other's pieces.
func TestMismatchedAlgorithm(t *testing.T) {
	comms := initAll(t, 2, nil)
	errs := make([]error, 2)
	run(t, comms, func(c *hcomm.Comm) error {
		s, _ := c.Device().CreateStream()
		defer s.Destroy()
		buf, _ := c.Device().Malloc(4096)
		defer c.Device().Free(buf)
		algo := collectives.AlgoOneShot
		if c.Rank() == 1 {
			algo = collectives.AlgoRing
		}
		if err := collectives.AllReduce(buf, buf, 16, hcomm.Float32, hcomm.Sum, c, s, &collectives.Options{Algorithm: algo}); err != nil {
			return err
		}
		errs[c.Rank()] = s.SynchronizeWithTimeout(time.Minute)
		return nil
	})
	for r, err := range errs {
		if !errors.Is(err, collectives.ErrMismatch) || !strings.Contains(err.Error(), "ring") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

func ExampleErrMismatch() {
	comms, _ := hcomm.InitAll(2, nil)
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	done := make(chan error, 2)
	for _, c := range comms {
		go func() {
			s, _ := c.Device().CreateStream()
			defer s.Destroy()
			buf, _ := c.Device().Malloc(64)
			defer c.Device().Free(buf)
			count := int64(4)
			if c.Rank() == 1 {
				count = 8 // a bug: rank 1 reduces more elements
			}
			collectives.AllReduce(buf, buf, count, hcomm.Float32, hcomm.Sum, c, s, nil)
			err := s.SynchronizeWithTimeout(time.Minute)
			if c.Rank() == 0 {
				fmt.Println(errors.Is(err, collectives.ErrMismatch))
			}
			done <- err
		}()
	}
	<-done
	<-done
	// Output: true
}

// TestGetCommAsyncError: a mismatch (or any failed task) is kept as the
// communicator's asynchronous error.
func TestGetCommAsyncError(t *testing.T) {
	comms := initAll(t, 2, nil)
	for _, c := range comms {
		if err := c.GetCommAsyncError(); err != nil {
			t.Fatalf("fresh communicator: %v", err)
		}
	}
	run(t, comms, func(c *hcomm.Comm) error {
		s, _ := c.Device().CreateStream()
		defer s.Destroy()
		buf, _ := c.Device().Malloc(4096)
		defer c.Device().Free(buf)
		collectives.AllReduce(buf, buf, int64(4+c.Rank()), hcomm.Float32, hcomm.Sum, c, s, nil)
		s.SynchronizeWithTimeout(time.Minute)
		return nil
	})
	for _, c := range comms {
		if err := c.GetCommAsyncError(); !errors.Is(err, collectives.ErrMismatch) {
			t.Errorf("rank %d: GetCommAsyncError = %v, want the mismatch", c.Rank(), err)
		}
	}
}

// TestTimeoutSaysWhereTheRanksAre: rank 2 never calls the collective; the
// others' waits time out, and their errors say that rank 1 (or 0) waits in
// the same collective while rank 2 reports no wait. In process the ranks
// publish where they wait in the communicator's store; initialised from a
// root info, in their own bootstrap mailboxes, which the timed-out rank
// asks one by one.
func TestTimeoutSaysWhereTheRanksAre(t *testing.T) {
	cfg := &hcomm.Config{ExecTimeout: 2500 * time.Millisecond, BufferSize: 1 << 20}
	t.Run("store", func(t *testing.T) { timeoutSaysWhere(t, initAll(t, 3, cfg)) })
	t.Run("mailboxes", func(t *testing.T) {
		c := *cfg
		c.Transport = hcomm.TransportTCP
		root, err := hcomm.GetRootInfo(&c)
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		comms := hcommtest.InitRanks(t, 3, func(r int) (*hcomm.Comm, error) { return hcomm.InitRootInfo(3, root, r, &c) })
		timeoutSaysWhere(t, comms)
	})
}

func timeoutSaysWhere(t *testing.T, comms []*hcomm.Comm) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	run(t, comms, func(c *hcomm.Comm) error { return collectives.BarrierContext(ctx, c) }) // channels up: collective #1
	errs := make([]error, 2)
	run(t, comms[:2], func(c *hcomm.Comm) error {
		s, _ := c.Device().CreateStream()
		defer s.Destroy()
		buf, _ := c.Device().Malloc(64)
		defer c.Device().Free(buf)
		if err := collectives.AllReduce(buf, buf, 4, hcomm.Float32, hcomm.Sum, c, s, nil); err != nil {
			return err
		}
		errs[c.Rank()] = s.SynchronizeWithTimeout(time.Minute)
		return nil
	})
	for r, err := range errs {
		if !errors.Is(err, hcomm.ErrTimeout) {
			t.Fatalf("rank %d: %v, want a timeout", r, err)
		}
		msg := err.Error()
		other := 1 - r
		if !strings.Contains(msg, fmt.Sprintf("rank %d waits in AllReduce #2", other)) || !strings.Contains(msg, "rank 2 reports no wait") {
			t.Errorf("rank %d: %q does not say where ranks %d and 2 are", r, msg, other)
		}
	}
}

// A mismatch between small all-reduces that take the lane, whose hellos
// between ranks of one host are compact lines compared as they come
// (lane.go, ll.go): another count, reduce op or data type — or a count that
// needs the full form — is an ErrMismatch on every rank naming what
// differs, as between schedules, never a reduction of what does not match.
func TestMismatchInALine(t *testing.T) {
	allreduce := func(count int64, dt hcomm.DataType, op hcomm.ReduceOp) mismatchCall {
		return func(c *hcomm.Comm, s *device.Stream, buf device.Ptr) error {
			return collectives.AllReduce(buf, buf, count, dt, op, c, s, nil)
		}
	}
	first := allreduce(4, hcomm.Float32, hcomm.Sum) // on the same stream: the next call takes the lane
	for _, tc := range []mismatchCase{
		{"count", allreduce(5, hcomm.Float32, hcomm.Sum), allreduce(4, hcomm.Float32, hcomm.Sum), "count 5"},
		{"op", allreduce(4, hcomm.Float32, hcomm.Max), allreduce(4, hcomm.Float32, hcomm.Sum), "max"},
		{"dtype", allreduce(4, hcomm.Int32, hcomm.Sum), allreduce(4, hcomm.Float32, hcomm.Sum), "int32"},
		{"full-form", allreduce(64, hcomm.Float32, hcomm.Sum), allreduce(4, hcomm.Float32, hcomm.Sum), "count 64"},
	} {
		for _, tr := range []hcommtest.Transport{hcommtest.Inproc, hcommtest.Shm} {
			t.Run(tc.name+"/"+tr.String(), func(t *testing.T) {
				comms := hcommtest.Options{Config: &hcomm.Config{ExecTimeout: 20 * time.Second}}.New(t, 3, tr)
				runMismatchAfter(t, comms, 1, tc, true, first)
			})
		}
	}
}
