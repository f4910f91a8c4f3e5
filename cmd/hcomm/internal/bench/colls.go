package bench

import (
	"fmt"
	"sort"
	"strings"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// coll is one benchmarkable collective: how a row's size maps to buffers,
// how to run it, what every output element must hold, and its busbw factor.
type coll struct {
	name    string
	reduces bool // has a reduction op (the redop column)
	rooted  bool // has a root (the root column)
	// inPlaceOnly: the API has a single buffer (HcclBroadcast), so the
	// out-of-place columns are N/A; outOfPlaceOnly: in place has no meaning
	// (send/recv) or is not supported, so the in-place columns are N/A.
	inPlaceOnly, outOfPlaceOnly bool
	// onlyRoot: only the root's output is defined (reduce, gather).
	onlyRoot bool
	// factor is busbw / algbw on n ranks (nccl-tests' PERFORMANCE.md).
	factor func(n int) float64
	// counts maps the -b..-e size of a row to the elements a rank sends and
	// receives in all, and the size printed (nccl-tests' conventions: the
	// size of allgather and gather is what is gathered, that of
	// reducescatter, alltoall and scatter what is sent).
	counts func(size int64, es, n int) (send, recv int64, printed int64)
	// inPlace gives, for the in-place call, where send and recv start
	// (elements) inside one buffer: rank*send for allgather's send, etc.
	inPlace func(rank int, send, recv int64) (sendOff, recvOff int64)
	// run enqueues one call on s.
	run func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, sendCount, recvCount int64, dt hcomm.DataType, op hcomm.ReduceOp, root int) error
	// expect returns output element i of rank r, given in(rank, j) = element
	// j of a rank's input (sendCount elements) and fold(values) = the
	// reduction of values in rank order.
	expect func(r, n int, i int64, root int, sendCount int64, in func(rank int, j int64) value, fold func([]value) value) value
}

func ringFactor(n int) float64 { return float64(n-1) / float64(n) }
func one(int) float64          { return 1 }

// same: one count for send and recv (allreduce, broadcast, reduce, send/recv).
func same(size int64, es, _ int) (int64, int64, int64) {
	c := size / int64(es)
	return c, c, c * int64(es)
}

// gathered: each rank sends 1/n of the row, and receives the whole row.
func gathered(size int64, es, n int) (int64, int64, int64) {
	c := size / int64(es) / int64(n)
	return c, c * int64(n), c * int64(n) * int64(es)
}

// scattered: each rank sends the whole row, and receives 1/n of it.
func scattered(size int64, es, n int) (int64, int64, int64) {
	c := size / int64(es) / int64(n)
	return c * int64(n), c, c * int64(n) * int64(es)
}

// whole: each rank sends and receives the whole row (alltoall).
func whole(size int64, es, n int) (int64, int64, int64) {
	c := size / int64(es) / int64(n) * int64(n)
	return c, c, c * int64(es)
}

func samePlace(int, int64, int64) (int64, int64) { return 0, 0 }

func foldAll(n int, in func(int, int64) value, fold func([]value) value, j int64) value {
	vs := make([]value, n)
	for p := range vs {
		vs[p] = in(p, j)
	}
	return fold(vs)
}

