package collectives_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// TestButterflyMismatch: above helloFullMax ranks each rank trades hellos
// with log2(n) partners only, yet a rank that makes a different call still
// fails every rank with ErrMismatch naming both calls — the odd rank's
// partners find the difference and poison their later hellos — well within
// the execution timeout. At 16 ranks (a power of two) and 11 (three ranks
// folded), with the odd rank a folded one, a folding one and one of the
// exchange, for a different collective, count (the same algorithm, and one
// that makes the selector pick another, which needs other peers' channels:
// that rank's call fails with ErrMismatch rather than wait for setups that
// its peers never join), data type, reduce op and root, and the
// all-to-all's: a count that puts one rank on another schedule than Bruck,
// and AlltoAllV against AlltoAll (whose ranks set up only Bruck's
// partners: the V form's rank sets up its channels to every peer after its
// butterfly, whose mismatch ends that setup; and a setup that fails because
// a peer already gave up waits a moment for the butterfly's word, so that
// the error is the mismatch). The tree's form of
// the handshake (a crowded host's) keeps the same promise: a difference
// goes up to rank 0 and comes down to every rank.
func TestButterflyMismatch(t *testing.T) {
	for _, n := range []int{16, 11} {
		for i, tc := range mismatchCases() {
			// Ranks 1 (folded at 11 ranks), 2 (folding) and n-1 (in the
			// exchange) take turns at being the odd one; in the tree, a
			// leaf, an inner rank and a leaf.
			odd := []int{1, 2, n - 1}[i%3]
			for _, hs := range []string{"tree", "butterfly"} {
				t.Run(fmt.Sprintf("ranks=%d/%s/odd=%d/handshake=%s", n, tc.name, odd, hs), func(t *testing.T) {
					t.Setenv("HCOMM_HANDSHAKE", hs)
					// Fresh communicators: a rank whose call needed other peers
					// than the rest fails the call itself, leaving its
					// communicator out of step.
					comms := initAll(t, n, &hcomm.Config{ExecTimeout: 20 * time.Second, ConnectTimeout: 20 * time.Second, BufferSize: 1 << 20})
					// The odd rank's schedule may need channels the others do
					// not set up: its call fails with the butterfly's mismatch,
					// not the setup's timeout.
					runMismatch(t, comms, odd, tc, true)
				})
			}
		}
	}
}

// TestCostModelFromEnv: HCOMM_COST_MODEL that makes no sense fails the
// first collective on every rank, at once, with an error naming the
// variable and the term; one that does is used.
func TestCostModelFromEnv(t *testing.T) {
	t.Setenv("HCOMM_COST_MODEL", "network:alpha=-3us")
	comms := initAll(t, 2, &hcomm.Config{BufferSize: 1 << 20})
	for _, c := range comms {
		err := collectives.AllReduceSlice(context.Background(), c, []float32{1}, []float32{0}, hcomm.Sum, nil)
		if err == nil || !strings.Contains(err.Error(), "HCOMM_COST_MODEL") || !strings.Contains(err.Error(), "alpha") {
			t.Errorf("rank %d: %v; want an error naming HCOMM_COST_MODEL and alpha", c.Rank(), err)
		}
	}
	t.Setenv("HCOMM_COST_MODEL", "network:alpha=35us,beta=5GB/s;mapped:o=0.5us")
	comms = initAll(t, 2, &hcomm.Config{BufferSize: 1 << 20})
	allReduceCase[float32](t, comms, 7, hcomm.Sum, false, collectives.AlgoAuto)
}

// TestRDOverlappingBuffers: recursive doubling reads its input where it
// lies and reduces its last round straight into the output; an output that
// partly overlaps the input (recv one element past send: no in-place form,
// yet not refused) still gets the exact result, the last round then going
// through a free hello slot. 2 ranks (the one round reads both inputs in
// place), 3 and 5 (folded ranks, whose result comes back whole), all-reduce
// and reduce.
func TestRDOverlappingBuffers(t *testing.T) {
	for _, n := range []int{2, 3, 5} {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			comms := initAll(t, n, &hcomm.Config{BufferSize: 1 << 20})
			dt, cnt := hcomm.Float32, 9
			es := int64(dt.Size())
			for _, coll := range []string{"AllReduce", "Reduce"} {
				root := n - 1
				withBuffers(t, comms,
					func(int) int64 { return int64(cnt+1) * es }, func(int) int64 { return int64(cnt) * es },
					func(r int) []byte {
						return encodeAll(dt, cnt+1, func(i int) float64 {
							if i == cnt {
								return 0
							}
							return input(dt, r, i)
						})
					},
					func(b *rankBufs) error {
						recv := b.send.Add(es)
						o := &collectives.Options{Algorithm: collectives.AlgoRD}
						var err error
						if coll == "AllReduce" {
							err = collectives.AllReduce(b.send, recv, int64(cnt), dt, hcomm.Sum, b.c, b.s, o)
						} else {
							err = collectives.Reduce(b.send, recv, int64(cnt), dt, hcomm.Sum, root, b.c, b.s, o)
						}
						if err != nil {
							return err
						}
						if coll == "Reduce" && b.c.Rank() != root {
							return nil
						}
						return b.s.MemcpyAsync(b.recv, recv, int64(cnt)*es, device.MemcpyDeviceToDevice)
					},
					func(r int) []byte {
						if coll == "Reduce" && r != root {
							return nil
						}
						return encodeAll(dt, cnt, func(i int) float64 {
							return ref(hcomm.Sum, n, func(q int) float64 { return input(dt, q, i) })
						})
					}, fmt.Sprintf("%s rd, recv = send + 1 element", coll))
			}
		})
	}
}
