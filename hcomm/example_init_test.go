package hcomm_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// Rank 0 makes a root info and hands its string to every rank — here
// goroutines; in real use other processes or hosts, which parse it back —
// and every rank joins with InitRootInfo.
func ExampleInitRootInfo() {
	cfg := &hcomm.Config{BufferSize: 1 << 20}
	root, err := hcomm.GetRootInfo(cfg) // on rank 0
	if err != nil {
		panic(err)
	}
	msg := root.String() // "hcomm1://<secret>@<address of rank 0's store>": send it to the ranks

	const n = 3
	sums := make([][]float64, n)
	var wg sync.WaitGroup
	for rank := range n {
		wg.Add(1)
		go func() { // each rank, wherever it runs
			defer wg.Done()
			ri, err := hcomm.ParseRootInfo(msg)
			if err != nil {
				panic(err)
			}
			c, err := hcomm.InitRootInfo(n, ri, rank, cfg)
			if err != nil {
				panic(err)
			}
			send := []float64{float64(rank), 1}
			sums[rank] = make([]float64, 2)
			if err := collectives.AllReduceSlice(context.Background(), c, send, sums[rank], hcomm.Sum, nil); err != nil {
				panic(err)
			}
			if err := collectives.BarrierContext(context.Background(), c); err != nil { // rank 0's store goes with its Destroy
				panic(err)
			}
			c.Destroy()
		}()
	}
	wg.Wait()
	for rank, s := range sums {
		fmt.Println("rank", rank, s)
	}
	// Output:
	// rank 0 [3 3]
	// rank 1 [3 3]
	// rank 2 [3 3]
}
