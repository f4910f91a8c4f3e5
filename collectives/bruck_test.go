package collectives_test

import (
	"fmt"
	"testing"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
)

// TestAlltoAllBruck runs Bruck's all-to-all, forced, against the reference
// at rank counts that are and are not powers of two, on both sides of
// helloFullMax: blocks of 0, 1 and 7 elements, which pack several to a piece,
// and blocks larger than a piece (a small piece override), which a round
// cuts across; every data type at 5 ranks. Calls of several sizes on one set
// of communicators, with pairwise calls in between, keep the pipes in step.
func TestAlltoAllBruck(t *testing.T) {
	defer collectives.SetPieceOverride(256)()
	for _, n := range []int{2, 3, 5, 6, 11, 16} {
		if raceEnabled && n != 5 && n != 11 {
			continue
		}
		t.Run(fmt.Sprintf("inproc/ranks=%d", n), func(t *testing.T) {
			comms := hcommtest.Options{Config: &hcomm.Config{BufferSize: 256 << 10}}.New(t, n, hcommtest.Inproc)
			types := []hcomm.DataType{hcomm.Float32, hcomm.Int8}
			if n == 5 {
				types = dtypes()
			}
			for _, dt := range types {
				for _, count := range []int64{0, 1, 7, 100} { // 100 float32: 400 bytes, more than a piece
					m := matrixCase{dt: dt, op: hcomm.Sum, count: count}
					testAlltoAll(t, comms, m, collectives.AlgoBruck)
					testAlltoAll(t, comms, m, collectives.AlgoPairwise)
				}
			}
		})
	}
	// At the default piece a round's blocks go in one piece, from the send
	// and recv buffers (which the device may place end to end).
	restore := collectives.SetPieceOverride(0)
	defer restore()
	comms := hcommtest.Options{Config: &hcomm.Config{BufferSize: 16 << 20}}.New(t, 16, hcommtest.Inproc)
	for _, count := range []int64{4, 64, 1000} {
		testAlltoAll(t, comms, matrixCase{dt: hcomm.Float32, op: hcomm.Sum, count: count}, collectives.AlgoBruck)
	}
}

// TestAlltoAllBruckEnv: HCCL_ALGO=alltoall=level0:NA;level1:bruck puts
// AlltoAll on Bruck's schedule (and leaves AlltoAllV, which has no Bruck,
// on pairwise), over inproc at 11 ranks and over tcp at 9.
func TestAlltoAllBruckEnv(t *testing.T) {
	t.Setenv("HCCL_ALGO", "alltoall=level0:NA;level1:bruck")
	for _, tc := range []struct {
		tr hcommtest.Transport
		n  int
	}{{hcommtest.Inproc, 11}, {hcommtest.TCP, 9}} {
		t.Run(fmt.Sprintf("%v/ranks=%d", tc.tr, tc.n), func(t *testing.T) {
			comms := hcommtest.Options{Config: &hcomm.Config{BufferSize: 256 << 10}}.New(t, tc.n, tc.tr)
			for _, count := range []int64{3, 5000} {
				m := matrixCase{dt: hcomm.Float32, op: hcomm.Sum, count: count}
				testAlltoAll(t, comms, m, collectives.AlgoAuto)
				testVCollectives(t, comms, m)
			}
		})
	}
}
