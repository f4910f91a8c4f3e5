package collectives_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
	"github.com/hcomm-dev/hcomm/internal/leakcheck"
	"github.com/hcomm-dev/hcomm/internal/reduce"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// run calls fn once per rank, concurrently (hcommtest.Each), and fails on
// the first error, naming the rank; a failing rank aborts the others, so that
// those waiting for it return.
func run(t *testing.T, comms []*hcomm.Comm, fn func(c *hcomm.Comm) error) {
	t.Helper()
	hcommtest.Each(t, comms, func(t testing.TB, c *hcomm.Comm) {
		if err := fn(c); err != nil {
			t.Fatal(err)
		}
	})
}

// initAll makes n ranks in this process (hcommtest.New), over cfg.Transport
// (hcomm's choice when empty), destroyed and checked for leaks when the test
// ends.
func initAll(t *testing.T, n int, cfg *hcomm.Config) []*hcomm.Comm {
	t.Helper()
	return hcommtest.Options{Config: cfg}.New(t, n, hcommtest.Auto)
}

// input is rank r's element i: small integers, so that every partial sum and
// product is exact in every type (|sum| <= 16, |prod| <= 256 for 8 ranks), and
// the float64 reference can be compared exactly.
func input(dt hcomm.DataType, r, i int) float64 {
	v := float64((i*7 + r*3 + i/5) % 5)
	switch dt {
	case hcomm.Uint8, hcomm.Uint16, hcomm.Uint32, hcomm.Uint64:
		if v == 0 {
			v = 1
		}
		return v // 1..4; products wrap in the reference as in the kernel
	}
	return v - 2 // -2..2
}

// refReduce is the naive reference: fold the ranks' inputs in float64, then
// cast to the type as C would (wrapping integers).
func refReduce(dt hcomm.DataType, op hcomm.ReduceOp, n, i int) float64 {
	return ref(op, n, func(r int) float64 { return input(dt, r, i) })
}

func toT[T collectives.Number](dt hcomm.DataType, v float64) T {
	switch dt {
	case hcomm.Float16:
		return T(reduce.Float32ToFloat16(float32(v)))
	case hcomm.BFloat16:
		return T(reduce.Float32ToBFloat16(float32(v)))
	}
	return T(v)
}

func wrapRef[T collectives.Number](dt hcomm.DataType, v float64) T {
	switch dt {
	case hcomm.Uint8:
		return T(uint8(uint64(v)))
	case hcomm.Uint16:
		return T(uint16(uint64(v)))
	case hcomm.Uint32:
		return T(uint32(uint64(v)))
	}
	return toT[T](dt, v)
}

