// Package sim is the simulator behind `hcomm sim`: it runs the collectives'
// own schedules — package collectives, unchanged — among ranks that are
// goroutines of this process, over the simulated transport of channel/sim,
// and reads the predicted time of a collective off the ranks' virtual
// clocks. The data is real: every rank's output is checked against what the
// collective must produce, so a schedule that loses or repeats a piece fails
// instead of being timed.
//
// Sizes are not scaled: a predicted size is what moves, so memory grows as
// ranks × size (Options.MemLimit refuses a case whose send and receive
// buffers would pass it, naming both, and aborts one whose Go heap passes
// it as it runs: Cluster.guard). The HCCL buffer is Options.BufferSize
// per rank (16 MB by default, as the measured runs' HCCL_BUFFSIZE=16), which
// fixes the pipeline's piece size and the hello slots exactly as on a real
// run; it is reserved address space, committed only where a schedule
// touches it.
//
// Cluster runs cases on one simulated cluster; Fit (fit.go) fits a link
// profile to measured runs, and Bootstrap (bootstrap.go) says how well those
// runs fix each fitted value; Probe (probe.go) measures a crowded host.
package sim

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	simch "github.com/hcomm-dev/hcomm/channel/sim"
	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// Options configure a Cluster; the zero value takes the defaults.
type Options struct {
	// BufferSize is each rank's HCCL_BUFFSIZE in bytes (default 16 MiB).
	BufferSize int64
	// MemLimit bounds the device memory a case may use over all ranks,
	// and, apart, the Go heap of the process while it runs, in bytes
	// (default 8 GiB): a case over either fails with an error; one over
	// the heap aborts every rank, leaving the cluster unusable.
	MemLimit int64
	// Timeout bounds the real time of one case (default 2 minutes): a
	// schedule that hangs fails with the ranks that did not finish.
	Timeout time.Duration
}

func (o Options) withDefaults() Options {
	if o.BufferSize == 0 {
		o.BufferSize = 16 << 20
	}
	if o.MemLimit == 0 {
		o.MemLimit = 8 << 30
	}
	if o.Timeout == 0 {
		o.Timeout = 2 * time.Minute
	}
	return o
}

// Case is one simulated call: a collective (by its bench name), an
// algorithm (collectives.AlgoAuto: the selector's) and a size in
// nccl-tests' convention (the buffer of an all-reduce, broadcast or reduce;
// what is gathered for an all-gather; what is sent for a reduce-scatter or
// an all-to-all).
type Case struct {
	Collective string
	Algorithm  collectives.Algorithm
	Bytes      int64
}

// Result is a case's prediction.
type Result struct {
	Case
	Ranks int
	// Algo is the algorithm that ran: the selector's choice for AlgoAuto.
	Algo string
	// Time is the predicted time of the call, in seconds: the latest
	// rank's clock when every rank is done, all starting at 0.
	Time float64
	// AlgBW and BusBW are in GB/s, as hcomm bench and nccl-tests compute them.
	AlgBW, BusBW float64
}

// coll is how a collective is run and checked. Elements are float32 holding
// small integers, so sums over up to 65536 ranks are exact.
type coll struct {
	factor func(n int) float64
	// counts: elements sent and received per rank for a size.
	counts func(size int64, n int) (send, recv int64)
	run    func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, sc, rc int64, o *collectives.Options) error
	// want is element i of rank r's output; in(p, j) is rank p's input j.
	want func(r, n int, i, sc int64, in func(p int, j int64) float32) float32
	// rootOnly: only the root's output is defined.
	rootOnly bool
	// inPlace: one buffer, the output, which holds the root's input
	// (broadcast).
	inPlace bool
}

func sumAll(n int, j int64, in func(int, int64) float32) float32 {
	var s float32
	for p := 0; p < n; p++ {
		s += in(p, j)
	}
	return s
}

