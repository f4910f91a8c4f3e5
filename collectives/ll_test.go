package collectives_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
)

// llTransports are the transports whose hellos travel as flagged words
// (collectives/ll.go): ranks of one process over inproc and over shm.
var llTransports = []hcommtest.Transport{hcommtest.Inproc, hcommtest.Shm}

// A rank that has polled past its spin bound sleeps on the hello notify
// behind a wake word, and the late sender wakes it: each call completes as
// soon as the sender arrives, not at the execution timeout (without the
// sender's look at the wake word the sleeping rank would wait it out).
func TestFlaggedHelloWakesASleepingRank(t *testing.T) {
	t.Setenv("HCOMM_LL", "1")
	for _, tr := range llTransports {
		t.Run(tr.String(), func(t *testing.T) {
			o := hcommtest.Options{Config: &hcomm.Config{ExecTimeout: 20 * time.Second, BufferSize: 1 << 20}}
			o.Run(t, 2, tr, func(t testing.TB, c *hcomm.Comm) {
				s, err := c.Device().CreateStream()
				if err != nil {
					t.Fatal(err)
				}
				defer s.Destroy()
				buf := deviceFloats(t, c, 3, 0)
				defer c.Device().Free(buf)
				for k := 1; k <= 4; k++ {
					if err := c.Device().MemcpyHtoD(buf, f32s(float32(k*(c.Rank()+1)), 1, 2)); err != nil {
						t.Fatal(err)
					}
					if c.Rank() == 1 {
						time.Sleep(30 * time.Millisecond) // rank 0 is asleep by now
					}
					start := time.Now()
					if err := collectives.AllReduce(buf, buf, 3, hcomm.Float32, hcomm.Sum, c, s, nil); err != nil {
						t.Fatal(err)
					}
					if err := s.SynchronizeWithTimeout(time.Minute); err != nil {
						t.Fatalf("call %d: %v", k, err)
					}
					if d := time.Since(start); c.Rank() == 0 && d > 5*time.Second {
						t.Fatalf("call %d took %v: the late sender did not wake the sleeping rank", k, d)
					}
					got := readFloats(t, c, buf, 3)
					if want := float32(3 * k); got[0] != want || got[1] != 2 || got[2] != 4 {
						t.Fatalf("call %d: got %v, want [%v 2 4]", k, got, want)
					}
				}
			})
		})
	}
}

// Flagged hellos under every timing: hundreds of all-reduces of sizes from
// one element to past the inline limit (so that flagged one-shots and
// pipelined rings alternate), each rank pausing at random for up to a
// spin bound and beyond, with 3 ranks and with 4 ranks on one processor;
// every result is checked exactly. A lost wake hangs (and fails at the
// execution timeout), a word taken from the hello two before gives a wrong
// sum.
func TestFlaggedHelloStress(t *testing.T) {
	t.Setenv("HCOMM_LL", "1")
	calls := 300
	if testing.Short() {
		calls = 60
	}
	for _, tr := range llTransports {
		for _, shape := range []struct{ n, procs int }{{3, 0}, {4, 1}} {
			t.Run(fmt.Sprintf("%v/ranks=%d/gomaxprocs=%d", tr, shape.n, shape.procs), func(t *testing.T) {
				o := hcommtest.Options{Config: &hcomm.Config{ExecTimeout: 60 * time.Second, BufferSize: 1 << 20}, GOMAXPROCS: shape.procs}
				sizes := []int{1, 2, 13, 64, 1000, 20000, 70000}
				o.Run(t, shape.n, tr, func(t testing.TB, c *hcomm.Comm) {
					s, err := c.Device().CreateStream()
					if err != nil {
						t.Fatal(err)
					}
					defer s.Destroy()
					rng := rand.New(rand.NewPCG(uint64(c.Rank()), 7))
					order := rand.New(rand.NewPCG(1, 1)) // the same on every rank: the calls
					buf := deviceFloats(t, c, sizes[len(sizes)-1], 0)
					defer c.Device().Free(buf)
					n := c.Size()
					for k := 0; k < calls; k++ {
						count := sizes[order.IntN(len(sizes))]
						in := make([]float32, count)
						for i := range in {
							in[i] = float32((i+k)%7 + c.Rank())
						}
						if err := c.Device().MemcpyHtoD(buf, f32s(in...)); err != nil {
							t.Fatal(err)
						}
						switch r := rng.IntN(10); {
						case r < 2:
							time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
						case r < 3:
							time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
						}
						if err := collectives.AllReduce(buf, buf, int64(count), hcomm.Float32, hcomm.Sum, c, s, nil); err != nil {
							t.Fatal(err)
						}
						if err := s.SynchronizeWithTimeout(time.Minute); err != nil {
							t.Fatalf("call %d (%d elements): %v", k, count, err)
						}
						got := readFloats(t, c, buf, count)
						for i, v := range got {
							want := float32(n*((i+k)%7) + n*(n-1)/2)
							if v != want {
								t.Fatalf("call %d (%d elements): element %d is %v, want %v", k, count, i, v, want)
							}
						}
					}
				})
			})
		}
	}
}
