package collectives_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
	"github.com/hcomm-dev/hcomm/internal/memcopy"
	"github.com/hcomm-dev/hcomm/internal/units"
)

// benchColl measures one collective with nccl-tests' conventions: every rank
// enqueues b.N back-to-back calls on its stream and synchronizes once; time per
// call = elapsed / b.N; algbw = size / time; busbw = algbw * factor.
func benchColl(b *testing.B, n int, size int64, factor float64, call func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, count int64) error) {
	benchCollOn(b, n, hcommtest.Auto, size, factor, call)
}

// benchCollOn is benchColl over transport tr.
func benchCollOn(b *testing.B, n int, tr hcommtest.Transport, size int64, factor float64, call func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, count int64) error) {
	comms := hcommtest.New(b, n, tr)
	type rank struct {
		s          *device.Stream
		send, recv device.Ptr
	}
	rs := make([]rank, n)
	for i, c := range comms {
		s, _ := c.Device().CreateStream()
		send, _ := c.Device().Malloc(max(size, 8))
		recv, _ := c.Device().Malloc(max(size, 8))
		c.Device().Memset(send, size, 1)
		rs[i] = rank{s, send, recv}
	}
	count := size / 4
	iter := func(iters int) {
		hcommtest.Each(b, comms, func(t testing.TB, c *hcomm.Comm) {
			r := rs[c.Rank()]
			for k := 0; k < iters; k++ {
				if err := call(c, r.s, r.send, r.recv, count); err != nil {
					t.Fatal(err)
				}
			}
			if err := r.s.SynchronizeWithTimeout(-1); err != nil {
				t.Fatal(err)
			}
		})
	}
	// Warm-up: channel setup, page faults, and the kernel settling after the
	// previous benchmark freed its memory (without it the first
	// sub-benchmark of a group reads slow).
	for start := time.Now(); time.Since(start) < 200*time.Millisecond; {
		iter(2)
	}
	b.SetBytes(size)
	b.ResetTimer()
	iter(b.N)
	b.StopTimer()
	sec := b.Elapsed().Seconds() / float64(b.N)
	b.ReportMetric(sec*1e6, "µs/op")
	b.ReportMetric(float64(size)/sec/1e9, "algbw_GB/s")
	b.ReportMetric(float64(size)/sec/1e9*factor, "busbw_GB/s")
	for _, r := range rs {
		r.s.Destroy()
	}
}

var benchSizes = []int64{8, 4 << 10, 1 << 20, 64 << 20}

func BenchmarkAllReduce(b *testing.B) {
	for _, n := range []int{2, 4} {
		for _, size := range benchSizes {
			b.Run(fmt.Sprintf("ranks=%d/%s", n, units.SizeIEC(size)), func(b *testing.B) {
				benchColl(b, n, size, 2*float64(n-1)/float64(n), func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, count int64) error {
					return collectives.AllReduce(send, recv, count, hcomm.Float32, hcomm.Sum, c, s, nil)
				})
			})
		}
	}
}

func BenchmarkBroadcast(b *testing.B) {
	for _, n := range []int{2, 4} {
		for _, size := range benchSizes {
			b.Run(fmt.Sprintf("ranks=%d/%s", n, units.SizeIEC(size)), func(b *testing.B) {
				benchColl(b, n, size, 1, func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, count int64) error {
					return collectives.Broadcast(send, count, hcomm.Float32, 0, c, s, nil)
				})
			})
		}
	}
}

// benchOp is one collective as nccl-tests measures it: size is S, the
// per-rank buffer that names the row (the whole output for all-gather, the
// whole input for reduce-scatter and all-to-all), and factor turns algbw into
// busbw.
type benchOp struct {
	name   string
	factor func(n int) float64
	call   func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, size int64, n int, algo collectives.Algorithm) error
}

var benchOps = []benchOp{
	{"AllReduce", func(n int) float64 { return 2 * float64(n-1) / float64(n) },
		func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, size int64, n int, a collectives.Algorithm) error {
			return collectives.AllReduce(send, recv, size/4, hcomm.Float32, hcomm.Sum, c, s, &collectives.Options{Algorithm: a})
		}},
	{"Broadcast", func(int) float64 { return 1 },
		func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, size int64, n int, a collectives.Algorithm) error {
			return collectives.Broadcast(send, size/4, hcomm.Float32, 0, c, s, &collectives.Options{Algorithm: a})
		}},
	{"Reduce", func(int) float64 { return 1 },
		func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, size int64, n int, a collectives.Algorithm) error {
			return collectives.Reduce(send, recv, size/4, hcomm.Float32, hcomm.Sum, 0, c, s, &collectives.Options{Algorithm: a})
		}},
	{"AllGather", func(n int) float64 { return float64(n-1) / float64(n) },
		func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, size int64, n int, a collectives.Algorithm) error {
			return collectives.AllGather(send, recv, size/4/int64(n), hcomm.Float32, c, s, &collectives.Options{Algorithm: a})
		}},
	{"ReduceScatter", func(n int) float64 { return float64(n-1) / float64(n) },
		func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, size int64, n int, a collectives.Algorithm) error {
			return collectives.ReduceScatter(send, recv, size/4/int64(n), hcomm.Float32, hcomm.Sum, c, s, &collectives.Options{Algorithm: a})
		}},
	{"AlltoAll", func(n int) float64 { return float64(n-1) / float64(n) },
		func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, size int64, n int, a collectives.Algorithm) error {
			bl := size / 4 / int64(n)
			return collectives.AlltoAll(send, bl, hcomm.Float32, recv, bl, hcomm.Float32, c, s, &collectives.Options{Algorithm: a})
		}},
}

