package collectives_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/channel/inproc"
	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// hostsOver makes len(hosts) ranks as goroutines over inproc, rank r on the
// host named hosts[r] (hcomm.InitAllOver), so that the two-level schedules
// find several hosts in one process; they are destroyed when t ends.
func hostsOver(t *testing.T, hosts []string, bufSize int64) []*hcomm.Comm {
	t.Helper()
	fab := inproc.NewFabric()
	ds := make([]channel.Dialer, len(hosts))
	for r := range ds {
		ds[r] = inproc.NewDialer(fab)
	}
	comms, err := hcomm.InitAllOver(ds, hosts, &hcomm.Config{BufferSize: bufSize})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range comms {
			c.Destroy()
		}
	})
	return comms
}

// hostShapes are the host layouts of the two-level tests: hosts of equal
// size holding consecutive ranks (the leaders' step is one all-gather),
// hosts of different sizes, ranks dealt to hosts in turn (each host's ranks
// in several runs: an AllGatherV per run), and one host.
var hostShapes = []struct {
	name  string
	hosts func(n int) []string
	ranks []int
}{
	{"blocks", func(n int) []string { return dealt(n, func(r int) int { return r / 2 }) }, []int{6, 16}},
	{"uneven", func(n int) []string { return dealt(n, func(r int) int { return min(r/3, 2) }) }, []int{5, 11}},
	{"dealt", func(n int) []string { return dealt(n, func(r int) int { return r % 3 }) }, []int{3, 11}},
	{"onehost", func(n int) []string { return dealt(n, func(int) int { return 0 }) }, []int{5}},
}

// eachHostShape runs body in a subtest for every shape and rank count of
// hostShapes (up to 6 ranks under -race), each on fresh communicators.
func eachHostShape(t *testing.T, body func(t *testing.T, shape string, n int, comms []*hcomm.Comm)) {
	for _, sh := range hostShapes {
		for _, n := range sh.ranks {
			if raceEnabled && n > 6 {
				continue
			}
			t.Run(fmt.Sprintf("%s/ranks=%d", sh.name, n), func(t *testing.T) {
				body(t, sh.name, n, hostsOver(t, sh.hosts(n), 1<<20))
			})
		}
	}
}

func dealt(n int, host func(r int) int) []string {
	hs := make([]string, n)
	for r := range hs {
		hs[r] = fmt.Sprintf("h%d", host(r))
	}
	return hs
}

// TestHierAllGatherBroadcast runs the two-level all-gather and broadcast,
// forced, against the reference over every host shape of hostShapes, at
// counts of 0, 1, 7 and more than a pipeline piece, in and out of place,
// with every root for the broadcast (a leader and not), every data type at
// one shape; and checks that the selector picks the two-level forms across
// hosts above the inline size, and that HCCL_ALGO=allgather=level1:hier
// forces it.
func TestHierAllGatherBroadcast(t *testing.T) {
	defer collectives.SetPieceOverride(1 << 10)()
	eachHostShape(t, func(t *testing.T, shape string, n int, comms []*hcomm.Comm) {
		types := []hcomm.DataType{hcomm.Float32}
		if shape == "uneven" && n == 5 {
			types = dtypes()
		}
		for _, dt := range types {
			for _, count := range []int64{0, 1, 7, 700} {
				m := matrixCase{dt: dt, op: hcomm.Sum, count: count, root: int(count) % n}
				testAllGather(t, comms, m, collectives.AlgoHier, count%2 == 1)
				broadcastRaw(t, comms, m, collectives.AlgoHier)
			}
		}
		for root := 0; root < n; root++ {
			broadcastRaw(t, comms, matrixCase{dt: hcomm.Int8, count: 33, root: root}, collectives.AlgoHier)
		}
		if n > 5 {
			m := matrixCase{dt: hcomm.Float32, count: 100 << 10, root: n - 1}
			testAllGather(t, comms, m, collectives.AlgoAuto, false)
			broadcastRaw(t, comms, m, collectives.AlgoAuto)
		}
	})
}

