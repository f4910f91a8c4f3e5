package collectives_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
	"github.com/hcomm-dev/hcomm/internal/reduce"
)

// The matrix of the stream-ordered API: every collective over raw device
// buffers, every data type, checked byte for byte against a float64
// reference. Inputs are small integers (see input), so every reference value
// is exact in every type; integer results wrap as the kernels do.

// encode writes v as one element of dt (integers wrap to the type's width).
func encode(dt hcomm.DataType, v float64, b []byte) {
	switch dt {
	case hcomm.Float16:
		binary.LittleEndian.PutUint16(b, reduce.Float32ToFloat16(float32(v)))
	case hcomm.BFloat16:
		binary.LittleEndian.PutUint16(b, reduce.Float32ToBFloat16(float32(v)))
	case hcomm.Float32:
		binary.LittleEndian.PutUint32(b, math.Float32bits(float32(v)))
	case hcomm.Float64:
		binary.LittleEndian.PutUint64(b, math.Float64bits(v))
	default:
		var x [8]byte
		binary.LittleEndian.PutUint64(x[:], uint64(int64(v)))
		copy(b, x[:dt.Size()])
	}
}

func encodeAll(dt hcomm.DataType, n int, f func(i int) float64) []byte {
	es := dt.Size()
	b := make([]byte, n*es)
	for i := 0; i < n; i++ {
		encode(dt, f(i), b[i*es:])
	}
	return b
}

// rankBufs is one rank's device buffers for a case.
type rankBufs struct {
	c          *hcomm.Comm
	s          *device.Stream
	send, recv device.Ptr
	sendN      int64
	recvN      int64
}

// withBuffers allocates send/recv of the given byte sizes on every rank of
// comms — every rank of the communicator, or this process's share of them
// (TestMixedLayout: the helpers below take the rank count from the
// communicator, not from comms) —, fills send with in(rank) and recv with
// 0xA5 (so that untouched bytes show), runs call on every rank
// concurrently, synchronizes, and checks recv against want(rank) (nil: not
// checked). inPlace makes recv alias send at
// inPlaceOff(rank) bytes (recv then must fit inside send, or send inside recv).
func withBuffers(t *testing.T, comms []*hcomm.Comm, sendN, recvN func(r int) int64, in func(r int) []byte,
	call func(b *rankBufs) error, want func(r int) []byte, desc string) {
	t.Helper()
	rs := make([]*rankBufs, comms[0].Size())
	for _, c := range comms {
		i := c.Rank()
		s, err := c.Device().CreateStream()
		if err != nil {
			t.Fatal(err)
		}
		b := &rankBufs{c: c, s: s, sendN: sendN(i), recvN: recvN(i)}
		b.send, err = c.Device().Malloc(max(b.sendN, 1))
		if err != nil {
			t.Fatal(err)
		}
		b.recv, err = c.Device().Malloc(max(b.recvN, 1))
		if err != nil {
			t.Fatal(err)
		}
		if d := in(i); len(d) > 0 {
			if err := c.Device().MemcpyHtoD(b.send, d); err != nil {
				t.Fatal(err)
			}
		}
		if b.recvN > 0 {
			c.Device().Memset(b.recv, b.recvN, 0xA5)
		}
		rs[i] = b
	}
	defer func() {
		for _, b := range rs {
			if b == nil {
				continue // a rank of another process (TestMixedLayout)
			}
			b.s.Destroy()
			b.c.Device().Free(b.send)
			b.c.Device().Free(b.recv)
		}
	}()
	run(t, comms, func(c *hcomm.Comm) error {
		b := rs[c.Rank()]
		if err := call(b); err != nil {
			return fmt.Errorf("%s: rank %d: %w", desc, c.Rank(), err)
		}
		if err := b.s.SynchronizeWithTimeout(60 * time.Second); err != nil {
			return fmt.Errorf("%s: rank %d: synchronize: %w", desc, c.Rank(), err)
		}
		if want == nil {
			return nil
		}
		w := want(c.Rank())
		if w == nil {
			return nil
		}
		got := make([]byte, len(w))
		if len(w) > 0 {
			if err := c.Device().MemcpyDtoH(got, b.recv); err != nil {
				return err
			}
		}
		if !bytes.Equal(got, w) {
			for i := range got {
				if got[i] != w[i] {
					return fmt.Errorf("%s: rank %d: byte %d (element %d) = %#x, want %#x", desc, c.Rank(), i, i, got[i], w[i])
				}
			}
		}
		return nil
	})
}

