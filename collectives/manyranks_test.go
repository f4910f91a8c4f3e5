package collectives_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
	"github.com/hcomm-dev/hcomm/internal/reduce"
)

// handshakes returns the subtests' handshake forms for n ranks: above
// helloFullMax, the tree (what a crowded host gets, and this machine
// usually is one) and the butterfly, each forced with HCOMM_HANDSHAKE, or
// the tree alone when both is too slow (one = true); "" below, where the
// full handshake opens every collective.
func handshakes(n int, one bool) []string {
	switch {
	case n <= 8:
		return []string{""}
	case one:
		return []string{"/handshake=tree"}
	}
	return []string{"/handshake=tree", "/handshake=butterfly"}
}

// manyRankCounts are the rank counts of the many-rank tests: every count
// from 2 to 9 (powers of two and not, on both sides of helloFullMax, where
// the handshake turns into the butterfly) and 16.
var manyRankCounts = []int{2, 3, 4, 5, 6, 7, 8, 9, 16}

// TestManyRanksMatrix runs every collective with every algorithm it has
// against the float64 reference at the rank counts of manyRankCounts, over
// every transport that runs ranks as goroutines, on one set of
// communicators per transport and rank count (so that the butterfly's hello
// parities and the pipes' counters carry across calls of different
// collectives). Every data type and reduce op at 16 ranks over inproc;
// int8 and float32 with sum and max at the other counts; float32 sums over
// shm and tcp at 9 and 16 ranks. Above helloFullMax, once with the tree's
// handshake and once with the butterfly's (handshakes).
func TestManyRanksMatrix(t *testing.T) {
	if testing.Short() {
		t.Skip("many ranks: not in -short")
	}
	for _, tr := range hcommtest.Transports() {
		if tr.Processes {
			continue
		}
		for _, n := range manyRankCounts {
			// inproc at every count; shm and tcp at one count above
			// helloFullMax and at 16. Every type and op at 16 over inproc.
			full := tr.Name == "inproc" && n == 16
			types := []hcomm.DataType{hcomm.Int8, hcomm.Float32}
			ops := []hcomm.ReduceOp{hcomm.Sum, hcomm.Max}
			counts := []int64{7, 1023, 5000}
			switch {
			case raceEnabled && (n != 3 && n != 9 && n != 16 || tr.Name != "inproc" && n != 9):
				continue
			case raceEnabled:
				// Ten times slower: two types, one count.
				types, counts = []hcomm.DataType{hcomm.Int8, hcomm.BFloat16}, []int64{7}
			case full:
				types, ops, counts = dtypes(), reduce.Ops(), []int64{7, 5000}
			case tr.Name != "inproc" && n != 9 && n != 16:
				continue
			case tr.Name != "inproc":
				types, ops, counts = []hcomm.DataType{hcomm.Float32}, []hcomm.ReduceOp{hcomm.Sum}, []int64{7, 5000}
			}
			for _, hs := range handshakes(n, raceEnabled && n != 16) {
				t.Run(fmt.Sprintf("%v/ranks=%d%s", tr, n, hs), func(t *testing.T) {
					if hs != "" {
						t.Setenv("HCOMM_HANDSHAKE", hs[len("/handshake="):])
					}
					comms := hcommtest.Options{Config: &hcomm.Config{BufferSize: 256 << 10}}.New(t, n, tr)
					inline := collectives.InlineBytes(comms[0])
					for _, dt := range types {
						for _, count := range counts {
							for _, op := range ops {
								m := matrixCase{dt: dt, op: op, count: count, root: int(count) % n, inline: inline}
								inPlace := count%2 == 1 && op == hcomm.Max
								for _, a := range algosOf("AllReduce") {
									if fits(a, count*int64(dt.Size()), inline) && a != collectives.AlgoHier && !ringAlias(a, n, tr) {
										allReduceRaw(t, comms, m, a, inPlace)
									}
								}
								for _, a := range algosOf("ReduceScatter") {
									testReduceScatter(t, comms, m, a, inPlace)
								}
								for _, a := range algosOf("Reduce") {
									testReduce(t, comms, m, a, inPlace)
								}
								if op != hcomm.Sum {
									continue
								}
								for _, a := range algosOf("AllGather") {
									testAllGather(t, comms, m, a, inPlace)
								}
								for _, a := range algosOf("Broadcast") {
									if fits(a, count*int64(dt.Size()), inline) {
										broadcastRaw(t, comms, m, a)
									}
								}
								testScatterGather(t, comms, m, collectives.AlgoPairwise)
								for _, a := range algosOf("AlltoAll") {
									if fits(a, m.count*int64(m.dt.Size()), m.inline) { // oneshot: a block per hello
										testAlltoAll(t, comms, m, a)
									}
								}
								testVCollectives(t, comms, m)
							}
						}
					}
					run(t, comms, func(c *hcomm.Comm) error {
						s, _ := c.Device().CreateStream()
						defer s.Destroy()
						if err := collectives.Barrier(c, s); err != nil {
							return err
						}
						return s.SynchronizeWithTimeout(time.Minute)
					})
				})
			}
		}
	}
}