// TestHierEnv: HCCL_ALGO=allgather=level0:NA;level1:hier puts AllGather
// on the two-level schedule (AllGatherV, which has no two-level form, stays
// on direct), broadcast=…hier and allreduce=…hier the broadcast and the
// all-reduce; the levels' own calls pick their algorithms themselves (the
// all-reduce's leaders, forced onto hier too, called the two-level
// all-reduce again and again, each time on a sub-communicator of the last,
// until the channels' keys grew too long).
func TestHierEnv(t *testing.T) {
	defer collectives.SetPieceOverride(1 << 10)()
	t.Setenv("HCCL_ALGO", "allgather=level0:NA;level1:hier/broadcast=level0:NA;level1:hier/allreduce=level0:NA;level1:hier")
	comms := hostsOver(t, dealt(6, func(r int) int { return r / 3 }), 1<<20)
	for _, count := range []int64{5, 3000} {
		m := matrixCase{dt: hcomm.Float32, op: hcomm.Sum, count: count, root: 4}
		allReduceRaw(t, comms, m, collectives.AlgoAuto, false)
		testAllGather(t, comms, m, collectives.AlgoAuto, false)
		broadcastRaw(t, comms, m, collectives.AlgoAuto)
		testVCollectives(t, comms, m)
	}
	// AllGatherV forced onto hier is refused, naming it.
	s, err := comms[0].Device().CreateStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	err = collectives.AllGatherV(0, 0, 0, make([]int64, 6), make([]int64, 6), hcomm.Float32, comms[0], s, &collectives.Options{Algorithm: collectives.AlgoHier})
	if err == nil || !strings.Contains(err.Error(), "hier") {
		t.Errorf("AllGatherV forced onto hier: %v, want an error naming hier", err)
	}
}

// TestHierReduceScatter runs the two-level reduce-scatter, forced, against
// the reference over every host shape of hostShapes, in and out of place,
// every data type and op at one shape; a call too large for the leaders'
// working space in the HCCL buffer runs the flat ring and is as correct;
// and HCCL_ALGO=reducescatter=level1:hier forces it.
func TestHierReduceScatter(t *testing.T) {
	defer collectives.SetPieceOverride(1 << 10)()
	eachHostShape(t, func(t *testing.T, shape string, n int, comms []*hcomm.Comm) {
		types, ops := []hcomm.DataType{hcomm.Float32}, []hcomm.ReduceOp{hcomm.Sum}
		if shape == "uneven" && n == 5 {
			types, ops = dtypes(), []hcomm.ReduceOp{hcomm.Sum, hcomm.Prod, hcomm.Max, hcomm.Min}
		}
		for _, dt := range types {
			for _, op := range ops {
				for _, count := range []int64{0, 1, 7, 700, 40000} { // 40000: more than the working space
					m := matrixCase{dt: dt, op: op, count: count}
					testReduceScatter(t, comms, m, collectives.AlgoHier, count%2 == 1)
				}
			}
		}
	})
	t.Run("env", func(t *testing.T) {
		t.Setenv("HCCL_ALGO", "reducescatter=level0:NA;level1:hier")
		comms := hostsOver(t, dealt(6, func(r int) int { return r / 2 }), 1<<20)
		for _, count := range []int64{5, 3000} {
			m := matrixCase{dt: hcomm.Float32, op: hcomm.Sum, count: count}
			testReduceScatter(t, comms, m, collectives.AlgoAuto, false)
			testVCollectives(t, comms, m)
		}
	})
}

// TestHierAlltoAll runs the two-level all-to-all, forced, against the
// reference over every host shape of hostShapes: where hosts hold equal
// runs of consecutive ranks it runs (gather, pack, the leaders' exchange,
// unpack, scatter), elsewhere — hosts of different sizes, ranks dealt in
// turn, one host — and for a call too large for the leaders' working space
// (40000 elements a block) the flat schedule runs instead, as correct;
// every data type at one shape; and HCCL_ALGO=alltoall=level1:hier puts
// AlltoAll on it (AlltoAllV, which has no two-level form, stays pairwise).
func TestHierAlltoAll(t *testing.T) {
	defer collectives.SetPieceOverride(1 << 10)()
	eachHostShape(t, func(t *testing.T, shape string, n int, comms []*hcomm.Comm) {
		types := []hcomm.DataType{hcomm.Float32}
		if shape == "blocks" && n == 6 {
			types = dtypes()
		}
		for _, dt := range types {
			for _, count := range []int64{0, 1, 7, 700, 40000} {
				if count == 40000 && dt.Size() > 4 {
					continue // the send buffers alone: 16 ranks × 40000 × 8 bytes
				}
				testAlltoAll(t, comms, matrixCase{dt: dt, count: count}, collectives.AlgoHier)
			}
		}
	})
	t.Run("env", func(t *testing.T) {
		t.Setenv("HCCL_ALGO", "alltoall=level0:NA;level1:hier")
		comms := hostsOver(t, dealt(8, func(r int) int { return r / 4 }), 1<<20)
		for _, count := range []int64{5, 3000} {
			m := matrixCase{dt: hcomm.Float32, op: hcomm.Sum, count: count}
			testAlltoAll(t, comms, m, collectives.AlgoAuto)
			testVCollectives(t, comms, m)
		}
	})
}