// ref folds op over the ranks' values in float64, in rank order.
func ref(op hcomm.ReduceOp, n int, v func(r int) float64) float64 {
	acc := v(0)
	for r := 1; r < n; r++ {
		x := v(r)
		switch op {
		case hcomm.Sum:
			acc += x
		case hcomm.Prod:
			acc *= x
		case hcomm.Max:
			acc = math.Max(acc, x)
		case hcomm.Min:
			acc = math.Min(acc, x)
		}
	}
	return acc
}

func algosOf(name string) []collectives.Algorithm {
	return append([]collectives.Algorithm{collectives.AlgoAuto}, collectives.Algorithms(name)...)
}

// ringAlias reports whether the all-reduce algorithm a, forced among n
// ranks over tr, runs the ring: the direct all-reduce where ranks cannot
// read each other's memory (tcp), above helloFullMax ranks, or alone. A
// matrix need not run the ring twice (TestDirectAllReduce and
// TestLentWithCheckOff run the forced direct's ring).
func ringAlias(a collectives.Algorithm, n int, tr hcommtest.Transport) bool {
	return a == collectives.AlgoDirect && (tr.Name == hcomm.TransportTCP || n > collectives.HelloFullMax || n == 1)
}

// fits reports whether an algorithm can carry a case: the one-shot path and
// recursive doubling only take what fits the hello slots.
func fits(algo collectives.Algorithm, bytes, inline int64) bool {
	return (algo != collectives.AlgoOneShot && algo != collectives.AlgoRD) || bytes <= inline
}

func dtypes() []hcomm.DataType {
	return []hcomm.DataType{hcomm.Int8, hcomm.Int16, hcomm.Int32, hcomm.Int64, hcomm.Uint8, hcomm.Uint16,
		hcomm.Uint32, hcomm.Uint64, hcomm.Float16, hcomm.BFloat16, hcomm.Float32, hcomm.Float64}
}

// matrixCase runs every collective once for one (dt, op, count, algo) on
// comms, checking each.
type matrixCase struct {
	dt     hcomm.DataType
	op     hcomm.ReduceOp
	count  int64
	root   int
	inline int64
}

func (m matrixCase) String() string {
	return fmt.Sprintf("%v/%v/count=%d/root=%d", m.dt, m.op, m.count, m.root)
}

func testAllGather(t *testing.T, comms []*hcomm.Comm, m matrixCase, algo collectives.Algorithm, inPlace bool) {
	n, es, cnt := comms[0].Size(), int64(m.dt.Size()), int(m.count)
	if !fits(algo, m.count*es, m.inline) || algo == collectives.AlgoRD && int64(n)*m.count*es > m.inline {
		return // rd's hellos carry the whole output
	}
	desc := fmt.Sprintf("AllGather %v %v in-place=%v", m, algo, inPlace)
	withBuffers(t, comms,
		func(int) int64 { return int64(n) * m.count * es }, func(int) int64 { return int64(n) * m.count * es },
		func(r int) []byte {
			b := make([]byte, int64(n)*m.count*es)
			copy(b[int64(r)*m.count*es:], encodeAll(m.dt, cnt, func(i int) float64 { return input(m.dt, r, i) }))
			return b
		},
		func(b *rankBufs) error {
			recv := b.recv
			send := b.send.Add(int64(b.c.Rank()) * m.count * es)
			if inPlace {
				recv = b.send
			}
			if err := collectives.AllGather(send, recv, m.count, m.dt, b.c, b.s, &collectives.Options{Algorithm: algo}); err != nil {
				return err
			}
			if inPlace {
				return b.s.MemcpyAsync(b.recv, b.send, int64(n)*m.count*es, device.MemcpyDeviceToDevice)
			}
			return nil
		},
		func(r int) []byte {
			return encodeAll(m.dt, n*cnt, func(i int) float64 { return input(m.dt, i/max(cnt, 1), i%max(cnt, 1)) })
		}, desc)
}

