package collectives_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
	"github.com/prometheus/client_golang/prometheus"
)

// laneTransports are the transports of the all-reduce's lane (lane.go):
// ranks whose memory is mapped, over inproc and over shm, and ranks whose
// peers are all over the network (tcp: laneCall.net).
var laneTransports = []hcommtest.Transport{hcommtest.Inproc, hcommtest.Shm, hcommtest.TCP}

// readLaneTransports are the read lane's (laneread.go): mapped memory only.
var readLaneTransports = []hcommtest.Transport{hcommtest.Inproc, hcommtest.Shm}

// The lane under every timing: hundreds of all-reduces, all-gathers,
// all-to-alls and broadcasts (from every root), one kind or another at
// random, whose
// sizes fall on both sides of the one-shot limit (so that the lane and the schedules alternate back to
// back), in place and out of place, on two streams in
// turn now and then (so that begin orders them and the lane steps aside),
// each rank pausing at random for up to a poll bound and beyond, with 2 and 3
// ranks and with 4 ranks on one processor. Every result is checked exactly,
// and most calls must have taken the lane. They run with the hellos as lines
// (ll.go; the default) and, with HCOMM_LL=0, as writes and notifies: with
// lines, a lost wake hangs (and fails at the execution timeout), a line taken
// from the hello two before gives a wrong sum. Over tcp the hellos are
// frames the caller's looks receive (laneCall.net), with tcp's polling on
// and off (a lane that looks once).
func TestLaneStress(t *testing.T) {
	calls := 300
	if testing.Short() {
		calls = 80
	}
	for _, ll := range []string{"1", "0", "spin-off"} {
		for _, tr := range laneTransports {
			if tr == hcommtest.TCP && ll == "0" || tr != hcommtest.TCP && ll == "spin-off" {
				continue // no lines over tcp either way; no tcp spin elsewhere
			}
			for _, shape := range []struct{ n, procs int }{{2, 0}, {3, 0}, {4, 1}} {
				t.Run(fmt.Sprintf("ll=%v/%v/ranks=%d/gomaxprocs=%d", ll, tr, shape.n, shape.procs), func(t *testing.T) {
					cfg := &hcomm.Config{ExecTimeout: 60 * time.Second, BufferSize: 1 << 20}
					if ll == "spin-off" {
						// tcp's polling off: the lane looks once, and
						// what it does not see its stream waits for.
						cfg.TCPSpin = -1
					} else {
						t.Setenv("HCOMM_LL", ll)
					}
					o := hcommtest.Options{Config: cfg, GOMAXPROCS: shape.procs}
					// Over a network 4 ranks' small all-reduces and
					// all-gathers are recursive doubling's (choose),
					// and ranks that outnumber the cores do not poll
					// their sockets in the lane: the lane meets none.
					lane := tr != hcommtest.TCP || shape.n != 4 && shape.n <= runtime.NumCPU()
					o.Run(t, shape.n, tr, func(t testing.TB, c *hcomm.Comm) { stressAllReduce(t, c, calls, lane) })
				})
			}
		}
	}
}

