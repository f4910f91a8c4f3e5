package collectives_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
	"github.com/hcomm-dev/hcomm/internal/units"
)

// The determinism tests run 4 ranks with a small HCCL buffer (64 KiB: pieces
// of about 9 KiB, inline payloads up to about 4 KiB), so that a few thousand
// elements cross several blocks and pieces of every schedule.
const (
	detRanks = 4
	detBuf   = 64 << 10
	detCount = 20011 // elements of the large case: 3 blocks of the float32 ring, an uneven last one
)

// detTransports are the transports of the determinism tests: every one this
// machine runs, ranks as goroutines.
func detTransports() []hcommtest.Transport {
	var out []hcommtest.Transport
	for _, tr := range hcommtest.Transports() {
		if !tr.Processes {
			out = append(out, tr)
		}
	}
	return out
}

// detInputs returns rank r's count elements of dt from seed: random signs,
// mantissas and exponents over 2^-12..2^12, so that the sum of the four
// ranks' elements rounds differently in almost every order.
func detInputs(dt hcomm.DataType, seed uint64, r, count int) []byte {
	rng := rand.New(rand.NewPCG(seed, uint64(r)))
	out := make([]byte, count*dt.Size())
	for i := 0; i < count; i++ {
		f := float32((rng.Float64()*2 - 1) * math.Ldexp(1, rng.IntN(25)-12))
		switch dt {
		case hcomm.Float32:
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(f))
		case hcomm.BFloat16:
			binary.LittleEndian.PutUint16(out[2*i:], toBF16(f))
		}
	}
	return out
}

// toBF16 rounds f to bfloat16, to nearest with ties to even (f is never NaN
// here).
func toBF16(f float32) uint16 {
	b := math.Float32bits(f)
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// canonical is the strict level's result, computed here independently of
// hcomm: every element summed in rank order, ((x0 + x1) + x2) + x3, each
// step rounded to the type.
func canonical(dt hcomm.DataType, in [][]byte, count int) []byte {
	out := make([]byte, count*dt.Size())
	for i := 0; i < count; i++ {
		switch dt {
		case hcomm.Float32:
			acc := math.Float32frombits(binary.LittleEndian.Uint32(in[0][4*i:]))
			for _, x := range in[1:] {
				acc += math.Float32frombits(binary.LittleEndian.Uint32(x[4*i:]))
			}
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(acc))
		case hcomm.BFloat16:
			acc := binary.LittleEndian.Uint16(in[0][2*i:])
			for _, x := range in[1:] {
				s := math.Float32frombits(uint32(acc)<<16) + math.Float32frombits(uint32(binary.LittleEndian.Uint16(x[2*i:]))<<16)
				acc = toBF16(s)
			}
			binary.LittleEndian.PutUint16(out[2*i:], acc)
		}
	}
	return out
}

// detRig holds every rank's device buffers and stream for one communicator
// set, made once and reused by every run.
type detRig struct {
	comms []*hcomm.Comm
	send  []device.Ptr
	recv  []device.Ptr
	s     []*device.Stream
	bytes int64
}

func newDetRig(t *testing.T, comms []*hcomm.Comm, bytes int64) *detRig {
	t.Helper()
	g := &detRig{comms: comms, bytes: bytes, send: make([]device.Ptr, len(comms)),
		recv: make([]device.Ptr, len(comms)), s: make([]*device.Stream, len(comms))}
	for r, c := range comms {
		var err error
		if g.s[r], err = c.Device().CreateStream(); err != nil {
			t.Fatal(err)
		}
		if g.send[r], err = c.Device().Malloc(bytes); err != nil {
			t.Fatal(err)
		}
		if g.recv[r], err = c.Device().Malloc(bytes); err != nil {
			t.Fatal(err)
		}
		dev, send, recv, s := c.Device(), g.send[r], g.recv[r], g.s[r]
		t.Cleanup(func() {
			dev.Free(send)
			dev.Free(recv)
			s.Destroy()
		})
	}
	return g
}