func testReduceScatter(t *testing.T, comms []*hcomm.Comm, m matrixCase, algo collectives.Algorithm, inPlace bool) {
	n, es, cnt := comms[0].Size(), int64(m.dt.Size()), int(m.count)
	hello := int64(n) * m.count * es // rd's: every rank's whole input
	if algo == collectives.AlgoOneShot {
		hello = m.count * es // a part per hello
	}
	if !fits(algo, hello, m.inline) {
		return
	}
	desc := fmt.Sprintf("ReduceScatter %v %v in-place=%v", m, algo, inPlace)
	withBuffers(t, comms,
		func(int) int64 { return int64(n) * m.count * es }, func(int) int64 { return m.count * es },
		func(r int) []byte {
			return encodeAll(m.dt, n*cnt, func(i int) float64 { return input(m.dt, r, i) })
		},
		func(b *rankBufs) error {
			recv := b.recv
			if inPlace {
				recv = b.send.Add(int64(b.c.Rank()) * m.count * es)
			}
			if err := collectives.ReduceScatter(b.send, recv, m.count, m.dt, m.op, b.c, b.s, &collectives.Options{Algorithm: algo}); err != nil {
				return err
			}
			if inPlace {
				return b.s.MemcpyAsync(b.recv, recv, m.count*es, device.MemcpyDeviceToDevice)
			}
			return nil
		},
		func(r int) []byte {
			return encodeAll(m.dt, cnt, func(i int) float64 {
				return ref(m.op, n, func(q int) float64 { return input(m.dt, q, r*cnt+i) })
			})
		}, desc)
}

func testReduce(t *testing.T, comms []*hcomm.Comm, m matrixCase, algo collectives.Algorithm, inPlace bool) {
	n, es, cnt := comms[0].Size(), int64(m.dt.Size()), int(m.count)
	if !fits(algo, m.count*es, m.inline) {
		return
	}
	desc := fmt.Sprintf("Reduce %v %v in-place=%v", m, algo, inPlace)
	withBuffers(t, comms,
		func(int) int64 { return m.count * es }, func(int) int64 { return m.count * es },
		func(r int) []byte { return encodeAll(m.dt, cnt, func(i int) float64 { return input(m.dt, r, i) }) },
		func(b *rankBufs) error {
			recv := b.recv
			if inPlace {
				recv = b.send
			}
			if err := collectives.Reduce(b.send, recv, m.count, m.dt, m.op, m.root, b.c, b.s, &collectives.Options{Algorithm: algo}); err != nil {
				return err
			}
			if inPlace && b.c.Rank() == m.root {
				return b.s.MemcpyAsync(b.recv, b.send, m.count*es, device.MemcpyDeviceToDevice)
			}
			return nil
		},
		func(r int) []byte {
			if r != m.root {
				return bytes.Repeat([]byte{0xA5}, cnt*int(es)) // untouched
			}
			return encodeAll(m.dt, cnt, func(i int) float64 {
				return ref(m.op, n, func(q int) float64 { return input(m.dt, q, i) })
			})
		}, desc)
}

func testScatterGather(t *testing.T, comms []*hcomm.Comm, m matrixCase, algo collectives.Algorithm) {
	n, es, cnt := comms[0].Size(), int64(m.dt.Size()), int(m.count)
	desc := fmt.Sprintf("Scatter %v %v", m, algo)
	withBuffers(t, comms,
		func(int) int64 { return int64(n) * m.count * es }, func(int) int64 { return m.count * es },
		func(r int) []byte {
			return encodeAll(m.dt, n*cnt, func(i int) float64 { return input(m.dt, r, i) })
		},
		func(b *rankBufs) error {
			return collectives.Scatter(b.send, b.recv, m.count, m.dt, m.root, b.c, b.s, &collectives.Options{Algorithm: algo})
		},
		func(r int) []byte {
			return encodeAll(m.dt, cnt, func(i int) float64 { return input(m.dt, m.root, r*cnt+i) })
		}, desc)
	desc = fmt.Sprintf("Gather %v %v", m, algo)
	withBuffers(t, comms,
		func(int) int64 { return m.count * es }, func(int) int64 { return int64(n) * m.count * es },
		func(r int) []byte { return encodeAll(m.dt, cnt, func(i int) float64 { return input(m.dt, r, i) }) },
		func(b *rankBufs) error {
			return collectives.Gather(b.send, b.recv, m.count, m.dt, m.root, b.c, b.s, &collectives.Options{Algorithm: algo})
		},
		func(r int) []byte {
			if r != m.root {
				return bytes.Repeat([]byte{0xA5}, n*cnt*int(es))
			}
			return encodeAll(m.dt, n*cnt, func(i int) float64 { return input(m.dt, i/max(cnt, 1), i%max(cnt, 1)) })
		}, desc)
}