// colls lists the collectives package's collectives by bench name.
var colls = map[string]*coll{
	"allreduce": {
		name: "allreduce", reduces: true,
		factor: func(n int) float64 { return 2 * float64(n-1) / float64(n) },
		counts: same, inPlace: samePlace,
		run: func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, sc, _ int64, dt hcomm.DataType, op hcomm.ReduceOp, _ int) error {
			return collectives.AllReduce(send, recv, sc, dt, op, c, s, nil)
		},
		expect: func(_, n int, i int64, _ int, _ int64, in func(int, int64) value, fold func([]value) value) value {
			return foldAll(n, in, fold, i)
		},
	},
	"broadcast": {
		name: "broadcast", rooted: true, inPlaceOnly: true,
		factor: one, counts: same, inPlace: samePlace,
		run: func(c *hcomm.Comm, s *device.Stream, _, recv device.Ptr, _, rc int64, dt hcomm.DataType, _ hcomm.ReduceOp, root int) error {
			return collectives.Broadcast(recv, rc, dt, root, c, s, nil)
		},
		expect: func(_, _ int, i int64, root int, _ int64, in func(int, int64) value, _ func([]value) value) value {
			return in(root, i)
		},
	},
	"reduce": {
		name: "reduce", reduces: true, rooted: true, onlyRoot: true,
		factor: one, counts: same, inPlace: samePlace,
		run: func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, sc, _ int64, dt hcomm.DataType, op hcomm.ReduceOp, root int) error {
			return collectives.Reduce(send, recv, sc, dt, op, root, c, s, nil)
		},
		expect: func(_, n int, i int64, _ int, _ int64, in func(int, int64) value, fold func([]value) value) value {
			return foldAll(n, in, fold, i)
		},
	},
	"allgather": {
		name: "allgather", factor: ringFactor, counts: gathered,
		inPlace: func(r int, sc, _ int64) (int64, int64) { return int64(r) * sc, 0 },
		run: func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, sc, _ int64, dt hcomm.DataType, _ hcomm.ReduceOp, _ int) error {
			return collectives.AllGather(send, recv, sc, dt, c, s, nil)
		},
		expect: func(_, _ int, i int64, _ int, sc int64, in func(int, int64) value, _ func([]value) value) value {
			return in(int(i/sc), i%sc)
		},
	},
	"reducescatter": {
		name: "reducescatter", reduces: true, factor: ringFactor, counts: scattered,
		inPlace: func(r int, _, rc int64) (int64, int64) { return 0, int64(r) * rc },
		run: func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, _, rc int64, dt hcomm.DataType, op hcomm.ReduceOp, _ int) error {
			return collectives.ReduceScatter(send, recv, rc, dt, op, c, s, nil)
		},
		expect: func(r, n int, i int64, _ int, sc int64, in func(int, int64) value, fold func([]value) value) value {
			return foldAll(n, in, fold, int64(r)*(sc/int64(n))+i)
		},
	},
	"alltoall": {
		name: "alltoall", factor: ringFactor, counts: whole, outOfPlaceOnly: true, inPlace: samePlace,
		run: func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, sc, _ int64, dt hcomm.DataType, _ hcomm.ReduceOp, _ int) error {
			per := sc / int64(c.Size())
			return collectives.AlltoAll(send, per, dt, recv, per, dt, c, s, nil)
		},
		expect: func(r, n int, i int64, _ int, sc int64, in func(int, int64) value, _ func([]value) value) value {
			per := sc / int64(n)
			return in(int(i/per), int64(r)*per+i%per)
		},
	},
	"scatter": {
		name: "scatter", rooted: true, factor: ringFactor, counts: scattered,
		inPlace: func(r int, _, rc int64) (int64, int64) { return 0, int64(r) * rc },
		run: func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, _, rc int64, dt hcomm.DataType, _ hcomm.ReduceOp, root int) error {
			return collectives.Scatter(send, recv, rc, dt, root, c, s, nil)
		},
		expect: func(r, n int, i int64, root int, sc int64, in func(int, int64) value, _ func([]value) value) value {
			return in(root, int64(r)*(sc/int64(n))+i)
		},
	},
	"gather": {
		name: "gather", rooted: true, onlyRoot: true, factor: ringFactor, counts: gathered,
		inPlace: func(r int, sc, _ int64) (int64, int64) { return int64(r) * sc, 0 },
		run: func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, sc, _ int64, dt hcomm.DataType, _ hcomm.ReduceOp, root int) error {
			return collectives.Gather(send, recv, sc, dt, root, c, s, nil)
		},
		expect: func(_, _ int, i int64, _ int, sc int64, in func(int, int64) value, _ func([]value) value) value {
			return in(int(i/sc), i%sc)
		},
	},
	"sendrecv": {
		name: "sendrecv", factor: one, counts: same, outOfPlaceOnly: true, inPlace: samePlace,
		run: func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, sc, rc int64, dt hcomm.DataType, _ hcomm.ReduceOp, _ int) error {
			n, me := c.Size(), c.Rank()
			return collectives.BatchSendRecv([]collectives.SendRecvItem{
				{Type: collectives.SendItem, Buf: send, Count: sc, DataType: dt, RemoteRank: (me + 1) % n},
				{Type: collectives.RecvItem, Buf: recv, Count: rc, DataType: dt, RemoteRank: (me + n - 1) % n},
			}, c, s)
		},
		expect: func(r, n int, i int64, _ int, _ int64, in func(int, int64) value, _ func([]value) value) value {
			return in((r+n-1)%n, i)
		},
	},
}

func collNames() string {
	var ns []string
	for n := range colls {
		ns = append(ns, n)
	}
	sort.Strings(ns)
	return strings.Join(append(ns, "p2p"), ", ")
}

func lookupColl(name string) (*coll, error) {
	c, ok := colls[strings.ToLower(name)]
	if !ok {
		return nil, fmt.Errorf("unknown collective %q; available: %s", name, collNames())
	}
	return c, nil
}