// run runs call on every rank with in[r] in its send buffer and returns
// every rank's recv buffer (its first want bytes). procs, when positive, is
// GOMAXPROCS while the ranks run.
func (g *detRig) run(t *testing.T, procs int, in [][]byte, want int64, call func(c *hcomm.Comm, send, recv device.Ptr, s *device.Stream) error) [][]byte {
	t.Helper()
	out := make([][]byte, len(g.comms))
	hcommtest.Options{GOMAXPROCS: procs}.Each(t, g.comms, func(t testing.TB, c *hcomm.Comm) {
		r := c.Rank()
		b, err := c.Device().Bytes(g.send[r], g.bytes)
		if err != nil {
			t.Fatal(err)
		}
		copy(b, in[r])
		o, err := c.Device().Bytes(g.recv[r], g.bytes)
		if err != nil {
			t.Fatal(err)
		}
		for i := range o {
			o[i] = 0xa5
		}
		if err := call(c, g.send[r], g.recv[r], g.s[r]); err != nil {
			t.Fatal(err)
		}
		if err := g.s[r].Synchronize(t.Context()); err != nil {
			t.Fatal(err)
		}
		out[r] = append([]byte(nil), o[:want]...)
	})
	return out
}

// jitter perturbs the timing of every step of every rank (collectives'
// test hook): a sleep of up to 50µs, a yield, or nothing, at random.
func jitter(t *testing.T) {
	collectives.SetTestJitter(func(int) {
		switch rand.IntN(4) {
		case 0:
			time.Sleep(time.Duration(rand.IntN(50)) * time.Microsecond)
		case 1:
			runtime.Gosched()
		}
	})
	t.Cleanup(func() { collectives.SetTestJitter(nil) })
}

// diffElem returns the index of the first element of es bytes where a and
// b differ, -1 if none.
func diffElem(a, b []byte, es int) int {
	for i := 0; i+es <= len(a) && i+es <= len(b); i += es {
		if !bytes.Equal(a[i:i+es], b[i:i+es]) {
			return i / es
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b)) / es
	}
	return -1
}

// detCases are the all-reduces of the determinism tests: the large case
// for every algorithm, and one that fits inline for oneshot and rd (and the
// selector).
func detCases(dt hcomm.DataType, inline int64) []struct {
	algo  collectives.Algorithm
	count int
} {
	small := int(min(inline/int64(dt.Size()), 997))
	var out []struct {
		algo  collectives.Algorithm
		count int
	}
	add := func(a collectives.Algorithm, n int) {
		out = append(out, struct {
			algo  collectives.Algorithm
			count int
		}{a, n})
	}
	add(collectives.AlgoAuto, small)
	add(collectives.AlgoAuto, detCount)
	for _, a := range collectives.Algorithms("AllReduce") {
		if a == collectives.AlgoOneShot || a == collectives.AlgoRD {
			add(a, small)
		} else {
			add(a, detCount)
		}
	}
	return out
}

