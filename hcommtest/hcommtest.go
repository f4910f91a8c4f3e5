package hcommtest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/channel/shm"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// Transport says how the ranks of a Run reach each other. The zero value,
// Auto, runs the ranks as goroutines and lets hcomm pick each channel's
// transport (inproc between goroutines of one process).
type Transport struct {
	// Name is the transport every channel is forced onto: hcomm.TransportInproc,
	// hcomm.TransportShm or hcomm.TransportTCP; empty lets hcomm choose.
	Name string
	// Processes runs each rank in its own process, a copy of the test binary
	// running only the calling test, instead of a goroutine of this one.
	Processes bool
}

// The transports by name.
var (
	Auto          = Transport{}
	Inproc        = Transport{Name: hcomm.TransportInproc}
	Shm           = Transport{Name: hcomm.TransportShm}
	TCP           = Transport{Name: hcomm.TransportTCP}
	AutoProcesses = Transport{Processes: true}
	ShmProcesses  = Transport{Name: hcomm.TransportShm, Processes: true}
	TCPProcesses  = Transport{Name: hcomm.TransportTCP, Processes: true}
)

// String names the transport as a subtest name: "inproc", "shm", "tcp",
// "auto", with "-procs" appended for ranks as processes ("shm-procs").
func (tr Transport) String() string {
	s := tr.Name
	if s == "" {
		s = "auto"
	}
	if tr.Processes {
		s += "-procs"
	}
	return s
}

// Transports returns the transports this build and machine can run, ranks
// as goroutines first: inproc, then shm when the machine has what it needs
// (Linux memfds, abstract unix sockets), then tcp; then shm and tcp with
// ranks as processes.
func Transports() []Transport {
	var in, procs []Transport
	for _, name := range hcomm.Transports() {
		if name == hcomm.TransportShm && shm.HostID() == "" {
			continue
		}
		in = append(in, Transport{Name: name})
		if name != hcomm.TransportInproc {
			procs = append(procs, Transport{Name: name, Processes: true})
		}
	}
	return append(in, procs...)
}

// Options adjusts a Run, New, Each or Go. The zero value is the default of
// every field; Run, New, Each and Go are the zero Options' methods.
type Options struct {
	// Config is every rank's configuration (nil: hcomm's defaults, from the
	// environment). A Transport with a Name overrides Config.Transport; the
	// Config is copied, never modified.
	Config *hcomm.Config
	// Timeout bounds one Run, Each or Go: ranks still running then fail the
	// test with their goroutines' stacks. Zero means five minutes, or less
	// when the test's deadline (go test -timeout) comes sooner.
	Timeout time.Duration
	// GOMAXPROCS, when positive, is runtime.GOMAXPROCS while the ranks run
	// (until the test ends for New), or the GOMAXPROCS of each rank process.
	// Setting it in this process affects every test running in parallel.
	GOMAXPROCS int
	// Env, for ranks as processes, gives variables to add to rank's process
	// after hcommtest's own (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
	// MASTER_ADDR, MASTER_PORT, HCOMM_SECRET, HCOMM_TRANSPORT), so that it
	// may replace or clear them: a test of mpirun's variables clears RANK and
	// sets OMPI_COMM_WORLD_RANK. port is the free port hcommtest picked for
	// rank 0's bootstrap store. Unused for ranks as goroutines.
	Env func(rank, port int) []string
}

// RankFunc is the body of one rank. t fails only this rank (the test as a
// whole fails too); it is safe to use from the goroutines fn starts, with
// the rules of testing.TB (FailNow and Fatal only from the rank's own
// goroutine).
type RankFunc func(t testing.TB, c *hcomm.Comm)

// Run runs fn on n ranks over tr with the default Options; see Options.Run.
func Run(t testing.TB, n int, tr Transport, fn RankFunc) { Options{}.Run(t, n, tr, fn) }

// New makes n ranks over tr with the default Options; see Options.New.
func New(t testing.TB, n int, tr Transport) []*hcomm.Comm { return Options{}.New(t, n, tr) }

// Each runs fn on every rank of comms with the default Options; see
// Options.Each.
func Each(t testing.TB, comms []*hcomm.Comm, fn RankFunc) { Options{}.Each(t, comms, fn) }