func testAlltoAll(t *testing.T, comms []*hcomm.Comm, m matrixCase, algo collectives.Algorithm) {
	n, es, cnt := comms[0].Size(), int64(m.dt.Size()), int(m.count)
	desc := fmt.Sprintf("AlltoAll %v %v", m, algo)
	withBuffers(t, comms,
		func(int) int64 { return int64(n) * m.count * es }, func(int) int64 { return int64(n) * m.count * es },
		func(r int) []byte { return encodeAll(m.dt, n*cnt, func(i int) float64 { return input(m.dt, r, i) }) },
		func(b *rankBufs) error {
			return collectives.AlltoAll(b.send, m.count, m.dt, b.recv, m.count, m.dt, b.c, b.s, &collectives.Options{Algorithm: algo})
		},
		func(r int) []byte {
			// Block p of rank r's recv is rank p's block r.
			return encodeAll(m.dt, n*cnt, func(i int) float64 {
				p, j := i/max(cnt, 1), i%max(cnt, 1)
				return input(m.dt, p, r*cnt+j)
			})
		}, desc)
}

// vCounts gives uneven per-rank counts around base (some zero), and
// displacements with gaps.
func vCounts(n int, base int64) (counts, displs []int64, total int64) {
	counts, displs = make([]int64, n), make([]int64, n)
	var off int64
	for p := 0; p < n; p++ {
		counts[p] = base * int64((p*7+3)%4) / 2 // 1.5x, 0, 0.5x, 1x ...
		displs[p] = off
		off += counts[p] + int64(p%2) // a gap after odd ranks
	}
	return counts, displs, off
}

func testVCollectives(t *testing.T, comms []*hcomm.Comm, m matrixCase) {
	n, es := comms[0].Size(), int64(m.dt.Size())
	counts, displs, total := vCounts(n, m.count)
	// AllGatherV: rank p sends counts[p] elements.
	withBuffers(t, comms,
		func(r int) int64 { return counts[r] * es }, func(int) int64 { return total * es },
		func(r int) []byte {
			return encodeAll(m.dt, int(counts[r]), func(i int) float64 { return input(m.dt, r, i) })
		},
		func(b *rankBufs) error {
			return collectives.AllGatherV(b.send, counts[b.c.Rank()], b.recv, counts, displs, m.dt, b.c, b.s, nil)
		},
		func(r int) []byte {
			w := bytes.Repeat([]byte{0xA5}, int(total*es))
			for p := 0; p < n; p++ {
				copy(w[displs[p]*es:], encodeAll(m.dt, int(counts[p]), func(i int) float64 { return input(m.dt, p, i) }))
			}
			return w
		}, fmt.Sprintf("AllGatherV %v counts %v", m, counts))
	// ReduceScatterV: rank p receives the reduction of its counts[p] elements.
	withBuffers(t, comms,
		func(int) int64 { return total * es }, func(r int) int64 { return counts[r] * es },
		func(r int) []byte {
			return encodeAll(m.dt, int(total), func(i int) float64 { return input(m.dt, r, i) })
		},
		func(b *rankBufs) error {
			return collectives.ReduceScatterV(b.send, counts, displs, b.recv, counts[b.c.Rank()], m.dt, m.op, b.c, b.s, nil)
		},
		func(r int) []byte {
			return encodeAll(m.dt, int(counts[r]), func(i int) float64 {
				return ref(m.op, n, func(q int) float64 { return input(m.dt, q, int(displs[r])+i) })
			})
		}, fmt.Sprintf("ReduceScatterV %v counts %v", m, counts))
	// AlltoAllV: rank r sends c(r, p) elements to p.
	c := func(r, p int) int64 { return m.count * int64((r*3+p*5)%4) / 2 }
	layout := func(r int, f func(r, p int) int64) (cs, ds []int64, tot int64) {
		cs, ds = make([]int64, n), make([]int64, n)
		for p := 0; p < n; p++ {
			cs[p], ds[p] = f(r, p), tot
			tot += cs[p] + 1
		}
		return
	}
	sendL := func(r int) ([]int64, []int64, int64) { return layout(r, c) }
	recvL := func(r int) ([]int64, []int64, int64) {
		return layout(r, func(r, p int) int64 { return c(p, r) })
	}
	withBuffers(t, comms,
		func(r int) int64 { _, _, tot := sendL(r); return tot * es },
		func(r int) int64 { _, _, tot := recvL(r); return tot * es },
		func(r int) []byte {
			_, _, tot := sendL(r)
			return encodeAll(m.dt, int(tot), func(i int) float64 { return input(m.dt, r, i) })
		},
		func(b *rankBufs) error {
			r := b.c.Rank()
			sc, sd, _ := sendL(r)
			rc, rd, _ := recvL(r)
			return collectives.AlltoAllV(b.send, sc, sd, m.dt, b.recv, rc, rd, m.dt, b.c, b.s, nil)
		},
		func(r int) []byte {
			rc, rd, tot := recvL(r)
			w := bytes.Repeat([]byte{0xA5}, int(tot*es))
			for p := 0; p < n; p++ {
				_, psd, _ := sendL(p)
				copy(w[rd[p]*es:], encodeAll(m.dt, int(rc[p]), func(i int) float64 { return input(m.dt, p, int(psd[r])+i) }))
			}
			return w
		}, fmt.Sprintf("AlltoAllV %v", m))
}

