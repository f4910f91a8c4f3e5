package hcommtest_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
)

// A test of an all-reduce over every transport this machine runs, four ranks
// each: goroutines over inproc, shm and tcp, then processes over shm and tcp.
func ExampleRun() {
	test := func(t *testing.T) { // func TestAllReduce(t *testing.T)
		for _, tr := range hcommtest.Transports() {
			t.Run(tr.String(), func(t *testing.T) {
				hcommtest.Run(t, 4, tr, func(t testing.TB, c *hcomm.Comm) {
					send := []float32{1, float32(c.Rank())}
					recv := make([]float32, 2)
					if err := collectives.AllReduceSlice(context.Background(), c, send, recv, hcomm.Sum, nil); err != nil {
						t.Fatal(err)
					}
					if recv[0] != 4 || recv[1] != 0+1+2+3 {
						t.Errorf("all-reduce gave %v, want [4 6]", recv)
					}
				})
			})
		}
	}
	_ = test
}

// Go runs the ranks of communicators made elsewhere (here InitAll's) and
// returns their failures as one error: for examples and tools without a
// testing.TB.
func ExampleGo() {
	comms, err := hcomm.InitAll(3, &hcomm.Config{BufferSize: 1 << 20})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	sums := make([][]int32, len(comms))
	err = hcommtest.Go(comms, func(c *hcomm.Comm) error {
		sums[c.Rank()] = make([]int32, 2)
		return collectives.AllReduceSlice(context.Background(), c, []int32{1, int32(c.Rank())}, sums[c.Rank()], hcomm.Sum, nil)
	})
	fmt.Println(sums, err)
	// Output: [[3 3] [3 3] [3 3]] <nil>
}