// TestDeterministicRunToRun: HCCL_DETERMINISTIC=true's promise. 100 runs of
// a float32 and a bf16 all-reduce of the same random inputs, on every
// algorithm and transport, with the timing of every step of every rank
// perturbed (random sleeps and yields before each step, every other run
// with GOMAXPROCS 1), give the same bits on every rank and in every run.
// Every schedule reduces in an order fixed when it is issued (ordered.go),
// so this holds with the level off too; the test guards it.
func TestDeterministicRunToRun(t *testing.T) {
	runs := 100
	if raceEnabled || testing.Short() {
		runs = 25 // make test runs the 100 without the race detector
	}
	for _, tr := range detTransports() {
		t.Run(tr.String(), func(t *testing.T) {
			comms := hcommtest.Options{Config: &hcomm.Config{BufferSize: detBuf, Deterministic: hcomm.DeterministicOn}}.New(t, detRanks, tr)
			inline := collectives.InlineBytes(comms[0])
			rig := newDetRig(t, comms, detCount*4)
			jitter(t)
			for _, dt := range []hcomm.DataType{hcomm.Float32, hcomm.BFloat16} {
				for ci, cs := range detCases(dt, inline) {
					in := make([][]byte, detRanks)
					for r := range in {
						in[r] = detInputs(dt, uint64(100+ci), r, cs.count)
					}
					want := int64(cs.count * dt.Size())
					var first []byte
					for run := 0; run < runs; run++ {
						out := rig.run(t, run%2, in, want, func(c *hcomm.Comm, send, recv device.Ptr, s *device.Stream) error {
							return collectives.AllReduce(send, recv, int64(cs.count), dt, hcomm.Sum, c, s, &collectives.Options{Algorithm: cs.algo})
						})
						if first == nil {
							first = out[0]
						}
						for r, o := range out {
							if i := diffElem(o, first, dt.Size()); i >= 0 {
								t.Fatalf("%v all-reduce of %d elements, %v: run %d rank %d differs from run 0 rank 0 at element %d", dt, cs.count, cs.algo, run, r, i)
							}
						}
					}
				}
			}
		})
	}
}