// testSendRecv: every rank sends a message to its right neighbour and two to
// its left, and receives the matching ones, listing its items in an order
// that would deadlock a naive single-stream schedule.
func testSendRecv(t *testing.T, comms []*hcomm.Comm, m matrixCase) {
	n, es, cnt := comms[0].Size(), int64(m.dt.Size()), int(m.count)
	if n == 1 {
		return
	}
	msg := func(from, to, k int) []byte {
		return encodeAll(m.dt, cnt, func(i int) float64 { return input(m.dt, from*7+to*3+k, i) })
	}
	withBuffers(t, comms,
		func(int) int64 { return 3 * m.count * es }, func(int) int64 { return 3 * m.count * es },
		func(r int) []byte {
			right, left := (r+1)%n, (r+n-1)%n
			return append(append(msg(r, right, 0), msg(r, left, 1)...), msg(r, left, 2)...)
		},
		func(b *rankBufs) error {
			r := b.c.Rank()
			right, left := (r+1)%n, (r+n-1)%n
			bl := m.count * es
			items := []collectives.SendRecvItem{
				{Type: collectives.SendItem, Buf: b.send.Add(bl), Count: m.count, DataType: m.dt, RemoteRank: left},
				{Type: collectives.SendItem, Buf: b.send.Add(2 * bl), Count: m.count, DataType: m.dt, RemoteRank: left},
				{Type: collectives.SendItem, Buf: b.send, Count: m.count, DataType: m.dt, RemoteRank: right},
				{Type: collectives.RecvItem, Buf: b.recv, Count: m.count, DataType: m.dt, RemoteRank: left},
				{Type: collectives.RecvItem, Buf: b.recv.Add(bl), Count: m.count, DataType: m.dt, RemoteRank: right},
				{Type: collectives.RecvItem, Buf: b.recv.Add(2 * bl), Count: m.count, DataType: m.dt, RemoteRank: right},
			}
			return collectives.BatchSendRecv(items, b.c, b.s)
		},
		func(r int) []byte {
			right, left := (r+1)%n, (r+n-1)%n
			if n == 2 {
				// The peer sent [to its left: k1, k1... ] in item order: its
				// two "left" sends and one "right" send all go to this rank,
				// in the order listed; this rank receives in its order.
				p := right
				return append(append(msg(p, r, 1), msg(p, r, 2)...), msg(p, r, 0)...)
			}
			return append(append(msg(left, r, 0), msg(right, r, 1)...), msg(right, r, 2)...)
		}, fmt.Sprintf("BatchSendRecv %v", m))
}