var colls = map[string]coll{
	"allreduce": {
		factor: func(n int) float64 { return 2 * float64(n-1) / float64(n) },
		counts: func(size int64, _ int) (int64, int64) { return size / 4, size / 4 },
		run: func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, sc, _ int64, o *collectives.Options) error {
			return collectives.AllReduce(send, recv, sc, hcomm.Float32, hcomm.Sum, c, s, o)
		},
		want: func(_, n int, i, _ int64, in func(int, int64) float32) float32 { return sumAll(n, i, in) },
	},
	"broadcast": {
		factor: func(int) float64 { return 1 },
		counts: func(size int64, _ int) (int64, int64) { return size / 4, size / 4 },
		run: func(c *hcomm.Comm, s *device.Stream, _, recv device.Ptr, sc, _ int64, o *collectives.Options) error {
			return collectives.Broadcast(recv, sc, hcomm.Float32, 0, c, s, o)
		},
		want:    func(r, _ int, i, _ int64, in func(int, int64) float32) float32 { return in(0, i) },
		inPlace: true,
	},
	"reduce": {
		factor: func(int) float64 { return 1 },
		counts: func(size int64, _ int) (int64, int64) { return size / 4, size / 4 },
		run: func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, sc, _ int64, o *collectives.Options) error {
			return collectives.Reduce(send, recv, sc, hcomm.Float32, hcomm.Sum, 0, c, s, o)
		},
		want:     func(_, n int, i, _ int64, in func(int, int64) float32) float32 { return sumAll(n, i, in) },
		rootOnly: true,
	},
	"allgather": {
		factor: func(n int) float64 { return float64(n-1) / float64(n) },
		counts: func(size int64, n int) (int64, int64) { c := size / 4 / int64(n); return c, c * int64(n) },
		run: func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, sc, _ int64, o *collectives.Options) error {
			return collectives.AllGather(send, recv, sc, hcomm.Float32, c, s, o)
		},
		want: func(_, _ int, i, sc int64, in func(int, int64) float32) float32 { return in(int(i/sc), i%sc) },
	},
	"reducescatter": {
		factor: func(n int) float64 { return float64(n-1) / float64(n) },
		counts: func(size int64, n int) (int64, int64) { c := size / 4 / int64(n); return c * int64(n), c },
		run: func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, _, rc int64, o *collectives.Options) error {
			return collectives.ReduceScatter(send, recv, rc, hcomm.Float32, hcomm.Sum, c, s, o)
		},
		want: func(r, n int, i, sc int64, in func(int, int64) float32) float32 {
			return sumAll(n, int64(r)*(sc/int64(n))+i, in)
		},
	},
	"alltoall": {
		factor: func(n int) float64 { return float64(n-1) / float64(n) },
		counts: func(size int64, n int) (int64, int64) { c := size / 4 / int64(n) * int64(n); return c, c },
		run: func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, sc, _ int64, o *collectives.Options) error {
			per := sc / int64(c.Size())
			return collectives.AlltoAll(send, per, hcomm.Float32, recv, per, hcomm.Float32, c, s, o)
		},
		want: func(r, n int, i, sc int64, in func(int, int64) float32) float32 {
			per := sc / int64(n)
			return in(int(i/per), int64(r)*per+i%per)
		},
	},
}

// Collectives returns the names of the collectives the simulator runs.
func Collectives() []string {
	return []string{"allreduce", "broadcast", "reduce", "allgather", "reducescatter", "alltoall"}
}

// input returns the inputs of run number salt: element j of rank p's input
// is a small integer, never 0, and differs from the previous run's (a piece
// that does not land leaves the last run's bytes in a buffer: they must
// show).
func input(salt int) func(p int, j int64) float32 {
	return func(p int, j int64) float32 { return float32(1 + (p*7+int(j%1009)*3+salt*5)%13) }
}

// Cluster is a simulated cluster: its communicators (one per rank, over a
// channel/sim World), their streams and buffers. Run cases one at a time;
// Close frees everything.
type Cluster struct {
	o       Options
	w       *simch.World
	comms   []*hcomm.Comm
	streams []*device.Stream
	bufs    [][2]device.Ptr // send, recv per rank
	cap     int64           // bytes of each buffer
	runs    int             // cases run: the inputs' salt
	algos   *algoLog
	aborted error // why a case aborted every rank (guard), or nil
}