func allReduceCase[T collectives.Number](t *testing.T, comms []*hcomm.Comm, count int, op hcomm.ReduceOp, inPlace bool, algo collectives.Algorithm) {
	t.Helper()
	dt := collectives.DataTypeOf[T]()
	n := len(comms)
	want := make([]T, count)
	for i := range want {
		want[i] = wrapRef[T](dt, refReduce(dt, op, n, i))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	run(t, comms, func(c *hcomm.Comm) error {
		send := make([]T, count)
		for i := range send {
			send[i] = toT[T](dt, input(dt, c.Rank(), i))
		}
		recv := send
		if !inPlace {
			recv = make([]T, count)
		}
		if err := collectives.AllReduceSlice(ctx, c, send, recv, op, &collectives.Options{Algorithm: algo}); err != nil {
			return err
		}
		for i := range recv {
			if recv[i] != want[i] {
				return fmt.Errorf("rank %d: %v %v count %d in-place %v algo %v: element %d = %v, want %v",
					c.Rank(), dt, op, count, inPlace, algo, i, recv[i], want[i])
			}
		}
		return nil
	})
}

func broadcastCase[T collectives.Number](t *testing.T, comms []*hcomm.Comm, count, root int, algo collectives.Algorithm) {
	t.Helper()
	dt := collectives.DataTypeOf[T]()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	run(t, comms, func(c *hcomm.Comm) error {
		buf := make([]T, count)
		for i := range buf {
			buf[i] = toT[T](dt, input(dt, c.Rank(), i))
		}
		if err := collectives.BroadcastSlice(ctx, c, buf, root, &collectives.Options{Algorithm: algo}); err != nil {
			return err
		}
		for i := range buf {
			if w := toT[T](dt, input(dt, root, i)); buf[i] != w {
				return fmt.Errorf("rank %d: broadcast %v count %d root %d algo %v: element %d = %v, want %v",
					c.Rank(), dt, count, root, algo, i, buf[i], w)
			}
		}
		return nil
	})
}

// everyType runs f for every data type of the host-slice layer.
func everyType(f func(name string, fn func(t *testing.T, comms []*hcomm.Comm, count int, op hcomm.ReduceOp, inPlace bool, algo collectives.Algorithm), bfn func(t *testing.T, comms []*hcomm.Comm, count, root int, algo collectives.Algorithm))) {
	f("int8", allReduceCase[int8], broadcastCase[int8])
	f("int16", allReduceCase[int16], broadcastCase[int16])
	f("int32", allReduceCase[int32], broadcastCase[int32])
	f("int64", allReduceCase[int64], broadcastCase[int64])
	f("uint8", allReduceCase[uint8], broadcastCase[uint8])
	f("uint16", allReduceCase[uint16], broadcastCase[uint16])
	f("uint32", allReduceCase[uint32], broadcastCase[uint32])
	f("uint64", allReduceCase[uint64], broadcastCase[uint64])
	f("fp16", allReduceCase[collectives.Float16], broadcastCase[collectives.Float16])
	f("bf16", allReduceCase[collectives.BFloat16], broadcastCase[collectives.BFloat16])
	f("fp32", allReduceCase[float32], broadcastCase[float32])
	f("fp64", allReduceCase[float64], broadcastCase[float64])
}

var (
	rankCounts  = []int{1, 2, 3, 4, 5, 8}
	smallCounts = []int{0, 1, 7, 1023}
	bigCount    = largeCount()
)

// TestAllReduceAndBroadcastMatrix: every rank count x small counts x every type
// x every op x in/out of place x every algorithm, and broadcast from every
// root, on one set of communicators per rank count (so that the schedules'
// counters carry across calls as they do in real use). A small HCCL buffer
// forces the ring through many pieces and the one-shot into small slots.
func TestAllReduceAndBroadcastMatrix(t *testing.T) {
	for _, bufSize := range []int64{0, 8 << 10} {
		for _, n := range rankCounts {
			t.Run(fmt.Sprintf("buf=%d/ranks=%d", bufSize, n), func(t *testing.T) {
				comms := initAll(t, n, &hcomm.Config{BufferSize: bufSize})
				inline := collectives.InlineBytes(comms[0])
				everyType(func(name string, ar func(*testing.T, []*hcomm.Comm, int, hcomm.ReduceOp, bool, collectives.Algorithm), bc func(*testing.T, []*hcomm.Comm, int, int, collectives.Algorithm)) {
					if raceEnabled && n != 3 && name != "int8" && name != "bf16" && name != "fp32" && name != "int64" {
						return // one type per element size under the race detector
					}
					for _, count := range smallCounts {
						for _, algo := range algosOf("AllReduce") {
							if !fits(algo, int64(count)*8, inline) || ringAlias(algo, n, hcommtest.Auto) {
								continue
							}
							for _, op := range reduce.Ops() {
								for _, inPlace := range []bool{false, true} {
									ar(t, comms, count, op, inPlace, algo)
								}
							}
						}
						for _, algo := range algosOf("Broadcast") {
							if !fits(algo, int64(count)*8, inline) {
								continue
							}
							for root := 0; root < n; root++ {
								bc(t, comms, count, root, algo)
							}
						}
					}
				})
			})
		}
	}
}

// TestLargeBuffers: 1 Mi + 3 elements, larger than the small HCCL buffer by far.
// Every type and op with 3 ranks (odd, and no divisor of the count); fp32 sum
// and int8 max with every other rank count; broadcast from the last root.
func TestLargeBuffers(t *testing.T) {
	for _, n := range rankCounts {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			comms := initAll(t, n, &hcomm.Config{BufferSize: largeBuffer()})
			if n == 3 {
				everyType(func(name string, ar func(*testing.T, []*hcomm.Comm, int, hcomm.ReduceOp, bool, collectives.Algorithm), bc func(*testing.T, []*hcomm.Comm, int, int, collectives.Algorithm)) {
					for _, op := range reduce.Ops() {
						ar(t, comms, bigCount, op, op == hcomm.Max, collectives.AlgoAuto)
					}
					bc(t, comms, bigCount, n-1, collectives.AlgoAuto)
				})
				return
			}
			allReduceCase[float32](t, comms, bigCount, hcomm.Sum, false, collectives.AlgoAuto)
			allReduceCase[int8](t, comms, bigCount, hcomm.Max, true, collectives.AlgoRing)
			broadcastCase[float32](t, comms, bigCount, n-1, collectives.AlgoAuto)
		})
	}
}

// largeCount is the element count of the "larger than the HCCL buffer"
// tests: 1 Mi + 3, or 64 Ki + 3 under the race detector (ten times slower;
// `make test` also runs the full size without it). largeBuffer is the HCCL
// buffer they use: 16 times smaller than the data either way.
func largeCount() int {
	if raceEnabled {
		return 64<<10 + 3
	}
	return 1<<20 + 3
}

func largeBuffer() int64 {
	if raceEnabled {
		return 4 << 10
	}
	return 64 << 10
}