// TestCollectiveMatrix: every collective x every algorithm it has x rank
// counts 1, 2, 3, 4, 5, 8 x counts 0, 1, 7, 1023 x every data type (every op
// for the reducing ones, with 3 and 4 ranks; sum and max elsewhere) x in and
// out of place, with the default and a small HCCL buffer, on one set of
// communicators per rank count, so that every schedule's counters carry
// across hundreds of calls of different collectives as in real use.
func TestCollectiveMatrix(t *testing.T) {
	for _, bufSize := range []int64{0, 8 << 10} {
		for _, n := range rankCounts {
			t.Run(fmt.Sprintf("buf=%d/ranks=%d", bufSize, n), func(t *testing.T) {
				comms := initAll(t, n, &hcomm.Config{BufferSize: bufSize})
				inline := collectives.InlineBytes(comms[0])
				ops := []hcomm.ReduceOp{hcomm.Sum, hcomm.Max}
				if n == 3 || n == 4 {
					ops = reduce.Ops()
				}
				types := dtypes()
				if raceEnabled && n != 3 {
					// Under the race detector: one type per element size,
					// every type and op at 3 ranks.
					types = []hcomm.DataType{hcomm.Int8, hcomm.BFloat16, hcomm.Float32, hcomm.Int64}
					ops = []hcomm.ReduceOp{hcomm.Sum, hcomm.Max}
				}
				for _, dt := range types {
					for _, count := range []int64{0, 1, 7, 1023} {
						for _, op := range ops {
							m := matrixCase{dt: dt, op: op, count: count, root: int(count) % n, inline: inline}
							for _, inPlace := range []bool{false, true} {
								for _, a := range algosOf("AllGather") {
									testAllGather(t, comms, m, a, inPlace)
								}
								for _, a := range algosOf("ReduceScatter") {
									testReduceScatter(t, comms, m, a, inPlace)
								}
								for _, a := range algosOf("Reduce") {
									testReduce(t, comms, m, a, inPlace)
								}
							}
							if op != hcomm.Sum {
								continue // the rest do not reduce: once per type and count
							}
							for _, a := range algosOf("Scatter") {
								testScatterGather(t, comms, m, a)
							}
							for _, a := range algosOf("AlltoAll") {
								if fits(a, m.count*int64(m.dt.Size()), m.inline) { // oneshot: a block per hello
									testAlltoAll(t, comms, m, a)
								}
							}
							testVCollectives(t, comms, m)
							testSendRecv(t, comms, m)
						}
						if count == 7 {
							run(t, comms, func(c *hcomm.Comm) error {
								s, _ := c.Device().CreateStream()
								defer s.Destroy()
								if err := collectives.Barrier(c, s); err != nil {
									return err
								}
								return s.SynchronizeWithTimeout(time.Minute)
							})
						}
					}
				}
			})
		}
	}
}

// TestCollectivesLarge: 1 Mi + 3 elements through a 64 KiB HCCL buffer, so
// that every pipelined schedule runs through many pieces and blocks.
func TestCollectivesLarge(t *testing.T) {
	for _, n := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			comms := initAll(t, n, &hcomm.Config{BufferSize: largeBuffer()})
			for _, dt := range []hcomm.DataType{hcomm.Float32, hcomm.Int8, hcomm.BFloat16} {
				m := matrixCase{dt: dt, op: hcomm.Sum, count: int64(bigCount) / int64(n), root: n - 1}
				for _, a := range algosOf("AllGather") {
					testAllGather(t, comms, m, a, false)
				}
				for _, a := range algosOf("ReduceScatter") {
					testReduceScatter(t, comms, m, a, dt == hcomm.Int8)
				}
				testReduce(t, comms, m, collectives.AlgoRing, false)
				testScatterGather(t, comms, m, collectives.AlgoPairwise)
				testAlltoAll(t, comms, m, collectives.AlgoPairwise)
				testVCollectives(t, comms, m)
				testSendRecv(t, comms, m)
			}
		})
	}
}

func allReduceRaw(t *testing.T, comms []*hcomm.Comm, m matrixCase, algo collectives.Algorithm, inPlace bool) {
	n, es, cnt := comms[0].Size(), int64(m.dt.Size()), int(m.count)
	withBuffers(t, comms,
		func(int) int64 { return m.count * es }, func(int) int64 { return m.count * es },
		func(r int) []byte { return encodeAll(m.dt, cnt, func(i int) float64 { return input(m.dt, r, i) }) },
		func(b *rankBufs) error {
			recv := b.recv
			if inPlace {
				recv = b.send
			}
			if err := collectives.AllReduce(b.send, recv, m.count, m.dt, m.op, b.c, b.s, &collectives.Options{Algorithm: algo}); err != nil {
				return err
			}
			if inPlace {
				return b.s.MemcpyAsync(b.recv, b.send, m.count*es, device.MemcpyDeviceToDevice)
			}
			return nil
		},
		func(r int) []byte {
			return encodeAll(m.dt, cnt, func(i int) float64 {
				return ref(m.op, n, func(q int) float64 { return input(m.dt, q, i) })
			})
		}, fmt.Sprintf("AllReduce %v %v in-place=%v", m, algo, inPlace))
}

func broadcastRaw(t *testing.T, comms []*hcomm.Comm, m matrixCase, algo collectives.Algorithm) {
	es, cnt := int64(m.dt.Size()), int(m.count)
	withBuffers(t, comms,
		func(int) int64 { return m.count * es }, func(int) int64 { return m.count * es },
		func(r int) []byte { return encodeAll(m.dt, cnt, func(i int) float64 { return input(m.dt, r, i) }) },
		func(b *rankBufs) error {
			if err := collectives.Broadcast(b.send, m.count, m.dt, m.root, b.c, b.s, &collectives.Options{Algorithm: algo}); err != nil {
				return err
			}
			if m.count == 0 {
				return nil
			}
			return b.s.MemcpyAsync(b.recv, b.send, m.count*es, device.MemcpyDeviceToDevice)
		},
		func(r int) []byte {
			return encodeAll(m.dt, cnt, func(i int) float64 { return input(m.dt, m.root, i) })
		}, fmt.Sprintf("Broadcast %v %v", m, algo))
}

