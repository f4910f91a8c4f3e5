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
	s, err := New(nil)
	if s != nil || err != nil {
		t.Fatalf("New(nil) = %v, %v", s, err)
	}
	s.AddBytes("inproc", Write, 10) // no panic
	s.ObserveWait("tcp", time.Second)
	s.ObserveCollective("AllReduce", "ring", time.Second)
	s.CountError("timeout")
}

func TestSharedAndLabelled(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, err := New(reg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(reg) // a second communicator: the same collectors
	if err != nil {
		t.Fatal(err)
	}
	a.AddBytes("inproc", Write, 100)
	b.AddBytes("inproc", Write, 23)
	b.AddBytes("rdma-of-the-future", Read, 7) // outside the fixed set: "other"
	a.AddBytes("shm", Read, 0)                // nothing moved: no series
	a.ObserveCollective("AllReduce", "Ring", 3*time.Millisecond)
	want := `
# HELP hcomm_transport_bytes_total Bytes moved by one-sided writes and reads (write-reduce and read-reduce included), by transport and direction.
# TYPE hcomm_transport_bytes_total counter
hcomm_transport_bytes_total{direction="read",transport="other"} 7
hcomm_transport_bytes_total{direction="write",transport="inproc"} 123
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
	if _, err := New(reg); err == nil {
		t.Error("a conflicting hcomm_errors_total was accepted")
	}
}