// benchCollSizes are BenchmarkCollectives' sizes.
var benchCollSizes = []int64{4 << 10, 1 << 20, 8 << 20, 64 << 20}

// BenchmarkCollectives measures every collective with every algorithm it has
// (and the selector's choice, "auto") at 4 KiB, 1 MiB and 64 MiB for 2 and 4
// ranks: the figures behind BENCHMARKS.md's per-algorithm table.
//
//	go test -run XXX -bench 'Collectives/AllGather' -benchtime 20x ./collectives
func BenchmarkCollectives(b *testing.B) {
	for _, op := range benchOps {
		algos := append([]collectives.Algorithm{collectives.AlgoAuto}, collectives.Algorithms(op.name)...)
		for _, n := range []int{2, 4} {
			for _, size := range benchCollSizes {
				for _, a := range algos {
					b.Run(fmt.Sprintf("%s/ranks=%d/%s/%v", op.name, n, units.SizeIEC(size), a), func(b *testing.B) {
						if (a == collectives.AlgoOneShot || a == collectives.AlgoRD) && size/int64(n) > 64<<10 {
							b.Skipf("larger than the %v hellos carry", a) // both move their data inline in hellos
						}
						benchColl(b, n, size, op.factor(n), func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, count int64) error {
							return op.call(c, s, send, recv, count*4, n, a)
						})
					})
				}
			}
		}
	}
}

// BenchmarkAlltoAllFloor is what any all-to-all costs here, without a
// library: 4 goroutines (the ranks), each copying block r of every rank's
// 64 MiB input, its own included, into its output with hcomm's streaming
// copy. Nothing waits on anything: it is the machine's copy rate applied to
// the bytes an out-of-place all-to-all must write, the ceiling for
// BenchmarkCollectives' AlltoAll (BENCHMARKS.md).
//
//	go test -run XXX -bench AlltoAllFloor -benchtime 20x ./collectives
func BenchmarkAlltoAllFloor(b *testing.B) {
	copyFloor(b, func(r, q, blk int) (int, int) { return q * blk, r * blk })
}

// BenchmarkAllGatherFloor is BenchmarkAlltoAllFloor for the all-gather of
// 64 MiB among 4 ranks: each goroutine copies every rank's whole 16 MiB
// input, its own included, into its output — the same bytes written, but
// every input read by all four, who may find it in a shared cache. The
// ceiling of an all-gather whose ranks read their peers' inputs (between
// processes of a host, below shmPushMin); the pushing all-gather (lent.go's
// lendPush), which reads each input once for its four copies, runs past it
// (stop 43: 109–223 % of it, launch by launch).
//
//	go test -run XXX -bench AllGatherFloor -benchtime 20x ./collectives
func BenchmarkAllGatherFloor(b *testing.B) {
	copyFloor(b, func(r, q, blk int) (int, int) { return q * blk, 0 })
}

// copyFloor times 4 goroutines, each copying, for every rank q from its own
// on, blk bytes of q's 64 MiB buffer at from into its own output at to
// (at(r, q, blk) gives to and from), and reports the bus bandwidth that
// an out-of-place collective moving those bytes would have.
func copyFloor(b *testing.B, at func(r, q, blk int) (to, from int)) {
	const n, size = 4, 64 << 20
	blk := size / n
	send, recv := make([][]byte, n), make([][]byte, n)
	for r := range send {
		send[r], recv[r] = make([]byte, size), make([]byte, size)
		for i := range send[r] {
			send[r][i] = byte(i + r)
		}
		copy(recv[r], send[r]) // fault the pages in
	}
	b.SetBytes(size)
	b.ResetTimer()
	for range b.N {
		var wg sync.WaitGroup
		for r := 0; r < n; r++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for p := 0; p < n; p++ {
					q := (r + p) % n
					to, from := at(r, q, blk)
					memcopy.Stream(recv[r][to:to+blk], send[q][from:from+blk])
				}
			}()
		}
		wg.Wait()
	}
	b.StopTimer()
	sec := b.Elapsed().Seconds() / float64(b.N)
	b.ReportMetric(float64(size)/sec/1e9*float64(n-1)/float64(n), "busbw_GB/s")
}