// TestMidSizeThresholds: every collective and algorithm at counts on and
// around the thresholds of the tuning table and the pipelines — the inline
// size (one-shot against the rest, per rank and per call), one and n
// pipeline pieces (pieces forced to 4 KiB, so that mid sizes run through
// many pieces and blocks), and treeMax over a network (the tree against the
// ring) — odd counts among them, in a 1-byte and a 4-byte type, over inproc
// and tcp with 2, 3 and 4 ranks, each checked against the float64
// reference, on one set of communicators per case so that the pipes'
// counters carry from size to size.
func TestMidSizeThresholds(t *testing.T) {
	const piece = 4 << 10
	defer collectives.SetPieceOverride(piece)()
	for _, tr := range []hcommtest.Transport{hcommtest.Inproc, hcommtest.TCP} {
		for _, n := range []int{2, 3, 4} {
			if raceEnabled && n != 3 {
				continue // under the race detector 3 ranks only (93 s with every inproc count); make test runs all without it
			}
			t.Run(fmt.Sprintf("%v/ranks=%d", tr, n), func(t *testing.T) {
				comms := hcommtest.New(t, n, tr)
				inline := collectives.InlineBytes(comms[0])
				for _, dt := range []hcomm.DataType{hcomm.Int8, hcomm.Float32} {
					es := int64(dt.Size())
					var counts []int64
					for _, b := range []int64{inline, inline / int64(n), piece, int64(n) * piece} {
						counts = append(counts, b/es-1, b/es, b/es+1)
					}
					counts = append(counts, 5*int64(n)*piece/es+3) // several blocks of the ring all-reduce
					for _, count := range counts {
						m := matrixCase{dt: dt, op: hcomm.Sum, count: count, root: int(count) % n, inline: inline}
						for _, a := range algosOf("AllGather") {
							testAllGather(t, comms, m, a, count%2 == 1)
						}
						for _, a := range algosOf("ReduceScatter") {
							testReduceScatter(t, comms, m, a, count%2 == 0)
						}
						for _, a := range algosOf("AlltoAll") {
							if fits(a, m.count*int64(m.dt.Size()), m.inline) { // oneshot: a block per hello
								testAlltoAll(t, comms, m, a)
							}
						}
						for _, a := range algosOf("AllReduce") {
							if a == collectives.AlgoHier || a == collectives.AlgoOrdered || ringAlias(a, n, tr) {
								continue // their own tests
							}
							if fits(a, count*es, inline) {
								allReduceRaw(t, comms, m, a, count%2 == 1)
							}
						}
						for _, a := range algosOf("Broadcast") {
							if fits(a, count*es, inline) {
								broadcastRaw(t, comms, m, a)
							}
						}
						testVCollectives(t, comms, m)
					}
				}
				if tr == hcommtest.TCP && n > 2 && !raceEnabled {
					// treeMax: the selector's tree below, its ring above.
					for _, count := range []int64{1<<20/4 - 1, 1 << 20 / 4, 1<<20/4 + 1} {
						broadcastRaw(t, comms, matrixCase{dt: hcomm.Float32, count: count, root: n - 1}, collectives.AlgoAuto)
					}
				}
			})
		}
	}
}