// Go runs fn on every rank of comms with the default Options; see Options.Go.
func Go(comms []*hcomm.Comm, fn func(c *hcomm.Comm) error) error { return Options{}.Go(comms, fn) }

// Run makes n ranks over tr, calls fn on every rank concurrently, destroys
// the communicators and checks that nothing they started outlives them. It
// returns when every rank has returned, or at the timeout; the test has then
// failed if a rank failed, panicked, hung or leaked, each named by its rank.
// When every rank skips (t.Skip), the test is skipped. See the package doc
// for ranks as processes. Run may be called from parallel tests; the checks
// of descriptors and mappings then step aside (goroutines are still checked).
func (o Options) Run(t testing.TB, n int, tr Transport, fn RankFunc) {
	t.Helper()
	if n < 1 {
		t.Fatalf("hcommtest.Run: %d ranks; want at least 1", n)
	}
	if tr.Processes || childTest() != "" {
		if o.runProcess(t, n, tr, fn) {
			return
		}
	}
	defer o.setProcs()()
	g, err := o.start(n, tr)
	if err != nil {
		t.Fatalf("hcommtest.Run: %d ranks over %v: %v", n, tr, err)
	}
	res := o.each(t, g.comms, g.label, fn)
	cerr := g.close()
	res.report(t)
	if cerr != nil {
		t.Errorf("hcommtest.Run: %v", cerr)
	}
	if res.skipped != "" && !t.Failed() {
		t.Skip(res.skipped)
	}
}

// New makes n ranks over tr, as goroutines of this process, and returns
// their communicators, rank i at index i. When the test ends they are
// destroyed and checked as Run checks them, after the cleanups registered
// later (which should free the streams and memory the test made on them).
// Run the ranks with Each. New fails the test for a Processes transport:
// only Run starts processes.
func (o Options) New(t testing.TB, n int, tr Transport) []*hcomm.Comm {
	t.Helper()
	if n < 1 {
		t.Fatalf("hcommtest.New: %d ranks; want at least 1", n)
	}
	if tr.Processes {
		t.Fatalf("hcommtest.New: %v runs ranks as processes; use Run", tr)
	}
	restore := o.setProcs()
	g, err := o.start(n, tr)
	if err != nil {
		restore()
		t.Fatalf("hcommtest.New: %d ranks over %v: %v", n, tr, err)
	}
	t.Cleanup(func() {
		defer restore()
		if err := g.close(); err != nil {
			t.Errorf("hcommtest.New: %v", err)
		}
	})
	return g.comms
}

// InitRanks calls init for every rank of n concurrently, one goroutine
// each — as ranks that join each other must, through hcomm.InitRootInfo,
// InitClusterInfo or Grow — and returns the communicators, rank i at index
// i, destroyed when the test ends (after the cleanups registered later).
// It fails the test (FailNow) naming the first rank whose init failed or
// whose communicator is not rank i of n; the communicators that were made
// are destroyed all the same. Unlike New it leaves the configuration,
// GOMAXPROCS and the leak checks to the caller: each init is the caller's.
// Run the ranks with Each.
func InitRanks(t testing.TB, n int, init func(rank int) (*hcomm.Comm, error)) []*hcomm.Comm {
	t.Helper()
	if n < 1 {
		t.Fatalf("hcommtest.InitRanks: %d ranks; want at least 1", n)
	}
	comms := make([]*hcomm.Comm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			comms[r], errs[r] = init(r)
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range comms {
			if c != nil {
				c.Destroy()
			}
		}
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		if comms[r].Rank() != r || comms[r].Size() != n {
			t.Fatalf("rank %d: comm says rank %d of %d", r, comms[r].Rank(), comms[r].Size())
		}
	}
	return comms
}

// Each calls fn on every communicator of comms concurrently, one goroutine
// per rank, and returns when all have returned or at the timeout, as Run
// does; a failing rank aborts every communicator of comms. Each fails the
// test (FailNow) when a rank failed or hung, and skips it when every rank
// skipped. comms may be New's, InitAll's or sub-communicators; Each does not
// destroy them.
func (o Options) Each(t testing.TB, comms []*hcomm.Comm, fn RankFunc) {
	t.Helper()
	res := o.each(t, comms, labelOf(comms), fn)
	if res.report(t) {
		t.FailNow()
	}
	if res.skipped != "" {
		t.Skip(res.skipped)
	}
}

