package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// -T: every wait of a rank — for its stream, for the other ranks at a
// barrier or a sum — is bounded by the timeout, as nccl-tests bounds each
// stream synchronization. A wait that outlasts it fails the rank with an
// error saying so; runRanks then aborts every communicator of the process,
// which ends the other ranks' waits, and hcomm bench exits with status 1.

type timeoutKey struct{}

// withTimeout makes the waits under ctx bounded by d (d <= 0: unbounded).
func withTimeout(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, timeoutKey{}, d)
}

// errTimeout is wrapped by the error of a wait that outlasted -T.
var errTimeout = errors.New("test timeout")

// bounded runs wait, a wait of rank for what, with the -T bound that ctx
// carries.
func bounded(ctx context.Context, rank int, what string, wait func(ctx context.Context) error) error {
	d, _ := ctx.Value(timeoutKey{}).(time.Duration)
	if d <= 0 {
		return wait(ctx)
	}
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	err := wait(wctx)
	if err != nil && ctx.Err() == nil && errors.Is(wctx.Err(), context.DeadlineExceeded) {
		host, _ := os.Hostname()
		return fmt.Errorf("%s: %w (-T %v): rank %d waited that long for %s; aborting the run", host, errTimeout, d, rank, what)
	}
	return err
}

// syncStream waits for the work enqueued on s, bounded by -T. When the
// wait fails (a timeout, the run cancelled by another rank's failure, a
// failed task) it aborts s: the work still queued would otherwise hold up
// the stream's Destroy until HCCL_EXEC_TIMEOUT ends it.
func syncStream(ctx context.Context, rank int, s *device.Stream) error {
	err := bounded(ctx, rank, "its stream (a collective or transfer that did not complete)", s.Synchronize)
	if err != nil {
		s.Abort()
	}
	return err
}

// IterStats are -I's per-iteration statistics of one placement of a row,
// over the ranks' slowest (the largest time of each iteration on any rank),
// in nccl-tests' JSON keys (out_of_place_per_iter, in_place_per_iter).
type IterStats struct {
	Skipped int     `json:"skipped_iterations"` // -K: leading iterations left out of the statistics
	MinUs   float64 `json:"min_us"`
	MaxUs   float64 `json:"max_us"`
	AvgUs   float64 `json:"avg_us"`
	P50Us   float64 `json:"p50_us"`
	P95Us   float64 `json:"p95_us"`
	P99Us   float64 `json:"p99_us"`
	StdevUs float64 `json:"stdev_us"` // population standard deviation
	CVPct   float64 `json:"cv_pct"`   // stdev / avg, in percent
	// TimesUs is every iteration's time, the skipped ones included.
	TimesUs []float64 `json:"times_us"`
	// PerProcess is each process's times (one row per process), when the
	// ranks are several processes.
	PerProcess [][]float64 `json:"per_process_max_times_us,omitempty"`
}

// iterStats computes the statistics of times[skip:] as nccl-tests 2.19's
// computeIterStats does: nearest-rank percentiles of the sorted times
// (p50 the middle one), the population standard deviation.
func iterStats(times []float64, skip int) *IterStats {
	st := &IterStats{Skipped: skip, TimesUs: times}
	s := slices.Clone(times[skip:])
	n := len(s)
	if n == 0 {
		return st
	}
	slices.Sort(s)
	pct := func(p int) float64 { return s[min(n-1, (n*p+99)/100-1)] }
	st.MinUs, st.MaxUs, st.P50Us, st.P95Us, st.P99Us = s[0], s[n-1], s[n/2], pct(95), pct(99)
	sum := 0.0
	for _, x := range s {
		sum += x
	}
	st.AvgUs = sum / float64(n)
	v := 0.0
	for _, x := range s {
		v += (x - st.AvgUs) * (x - st.AvgUs)
	}
	st.StdevUs = math.Sqrt(v / float64(n))
	if st.AvgUs > 0 {
		st.CVPct = st.StdevUs / st.AvgUs * 100
	}
	return st
}

// iterTimer times each of -n iterations on a stream with device events:
// an event recorded before each iteration and one after the last.
type iterTimer struct {
	evs []*device.Event
}

func newIterTimer(dev *device.Device, iters int) (*iterTimer, error) {
	t := &iterTimer{}
	for i := 0; i <= iters; i++ {
		e, err := dev.CreateEvent()
		if err != nil {
			t.destroy()
			return nil, err
		}
		t.evs = append(t.evs, e)
	}
	return t, nil
}

func (t *iterTimer) destroy() {
	for _, e := range t.evs {
		e.Destroy()
	}
}

// mark records event i on s (nil timer: nothing).
func (t *iterTimer) mark(s *device.Stream, i int) error {
	if t == nil {
		return nil
	}
	return t.evs[i].Record(s)
}

// times returns this rank's µs per iteration, once the stream is synchronized.
func (t *iterTimer) times() ([]float64, error) {
	out := make([]float64, len(t.evs)-1)
	for i := range out {
		ms, err := t.evs[i].ElapsedTime(t.evs[i+1])
		if err != nil {
			return nil, err
		}
		out[i] = float64(ms) * 1e3
	}
	return out, nil
}

// gatherIterStats combines the ranks' iteration times (a collective: every
// rank calls it with its own): each iteration's time is the largest on any
// rank, and with one rank per process each process's row is kept too.
func gatherIterStats(ctx context.Context, c *hcomm.Comm, mine []float64, skip int, perProcess bool) (*IterStats, error) {
	n, me, k := c.Size(), c.Rank(), len(mine)
	all := make([]float64, n*k)
	copy(all[me*k:], mine)
	if err := bounded(ctx, me, "the other ranks' iteration times", func(ctx context.Context) error {
		return collectives.AllReduceSlice(ctx, c, all, all, hcomm.Sum, nil)
	}); err != nil {
		return nil, err
	}
	worst := make([]float64, k)
	rows := make([][]float64, n)
	for r := range n {
		rows[r] = all[r*k : (r+1)*k]
		for i, x := range rows[r] {
			worst[i] = max(worst[i], x)
		}
	}
	st := iterStats(worst, skip)
	if perProcess && n > 1 {
		st.PerProcess = rows
	}
	return st, nil
}

// floatStr formats v in width columns as nccl-tests' getFloatStr: two
// decimals if they fit, else one, else none, else an exponent.
func floatStr(v float64, width int) string {
	for _, f := range []string{"%*.2f", "%*.1f", "%*.0f"} {
		if s := fmt.Sprintf(f, width, v); len(s) <= width {
			return s
		}
	}
	if width >= 7 {
		return fmt.Sprintf("%*.1e", width, v)
	}
	return fmt.Sprintf("%*.0e", width, v)
}