// TestDeterministicStrict: HCCL_DETERMINISTIC=strict's promise. On every
// transport, a float32 and a bf16 all-reduce — chosen by the selector,
// forced onto ordered, or onto oneshot where it fits, runs with perturbed
// timing — give on every rank exactly the rank-order sum this test computes;
// so every algorithm and transport gives the same bits. ReduceScatter (in
// and out of place), ReduceScatterV and Reduce do too. A reducing
// collective forced onto an algorithm that does not reduce in rank order is
// refused, naming it. The inputs are such that the ring's own order gives
// other bits (checked with the level off), so the test fails if strict is
// ignored.
func TestDeterministicStrict(t *testing.T) {
	runs := 4
	if raceEnabled {
		runs = 2
	}
	for _, tr := range detTransports() {
		t.Run(tr.String(), func(t *testing.T) {
			comms := hcommtest.Options{Config: &hcomm.Config{BufferSize: detBuf, Deterministic: hcomm.DeterministicStrict}}.New(t, detRanks, tr)
			inline := collectives.InlineBytes(comms[0])
			rig := newDetRig(t, comms, detCount*4)
			jitter(t)
			for _, dt := range []hcomm.DataType{hcomm.Float32, hcomm.BFloat16} {
				es := dt.Size()
				small := int(inline) / es
				for _, count := range []int{small, detCount} {
					in := make([][]byte, detRanks)
					for r := range in {
						in[r] = detInputs(dt, uint64(7+count), r, count)
					}
					want := canonical(dt, in, count)
					algos := []collectives.Algorithm{collectives.AlgoAuto, collectives.AlgoOrdered}
					if count == small {
						algos = append(algos, collectives.AlgoOneShot)
					}
					for _, a := range algos {
						for run := 0; run < runs; run++ {
							out := rig.run(t, run%2, in, int64(count*es), func(c *hcomm.Comm, send, recv device.Ptr, s *device.Stream) error {
								return collectives.AllReduce(send, recv, int64(count), dt, hcomm.Sum, c, s, &collectives.Options{Algorithm: a})
							})
							for r, o := range out {
								if i := diffElem(o, want, es); i >= 0 {
									t.Fatalf("strict %v all-reduce of %d elements, %v, run %d: rank %d element %d is %x, the rank-order sum is %x",
										dt, count, a, run, r, i, o[i*es:(i+1)*es], want[i*es:(i+1)*es])
								}
							}
						}
					}
					// ReduceScatter, out of place and in place: rank r gets
					// chunk r of the rank-order sum.
					per := count / detRanks
					for _, inPlace := range []bool{false, true} {
						out := rig.run(t, 0, in, int64(count*es), func(c *hcomm.Comm, send, recv device.Ptr, s *device.Stream) error {
							dst := recv
							if inPlace {
								dst = send.Add(int64(c.Rank() * per * es))
							}
							if err := collectives.ReduceScatter(send, dst, int64(per), dt, hcomm.Sum, c, s, nil); err != nil {
								return err
							}
							if inPlace {
								return s.MemcpyAsync(recv, dst, int64(per*es), device.MemcpyDeviceToDevice)
							}
							return nil
						})
						for r, o := range out {
							w := want[r*per*es : (r+1)*per*es]
							if i := diffElem(o[:per*es], w, es); i >= 0 {
								t.Fatalf("strict %v ReduceScatter of %d per rank (in place %v): rank %d element %d is %x, want %x", dt, per, inPlace, r, i, o[i*es:(i+1)*es], w[i*es:(i+1)*es])
							}
						}
					}
					// ReduceScatterV with uneven counts.
					counts := []int64{int64(per) + 3, 0, int64(per) - 5, int64(per)}
					displs := []int64{0, int64(per) + 3, int64(per) + 3, int64(2*per) - 2}
					out := rig.run(t, 0, in, int64(count*es), func(c *hcomm.Comm, send, recv device.Ptr, s *device.Stream) error {
						return collectives.ReduceScatterV(send, counts, displs, recv, counts[c.Rank()], dt, hcomm.Sum, c, s, nil)
					})
					for r, o := range out {
						w := want[displs[r]*int64(es) : (displs[r]+counts[r])*int64(es)]
						if i := diffElem(o[:len(w)], w, es); i >= 0 {
							t.Fatalf("strict %v ReduceScatterV: rank %d element %d is %x, want %x", dt, r, i, o[i*es:(i+1)*es], w[i*es:(i+1)*es])
						}
					}
					// Reduce to root 2, in place on the root.
					out = rig.run(t, 0, in, int64(count*es), func(c *hcomm.Comm, send, recv device.Ptr, s *device.Stream) error {
						if c.Rank() == 2 {
							if err := collectives.Reduce(send, send, int64(count), dt, hcomm.Sum, 2, c, s, nil); err != nil {
								return err
							}
							return s.MemcpyAsync(recv, send, int64(count*es), device.MemcpyDeviceToDevice)
						}
						return collectives.Reduce(send, recv, int64(count), dt, hcomm.Sum, 2, c, s, nil)
					})
					if i := diffElem(out[2], want, es); i >= 0 {
						t.Fatalf("strict %v Reduce of %d elements: root's element %d is %x, want %x", dt, count, i, out[2][i*es:(i+1)*es], want[i*es:(i+1)*es])
					}
				}
			}
			// Forced algorithms that do not reduce in rank order are refused
			// on every rank, before anything is issued.
			for _, a := range []collectives.Algorithm{collectives.AlgoRing, collectives.AlgoHD, collectives.AlgoHier} {
				hcommtest.Each(t, comms, func(t testing.TB, c *hcomm.Comm) {
					r := c.Rank()
					err := collectives.AllReduce(rig.send[r], rig.recv[r], detCount, hcomm.Float32, hcomm.Sum, c, rig.s[r], &collectives.Options{Algorithm: a})
					if !errors.Is(err, hcomm.ErrNotSupport) || !strings.Contains(err.Error(), "strict") || !strings.Contains(err.Error(), a.String()) {
						t.Errorf("strict AllReduce forced onto %v: got %v, want ErrNotSupport naming strict and %v", a, err, a)
					}
				})
			}
			hcommtest.Each(t, comms, func(t testing.TB, c *hcomm.Comm) {
				r := c.Rank()
				err := collectives.Reduce(rig.send[r], rig.recv[r], detCount, hcomm.Float32, hcomm.Sum, 0, c, rig.s[r], &collectives.Options{Algorithm: collectives.AlgoTree})
				if !errors.Is(err, hcomm.ErrNotSupport) || !strings.Contains(err.Error(), "tree") {
					t.Errorf("strict Reduce forced onto tree: got %v, want ErrNotSupport naming tree", err)
				}
			})
			// The communicator still works after the refusals.
			in := make([][]byte, detRanks)
			for r := range in {
				in[r] = detInputs(hcomm.Float32, 1, r, detCount)
			}
			out := rig.run(t, 0, in, detCount*4, func(c *hcomm.Comm, send, recv device.Ptr, s *device.Stream) error {
				return collectives.AllReduce(send, recv, detCount, hcomm.Float32, hcomm.Sum, c, s, nil)
			})
			if i := diffElem(out[3], canonical(hcomm.Float32, in, detCount), 4); i >= 0 {
				t.Fatalf("strict AllReduce after the refusals: element %d differs from the rank-order sum", i)
			}
		})
	}

	// The inputs tell orders apart: with the level off, the ring's result
	// differs from the rank-order sum.
	comms := hcommtest.Options{Config: &hcomm.Config{BufferSize: detBuf, Deterministic: hcomm.DeterministicOff}}.New(t, detRanks, hcommtest.Inproc)
	rig := newDetRig(t, comms, detCount*4)
	for _, dt := range []hcomm.DataType{hcomm.Float32, hcomm.BFloat16} {
		in := make([][]byte, detRanks)
		for r := range in {
			in[r] = detInputs(dt, uint64(7+detCount), r, detCount)
		}
		out := rig.run(t, 0, in, int64(detCount*dt.Size()), func(c *hcomm.Comm, send, recv device.Ptr, s *device.Stream) error {
			return collectives.AllReduce(send, recv, detCount, dt, hcomm.Sum, c, s, &collectives.Options{Algorithm: collectives.AlgoRing})
		})
		if diffElem(out[0], canonical(dt, in, detCount), dt.Size()) < 0 {
			t.Errorf("%v: the ring's sum equals the rank-order sum on every element: the inputs do not tell the orders apart", dt)
		}
	}
}

