package collectives_test

import (
	"fmt"
	"testing"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
)

// TestCollectivesOverEveryTransport runs the collective matrix with the
// ranks' channels forced onto each transport hcommtest runs as goroutines:
// inproc, shm (shared mappings, as between processes of one host) and tcp
// (loopback sockets, as between hosts). The schedules are the same on all three: they
// see only the data-plane ops. The multi-process runs of hcomm's own tests
// cover the same transports with ranks as separate processes.
func TestCollectivesOverEveryTransport(t *testing.T) {
	for _, tr := range hcommtest.Transports() {
		if tr.Processes {
			continue // the matrix drives every rank's buffers from this goroutine
		}
		for _, n := range []int{2, 3} {
			t.Run(fmt.Sprintf("%v/ranks=%d", tr, n), func(t *testing.T) {
				comms := hcommtest.Options{Config: &hcomm.Config{BufferSize: 64 << 10}}.New(t, n, tr)
				inline := collectives.InlineBytes(comms[0])
				types := []hcomm.DataType{hcomm.Int8, hcomm.BFloat16, hcomm.Float32, hcomm.Float64}
				for _, dt := range types {
					for _, count := range []int64{0, 1, 7, 1023, 40000} {
						m := matrixCase{dt: dt, op: hcomm.Sum, count: count, root: int(count) % n, inline: inline}
						for _, inPlace := range []bool{false, true} {
							for _, a := range algosOf("AllReduce") {
								if fits(a, count*int64(dt.Size()), inline) && !ringAlias(a, n, tr) {
									allReduceRaw(t, comms, m, a, inPlace)
								}
							}
							for _, a := range algosOf("AllGather") {
								testAllGather(t, comms, m, a, inPlace)
							}
							for _, a := range algosOf("ReduceScatter") {
								testReduceScatter(t, comms, m, a, inPlace)
							}
							for _, a := range algosOf("Reduce") {
								testReduce(t, comms, m, a, inPlace)
							}
						}
						for _, a := range algosOf("Broadcast") {
							if fits(a, count*int64(dt.Size()), inline) {
								broadcastRaw(t, comms, m, a)
							}
						}
						testScatterGather(t, comms, m, collectives.AlgoPairwise)
						testAlltoAll(t, comms, m, collectives.AlgoPairwise)
						testVCollectives(t, comms, m)
						testSendRecv(t, comms, m)
					}
				}
			})
		}
	}
}
