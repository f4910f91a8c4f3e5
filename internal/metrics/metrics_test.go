package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hcomm-dev/hcomm/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

func TestNilSetRecordsNothing(t *testing.T) {
	s, err := New(nil, 0)
	if s != nil || err != nil {
		t.Fatalf("New(nil) = %v, %v", s, err)
	}
	s.AddBytes("inproc", Write, 10) // no panic
	s.BytesOf("tcp", Read).Add(10)
	var zero Bytes
	zero.Add(10)
	s.ObserveWait("tcp", time.Second)
	s.ObserveCollective("AllReduce", "ring", time.Second)
	s.CountError("timeout")
}

func TestSharedAndLabelled(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, err := New(reg, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(reg, 0) // a second communicator of rank 0: the same collectors
	if err != nil {
		t.Fatal(err)
	}
	a.AddBytes("inproc", Write, 100)
	b.AddBytes("inproc", Write, 23)
	b.AddBytes("rdma-of-the-future", Read, 7) // outside the fixed set: "other"
	a.AddBytes("shm", Read, 0)                // nothing moved: no series
	w := b.BytesOf("inproc", Write)           // a channel's series, found once
	w.Add(1000)
	w.Add(-5) // nothing
	a.ObserveCollective("AllReduce", "Ring", 3*time.Millisecond)
	want := `
# HELP hcomm_transport_bytes_total Bytes moved by one-sided writes and reads (write-reduce and read-reduce included), by transport and direction.
# TYPE hcomm_transport_bytes_total counter
hcomm_transport_bytes_total{direction="read",rank="0",transport="other"} 7
hcomm_transport_bytes_total{direction="write",rank="0",transport="inproc"} 1123
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "hcomm_transport_bytes_total"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(b.colls, "hcomm_collective_duration_seconds"); n != 1 {
		t.Errorf("%d collective series, want 1 (allreduce, ring: lower-cased)", n)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) != 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

// A collector of the same name but another shape is a conflict, reported.
func TestConflictIsAnError(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "hcomm_errors_total", Help: "not ours"}))
	if _, err := New(reg, 0); err == nil {
		t.Error("a conflicting hcomm_errors_total was accepted")
	}
}

// Two ranks on one registry are told apart by their rank label, and the
// error counters given to New exist from the start, at zero.
func TestRanksApartErrorsFromZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	r0, err := New(reg, 0, "timeout", "remote_error")
	if err != nil {
		t.Fatal(err)
	}
	r1, err := New(reg, 1, "timeout", "remote_error")
	if err != nil {
		t.Fatal(err)
	}
	want := `
# HELP hcomm_errors_total Data-plane tasks that failed, by HcclResult name.
# TYPE hcomm_errors_total counter
hcomm_errors_total{code="remote_error",rank="0"} 0
hcomm_errors_total{code="remote_error",rank="1"} 0
hcomm_errors_total{code="timeout",rank="0"} 0
hcomm_errors_total{code="timeout",rank="1"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "hcomm_errors_total"); err != nil {
		t.Error(err)
	}
	r0.AddBytes("shm", Write, 5)
	r1.AddBytes("shm", Write, 7)
	r1.CountError("timeout")
	want = `
# HELP hcomm_transport_bytes_total Bytes moved by one-sided writes and reads (write-reduce and read-reduce included), by transport and direction.
# TYPE hcomm_transport_bytes_total counter
hcomm_transport_bytes_total{direction="write",rank="0",transport="shm"} 5
hcomm_transport_bytes_total{direction="write",rank="1",transport="shm"} 7
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "hcomm_transport_bytes_total"); err != nil {
		t.Error(err)
	}
	if got := testutil.ToFloat64(r1.errors.WithLabelValues("timeout")); got != 1 {
		t.Errorf("rank 1's timeouts = %g, want 1", got)
	}
	if got := testutil.ToFloat64(r0.errors.WithLabelValues("timeout")); got != 0 {
		t.Errorf("rank 0's timeouts = %g, want 0", got)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) != 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}
