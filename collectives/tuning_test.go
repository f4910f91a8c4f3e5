package collectives_test

import (
	"fmt"
	"testing"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
	"github.com/hcomm-dev/hcomm/internal/units"
)

// BenchmarkTuning measures what the tuning table (collectives/tuning.go)
// decides between: every collective the table has rows for, over each
// transport (ranks as goroutines), with 2 and 4 ranks, at the mid sizes
// (64 KiB to 4 MiB, nccl-tests' size: the total a rank sends or receives),
// every algorithm the collective has, and pipeline pieces of the table's
// choice ("piece=table") and of fixed sizes. BENCHMARKS.md ("Retuning the
// selector") gives the command lines and how to read the result into the
// table.
func BenchmarkTuning(b *testing.B) {
	trs := []hcommtest.Transport{hcommtest.Inproc, hcommtest.Shm, hcommtest.TCP}
	for _, op := range benchOps {
		if op.name == "Reduce" {
			continue
		}
		for _, tr := range trs {
			for _, n := range []int{2, 4} {
				for _, size := range []int64{64 << 10, 256 << 10, 1 << 20, 4 << 20} {
					for _, a := range collectives.Algorithms(op.name) {
						for _, piece := range []int64{0, 64 << 10, 128 << 10, 256 << 10, 512 << 10} {
							name := "table"
							if piece > 0 {
								name = units.SizeIEC(piece)
							}
							b.Run(fmt.Sprintf("%s/%v/ranks=%d/%s/%v/piece=%s", op.name, tr, n, units.SizeIEC(size), a, name), func(b *testing.B) {
								if a == collectives.AlgoOneShot && size > 64<<10 {
									b.Skip("larger than the one-shot slots")
								}
								if a == collectives.AlgoOneShot && piece > 0 {
									b.Skip("the one-shot path has no pieces")
								}
								defer collectives.SetPieceOverride(piece)()
								benchCollOn(b, n, tr, size, op.factor(n), func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, count int64) error {
									return op.call(c, s, send, recv, count*4, n, a)
								})
							})
						}
					}
				}
			}
		}
	}
}
