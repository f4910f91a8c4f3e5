package hcomm_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hcomm-dev/hcomm/hcomm"
)

// Every series carries the rank, so the ranks of one process (or of a job
// scraped into one Prometheus) are told apart; hcomm_errors_total is there
// from the start, at zero, for every rank.
func TestMetricsRankLabelAndErrorsFromStart(t *testing.T) {
	reg := prometheus.NewRegistry()
	p := newPair(t, &hcomm.Config{BufferSize: 32 << 10, Name: "ranks", Metrics: reg})
	for r := 0; r < 2; r++ {
		if err := hcomm.WriteOnThread(p.th[r], p.ch[r], p.buf[1-r], p.buf[r], int64(100*(r+1))); err != nil {
			t.Fatal(err)
		}
		if err := p.sync(t, r); err != nil {
			t.Fatal(err)
		}
	}
	zero := map[string]bool{}
	for _, m := range family(t, reg, "hcomm_errors_total").GetMetric() {
		l := labels(m)
		if m.GetCounter().GetValue() != 0 {
			t.Errorf("errors_total%v = %g before any error", l, m.GetCounter().GetValue())
		}
		zero[l["rank"]+"/"+l["code"]] = true
	}
	for _, k := range []string{"0/timeout", "1/timeout", "0/remote_error", "1/remote_error"} {
		if !zero[k] {
			t.Errorf("no hcomm_errors_total{rank/code=%s} at start; have %v", k, zero)
		}
	}
	written := map[string]float64{}
	for _, m := range family(t, reg, "hcomm_transport_bytes_total").GetMetric() {
		if l := labels(m); l["direction"] == "write" {
			written[l["rank"]] += m.GetCounter().GetValue()
		}
	}
	if written["0"] != 100 || written["1"] != 200 {
		t.Errorf("bytes written by rank: %v; want rank 0: 100, rank 1: 200", written)
	}
}
