package collectives_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
)

// TestSteeredHellosOverTCP: over tcp the one-shot all-to-all's and
// all-gather's hellos have their blocks steered straight into recv as they
// arrive, and the recursive-doubling all-gather's into the rank's own slot
// (steer.go); the calls stay exact: blocks below, at and above the
// smallest steered payload, odd ones, every data type's width, in place
// and out, back to back with each other and with calls that steer nothing,
// 2 to 5 ranks (3 and 5: the butterfly's folds). Steering is counted: a
// run in which no block landed in place does not test it.
func TestSteeredHellosOverTCP(t *testing.T) {
	for _, n := range []int{2, 3, 4, 5} {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			comms := hcommtest.Options{}.New(t, n, hcommtest.TCP)
			inline := collectives.InlineBytes(comms[0])
			before, rdLanded := collectives.SteersLanded(), int64(0)
			for _, dt := range []hcomm.DataType{hcomm.Int8, hcomm.Float16, hcomm.Float32, hcomm.Float64} {
				es := int64(dt.Size())
				for _, bytes := range []int64{collectives.SteerMin - es, collectives.SteerMin, collectives.SteerMin + 7*es, 3*collectives.SteerMin + 5*es, inline} {
					m := matrixCase{dt: dt, op: hcomm.Sum, count: bytes / es, inline: inline}
					testAlltoAll(t, comms, m, collectives.AlgoOneShot)
					testAllGather(t, comms, m, collectives.AlgoOneShot, false)
					testAllGather(t, comms, m, collectives.AlgoOneShot, true)
					testAlltoAll(t, comms, m, collectives.AlgoAuto)
					m.root = n - 1
					broadcastRaw(t, comms, m, collectives.AlgoOneShot)
					m.root = 0
					rd := collectives.SteersLanded()
					testAllGather(t, comms, m, collectives.AlgoRD, false)
					testAllGather(t, comms, m, collectives.AlgoRD, true)
					rdLanded += collectives.SteersLanded() - rd
				}
			}
			t.Logf("%d payloads steered into place (inline %d)", collectives.SteersLanded()-before, inline)
			if collectives.SteersLanded() == before {
				t.Fatal("no hello's payload was steered into place")
			}
			if rdLanded == 0 {
				t.Fatal("no recursive-doubling all-gather's blocks were steered into place")
			}
		})
	}
}

// TestSteeredMismatch: a rank whose one-shot all-gather meets its peers'
// one-shot all-to-alls of the same block size writes a hello of exactly
// the length their steers wait for; the block may land in their receive
// buffers, but every rank still fails with ErrMismatch naming the odd call.
func TestSteeredMismatch(t *testing.T) {
	const count = 2 * collectives.SteerMin / 4 // float32 blocks of 2·SteerMin bytes
	oneShot := &collectives.Options{Algorithm: collectives.AlgoOneShot}
	comms := hcommtest.Options{Config: &hcomm.Config{ExecTimeout: 20 * time.Second}}.New(t, 3, hcommtest.TCP)
	before := collectives.SteersLanded()
	// Warm up: the same all-to-all on every rank, steered.
	first := func(c *hcomm.Comm, s *device.Stream, buf device.Ptr) error {
		for i := 0; i < 20; i++ {
			if err := collectives.AlltoAll(buf, count, hcomm.Float32, buf.Add(1<<20), count, hcomm.Float32, c, s, oneShot); err != nil {
				return err
			}
		}
		return nil
	}
	runMismatchAfter(t, comms, 1, mismatchCase{
		name: "steered",
		odd: func(c *hcomm.Comm, s *device.Stream, buf device.Ptr) error {
			return collectives.AllGather(buf, buf.Add(1<<20), count, hcomm.Float32, c, s, oneShot)
		},
		usual: func(c *hcomm.Comm, s *device.Stream, buf device.Ptr) error {
			return collectives.AlltoAll(buf, count, hcomm.Float32, buf.Add(1<<20), count, hcomm.Float32, c, s, oneShot)
		},
		want: "AllGather",
	}, false, first)
	if collectives.SteersLanded() == before {
		t.Fatal("no all-to-all's block was steered: this test does not test a steered mismatch")
	}
}

