package collectives_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// TestSchedulesDeliverEveryElementOnce: random rank counts, element counts
// and HCCL buffer sizes (so that pieces, blocks and rounds fall at random
// boundaries), every algorithm of the all-reduce, all-gather and
// reduce-scatter. Each rank's input element i is distinct per rank, and the
// sum of n distinct powers of two identifies exactly which ranks' elements
// reached an output: an element lost, doubled or misplaced changes it.
func TestSchedulesDeliverEveryElementOnce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	trials := 24
	if raceEnabled {
		trials = 8
	}
	for trial := 0; trial < trials; trial++ {
		n := 1 + rng.IntN(7)
		count := int64(rng.IntN(5000))
		buf := int64(8<<10 + rng.IntN(16<<10))
		t.Run(fmt.Sprintf("ranks=%d/count=%d/buf=%d", n, count, buf), func(t *testing.T) {
			comms := initAll(t, n, &hcomm.Config{BufferSize: buf})
			inline := collectives.InlineBytes(comms[0])
			// int64 inputs: rank r contributes 2^r at every element (plus a
			// per-element offset that only rank 0 adds), so a sum names the
			// set of ranks whose elements arrived.
			es := int64(8)
			in := func(r int) func(i int) float64 {
				return func(i int) float64 {
					v := float64(int64(1) << r)
					if r == 0 {
						v += float64(i%1000) * 256
					}
					return v
				}
			}
			all := func(i int) float64 { return float64(int64(1)<<n-1) + float64(i%1000)*256 }
			for _, a := range collectives.Algorithms("AllReduce") {
				if !fits(a, count*es, inline) {
					continue
				}
				withBuffers(t, comms,
					func(int) int64 { return count * es }, func(int) int64 { return count * es },
					func(r int) []byte { return encodeAll(hcomm.Int64, int(count), in(r)) },
					func(b *rankBufs) error {
						return collectives.AllReduce(b.send, b.recv, count, hcomm.Int64, hcomm.Sum, b.c, b.s, &collectives.Options{Algorithm: a})
					},
					func(int) []byte { return encodeAll(hcomm.Int64, int(count), all) },
					fmt.Sprintf("AllReduce %v", a))
			}
			per := count / int64(n)
			for _, a := range collectives.Algorithms("ReduceScatter") {
				if !fits(a, per*int64(n)*es, inline) {
					continue
				}
				withBuffers(t, comms,
					func(int) int64 { return per * int64(n) * es }, func(int) int64 { return per * es },
					func(r int) []byte { return encodeAll(hcomm.Int64, int(per)*n, in(r)) },
					func(b *rankBufs) error {
						return collectives.ReduceScatter(b.send, b.recv, per, hcomm.Int64, hcomm.Sum, b.c, b.s, &collectives.Options{Algorithm: a})
					},
					func(r int) []byte {
						return encodeAll(hcomm.Int64, int(per), func(i int) float64 { return all(r*int(per) + i) })
					},
					fmt.Sprintf("ReduceScatter %v", a))
			}
			for _, a := range collectives.Algorithms("AllGather") {
				need := per * es // oneshot: a rank's own block in its hellos
				if a == collectives.AlgoRD {
					need *= int64(n) // rd: its last round carries half the blocks, up to all of them folded
				}
				if !fits(a, need, inline) {
					continue
				}
				withBuffers(t, comms,
					func(int) int64 { return per * es }, func(int) int64 { return per * int64(n) * es },
					func(r int) []byte { return encodeAll(hcomm.Int64, int(per), in(r)) },
					func(b *rankBufs) error {
						return collectives.AllGather(b.send, b.recv, per, hcomm.Int64, b.c, b.s, &collectives.Options{Algorithm: a})
					},
					func(int) []byte {
						return encodeAll(hcomm.Int64, int(per)*n, func(i int) float64 {
							if per == 0 {
								return 0
							}
							return in(i / int(per))(i % int(per))
						})
					},
					fmt.Sprintf("AllGather %v", a))
			}
		})
	}
}
