package collectives_test

import (
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

// Flagged hellos under every timing: TestLaneStress runs its calls with
// HCOMM_LL=1 too (every hello flagged, the lane off).
