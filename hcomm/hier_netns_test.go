package hcomm_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// hierRegistry collects a "hier" rank's metrics: the bytes its channels move
// over tcp.
var hierRegistry = prometheus.NewRegistry()

// tcpBytes is what this process has moved over tcp so far (written and read).
func tcpBytes() (float64, error) {
	mfs, err := hierRegistry.Gather()
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != "hcomm_transport_bytes_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "transport" && l.GetValue() == "tcp" {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum, nil
}

// hierWork is a rank of TestTwoLevelNetns: the same all-reduce with the flat
// ring and with the two-level schedule, checked, and the tcp bytes each
// moved from this rank printed.
func hierWork(c *hcomm.Comm) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const count = 1<<18 + 5 // 1 MiB of float32, and not a multiple of anything
	send := make([]float32, count)
	for i := range send {
		send[i] = float32(c.Rank()*3 + i%7)
	}
	var moved []float64
	for _, a := range []collectives.Algorithm{collectives.AlgoRing, collectives.AlgoHier} {
		before, err := tcpBytes()
		if err != nil {
			return err
		}
		recv := make([]float32, count)
		if err := collectives.AllReduceSlice(ctx, c, send, recv, hcomm.Sum, &collectives.Options{Algorithm: a}); err != nil {
			return fmt.Errorf("%v: %w", a, err)
		}
		n := c.Size()
		for i, v := range recv {
			if want := float32(3*n*(n-1)/2 + n*(i%7)); v != want {
				return fmt.Errorf("%v: element %d = %v, want %v", a, i, v, want)
			}
		}
		after, err := tcpBytes()
		if err != nil {
			return err
		}
		moved = append(moved, after-before)
	}
	fmt.Printf("TCPBYTES %.0f %.0f\n", moved[0], moved[1])
	return nil
}

// TestTwoLevelNetns: two network namespaces ("hosts") with two processes
// each — shm inside a namespace, tcp between — run one all-reduce with the
// flat ring and one with the two-level schedule; both are correct, and the
// two-level one sends fewer bytes over tcp (counted by hcomm's own metrics on
// every rank).
func TestTwoLevelNetns(t *testing.T) {
	h := makeNetnsHosts(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const n = 4 // ranks 0, 1 in namespace 0; ranks 2, 3 in namespace 1
	procs := launchRanks(t, ctx, n, "hier",
		func(r int) []string { return []string{"ip", "netns", "exec", h.ns(r / 2)} },
		func(r int) []string {
			return []string{"MASTER_ADDR=" + h.addr(0), "MASTER_PORT=29501", "HCOMM_SOCKET_IFNAME==" + h.nsEnd(r/2)}
		})
	var ring, hier float64
	for _, p := range procs {
		f := strings.Fields(waitLine(t, p, "TCPBYTES", 60*time.Second).text)
		if len(f) != 3 {
			t.Fatalf("rank %d: %q", p.rank, f)
		}
		r, _ := strconv.ParseFloat(f[1], 64)
		hh, _ := strconv.ParseFloat(f[2], 64)
		ring, hier = ring+r, hier+hh
	}
	waitAll(t, procs)
	t.Logf("bytes over tcp, all ranks: flat ring %.0f, two-level %.0f", ring, hier)
	if hier <= 0 || hier >= ring {
		t.Errorf("two-level moved %.0f bytes over tcp, the flat ring %.0f: want fewer, and some", hier, ring)
	}
}