// TestBackToBackSizes: collectives of different kinds, sizes and algorithms
// issued back to back on one stream with no synchronization between them —
// one-shot, one piece, many pieces, forced algorithms, the read lanes
// beside the direct all-reduce's gather-slot turns — and every result
// checked once the stream is done: a schedule's pipes and gather slots must
// be left in step for whatever follows, whatever its size.
func TestBackToBackSizes(t *testing.T) {
	defer collectives.SetPieceOverride(4 << 10)()
	for _, tr := range []hcommtest.Transport{hcommtest.Inproc, hcommtest.Shm, hcommtest.TCP} {
		for _, n := range []int{2, 4} {
			t.Run(fmt.Sprintf("%v/ranks=%d", tr, n), func(t *testing.T) {
				comms := hcommtest.New(t, n, tr)
				inline := collectives.InlineBytes(comms[0]) / 4
				type call struct {
					kind  string
					count int64
					algo  collectives.Algorithm
				}
				calls := []call{
					{"AllReduce", 7, 0}, {"AllGather", inline + 1, 0}, {"AllReduce", 3*1024 + 5, collectives.AlgoRing},
					{"Broadcast", 1, 0}, {"ReduceScatter", 5 * 1024, 0}, {"AlltoAll", 1025, 0},
					{"AllReduce", 5*1024 + 3, collectives.AlgoHD}, {"Broadcast", 9 * 1024, collectives.AlgoTree},
					{"AllGather", 2049, collectives.AlgoRing}, {"AllGather", 2049, collectives.AlgoDirect},
					{"AllReduce", 3*1024 + 7, collectives.AlgoDirect}, {"AlltoAll", 1025, collectives.AlgoPairwise},
					{"AllReduce", int64(n)*collectives.ArDirectMin/4 + 5, 0}, // direct where ranks read each other
					{"Broadcast", 9*1024 + 1, collectives.AlgoDirect}, {"ReduceScatter", 3, 0}, {"AlltoAll", 1, 0},
				}
				run(t, comms, func(c *hcomm.Comm) error {
					me, dev := c.Rank(), c.Device()
					s, err := dev.CreateStream()
					if err != nil {
						return err
					}
					defer s.Destroy()
					type result struct {
						recv device.Ptr
						want []float32
					}
					var results []result
					for i, x := range calls {
						o := &collectives.Options{Algorithm: x.algo}
						in := func(r int, j int64) float32 { return float32((int64(r)*31 + j*7 + int64(i)) % 13) }
						sendN, recvN := x.count, x.count
						switch x.kind {
						case "AllGather":
							recvN = int64(n) * x.count
						case "ReduceScatter":
							sendN = int64(n) * x.count
						case "AlltoAll":
							sendN, recvN = int64(n)*x.count, int64(n)*x.count
						}
						send, _ := dev.Malloc(4 * sendN)
						recv, _ := dev.Malloc(4 * recvN)
						defer dev.Free(send)
						defer dev.Free(recv)
						host := make([]float32, sendN)
						for j := range host {
							host[j] = in(me, int64(j))
						}
						if err := dev.MemcpyHtoD(send, f32bytes(host)); err != nil {
							return err
						}
						want := make([]float32, recvN)
						switch x.kind {
						case "AllReduce":
							err = collectives.AllReduce(send, recv, x.count, hcomm.Float32, hcomm.Sum, c, s, o)
							for j := range want {
								for r := 0; r < n; r++ {
									want[j] += in(r, int64(j))
								}
							}
						case "AllGather":
							err = collectives.AllGather(send, recv, x.count, hcomm.Float32, c, s, o)
							for j := range want {
								want[j] = in(j/int(x.count), int64(j)%x.count)
							}
						case "Broadcast":
							recv = send
							err = collectives.Broadcast(send, x.count, hcomm.Float32, n-1, c, s, o)
							for j := range want {
								want[j] = in(n-1, int64(j))
							}
						case "ReduceScatter":
							err = collectives.ReduceScatter(send, recv, x.count, hcomm.Float32, hcomm.Sum, c, s, o)
							for j := range want {
								for r := 0; r < n; r++ {
									want[j] += in(r, int64(me)*x.count+int64(j))
								}
							}
						case "AlltoAll":
							err = collectives.AlltoAll(send, x.count, hcomm.Float32, recv, x.count, hcomm.Float32, c, s, o)
							for j := range want {
								p := j / int(x.count)
								want[j] = in(p, int64(me)*x.count+int64(j)%x.count)
							}
						}
						if err != nil {
							return fmt.Errorf("call %d (%s of %d, %v): %w", i, x.kind, x.count, x.algo, err)
						}
						results = append(results, result{recv, want})
					}
					if err := s.SynchronizeWithTimeout(time.Minute); err != nil {
						return err
					}
					for i, r := range results {
						got := make([]byte, 4*len(r.want))
						if err := dev.MemcpyDtoH(got, r.recv); err != nil {
							return err
						}
						for j, w := range r.want {
							if g := math.Float32frombits(binary.LittleEndian.Uint32(got[4*j:])); g != w {
								return fmt.Errorf("call %d (%s of %d, %v): element %d = %v, want %v", i, calls[i].kind, calls[i].count, calls[i].algo, j, g, w)
							}
						}
					}
					return nil
				})
			})
		}
	}
}

func f32bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}
