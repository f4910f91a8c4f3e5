package collectives_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
)

// TestSteeredHellosOverTCP: over tcp the one-shot all-to-all's and
// all-gather's hellos have their blocks steered straight into recv as they
// arrive, and the recursive-doubling all-gather's into the rank's own slot
// (steer.go); the calls stay exact: blocks below, at and above the
// smallest steered payload, odd ones, every data type's width, in place
// and out, back to back with each other and with calls that steer nothing,
// 2 to 5 ranks (3 and 5: the butterfly's folds). Steering is counted: a
// run in which no block landed in place does not test it.
func TestSteeredHellosOverTCP(t *testing.T) {
	for _, n := range []int{2, 3, 4, 5} {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			comms := hcommtest.Options{}.New(t, n, hcommtest.TCP)
			inline := collectives.InlineBytes(comms[0])
			before, rdLanded := collectives.SteersLanded(), int64(0)
			for _, dt := range []hcomm.DataType{hcomm.Int8, hcomm.Float16, hcomm.Float32, hcomm.Float64} {
				es := int64(dt.Size())
				for _, bytes := range []int64{collectives.SteerMin - es, collectives.SteerMin, collectives.SteerMin + 7*es, 3*collectives.SteerMin + 5*es, inline} {
					m := matrixCase{dt: dt, op: hcomm.Sum, count: bytes / es, inline: inline}
					testAlltoAll(t, comms, m, collectives.AlgoOneShot)
					testAllGather(t, comms, m, collectives.AlgoOneShot, false)
					testAllGather(t, comms, m, collectives.AlgoOneShot, true)
					testAlltoAll(t, comms, m, collectives.AlgoAuto)
					rd := collectives.SteersLanded()
					testAllGather(t, comms, m, collectives.AlgoRD, false)
					testAllGather(t, comms, m, collectives.AlgoRD, true)
					rdLanded += collectives.SteersLanded() - rd
				}
			}
			t.Logf("%d payloads steered into place (inline %d)", collectives.SteersLanded()-before, inline)
			if collectives.SteersLanded() == before {
				t.Fatal("no hello's payload was steered into place")
			}
			if rdLanded == 0 {
				t.Fatal("no recursive-doubling all-gather's blocks were steered into place")
			}
		})
	}
}

// TestSteeredMismatch: a rank whose one-shot all-gather meets its peers'
// one-shot all-to-alls of the same block size writes a hello of exactly
// the length their steers wait for; the block may land in their receive
// buffers, but every rank still fails with ErrMismatch naming the odd call.
func TestSteeredMismatch(t *testing.T) {
	const count = 2 * collectives.SteerMin / 4 // float32 blocks of 2·SteerMin bytes
	oneShot := &collectives.Options{Algorithm: collectives.AlgoOneShot}
	comms := hcommtest.Options{Config: &hcomm.Config{ExecTimeout: 20 * time.Second}}.New(t, 3, hcommtest.TCP)
	before := collectives.SteersLanded()
	// Warm up: the same all-to-all on every rank, steered.
	first := func(c *hcomm.Comm, s *device.Stream, buf device.Ptr) error {
		for i := 0; i < 20; i++ {
			if err := collectives.AlltoAll(buf, count, hcomm.Float32, buf.Add(1<<20), count, hcomm.Float32, c, s, oneShot); err != nil {
				return err
			}
		}
		return nil
	}
	runMismatchAfter(t, comms, 1, mismatchCase{
		name: "steered",
		odd: func(c *hcomm.Comm, s *device.Stream, buf device.Ptr) error {
			return collectives.AllGather(buf, buf.Add(1<<20), count, hcomm.Float32, c, s, oneShot)
		},
		usual: func(c *hcomm.Comm, s *device.Stream, buf device.Ptr) error {
			return collectives.AlltoAll(buf, count, hcomm.Float32, buf.Add(1<<20), count, hcomm.Float32, c, s, oneShot)
		},
		want: "AllGather",
	}, false, first)
	if collectives.SteersLanded() == before {
		t.Fatal("no all-to-all's block was steered: this test does not test a steered mismatch")
	}
}