// stressAllReduce is TestLaneStress's calls on one rank; lane says whether
// most of them must have taken the lane.
func stressAllReduce(t testing.TB, c *hcomm.Comm, calls int, lane bool) {
	var ss [2]*device.Stream
	for i := range ss {
		s, err := c.Device().CreateStream()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Destroy()
		ss[i] = s
	}
	rng := rand.New(rand.NewPCG(uint64(c.Rank()), 9))
	order := rand.New(rand.NewPCG(2, 2)) // the same on every rank: the calls
	// The largest all-reduce; the buffers hold 4 ranks' all-gather of one
	// element past the one-shot limit (16384 floats a rank here).
	const most, room = 20000, 70000
	send := deviceFloats(t, c, room, 0)
	defer c.Device().Free(send)
	recv := deviceFloats(t, c, room, 0)
	defer c.Device().Free(recv)
	// The first call sets the collectives up; then the
	// limit is known and the sizes straddle it.
	if err := collectives.AllReduce(send, recv, 1, hcomm.Float32, hcomm.Sum, c, ss[0], nil); err != nil {
		t.Fatal(err)
	}
	lim := int(collectives.InlineBytes(c) / 4)
	n, s := c.Size(), ss[0]
	sizes := []int{0, 1, 2, 13, 64, lim - 1, lim, lim + 1, most}
	for k := 0; k < calls; k++ {
		count := sizes[order.IntN(len(sizes))]
		gather := order.IntN(3) == 0 // an all-gather of count elements a rank
		if gather {
			count = min(count, room/n) // n of them in the buffers
		}
		// Or a broadcast from root, a reduce to root, a barrier, an
		// all-to-all of count elements a block.
		other := 0
		if !gather {
			other = order.IntN(6)
		}
		bcast, reduce, barrier, a2a := other == 1, other == 2, other == 3, other == 4
		if a2a {
			count = min(count, room/n)
		}
		root := order.IntN(n)
		if order.IntN(8) == 0 {
			s = ss[order.IntN(2)]
		}
		inPlace := order.IntN(3) == 0
		in := make([]float32, count)
		for i := range in {
			in[i] = float32((i+k)%7 + c.Rank())
		}
		if a2a { // block p for rank p
			in = make([]float32, n*count)
			for i := range in {
				in[i] = float32((i%count+k)%7 + 3*(i/count) + c.Rank())
			}
		}
		// An in-place all-gather's input is its own part of the output.
		at := send
		if gather && inPlace {
			at = send.Add(int64(4 * count * c.Rank()))
		}
		if err := c.Device().MemcpyHtoD(at, f32s(in...)); err != nil {
			t.Fatal(err)
		}
		switch r := rng.IntN(10); {
		case r < 2:
			time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
		case r < 3:
			time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
		}
		out := recv
		if inPlace && !a2a { // an all-to-all has no in-place form
			out = send
		}
		var err error
		switch {
		case gather:
			err = collectives.AllGather(at, out, int64(count), hcomm.Float32, c, s, nil)
		case a2a:
			err = collectives.AlltoAll(send, int64(count), hcomm.Float32, out, int64(count), hcomm.Float32, c, s, nil)
		case bcast:
			err = collectives.Broadcast(send, int64(count), hcomm.Float32, root, c, s, nil)
		case reduce:
			err = collectives.Reduce(send, out, int64(count), hcomm.Float32, hcomm.Sum, root, c, s, nil)
		case barrier:
			err = collectives.Barrier(c, s)
		default:
			err = collectives.AllReduce(send, out, int64(count), hcomm.Float32, hcomm.Sum, c, s, nil)
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := s.SynchronizeWithTimeout(time.Minute); err != nil {
			t.Fatalf("call %d (%d elements, all-gather %v): %v", k, count, gather, err)
		}
		if gather {
			for i, v := range readFloats(t, c, out, n*count) {
				if want := float32((i%count+k)%7 + i/count); v != want {
					t.Fatalf("all-gather %d (%d elements a rank, in place %v): element %d is %v, want %v", k, count, inPlace, i, v, want)
				}
			}
			continue
		}
		if a2a {
			for i, v := range readFloats(t, c, out, n*count) {
				if want := float32((i%count+k)%7 + 3*c.Rank() + i/count); v != want {
					t.Fatalf("all-to-all %d (%d elements a block): element %d is %v, want %v", k, count, i, v, want)
				}
			}
			continue
		}
		if bcast {
			for i, v := range readFloats(t, c, send, count) {
				if want := float32((i+k)%7 + root); v != want {
					t.Fatalf("broadcast %d (%d elements from rank %d): element %d is %v, want %v", k, count, root, i, v, want)
				}
			}
			continue
		}
		if barrier || reduce && c.Rank() != root {
			continue
		}
		for i, v := range readFloats(t, c, out, count) {
			if want := float32(n*((i+k)%7) + n*(n-1)/2); v != want {
				t.Fatalf("call %d (%d elements, in place %v): element %d is %v, want %v", k, count, inPlace, i, v, want)
			}
		}
	}
	inline, pending, queued := collectives.LaneRuns(c)
	if lane && inline+pending+queued < calls/3 {
		t.Errorf("rank %d: %d of %d calls took the lane (%d in the caller, %d waits queued, %d queued whole); most are small and on the stream before them", c.Rank(), inline+pending+queued, calls, inline, pending, queued)
	}
	t.Logf("lane: %d in the caller, %d waits queued, %d queued whole", inline, pending, queued)
}

// HCOMM_LANE=0 sends every call through its schedule (to measure the lane
// against it); by default a run of small all-reduces on one stream takes
// the lane from its second call, and so do the small all-gathers,
// broadcasts, reduces and barriers after them.
func TestLaneSwitch(t *testing.T) {
	for _, off := range []bool{false, true} {
		t.Run(fmt.Sprintf("off=%v", off), func(t *testing.T) {
			if off {
				t.Setenv("HCOMM_LANE", "0")
			}
			comms := initAll(t, 2, nil)
			run(t, comms, func(c *hcomm.Comm) error {
				s, err := c.Device().CreateStream()
				if err != nil {
					return err
				}
				defer s.Destroy()
				buf := deviceFloats(t, c, 4, 1)
				defer c.Device().Free(buf)
				for k := 0; k < 10; k++ {
					if err := collectives.AllReduce(buf, buf, 4, hcomm.Float32, hcomm.Max, c, s, nil); err != nil {
						return err
					}
				}
				all := deviceFloats(t, c, 8, -1)
				defer c.Device().Free(all)
				for k := 0; k < 10; k++ {
					if err := collectives.AllGather(buf, all, 4, hcomm.Float32, c, s, nil); err != nil {
						return err
					}
				}
				red := deviceFloats(t, c, 4, -1)
				defer c.Device().Free(red)
				for k := 0; k < 10; k++ {
					if err := collectives.Broadcast(buf, 4, hcomm.Float32, 1, c, s, nil); err != nil {
						return err
					}
					if err := collectives.Reduce(buf, red, 4, hcomm.Float32, hcomm.Sum, 0, c, s, nil); err != nil {
						return err
					}
					if err := collectives.Barrier(c, s); err != nil {
						return err
					}
				}
				if err := s.SynchronizeWithTimeout(time.Minute); err != nil {
					return err
				}
				for i, v := range readFloats(t, c, all, 8) {
					if v != 1 {
						return fmt.Errorf("rank %d: all-gathered element %d is %v, want 1", c.Rank(), i, v)
					}
				}
				want := float32(2) // rank 0's reduction
				if c.Rank() != 0 {
					want = -1 // untouched
				}
				for i, v := range readFloats(t, c, red, 4) {
					if v != want {
						return fmt.Errorf("rank %d: reduced element %d is %v, want %v", c.Rank(), i, v, want)
					}
				}
				// The all-reduces' first call sets up; every call after it
				// takes the lane: the all-gathers, broadcasts, reduces and
				// barriers too.
				inline, pending, queued := collectives.LaneRuns(c)
				if got := inline + pending + queued; off && got != 0 || !off && got != 49 {
					return fmt.Errorf("rank %d: %d calls took the lane with HCOMM_LANE off=%v", c.Rank(), got, off)
				}
				return nil
			})
		})
	}
}

// A call that mismatches its peers' is caught whether it or they took the
// lane: every mismatch case of TestMismatchIsAnErrorOnEveryRank, after a
// first all-reduce on the stream, so that the small all-reduces of the
// usual ranks take the lane and meet the odd rank's schedule (or lane).
func TestLaneMismatch(t *testing.T) {
	for _, tc := range mismatchCases() {
		t.Run(tc.name, func(t *testing.T) {
			comms := initAll(t, 3, &hcomm.Config{ExecTimeout: 20 * time.Second})
			runMismatchAfter(t, comms, 1, tc, false, func(c *hcomm.Comm, s *device.Stream, buf device.Ptr) error {
				return collectives.AllReduce(buf, buf, 8, hcomm.Float32, hcomm.Sum, c, s, nil)
			})
			if tc.name == "alltoall-v" {
				return // a V form: no lane
			}
			if inline, pending, queued := collectives.LaneRuns(comms[0]); inline+pending+queued == 0 {
				t.Errorf("rank 0's all-reduce did not take the lane: the case tests the schedules only")
			}
		})
	}
}

// A peer that destroys its communicator as soon as its lane call is done
// (doc.go allows it once the stream is done) leaves the other rank's call
// complete, not failed: the lane's writes are copies into the peer's memory,
// done when they return. And a call that a gone peer never makes fails at
// once, naming the peer, instead of waiting out the execution timeout.
func TestLanePeerGone(t *testing.T) {
	for _, tr := range laneTransports {
		t.Run(tr.String(), func(t *testing.T) {
			o := hcommtest.Options{Config: &hcomm.Config{ExecTimeout: 60 * time.Second}}
			o.Run(t, 2, tr, func(t testing.TB, c *hcomm.Comm) {
				s, buf, free := laneStreamAndFloats(t, c)
				defer free()
				all := []int{0, 1}
				cfg := &hcomm.Config{BufferSize: 64 << 10, Transport: tr.Name, ExecTimeout: 60 * time.Second}
				lane := func(sub *hcomm.Comm, calls int) error {
					for k := 0; k < calls; k++ {
						if err := collectives.AllReduce(buf, buf, 4, hcomm.Float32, hcomm.Sum, sub, s, nil); err != nil {
							return err
						}
					}
					return s.SynchronizeWithTimeout(time.Minute)
				}
				for it := uint64(1); it <= 20; it++ {
					sub, err := c.CreateSubComm(all, it, cfg)
					if err != nil {
						t.Fatal(err)
					}
					err = lane(sub, 3)
					if inline, pending, queued := collectives.LaneRuns(sub); err == nil && inline+pending+queued == 0 {
						err = errors.New("no call took the lane")
					}
					sub.Destroy()
					if err != nil {
						t.Fatalf("iteration %d: %v", it, err)
					}
				}
				// Rank 1 goes before rank 0's call, and while rank 0
				// waits in it (its poll over, its wait queued).
				for i, before := range []bool{true, false} { // in this order on every rank
					id := uint64(100 + i)
					sub, err := c.CreateSubComm(all, id, cfg)
					if err != nil {
						t.Fatal(err)
					}
					if err := lane(sub, 3); err != nil { // both parities prepared: the next call posts
						t.Fatal(err)
					}
					rankGone(t, c, sub, before, "all-reduce", func() error {
						err := collectives.AllReduce(buf, buf, 4, hcomm.Float32, hcomm.Sum, sub, s, nil)
						if err == nil {
							err = s.SynchronizeWithTimeout(time.Minute)
						}
						return err
					})
				}
			})
		})
	}
}

// rankGone ends a lane's test of a lost peer on sub, a communicator of
// ranks 0 and 1: rank 1 destroys its end before rank 0's call (before) or
// while rank 0 waits in it; rank 0's call, then destroying its end, must
// fail within 10 s with an error naming rank 1.
func rankGone(t testing.TB, c, sub *hcomm.Comm, before bool, what string, call func() error) {
	if c.Rank() == 1 {
		if !before {
			time.Sleep(200 * time.Millisecond)
		}
		sub.Destroy()
		return
	}
	if before {
		time.Sleep(100 * time.Millisecond) // rank 1 is gone
	}
	start := time.Now()
	err := call()
	sub.Destroy()
	if err == nil || !strings.Contains(err.Error(), "rank 1") {
		t.Fatalf("an %s with rank 1 gone (before the call: %v): %v; want an error naming rank 1", what, before, err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("the %s with rank 1 gone (before the call: %v) failed after %v; the loss must end it, not the timeout", what, before, d)
	}
	t.Logf("%s, before the call: %v: %v", what, before, err)
}

// The lane's calls are collectives like the others: numbered in turn with
// the schedules' (LastOp, which the wait errors and hang reports use), and
// timed by the metrics when they are on.
func TestLaneCountsItsCalls(t *testing.T) {
	for _, withMetrics := range []bool{false, true} {
		t.Run(fmt.Sprintf("metrics=%v", withMetrics), func(t *testing.T) {
			cfg := &hcomm.Config{BufferSize: 1 << 20}
			reg := prometheus.NewRegistry()
			if withMetrics {
				cfg.Metrics = reg
			}
			comms := initAll(t, 3, cfg)
			run(t, comms, func(c *hcomm.Comm) error {
				s, err := c.Device().CreateStream()
				if err != nil {
					return err
				}
				defer s.Destroy()
				const big = 100000 // past the one-shot limit: a schedule
				buf := deviceFloats(t, c, big, 1)
				defer c.Device().Free(buf)
				for _, count := range []int64{4, 4, 4, 4, big, 4, 4} {
					if err := collectives.AllReduce(buf, buf, count, hcomm.Float32, hcomm.Max, c, s, nil); err != nil {
						return err
					}
				}
				if err := s.SynchronizeWithTimeout(time.Minute); err != nil {
					return err
				}
				if op, seq := c.LastOp(); op != "AllReduce" || seq != 7 {
					return fmt.Errorf("rank %d: LastOp is %s #%d, want AllReduce #7", c.Rank(), op, seq)
				}
				if inline, pending, queued := collectives.LaneRuns(c); inline+pending+queued < 4 {
					return fmt.Errorf("rank %d: %d calls took the lane, want at least 4", c.Rank(), inline+pending+queued)
				}
				return nil
			})
			if !withMetrics {
				return
			}
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			var count uint64
			for _, mf := range mfs {
				if mf.GetName() != "hcomm_collective_duration_seconds" {
					continue
				}
				for _, m := range mf.GetMetric() {
					count += m.GetHistogram().GetSampleCount()
				}
			}
			if count != 3*7 {
				t.Errorf("%d collectives timed, want %d (7 per rank)", count, 3*7)
			}
		})
	}
}

// TestLaneFirstAfterRD: the lane's first call on a communicator whose
// collectives so far met only their recursive-doubling partners (the
// all-reduce forced to rd). The lane must still find every peer: before,
// it looked at a list of peers no schedule had made yet, found none, and
// over shm or in process returned this rank's own input as the sum; over
// tcp, where the lane must not run at all, it tried to write lines.
func TestLaneFirstAfterRD(t *testing.T) {
	for _, tr := range []hcommtest.Transport{hcommtest.Inproc, hcommtest.Shm, hcommtest.TCP} {
		t.Run(tr.String(), func(t *testing.T) {
			hcommtest.Options{}.Run(t, 4, tr, func(t testing.TB, c *hcomm.Comm) {
				s, err := c.Device().CreateStream()
				if err != nil {
					t.Fatal(err)
				}
				defer s.Destroy()
				n := c.Size()
				send := deviceFloats(t, c, 4*n, float32(c.Rank()+1))
				defer c.Device().Free(send)
				recv := deviceFloats(t, c, 4*n, 0)
				defer c.Device().Free(recv)
				if err := collectives.AllReduce(send, recv, 4, hcomm.Float32, hcomm.Sum, c, s, &collectives.Options{Algorithm: collectives.AlgoRD}); err != nil {
					t.Fatal(err)
				}
				for k := 0; k < 3; k++ {
					if err := collectives.AllReduce(send, recv, 4, hcomm.Float32, hcomm.Sum, c, s, nil); err != nil {
						t.Fatal(err)
					}
					if err := s.SynchronizeWithTimeout(time.Minute); err != nil {
						t.Fatal(err)
					}
					for i, v := range readFloats(t, c, recv, 4) {
						if want := float32(n * (n + 1) / 2); v != want {
							t.Fatalf("rank %d, call %d: element %d of the sum is %v, want %v", c.Rank(), k, i, v, want)
						}
					}
				}
			})
		})
	}
}

// TestReadLaneMeetsSchedule: whether a call takes the lane is each rank's
// own business, so a rank in the read lane (laneread.go) must meet a rank
// in the schedule as two schedules meet. Rank 0 issues every call on the
// other of its two streams (a call after one on another stream never takes
// the lane), the others on one stream (their calls take it): all-gathers,
// all-to-alls and broadcasts (every root in turn) whose inputs, blocks and
// root's buffer are read where they lie, small all-to-alls and
// reduce-scatters (in place and out) whose hellos carry a part for each
// peer, small all-reduces, one-shot all-gathers and broadcasts of the
// schedules between them, back to back,
// each rank late now and then, 2 and 3 ranks and 4 on one processor, sizes
// on and around every threshold of the read lane, results exact. The gather slots' counters
// must stay in step across the two paths, or a later call reads a peer's
// buffer too early or waits forever.
func TestReadLaneMeetsSchedule(t *testing.T) {
	for _, tr := range readLaneTransports {
		for _, shape := range []struct{ n, procs int }{{2, 0}, {3, 0}, {4, 1}} {
			n := shape.n
			t.Run(fmt.Sprintf("%v/ranks=%d/gomaxprocs=%d", tr, n, shape.procs), func(t *testing.T) {
				o := hcommtest.Options{Config: &hcomm.Config{ExecTimeout: 60 * time.Second, BufferSize: 1 << 20}, GOMAXPROCS: shape.procs}
				o.Run(t, n, tr, func(t testing.TB, c *hcomm.Comm) {
					var ss [2]*device.Stream
					for i := range ss {
						s, err := c.Device().CreateStream()
						if err != nil {
							t.Fatal(err)
						}
						defer s.Destroy()
						ss[i] = s
					}
					me := c.Rank()
					const room = 4 * 20000
					send := deviceFloats(t, c, room, 0)
					defer c.Device().Free(send)
					recv := deviceFloats(t, c, room, 0)
					defer c.Device().Free(recv)
					// Blocks of 1 element to 80 KB, on both sides of the
					// read lane's thresholds over inproc and shm: the
					// in-process all-gather's 2 and 8 KiB inputs, readMin
					// (16 KiB), the lane's 64 KiB bounds.
					counts := []int{1, 511, 512, 600, 2047, 2048, 5000, 20000, 3, 4095, 4096, 4097, 16384, 16385}
					rng := rand.New(rand.NewPCG(uint64(me), 5))
					for k := 0; k < 6*len(counts); k++ {
						s := ss[0]
						if me == 0 {
							s = ss[k%2]
						}
						count := counts[k%len(counts)]
						kind := k / len(counts) % 5 // all-gather, all-to-all, all-reduce, broadcast, reduce-scatter
						root := k % n
						out := recv // the reduce-scatter's, in place on odd calls: this rank's part of send
						if kind == 4 && k%2 == 1 {
							out = send.Add(int64(4 * me * count))
						}
						val := func(r, p, i int) float32 { return float32((r*7 + p*3 + i + k) % 251) }
						in := make([]float32, n*count)
						for i := range in {
							in[i] = val(me, i/count, i%count)
						}
						if err := c.Device().MemcpyHtoD(send, f32s(in...)); err != nil {
							t.Fatal(err)
						}
						if rng.IntN(3) == 0 { // a late rank: the others' polls give up, their waits queue
							time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
						}
						var err error
						switch kind {
						case 0:
							err = collectives.AllGather(send, recv, int64(count), hcomm.Float32, c, s, nil)
						case 1:
							err = collectives.AlltoAll(send, int64(count), hcomm.Float32, recv, int64(count), hcomm.Float32, c, s, nil)
						case 2:
							err = collectives.AllReduce(send, recv, int64(count), hcomm.Float32, hcomm.Sum, c, s, nil)
						case 4:
							err = collectives.ReduceScatter(send, out, int64(count), hcomm.Float32, hcomm.Sum, c, s, nil)
						default:
							if err = c.Device().MemcpyHtoD(recv, f32s(in[:count]...)); err == nil {
								err = collectives.Broadcast(recv, int64(count), hcomm.Float32, root, c, s, nil)
							}
						}
						if err != nil {
							t.Fatal(err)
						}
						if err := s.SynchronizeWithTimeout(time.Minute); err != nil {
							t.Fatalf("call %d (kind %d, %d elements): %v", k, kind, count, err)
						}
						m := n * count
						if kind >= 2 {
							m = count
						}
						got := readFloats(t, c, out, m)
						for i, v := range got {
							var want float32
							switch kind {
							case 0: // rank i/count's block 0
								want = val(i/count, 0, i%count)
							case 1: // rank i/count's block me
								want = val(i/count, me, i%count)
							case 2:
								for r := 0; r < n; r++ {
									want += val(r, 0, i)
								}
							case 4: // every rank's part me, summed
								for r := 0; r < n; r++ {
									want += val(r, me, i)
								}
							default: // the root's block 0
								want = val(root, 0, i)
							}
							if v != want {
								t.Fatalf("call %d (kind %d, %d elements): element %d is %v, want %v", k, kind, count, i, v, want)
							}
						}
					}
					inline, pending, queued := collectives.LaneRuns(c)
					if lane := inline + pending + queued; me == 0 && lane != 0 || me != 0 && lane < 6*len(counts)/2 {
						t.Errorf("rank %d: %d calls took the lane; want none on rank 0 and most on the others", me, lane)
					}
				})
			})
		}
	}
}

// TestReadLanePeerGone: a call of the read lane whose peer is gone — before
// the call, or while the call waits for it (its poll over, its waits
// queued) — fails at once with an error naming the peer, instead of
// waiting out the execution timeout; calls whose peer stays are exact.
func TestReadLanePeerGone(t *testing.T) {
	for _, tr := range readLaneTransports {
		t.Run(tr.String(), func(t *testing.T) {
			o := hcommtest.Options{Config: &hcomm.Config{ExecTimeout: 60 * time.Second}}
			o.Run(t, 2, tr, func(t testing.TB, c *hcomm.Comm) {
				s, err := c.Device().CreateStream()
				if err != nil {
					t.Fatal(err)
				}
				defer s.Destroy()
				const count = 8192 // 32 KiB a rank: read in place in process and between shm processes
				send := deviceFloats(t, c, count, float32(c.Rank()+1))
				defer c.Device().Free(send)
				recv := deviceFloats(t, c, 2*count, 0)
				defer c.Device().Free(recv)
				cfg := &hcomm.Config{BufferSize: 1 << 20, Transport: tr.Name, ExecTimeout: 60 * time.Second}
				gather := func(sub *hcomm.Comm) error {
					if err := collectives.AllGather(send, recv, count, hcomm.Float32, sub, s, nil); err != nil {
						return err
					}
					return s.SynchronizeWithTimeout(time.Minute)
				}
				for i, before := range []bool{true, false} { // in this order on every rank
					sub, err := c.CreateSubComm([]int{0, 1}, uint64(200+i), cfg)
					if err != nil {
						t.Fatal(err)
					}
					for k := 0; k < 3; k++ { // the first sets up; the others take the lane
						if err := gather(sub); err != nil {
							t.Fatal(err)
						}
						for j, v := range readFloats(t, c, recv, 2*count) {
							if want := float32(j/count + 1); v != want {
								t.Fatalf("call %d: element %d is %v, want %v", k, j, v, want)
							}
						}
					}
					if inline, pending, queued := collectives.LaneRuns(sub); inline+pending+queued == 0 {
						t.Fatal("no all-gather took the lane")
					}
					rankGone(t, c, sub, before, "all-gather", func() error { return gather(sub) })
				}
			})
		})
	}
}

// TestLaneZeroCount: calls of no elements in every lane — the one-shot's,
// the parts', the read lane's (forced and chosen) — between calls with
// data, on inproc, shm and tcp: each completes, and the calls after it are
// exact (the counters the lanes advance stay in step).
func TestLaneZeroCount(t *testing.T) {
	for _, tr := range laneTransports {
		t.Run(tr.String(), func(t *testing.T) {
			o := hcommtest.Options{Config: &hcomm.Config{ExecTimeout: 60 * time.Second, BufferSize: 1 << 20}}
			o.Run(t, 2, tr, func(t testing.TB, c *hcomm.Comm) {
				s, err := c.Device().CreateStream()
				if err != nil {
					t.Fatal(err)
				}
				defer s.Destroy()
				const count = 8192
				send := deviceFloats(t, c, 2*count, float32(c.Rank()+1))
				defer c.Device().Free(send)
				recv := deviceFloats(t, c, 2*count, 0)
				defer c.Device().Free(recv)
				f32 := hcomm.Float32
				calls := []func(n int64, a collectives.Algorithm) error{
					func(n int64, a collectives.Algorithm) error {
						return collectives.AllReduce(send, recv, n, f32, hcomm.Sum, c, s, &collectives.Options{Algorithm: a})
					},
					func(n int64, a collectives.Algorithm) error {
						return collectives.AllGather(send, recv, n, f32, c, s, &collectives.Options{Algorithm: a})
					},
					func(n int64, a collectives.Algorithm) error {
						return collectives.AlltoAll(send, n, f32, recv, n, f32, c, s, &collectives.Options{Algorithm: a})
					},
					func(n int64, a collectives.Algorithm) error {
						return collectives.ReduceScatter(send, recv, n, f32, hcomm.Sum, c, s, &collectives.Options{Algorithm: a})
					},
					func(n int64, a collectives.Algorithm) error {
						return collectives.Broadcast(recv, n, f32, 0, c, s, &collectives.Options{Algorithm: a})
					},
				}
				algos := [][]collectives.Algorithm{
					{collectives.AlgoAuto, collectives.AlgoOneShot},
					{collectives.AlgoAuto, collectives.AlgoOneShot, collectives.AlgoDirect},
					{collectives.AlgoAuto, collectives.AlgoOneShot, collectives.AlgoPairwise},
					{collectives.AlgoAuto, collectives.AlgoOneShot},
					{collectives.AlgoAuto, collectives.AlgoDirect},
				}
				for i, call := range calls {
					for _, a := range algos[i] {
						for _, n := range []int64{4, 0, count, 0, 4} {
							if err := call(n, a); err != nil {
								t.Fatalf("call %d (%v, %d elements): %v", i, a, n, err)
							}
							if err := s.SynchronizeWithTimeout(time.Minute); err != nil {
								t.Fatalf("call %d (%v, %d elements): %v", i, a, n, err)
							}
						}
					}
				}
				// After them all, an all-reduce with data is exact.
				if err := collectives.AllReduce(send, recv, 4, f32, hcomm.Sum, c, s, nil); err != nil {
					t.Fatal(err)
				}
				if err := s.SynchronizeWithTimeout(time.Minute); err != nil {
					t.Fatal(err)
				}
				for i, v := range readFloats(t, c, recv, 4) {
					if v != 3 {
						t.Fatalf("element %d of the last all-reduce is %v, want 3", i, v)
					}
				}
				if inline, pending, queued := collectives.LaneRuns(c); inline+pending+queued == 0 {
					t.Fatal("no call took a lane")
				}
			})
		})
	}
}

// A lane's call over tcp polls its peers' sockets in its caller for up to
// Config.TCPSpin; an Abort of its stream ends that poll at once, not at its
// bound (here 5 s, and the peer that never calls stays 2 s): the call
// returns, and the stream reports the abort.
func TestNetLaneEndsOnAbort(t *testing.T) {
	o := hcommtest.Options{Config: &hcomm.Config{ExecTimeout: 60 * time.Second, TCPSpin: 5 * time.Second}}
	o.Run(t, 2, hcommtest.TCP, func(t testing.TB, c *hcomm.Comm) {
		s, buf, free := laneStreamAndFloats(t, c)
		defer free()
		for k := 0; k < 3; k++ { // set up; both parities prepared
			if err := collectives.AllReduce(buf, buf, 4, hcomm.Float32, hcomm.Sum, c, s, nil); err != nil {
				t.Fatal(err)
			}
			if err := s.SynchronizeWithTimeout(time.Minute); err != nil {
				t.Fatal(err)
			}
		}
		if inline, pending, queued := collectives.LaneRuns(c); inline+pending+queued == 0 {
			t.Fatal("no call took the lane over tcp")
		}
		if c.Rank() == 1 {
			time.Sleep(2 * time.Second) // and never makes the call
			return
		}
		go func() {
			time.Sleep(100 * time.Millisecond)
			s.Abort()
		}()
		start := time.Now()
		err := collectives.AllReduce(buf, buf, 4, hcomm.Float32, hcomm.Sum, c, s, nil)
		if d := time.Since(start); d > time.Second {
			t.Fatalf("the lane's call returned %v after it started (%v); the abort at 100 ms must end its poll", d, err)
		}
		if err == nil {
			err = s.SynchronizeWithTimeout(10 * time.Second)
		}
		if err == nil {
			t.Fatal("the aborted call reports no failure")
		}
		t.Logf("aborted: %v", err)
	})
}

// laneStreamAndFloats gives rank c a stream of its own and 4 floats of 1 on
// its device; free destroys and frees them.
func laneStreamAndFloats(t testing.TB, c *hcomm.Comm) (*device.Stream, device.Ptr, func()) {
	t.Helper()
	s, err := c.Device().CreateStream()
	if err != nil {
		t.Fatal(err)
	}
	buf := deviceFloats(t, c, 4, 1)
	return s, buf, func() {
		c.Device().Free(buf)
		s.Destroy()
	}
}