// guardEvery is how often a running case's heap is looked at.
const guardEvery = 50 * time.Millisecond

// guard watches the process's Go heap while a case runs — the schedules'
// channels and the trace, which Options.MemLimit's check of the buffers
// does not see (an algorithm whose setup reaches every peer holds n²
// channels) — and aborts every rank when it passes Options.MemLimit, so
// that the case fails with an error instead of taking the machine's
// memory. The returned function stops the watch and reports the heap that
// passed the limit, or 0.
func (cl *Cluster) guard() func() int64 {
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	heap := func() int64 {
		metrics.Read(sample)
		return int64(sample[0].Value.Uint64())
	}
	var over atomic.Int64
	abort := func(h int64) {
		over.Store(h)
		for _, c := range cl.comms {
			c.Abort()
		}
	}
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		if h := heap(); h > cl.o.MemLimit {
			abort(h)
			return
		}
		t := time.NewTicker(guardEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			if h := heap(); h > cl.o.MemLimit {
				abort(h)
				return
			}
		}
	}()
	return func() int64 {
		close(done)
		<-exited
		return over.Load()
	}
}

// algoLog keeps the algorithm of the last collective rank 0 issued, from
// hcomm's TRACE record "collective issued" — on the simulated communicator,
// not on the sub-communicators ("parent/id…") a two-level schedule calls
// its levels' collectives on.
type algoLog struct {
	mu   sync.Mutex
	last string
}

func (a *algoLog) Enabled(context.Context, slog.Level) bool { return true }
func (a *algoLog) WithAttrs([]slog.Attr) slog.Handler       { return a }
func (a *algoLog) WithGroup(string) slog.Handler            { return a }
func (a *algoLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "collective issued" {
		return nil
	}
	var algo string
	rank := int64(-1)
	sub := false
	r.Attrs(func(at slog.Attr) bool {
		switch at.Key {
		case "algorithm":
			algo = at.Value.String()
		case "rank":
			rank = at.Value.Int64()
		case "comm":
			sub = strings.Contains(at.Value.String(), "/")
		}
		return true
	})
	if rank != 0 || sub {
		return nil
	}
	a.mu.Lock()
	a.last = algo
	a.mu.Unlock()
	return nil
}

// NewCluster makes the communicators of p's cluster. It fails with p's
// Validate error, or hcomm's.
func NewCluster(p simch.Profile, o Options) (*Cluster, error) {
	o = o.withDefaults()
	if o.BufferSize < 0 || o.MemLimit < 0 || o.Timeout < 0 {
		return nil, fmt.Errorf("sim: buffer size %d, memory limit %d and timeout %v must not be negative", o.BufferSize, o.MemLimit, o.Timeout)
	}
	w, err := simch.NewWorld(p)
	if err != nil {
		return nil, err
	}
	n := w.Ranks()
	// The HCCL buffers are reserved, not committed: the host device maps
	// them from memory files whose pages exist once touched, and a
	// schedule touches its hello slots and the inbox pieces it uses. Their
	// address space is bounded all the same.
	if bufs := int64(n) * 2 * o.BufferSize; bufs > 1<<40 {
		return nil, fmt.Errorf("sim: %d ranks' HCCL buffers (2 × %d bytes each) need %d bytes of address space, over 1 TiB: lower the buffer size", n, o.BufferSize, bufs)
	}
	cl := &Cluster{o: o, w: w, algos: &algoLog{}}
	// The ranks log at TRACE to a handler that keeps the algorithm rank 0
	// issued and drops everything else.
	logs := slog.New(cl.algos)
	comms, err := hcomm.InitAllOver(w.Dialers(), w.Hosts(), &hcomm.Config{Name: "sim", BufferSize: o.BufferSize,
		ExecTimeout: o.Timeout, ConnectTimeout: o.Timeout, Logger: logs})
	if err != nil {
		return nil, err
	}
	cl.comms = comms
	for _, c := range comms {
		s, err := c.Device().CreateStream()
		if err != nil {
			cl.Close()
			return nil, fmt.Errorf("sim: rank %d: %w", c.Rank(), err)
		}
		cl.streams = append(cl.streams, s)
	}
	return cl, nil
}