// TestDeterministicEnv: HCCL_DETERMINISTIC=strict in the environment makes
// the selector reduce in rank order, as Config.Deterministic does.
func TestDeterministicEnv(t *testing.T) {
	t.Setenv("HCCL_DETERMINISTIC", "strict")
	comms := hcommtest.Options{Config: &hcomm.Config{BufferSize: detBuf}}.New(t, detRanks, hcommtest.Inproc)
	if got := comms[0].Config().Deterministic; got != hcomm.DeterministicStrict {
		t.Fatalf("HCCL_DETERMINISTIC=strict: Config().Deterministic = %v", got)
	}
	rig := newDetRig(t, comms, detCount*4)
	in := make([][]byte, detRanks)
	for r := range in {
		in[r] = detInputs(hcomm.Float32, 3, r, detCount)
	}
	out := rig.run(t, 0, in, detCount*4, func(c *hcomm.Comm, send, recv device.Ptr, s *device.Stream) error {
		return collectives.AllReduce(send, recv, detCount, hcomm.Float32, hcomm.Sum, c, s, nil)
	})
	want := canonical(hcomm.Float32, in, detCount)
	for r, o := range out {
		if i := diffElem(o, want, 4); i >= 0 {
			t.Fatalf("HCCL_DETERMINISTIC=strict: rank %d element %d differs from the rank-order sum", r, i)
		}
	}
}

// BenchmarkAllReduceDeterministic measures what HCCL_DETERMINISTIC costs: a
// float32 all-reduce of 1 MiB and 64 MiB on 4 ranks in this process (inproc),
// with the level off, on and strict (the ordered algorithm). Off and on run
// the same schedules; the difference between them is noise.
func BenchmarkAllReduceDeterministic(b *testing.B) {
	const n = 4
	for _, size := range []int64{1 << 20, 64 << 20} {
		for _, level := range []string{"false", "true", "strict"} {
			b.Run(fmt.Sprintf("%s/%s", units.SizeIEC(size), level), func(b *testing.B) {
				b.Setenv("HCCL_DETERMINISTIC", level)
				benchColl(b, n, size, 2*float64(n-1)/n, func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, count int64) error {
					return collectives.AllReduce(send, recv, count, hcomm.Float32, hcomm.Sum, c, s, nil)
				})
			})
		}
	}
}