// Go is Each for code without a testing.TB: it calls fn on every
// communicator of comms concurrently, aborts every communicator when one
// returns an error or panics, and returns an error naming each rank that
// failed (the first to fail first) or was still running at the timeout, nil
// when all returned nil. The ranks' errors are wrapped (errors.Is and
// errors.As see them); the goroutine stacks of a hang are in the error.
func (o Options) Go(comms []*hcomm.Comm, fn func(c *hcomm.Comm) error) error {
	res := o.each(nil, comms, labelOf(comms), func(t testing.TB, c *hcomm.Comm) {
		if err := fn(c); err != nil {
			rt := t.(*rankT)
			rt.mu.Lock()
			rt.err = err
			rt.mu.Unlock()
			rt.Fail()
		}
	})
	return res.err()
}

// setProcs applies GOMAXPROCS and returns what undoes it.
func (o Options) setProcs() func() {
	if o.GOMAXPROCS <= 0 {
		return func() {}
	}
	old := runtime.GOMAXPROCS(o.GOMAXPROCS)
	return func() { runtime.GOMAXPROCS(old) }
}

// config is the Config for tr: a copy of o.Config with tr's transport.
func (o Options) config(tr Transport) *hcomm.Config {
	var cfg hcomm.Config
	if o.Config != nil {
		cfg = *o.Config
	}
	if tr.Name != "" {
		cfg.Transport = tr.Name
	}
	return &cfg
}

// timeout is o.Timeout, or the default bounded by t's deadline.
func (o Options) timeout(t testing.TB) time.Duration {
	if o.Timeout > 0 {
		return o.Timeout
	}
	d := 5 * time.Minute
	if dt, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if dl, ok := dt.Deadline(); ok {
			// Leave a tenth (at least a second) for the report and the cleanup
			// before go test's own timeout panics.
			left := time.Until(dl)
			if left -= max(left/10, time.Second); left < d {
				d = max(left, time.Second)
			}
		}
	}
	return d
}

// group is the ranks of one Run or New.
type group struct {
	comms []*hcomm.Comm
	label string
	snap  *snapshot
	once  sync.Once
	err   error
}

var (
	nextLabel atomic.Int64
	labelsMu  sync.Mutex
	labels    = map[*hcomm.Comm]string{} // New's communicators, for Each's goroutines
)

// labelOf is the label of the group comms[0] belongs to, else a new one.
func labelOf(comms []*hcomm.Comm) string {
	if len(comms) > 0 {
		labelsMu.Lock()
		l, ok := labels[comms[0]]
		labelsMu.Unlock()
		if ok {
			return l
		}
	}
	return strconv.FormatInt(nextLabel.Add(1), 10)
}

// labelled runs fn in a goroutine carrying label, so that every goroutine it
// starts, and they start, carries it too (the leak check finds them so).
func labelled(label string, fn func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		pprof.SetGoroutineLabels(pprof.WithLabels(context.Background(), pprof.Labels(labelKey, label)))
		fn()
	}()
	<-done
}

const labelKey = "hcommtest"

// start makes n communicators over tr in this process.
func (o Options) start(n int, tr Transport) (*group, error) {
	g := &group{label: strconv.FormatInt(nextLabel.Add(1), 10), snap: takeSnapshot()}
	var err error
	labelled(g.label, func() { g.comms, err = hcomm.InitAll(n, o.config(tr)) })
	if err != nil {
		g.snap.release()
		return nil, err
	}
	labelsMu.Lock()
	for _, c := range g.comms {
		labels[c] = g.label
	}
	labelsMu.Unlock()
	return g, nil
}

// close destroys the communicators and checks for leaks, once.
func (g *group) close() error {
	g.once.Do(func() {
		var errs []error
		for r, c := range g.comms {
			if err := c.Destroy(); err != nil {
				errs = append(errs, fmt.Errorf("rank %d: Destroy: %w", r, err))
			}
		}
		labelsMu.Lock()
		for _, c := range g.comms {
			delete(labels, c)
		}
		labelsMu.Unlock()
		if leak := checkLeaks(g.label, g.snap); leak != "" {
			errs = append(errs, errors.New(leak))
		}
		g.err = errors.Join(errs...)
	})
	return g.err
}