// World returns the cluster's simulated world (its clocks).
func (cl *Cluster) World() *simch.World { return cl.w }

// Ranks returns the cluster's rank count.
func (cl *Cluster) Ranks() int { return len(cl.comms) }

// Close destroys the communicators and frees the buffers. Idempotent.
func (cl *Cluster) Close() error {
	var errs []error
	for r, c := range cl.comms {
		if r < len(cl.bufs) {
			for _, p := range cl.bufs[r] {
				c.Device().Free(p)
			}
		}
		if r < len(cl.streams) {
			cl.streams[r].Destroy()
		}
		if err := c.Destroy(); err != nil {
			errs = append(errs, err)
		}
	}
	cl.comms, cl.streams, cl.bufs = nil, nil, nil
	return errors.Join(errs...)
}

// grow makes every rank's send and receive buffers at least n bytes.
func (cl *Cluster) grow(n int64) error {
	if n <= cl.cap && cl.bufs != nil {
		return nil
	}
	if need := int64(len(cl.comms)) * 2 * n; need > cl.o.MemLimit {
		return fmt.Errorf("sim: %d ranks × 2 buffers of %d bytes need %d bytes, over the memory limit of %d", len(cl.comms), n, need, cl.o.MemLimit)
	}
	for r, c := range cl.comms {
		if r < len(cl.bufs) {
			for _, p := range cl.bufs[r] {
				c.Device().Free(p)
			}
		}
	}
	cl.bufs = make([][2]device.Ptr, len(cl.comms))
	for r, c := range cl.comms {
		for i := range cl.bufs[r] {
			p, err := c.Device().Malloc(max(n, 64))
			if err != nil {
				return fmt.Errorf("sim: rank %d: %w", r, err)
			}
			cl.bufs[r][i] = p
		}
	}
	cl.cap = n
	return nil
}

// Run simulates one case on every rank and checks every rank's output. It
// fails naming the collective, the size, and the first rank and element
// that came out wrong; or with the collective's error.
func (cl *Cluster) Run(cs Case) (Result, error) {
	if cl.aborted != nil {
		return Result{}, fmt.Errorf("sim: the cluster is unusable: %w", cl.aborted)
	}
	co, ok := colls[cs.Collective]
	if !ok {
		return Result{}, fmt.Errorf("sim: no collective %q (have %s)", cs.Collective, strings.Join(Collectives(), ", "))
	}
	n := len(cl.comms)
	if cs.Bytes < 0 {
		return Result{}, fmt.Errorf("sim: %s of %d bytes: the size is negative", cs.Collective, cs.Bytes)
	}
	sc, rc := co.counts(cs.Bytes, n)
	if sc <= 0 || rc <= 0 {
		return Result{}, fmt.Errorf("sim: %s of %d bytes over %d ranks moves nothing: take at least %d bytes", cs.Collective, cs.Bytes, n, 4*n)
	}
	if err := cl.grow(4 * max(sc, rc)); err != nil {
		return Result{}, err
	}
	// Inputs, and outputs filled with 0 (no input is 0).
	cl.runs++
	in := input(cl.runs)
	if err := eachRank(n, func(r int) error { return cl.fill(co, in, r, sc, rc) }); err != nil {
		return Result{}, err
	}
	cl.w.Reset()
	o := &collectives.Options{Algorithm: cs.Algorithm}
	over := cl.guard()
	err := eachRank(n, func(r int) error {
		s := cl.streams[r]
		if err := co.run(cl.comms[r], s, cl.bufs[r][0], cl.bufs[r][1], sc, rc, o); err != nil {
			return err
		}
		return s.SynchronizeWithTimeout(cl.o.Timeout)
	})
	if heap := over(); heap > 0 {
		cl.aborted = fmt.Errorf("sim: %s %s of %d bytes over %d ranks took %d bytes of heap, over the memory limit of %d (-mem): every rank was aborted, and the cluster with them", cs.Collective, cs.Algorithm, cs.Bytes, n, heap, cl.o.MemLimit)
		return Result{}, cl.aborted
	}
	if err != nil {
		return Result{}, fmt.Errorf("sim: %s %s of %d bytes over %d ranks: %w", cs.Collective, cs.Algorithm, cs.Bytes, n, err)
	}
	ends, err := cl.w.Finish()
	if err != nil {
		return Result{}, fmt.Errorf("sim: %s %s of %d bytes over %d ranks: %w", cs.Collective, cs.Algorithm, cs.Bytes, n, err)
	}
	t := 0.0
	for _, e := range ends {
		t = max(t, e)
	}
	cl.algos.mu.Lock()
	algo := cl.algos.last
	cl.algos.mu.Unlock()
	if err := eachRank(n, func(r int) error { return cl.check(co, in, r, sc, rc) }); err != nil {
		return Result{}, fmt.Errorf("sim: %s %s (%s) of %d bytes over %d ranks: %w", cs.Collective, cs.Algorithm, algo, cs.Bytes, n, err)
	}
	res := Result{Case: cs, Ranks: n, Algo: algo, Time: t}
	if t > 0 {
		res.AlgBW = float64(cs.Bytes) / t / 1e9
		res.BusBW = res.AlgBW * co.factor(n)
	}
	return res, nil
}