// TestLaneSteersOverTCP: 2 ranks over tcp, one stream, all-to-alls,
// all-gathers (in place and out) and broadcasts from either root back to
// back, blocks below and above the smallest steered payload: the calls take
// the lane (in the caller's goroutine), whose steers put the peer's block
// or the root's data straight into recv; every result exact, and both the
// lane and steering counted.
func TestLaneSteersOverTCP(t *testing.T) {
	comms := hcommtest.Options{}.New(t, 2, hcommtest.TCP)
	lane, landed := laneRunsOf(comms), collectives.SteersLanded()
	run(t, comms, func(c *hcomm.Comm) error {
		dev, me := c.Device(), c.Rank()
		s, err := dev.CreateStream()
		if err != nil {
			return err
		}
		defer s.Destroy()
		const most = 3 * collectives.SteerMin
		send, err := dev.Malloc(2 * most)
		if err != nil {
			return err
		}
		defer dev.Free(send)
		recv, err := dev.Malloc(2 * most)
		if err != nil {
			return err
		}
		defer dev.Free(recv)
		val := func(r, i, round int) byte { return byte(r*89 + i*7 + i/251 + round*13) }
		check := func(what string, round int, want func(i int) byte, n int64) error {
			got := make([]byte, n)
			if err := s.SynchronizeWithTimeout(time.Minute); err != nil {
				return err
			}
			if err := dev.MemcpyDtoH(got, recv); err != nil {
				return err
			}
			for i := range got {
				if got[i] != want(i) {
					return fmt.Errorf("round %d: %s of %d bytes: recv[%d] = %d, want %d", round, what, n, i, got[i], want(i))
				}
			}
			return nil
		}
		fillSend := func(round int, n int64, at func(i int) byte) error {
			b := make([]byte, n)
			for i := range b {
				b[i] = at(i)
			}
			return dev.MemcpyHtoD(send, b)
		}
		for round := 0; round < 40; round++ {
			block := []int64{collectives.SteerMin - 1, collectives.SteerMin, collectives.SteerMin + 3, most}[round%4]
			// All-to-all: rank r's block for p holds val(r, p·block + i).
			if err := fillSend(round, 2*block, func(i int) byte { return val(me, i, round) }); err != nil {
				return err
			}
			if err := collectives.AlltoAll(send, block, hcomm.Int8, recv, block, hcomm.Int8, c, s, nil); err != nil {
				return err
			}
			if err := check("all-to-all", round, func(i int) byte {
				q := i / int(block)
				return val(q, me*int(block)+i%int(block), round)
			}, 2*block); err != nil {
				return err
			}
			// All-gather, out of place and then in place.
			if err := fillSend(round, block, func(i int) byte { return val(me, i, round+1) }); err != nil {
				return err
			}
			if err := collectives.AllGather(send, recv, block, hcomm.Int8, c, s, nil); err != nil {
				return err
			}
			gathered := func(i int) byte { return val(i/int(block), i%int(block), round+1) }
			if err := check("all-gather", round, gathered, 2*block); err != nil {
				return err
			}
			if err := dev.Memset(recv, 2*block, 0); err != nil {
				return err
			}
			if err := dev.Memcpy(recv.Add(int64(me)*block), send, block, device.MemcpyDeviceToDevice); err != nil {
				return err
			}
			if err := collectives.AllGather(recv.Add(int64(me)*block), recv, block, hcomm.Int8, c, s, nil); err != nil {
				return err
			}
			if err := check("in-place all-gather", round, gathered, 2*block); err != nil {
				return err
			}
			// Broadcast from rank round%2, into recv.
			root := round % 2
			if me == root {
				if err := dev.Memcpy(recv, send, block, device.MemcpyDeviceToDevice); err != nil {
					return err
				}
			}
			if err := collectives.Broadcast(recv, block, hcomm.Int8, root, c, s, nil); err != nil {
				return err
			}
			if err := check("broadcast", round, func(i int) byte { return val(root, i, round+1) }, block); err != nil {
				return err
			}
		}
		return nil
	})
	if laneRunsOf(comms) == lane {
		t.Fatal("no call took the lane: this test does not test the lane's steers")
	}
	if collectives.SteersLanded() == landed {
		t.Fatal("no block was steered into place")
	}
}
