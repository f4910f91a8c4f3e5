package hcomm_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
)

// family returns the gathered metric family name, failing if it is absent.
func family(t *testing.T, reg *prometheus.Registry, name string) *dto.MetricFamily {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			return f
		}
	}
	t.Fatalf("no %s in the scrape", name)
	return nil
}

func labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// Bytes written and read by the data plane are counted exactly, by transport
// and direction — a channel's series are there from its setup, at zero on
// the rank that moved nothing — and a notify wait is observed.
func TestMetricsDataPlane(t *testing.T) {
	reg := prometheus.NewRegistry()
	p := newPair(t, &hcomm.Config{BufferSize: 32 << 10, Name: "test", Metrics: reg})
	const nw, nr = 3000, 1234
	if err := hcomm.WriteOnThread(p.th[0], p.ch[0], p.buf[1], p.buf[0], nw); err != nil {
		t.Fatal(err)
	}
	if err := hcomm.ReadOnThread(p.th[0], p.ch[0], p.buf[0], p.buf[1].Add(8192), nr); err != nil {
		t.Fatal(err)
	}
	if err := hcomm.ChannelNotifyRecordOnThread(p.th[0], p.ch[0], 1); err != nil {
		t.Fatal(err)
	}
	if err := hcomm.ChannelNotifyWaitOnThread(p.th[1], p.ch[1], 1, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	for r := 0; r < 2; r++ {
		if err := p.sync(t, r); err != nil {
			t.Fatal(err)
		}
	}
	tr := p.ch[0].Transport()
	want := strings.NewReader(`
# HELP hcomm_transport_bytes_total Bytes moved by one-sided writes and reads (write-reduce and read-reduce included), by transport and direction.
# TYPE hcomm_transport_bytes_total counter
hcomm_transport_bytes_total{direction="read",rank="0",transport="` + tr + `"} 1234
hcomm_transport_bytes_total{direction="read",rank="1",transport="` + tr + `"} 0
hcomm_transport_bytes_total{direction="write",rank="0",transport="` + tr + `"} 3000
hcomm_transport_bytes_total{direction="write",rank="1",transport="` + tr + `"} 0
`)
	if err := testutil.GatherAndCompare(reg, want, "hcomm_transport_bytes_total"); err != nil {
		t.Error(err)
	}
	h := family(t, reg, "hcomm_notify_wait_seconds").GetMetric()[0].GetHistogram()
	if h.GetSampleCount() != 1 || h.GetSampleSum() < 0 || h.GetSampleSum() > 10 {
		t.Errorf("notify waits: count %d sum %g, want 1 wait of under 10 s", h.GetSampleCount(), h.GetSampleSum())
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

// After an allreduce on 3 ranks, the scrape shows every documented series
// with sane values, and passes promlint.
func TestMetricsAfterAllReduce(t *testing.T) {
	reg := prometheus.NewRegistry()
	comms := hcommtest.Options{Config: &hcomm.Config{BufferSize: 1 << 20, Name: "m", Metrics: reg}}.New(t, 3, hcommtest.Auto)
	const n = 1000
	hcommtest.Each(t, comms, func(t testing.TB, c *hcomm.Comm) {
		in := make([]float32, n)
		for j := range in {
			in[j] = float32(c.Rank())
		}
		if err := collectives.AllReduceSlice(context.Background(), c, in, in, hcomm.Sum, nil); err != nil {
			t.Fatal(err)
		}
		if in[n-1] != 3 {
			t.Fatalf("element %d = %v, want 3", n-1, in[n-1])
		}
	})
	// Every rank's allreduce is one observation of op="allreduce".
	colls := family(t, reg, "hcomm_collective_duration_seconds").GetMetric()
	var count uint64
	for _, m := range colls {
		l := labels(m)
		if l["op"] != "allreduce" || l["algorithm"] == "" {
			t.Errorf("collective labels %v", l)
		}
		count += m.GetHistogram().GetSampleCount()
		if s := m.GetHistogram().GetSampleSum(); s <= 0 || s > 60 {
			t.Errorf("collective duration sum %g s is not sane", s)
		}
	}
	if count != 3 {
		t.Errorf("%d collective observations, want 3 (one per rank)", count)
	}
	var moved float64
	for _, m := range family(t, reg, "hcomm_transport_bytes_total").GetMetric() {
		moved += m.GetCounter().GetValue()
	}
	// Every rank must at least receive the other ranks' contributions once:
	// no schedule moves less than (n-1)/n of the data into each rank.
	if min := float64(3 * 2 * n * 4 / 3); moved < min || moved > 100*n*4 {
		t.Errorf("%g bytes moved, want between %g and %d", moved, min, 100*n*4)
	}
	// That all-reduce's handshake between goroutines is a line, no
	// notify (collectives/ll.go); a ring's pipes wait on notifies.
	hcommtest.Each(t, comms, func(t testing.TB, c *hcomm.Comm) {
		in := make([]float32, n)
		if err := collectives.AllReduceSlice(context.Background(), c, in, in, hcomm.Sum, &collectives.Options{Algorithm: collectives.AlgoRing}); err != nil {
			t.Fatal(err)
		}
	})
	if w := family(t, reg, "hcomm_notify_wait_seconds").GetMetric(); len(w) == 0 || w[0].GetHistogram().GetSampleCount() == 0 {
		t.Error("no notify wait observed")
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
	// A second group on the same registry shares the collectors.
	more, err := hcomm.InitAll(2, &hcomm.Config{BufferSize: 1 << 20, Metrics: reg})
	if err != nil {
		t.Fatalf("a second communicator group on the same registry: %v", err)
	}
	for _, c := range more {
		c.Destroy()
	}
}

// A collective whose peers never come times out: the error and the WARN log
// line name the collective and its number, and errors_total counts it.
func TestWaitTimeoutNamesTheCollective(t *testing.T) {
	reg := prometheus.NewRegistry()
	var logs bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(&lockedWriter{mu: &mu, w: &logs}, &slog.HandlerOptions{Level: hcomm.LevelTrace, ReplaceAttr: hcomm.ReplaceLevelNames}))
	comms, err := hcomm.InitAll(2, &hcomm.Config{BufferSize: 1 << 20, Name: "late", Metrics: reg, Logger: logger, ExecTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range comms {
			c.Abort()
			c.Destroy()
		}
	}()
	// Both ranks do one allreduce; then rank 0 does a second one alone.
	var wg sync.WaitGroup
	for _, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := []float64{1}
			if err := collectives.AllReduceSlice(context.Background(), c, x, x, hcomm.Sum, nil); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	x := []float64{1}
	err = collectives.AllReduceSlice(context.Background(), comms[0], x, x, hcomm.Sum, nil)
	if !errors.Is(err, hcomm.ErrTimeout) {
		t.Fatalf("err = %v, want a timeout", err)
	}
	// LastOp shows who is behind: rank 0 is in #2, rank 1 still at #1.
	if op, seq := comms[0].LastOp(); op != "AllReduce" || seq != 2 {
		t.Errorf("rank 0 LastOp = %q #%d", op, seq)
	}
	if op, seq := comms[1].LastOp(); op != "AllReduce" || seq != 1 {
		t.Errorf("rank 1 LastOp = %q #%d", op, seq)
	}
	for _, s := range []string{"AllReduce #2 (oneshot)", "rank 1 did not record it within 200ms", "late"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
	if got := testutil.ToFloat64(mustCounter(t, reg, "timeout")); got < 1 {
		t.Errorf("hcomm_errors_total{code=\"timeout\"} = %g, want >= 1", got)
	}
	mu.Lock()
	out := logs.String()
	mu.Unlock()
	for _, s := range []string{
		`level=TRACE msg="collective issued" comm=late rank=1 op=AllReduce seq=1`,
		`level=TRACE msg="collective done" comm=late rank=0 op=AllReduce seq=1`,
		`level=WARN msg="task failed" comm=late rank=0 op=ChannelNotifyWait peer=1 code=timeout`, // the one-shot hello waits with the immediate call
		"AllReduce #2 (oneshot)",
	} {
		if !strings.Contains(out, s) {
			t.Errorf("log lacks %q:\n%s", s, out)
		}
	}
}

// mustCounter returns hcomm_errors_total{code} from a scrape as a collector
// testutil.ToFloat64 can read.
func mustCounter(t *testing.T, reg *prometheus.Registry, code string) prometheus.Collector {
	t.Helper()
	for _, m := range family(t, reg, "hcomm_errors_total").GetMetric() {
		if labels(m)["code"] == code {
			c := prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})
			c.Add(m.GetCounter().GetValue())
			return c
		}
	}
	t.Fatalf("no hcomm_errors_total{code=%q}", code)
	return nil
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Without a Registerer nothing is registered anywhere, and the data plane
// still works.
func TestNoMetricsRegistersNothing(t *testing.T) {
	before, _ := prometheus.DefaultGatherer.Gather()
	p := newPair(t, nil)
	if err := hcomm.WriteOnThread(p.th[0], p.ch[0], p.buf[1], p.buf[0], 100); err != nil {
		t.Fatal(err)
	}
	if err := p.sync(t, 0); err != nil {
		t.Fatal(err)
	}
	after, _ := prometheus.DefaultGatherer.Gather()
	for _, f := range after {
		if strings.HasPrefix(f.GetName(), "hcomm_") {
			t.Errorf("%s registered globally", f.GetName())
		}
	}
	if len(after) != len(before) {
		t.Errorf("the default registry went from %d to %d families", len(before), len(after))
	}
}

// A wait that takes more than a second is logged at INFO with the peer and
// the collective.
func TestSlowWaitIsLogged(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(&lockedWriter{mu: &mu, w: &logs}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	comms := hcommtest.Options{Config: &hcomm.Config{BufferSize: 1 << 20, Name: "slow", Logger: logger}}.New(t, 2, hcommtest.Auto)
	hcommtest.Each(t, comms, func(t testing.TB, c *hcomm.Comm) {
		x := []int32{1}
		for i := 0; i < 2; i++ { // the first sets the channels up
			if i == 1 && c.Rank() == 1 {
				time.Sleep(1200 * time.Millisecond) // rank 0 waits for this rank
			}
			if err := collectives.AllReduceSlice(context.Background(), c, x, x, hcomm.Sum, nil); err != nil {
				t.Fatal(err)
			}
		}
	})
	mu.Lock()
	out := logs.String()
	mu.Unlock()
	if !strings.Contains(out, `level=INFO msg="slow notify wait" comm=slow rank=0 peer=1`) || !strings.Contains(out, "op=AllReduce seq=2") {
		t.Errorf("no INFO line for rank 0's slow wait:\n%s", out)
	}
}

// A collective is timed from when its stream reaches it: issued behind a
// task that holds the stream for 50 ms, its observation leaves that wait
// out (the begin task's time, not the issue's); issued on an idle stream,
// it is timed from its call (no task). Both are observed once a rank.
func TestMetricsTimeFromTheStream(t *testing.T) {
	reg := prometheus.NewRegistry()
	comms := hcommtest.Options{Config: &hcomm.Config{BufferSize: 1 << 20, Name: "mq", Metrics: reg}}.New(t, 2, hcommtest.Auto)
	const hold = 50 * time.Millisecond
	sum := func() (n uint64, s float64) {
		for _, m := range family(t, reg, "hcomm_collective_duration_seconds").GetMetric() {
			n += m.GetHistogram().GetSampleCount()
			s += m.GetHistogram().GetSampleSum()
		}
		return n, s
	}
	hcommtest.Each(t, comms, func(t testing.TB, c *hcomm.Comm) {
		s, err := c.Device().CreateStream()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Destroy()
		buf, err := c.Device().Malloc(4096)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Device().Free(buf)
		// The first call sets the channels up (and is timed too).
		if err := collectives.AllReduce(buf, buf, 16, hcomm.Float32, hcomm.Sum, c, s, nil); err != nil {
			t.Fatal(err)
		}
		if err := s.SynchronizeWithTimeout(time.Minute); err != nil {
			t.Fatal(err)
		}
		gate := make(chan struct{})
		if err := s.Launch("hold", func(<-chan struct{}) error { <-gate; return nil }); err != nil {
			t.Fatal(err)
		}
		if err := collectives.AllReduce(buf, buf, 16, hcomm.Float32, hcomm.Sum, c, s, nil); err != nil {
			t.Fatal(err)
		}
		time.Sleep(hold)
		close(gate)
		if err := s.SynchronizeWithTimeout(time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := collectives.AllReduce(buf, buf, 16, hcomm.Float32, hcomm.Sum, c, s, nil); err != nil { // idle stream
			t.Fatal(err)
		}
		if err := s.SynchronizeWithTimeout(time.Minute); err != nil {
			t.Fatal(err)
		}
	})
	n, total := sum()
	if n != 6 {
		t.Fatalf("%d collective observations, want 6 (three a rank)", n)
	}
	// Each rank's held call waited 50 ms behind the hold before its stream
	// reached it; timed from its issue, the two would add 100 ms at least.
	if total >= 2*hold.Seconds() {
		t.Errorf("the collectives' durations add up to %v: the held calls were timed from their issue, not from when their stream reached them", time.Duration(total*1e9))
	}
	t.Logf("6 collectives, %v in all", time.Duration(total*1e9))
}