// eachRank calls fn for every rank of n at once, one goroutine each, and
// returns firstErr of what they returned once all have.
func eachRank(n int, fn func(r int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = fn(r)
		}()
	}
	wg.Wait()
	return firstErr(errs)
}

// firstErr returns the first rank's error, saying how many other ranks
// failed too (every rank usually fails alike: one line, not n).
func firstErr(errs []error) error {
	var first error
	others := 0
	for _, err := range errs {
		switch {
		case err == nil:
		case first == nil:
			first = err
		default:
			others++
		}
	}
	if first != nil && others > 0 {
		return fmt.Errorf("%w (and %d other ranks)", first, others)
	}
	return first
}

// fill writes rank r's input and zeroes its output (the root's output of
// an in-place collective holds its input).
func (cl *Cluster) fill(co coll, in func(int, int64) float32, r int, sc, rc int64) error {
	b := make([]byte, 4*max(sc, rc))
	for j := int64(0); j < sc; j++ {
		binary.LittleEndian.PutUint32(b[4*j:], math.Float32bits(in(r, j)))
	}
	s := cl.streams[r]
	if err := s.MemcpyHtoDAsync(cl.bufs[r][0], b[:4*sc]); err != nil {
		return err
	}
	out := make([]byte, 4*rc) // not b: the copy above reads it when the stream runs it
	if co.inPlace && r == 0 {
		copy(out, b)
	}
	if err := s.MemcpyHtoDAsync(cl.bufs[r][1], out); err != nil {
		return err
	}
	return s.SynchronizeWithTimeout(cl.o.Timeout)
}

// check compares rank r's output with what the collective must produce.
func (cl *Cluster) check(co coll, in func(int, int64) float32, r int, sc, rc int64) error {
	if co.rootOnly && r != 0 {
		return nil
	}
	b := make([]byte, 4*rc)
	s := cl.streams[r]
	if err := s.MemcpyDtoHAsync(b, cl.bufs[r][1]); err != nil {
		return err
	}
	if err := s.SynchronizeWithTimeout(cl.o.Timeout); err != nil {
		return err
	}
	n := len(cl.comms)
	for i := int64(0); i < rc; i++ {
		got := math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		if want := co.want(r, n, i, sc, in); got != want {
			return fmt.Errorf("rank %d element %d is %v, want %v: a piece was lost or repeated", r, i, got, want)
		}
	}
	return nil
}
