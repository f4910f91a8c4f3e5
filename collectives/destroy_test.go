package collectives_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
)

// destroyCase is one collective call of TestDestroyRightAfterCollective:
// send and recv hold 4*n*count bytes each (float32), enough for every
// collective's layout with count elements per rank.
type destroyCase struct {
	name string
	call func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, count int64) error
}

func destroyCases() []destroyCase {
	const f = hcomm.Float32
	every := func(n int, v int64) (counts, displs []int64) {
		counts, displs = make([]int64, n), make([]int64, n)
		for p := range counts {
			counts[p], displs[p] = v, int64(p)*v
		}
		return counts, displs
	}
	// Not in the table yet: the schedules that end with the handshake
	// (oneshot, and auto, which picks oneshot at this size; Barrier). The
	// hello's writes are non-blocking (WriteWithNotifyNbi), and a rank whose
	// hello wait is satisfied may finish and destroy its communicator before
	// its own hello has landed at a peer, which then fails its wait with
	// ErrPeerClosed; a ChannelFence after the waits needs the peer alive too.
	var cs []destroyCase
	for _, a := range collectives.Algorithms("AllReduce") {
		if a == collectives.AlgoOneShot {
			continue
		}
		cs = append(cs, destroyCase{"AllReduce/" + a.String(), func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, count int64) error {
			return collectives.AllReduce(send, recv, count, f, hcomm.Sum, c, s, &collectives.Options{Algorithm: a})
		}})
	}
	for _, a := range collectives.Algorithms("Broadcast") {
		if a == collectives.AlgoOneShot {
			continue
		}
		cs = append(cs, destroyCase{"Broadcast/" + a.String(), func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, count int64) error {
			return collectives.Broadcast(send, count, f, c.Size()-1, c, s, &collectives.Options{Algorithm: a})
		}})
	}
	for _, a := range collectives.Algorithms("AllGather") {
		if a == collectives.AlgoOneShot {
			continue
		}
		cs = append(cs, destroyCase{"AllGather/" + a.String(), func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, count int64) error {
			return collectives.AllGather(send, recv, count, f, c, s, &collectives.Options{Algorithm: a})
		}})
	}
	cs = append(cs, destroyCase{"AllGatherV", func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, count int64) error {
		counts, displs := every(c.Size(), count)
		return collectives.AllGatherV(send, count, recv, counts, displs, f, c, s, nil)
	}})
	for _, a := range collectives.Algorithms("ReduceScatter") {
		if a == collectives.AlgoOneShot {
			continue
		}
		cs = append(cs, destroyCase{"ReduceScatter/" + a.String(), func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, count int64) error {
			return collectives.ReduceScatter(send, recv, count, f, hcomm.Sum, c, s, &collectives.Options{Algorithm: a})
		}})
	}
	for _, a := range collectives.Algorithms("ReduceScatterV") {
		if a == collectives.AlgoOneShot {
			continue
		}
		cs = append(cs, destroyCase{"ReduceScatterV/" + a.String(), func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, count int64) error {
			counts, displs := every(c.Size(), count)
			return collectives.ReduceScatterV(send, counts, displs, recv, count, f, hcomm.Sum, c, s, &collectives.Options{Algorithm: a})
		}})
	}
	for _, a := range collectives.Algorithms("Reduce") {
		if a == collectives.AlgoOneShot {
			continue
		}
		cs = append(cs, destroyCase{"Reduce/" + a.String(), func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, count int64) error {
			return collectives.Reduce(send, recv, count, f, hcomm.Sum, c.Size()-1, c, s, &collectives.Options{Algorithm: a})
		}})
	}
	cs = append(cs,
		destroyCase{"Scatter", func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, count int64) error {
			return collectives.Scatter(send, recv, count, f, c.Size()-1, c, s, nil)
		}},
		destroyCase{"Gather", func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, count int64) error {
			return collectives.Gather(send, recv, count, f, c.Size()-1, c, s, nil)
		}},
		destroyCase{"AlltoAll", func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, count int64) error {
			return collectives.AlltoAll(send, count, f, recv, count, f, c, s, nil)
		}},
		destroyCase{"AlltoAllV", func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, count int64) error {
			counts, displs := every(c.Size(), count)
			return collectives.AlltoAllV(send, counts, displs, f, recv, counts, displs, f, c, s, nil)
		}},
		destroyCase{"SendRecv", func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, count int64) error {
			// Every rank sends to its right and receives from its left.
			n, r := c.Size(), c.Rank()
			return collectives.BatchSendRecv([]collectives.SendRecvItem{
				{Type: collectives.SendItem, Buf: send, Count: count, DataType: f, RemoteRank: (r + 1) % n},
				{Type: collectives.RecvItem, Buf: recv, Count: count, DataType: f, RemoteRank: (r + n - 1) % n},
			}, c, s)
		}},
	)
	return cs
}

// TestDestroyRightAfterCollective: doc.go promises that a rank may destroy
// its communicator as soon as its collective's stream is done. Each rank
// runs one small collective on a fresh sub-communicator, synchronizes its
// stream and destroys the sub-communicator at once, with no barrier, many
// times: a schedule whose last step still needs a peer after that peer's
// stream is done (a notify record not yet applied there, a read of its
// memory) fails here with ErrPeerClosed on some rank.
func TestDestroyRightAfterCollective(t *testing.T) {
	iters := 12
	if testing.Short() {
		iters = 3
	}
	for _, tr := range []hcommtest.Transport{hcommtest.Shm, hcommtest.TCP} {
		for _, n := range []int{2, 3, 4} {
			t.Run(fmt.Sprintf("%v/ranks=%d", tr, n), func(t *testing.T) {
				cases := destroyCases()
				hcommtest.Options{Timeout: 3 * time.Minute}.Run(t, n, tr, func(t testing.TB, c *hcomm.Comm) {
					all := make([]int, n)
					for i := range all {
						all[i] = i
					}
					s, err := c.Device().CreateStream()
					if err != nil {
						t.Fatal(err)
					}
					defer s.Destroy()
					const count = 16
					size := int64(4 * n * count)
					send, err := c.Device().Malloc(size)
					if err != nil {
						t.Fatal(err)
					}
					defer c.Device().Free(send)
					recv, err := c.Device().Malloc(size)
					if err != nil {
						t.Fatal(err)
					}
					defer c.Device().Free(recv)
					id := uint64(0)
					for _, tc := range cases {
						for it := 0; it < iters; it++ {
							id++
							sub, err := c.CreateSubComm(all, id, &hcomm.Config{BufferSize: 64 << 10, Transport: tr.Name, ConnectTimeout: 20 * time.Second})
							if err != nil {
								t.Fatalf("%s: iteration %d: %v", tc.name, it, err)
							}
							err = tc.call(sub, s, send, recv, count)
							if errors.Is(err, hcomm.ErrNotSupport) {
								sub.Destroy()
								break // hier on one host
							}
							if err == nil {
								err = s.SynchronizeWithTimeout(time.Minute)
							}
							sub.Destroy()
							if err != nil {
								t.Fatalf("%s: iteration %d: %v", tc.name, it, err)
							}
						}
					}
				})
			})
		}
	}
}
