package collectives_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
)

// f32s encodes xs as float32 bytes; unf32 decodes them.
func f32s(xs ...float32) []byte {
	b := make([]byte, 4*len(xs))
	for i, x := range xs {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func unf32(b []byte) []float32 {
	xs := make([]float32, len(b)/4)
	for i := range xs {
		xs[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return xs
}

// deviceFloats allocates count float32s on c's device, each v.
func deviceFloats(t testing.TB, c *hcomm.Comm, count int, v float32) device.Ptr {
	t.Helper()
	p, err := c.Device().Malloc(int64(max(4*count, 4)))
	if err != nil {
		t.Fatal(err)
	}
	xs := make([]float32, count)
	for i := range xs {
		xs[i] = v
	}
	if err := c.Device().MemcpyHtoD(p, f32s(xs...)); err != nil {
		t.Fatal(err)
	}
	return p
}

func readFloats(t testing.TB, c *hcomm.Comm, p device.Ptr, count int) []float32 {
	t.Helper()
	b := make([]byte, 4*count)
	if err := c.Device().MemcpyDtoH(b, p); err != nil {
		t.Fatal(err)
	}
	return unf32(b)
}

// A stream-ordered collective returns once enqueued even when the caller's
// stream is idle and its hello runs in the calling goroutine: a peer that is
// late (here: one that calls only after this rank's call has returned) is
// waited for by the stream task queued behind the hello, and the result is
// right once the stream is synchronized. A hello that waited for its peers in
// the calling goroutine would never return here.
func TestLatePeerCompletesThroughQueuedRest(t *testing.T) {
	for _, tr := range []hcommtest.Transport{hcommtest.Inproc, hcommtest.Shm} {
		t.Run(tr.String(), func(t *testing.T) {
			for _, algo := range []collectives.Algorithm{collectives.AlgoOneShot, collectives.AlgoRing} {
				returned := make(chan time.Duration, 1)
				hcommtest.Run(t, 2, tr, func(t testing.TB, c *hcomm.Comm) {
					s, err := c.Device().CreateStream()
					if err != nil {
						t.Fatal(err)
					}
					defer s.Destroy()
					const count = 4
					buf := deviceFloats(t, c, count, float32(c.Rank()+1))
					o := &collectives.Options{Algorithm: algo}
					// Set the channels up first, so that the call below
					// only issues.
					if err := collectives.Barrier(c, s); err != nil {
						t.Fatal(err)
					}
					if err := s.SynchronizeWithTimeout(10 * time.Second); err != nil {
						t.Fatal(err)
					}
					if c.Rank() == 1 {
						select {
						case d := <-returned:
							t.Logf("rank 0's call returned in %v", d)
						case <-time.After(10 * time.Second):
							t.Error("rank 0's AllReduce did not return while rank 1 had not called it")
						}
					}
					start := time.Now()
					if err := collectives.AllReduce(buf, buf, count, hcomm.Float32, hcomm.Sum, c, s, o); err != nil {
						t.Fatal(err)
					}
					if c.Rank() == 0 {
						returned <- time.Since(start)
					}
					if err := s.SynchronizeWithTimeout(10 * time.Second); err != nil {
						t.Fatal(err)
					}
					for i, x := range readFloats(t, c, buf, count) {
						if x != 3 {
							t.Fatalf("%v: element %d is %v, want 3", algo, i, x)
						}
					}
				})
			}
		})
	}
}

// Abort ends the wait of a collective whose peer never comes, whether the
// hello is still polled or waited for by the queued rest; the stream reports
// the abort and stays usable.
func TestAbortEndsPolledHello(t *testing.T) {
	hcommtest.Run(t, 2, hcommtest.Inproc, func(t testing.TB, c *hcomm.Comm) {
		s, err := c.Device().CreateStream()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Destroy()
		if err := collectives.Barrier(c, s); err != nil {
			t.Fatal(err)
		}
		if err := s.SynchronizeWithTimeout(10 * time.Second); err != nil {
			t.Fatal(err)
		}
		if c.Rank() == 1 {
			return // never calls the all-reduce
		}
		buf := deviceFloats(t, c, 2, 1)
		if err := collectives.AllReduce(buf, buf, 2, hcomm.Float32, hcomm.Sum, c, s, &collectives.Options{Algorithm: collectives.AlgoOneShot}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		if err := s.Query(); !errors.Is(err, device.ErrStreamNotComplete) {
			t.Fatalf("Query with the peer absent = %v, want not complete", err)
		}
		s.Abort()
		err = s.SynchronizeWithTimeout(10 * time.Second)
		if !errors.Is(err, device.ErrStreamAbort) {
			t.Fatalf("Synchronize after Abort = %v, want ErrStreamAbort", err)
		}
		if err := s.SynchronizeWithTimeout(10 * time.Second); err != nil {
			t.Fatalf("the stream is not usable after the abort: %v", err)
		}
	})
}

// Small collectives of different kinds, sizes and algorithms issued back to
// back, with no synchronization between them — some complete in the
// caller's goroutine, some go to the queue behind a late peer — give the
// right results, with metrics on (their begin and end tasks around each
// collective) and off, with 2 and 4 ranks, 4 of them on one processor.
func TestBackToBackSmallCollectives(t *testing.T) {
	type cfg struct {
		n       int
		tr      hcommtest.Transport
		metrics bool
		procs   int
	}
	var cases []cfg
	for _, tr := range []hcommtest.Transport{hcommtest.Inproc, hcommtest.Shm} {
		cases = append(cases, cfg{2, tr, false, 0}, cfg{4, tr, false, 0}, cfg{2, tr, true, 0})
	}
	cases = append(cases, cfg{4, hcommtest.Inproc, false, 1}, cfg{4, hcommtest.Shm, true, 1})
	for _, k := range cases {
		name := fmt.Sprintf("%s/%dranks/metrics=%v/procs=%d", k.tr, k.n, k.metrics, k.procs)
		t.Run(name, func(t *testing.T) {
			conf := &hcomm.Config{BufferSize: 1 << 20, Name: "b2b"}
			o := hcommtest.Options{Config: conf, GOMAXPROCS: k.procs}
			if k.metrics {
				conf.Metrics = prometheus.NewRegistry()
				o.Config = conf
			}
			o.Run(t, k.n, k.tr, func(t testing.TB, c *hcomm.Comm) {
				s, err := c.Device().CreateStream()
				if err != nil {
					t.Fatal(err)
				}
				defer s.Destroy()
				n, me := c.Size(), c.Rank()
				type call struct {
					name  string
					count int
					buf   device.Ptr
					want  func(i int) float32
					issue func(buf device.Ptr) error
				}
				one := &collectives.Options{Algorithm: collectives.AlgoOneShot}
				ring := &collectives.Options{Algorithm: collectives.AlgoRing}
				sum := float32(n * (n + 1) / 2)
				var calls []call
				for rep := 0; rep < 40; rep++ {
					for _, count := range []int{1, 2, 3, 4, 5, 15, 16, 17, 255, 256, 257} {
						count := count
						for _, ao := range []*collectives.Options{nil, one, ring} {
							ao := ao
							calls = append(calls, call{name: fmt.Sprintf("AllReduce(%d, %v)", count, ao), count: count,
								want: func(int) float32 { return sum },
								issue: func(b device.Ptr) error {
									return collectives.AllReduce(b, b, int64(count), hcomm.Float32, hcomm.Sum, c, s, ao)
								}})
						}
					}
					calls = append(calls, call{name: "Broadcast(7)", count: 7,
						want: func(int) float32 { return float32(rep%n + 1) },
						issue: func(b device.Ptr) error {
							return collectives.Broadcast(b, 7, hcomm.Float32, rep%n, c, s, nil)
						}})
					calls = append(calls, call{name: "Barrier", issue: func(device.Ptr) error { return collectives.Barrier(c, s) }})
				}
				for i := range calls {
					if calls[i].count > 0 {
						calls[i].buf = deviceFloats(t, c, calls[i].count, float32(me+1))
					}
				}
				for _, x := range calls {
					if err := x.issue(x.buf); err != nil {
						t.Fatalf("%s: %v", x.name, err)
					}
				}
				if err := s.SynchronizeWithTimeout(60 * time.Second); err != nil {
					t.Fatal(err)
				}
				for k, x := range calls {
					if x.count == 0 {
						continue
					}
					for i, v := range readFloats(t, c, x.buf, x.count) {
						if w := x.want(i); v != w {
							t.Fatalf("call %d, %s: element %d is %v, want %v", k, x.name, i, v, w)
						}
					}
				}
			})
		})
	}
}

// HCOMM_HELLO_POLL=off runs every handshake as a stream task (the calls
// still give the right results); a value that is not a duration is refused,
// naming the variable.
func TestHelloPollSetting(t *testing.T) {
	t.Setenv("HCOMM_HELLO_POLL", "off")
	hcommtest.Run(t, 2, hcommtest.Inproc, func(t testing.TB, c *hcomm.Comm) {
		s, err := c.Device().CreateStream()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Destroy()
		buf := deviceFloats(t, c, 4, float32(c.Rank()+1))
		for i := 0; i < 10; i++ {
			if err := collectives.AllReduce(buf, buf, 4, hcomm.Float32, hcomm.Max, c, s, nil); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.SynchronizeWithTimeout(10 * time.Second); err != nil {
			t.Fatal(err)
		}
		if got := readFloats(t, c, buf, 4); got[3] != 2 {
			t.Fatalf("got %v, want 2s", got)
		}
	})
	t.Setenv("HCOMM_HELLO_POLL", "soon")
	hcommtest.Run(t, 1, hcommtest.Inproc, func(t testing.TB, c *hcomm.Comm) {
		s, err := c.Device().CreateStream()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Destroy()
		buf := deviceFloats(t, c, 1, 1)
		err = collectives.AllReduce(buf, buf, 1, hcomm.Float32, hcomm.Sum, c, s, nil)
		if err == nil || !strings.Contains(err.Error(), "HCOMM_HELLO_POLL") {
			t.Fatalf("HCOMM_HELLO_POLL=soon: %v, want an error naming the variable", err)
		}
	})
}

// A small collective whose peers call it at the same time is done when its
// call returns: the hello polls in the caller, and the rest of the
// schedule — the copies out of the hellos, the count table, the lent
// reads, the records, the waits — runs there too while the stream is idle
// (Thread.SetEager), so nothing is left on the stream. Without that the
// copies were queued, and the call returned with them pending. The sizes
// take the one-shot schedules (inputs in the hellos) and, at 16 KiB a rank,
// the direct all-gather and broadcast, whose receivers read the senders'
// buffers. (The poll is set long, so that a rank late by a scheduling
// quantum, or the race detector, does not send the call to the queue.)
func TestSmallCollectivesDoneInCaller(t *testing.T) {
	t.Setenv("HCOMM_HELLO_POLL", "50ms")
	const rounds = 30
	type op struct {
		name  string
		issue func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, k int64) error
		out   func(send, recv device.Ptr, k int) (device.Ptr, int) // where the result is, and its elements
		want  func(i, k int) float32                               // its element i (rank r's input is r+1)
	}
	ops := []op{
		{"AllGather", func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, k int64) error {
			return collectives.AllGather(send, recv, k, hcomm.Float32, c, s, nil)
		}, func(_, recv device.Ptr, k int) (device.Ptr, int) { return recv, 2 * k }, func(i, k int) float32 { return float32(i/k + 1) }},
		{"Broadcast", func(c *hcomm.Comm, s *device.Stream, send, _ device.Ptr, k int64) error {
			return collectives.Broadcast(send, k, hcomm.Float32, 1, c, s, nil)
		}, func(send, _ device.Ptr, k int) (device.Ptr, int) { return send, k }, func(int, int) float32 { return 2 }},
		{"AlltoAll", func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, k int64) error {
			return collectives.AlltoAll(send, k, hcomm.Float32, recv, k, hcomm.Float32, c, s, nil)
		}, func(_, recv device.Ptr, k int) (device.Ptr, int) { return recv, 2 * k }, func(i, k int) float32 { return float32(i/k + 1) }},
		{"ReduceScatter", func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, k int64) error {
			return collectives.ReduceScatter(send, recv, k, hcomm.Float32, hcomm.Sum, c, s, nil)
		}, func(_, recv device.Ptr, k int) (device.Ptr, int) { return recv, k }, func(int, int) float32 { return 3 }},
	}
	for _, o := range ops {
		for _, k := range []int{100, 4096} {
			if k > 100 && o.name != "AllGather" && o.name != "Broadcast" {
				continue
			}
			t.Run(fmt.Sprintf("%s/%d", o.name, k), func(t *testing.T) {
				hcommtest.Options{Config: &hcomm.Config{BufferSize: 1 << 20, Name: "eager"}}.Run(t, 2, hcommtest.Inproc, func(t testing.TB, c *hcomm.Comm) {
					s, err := c.Device().CreateStream()
					if err != nil {
						t.Fatal(err)
					}
					defer s.Destroy()
					me := c.Rank()
					send := deviceFloats(t, c, 2*k, float32(me+1))
					recv := deviceFloats(t, c, 2*k, -1)
					done := 0
					for i := 0; i < rounds; i++ {
						if err := o.issue(c, s, send, recv, int64(k)); err != nil {
							t.Fatal(err)
						}
						if s.Pending() == 0 {
							done++
						}
						if err := s.SynchronizeWithTimeout(60 * time.Second); err != nil {
							t.Fatal(err)
						}
					}
					if done < rounds*2/3 {
						t.Errorf("%d of %d calls done when they returned, want most", done, rounds)
					}
					out, count := o.out(send, recv, k)
					for i, v := range readFloats(t, c, out, count) {
						if w := o.want(i, k); v != w {
							t.Fatalf("element %d is %v, want %v", i, v, w)
						}
					}
				})
			})
		}
	}
}
