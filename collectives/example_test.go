package collectives_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// Four ranks in one process sum their vectors; every rank gets the total.
func ExampleAllReduceSlice() {
	comms, err := hcomm.InitAll(4, &hcomm.Config{BufferSize: 1 << 20})
	if err != nil {
		panic(err)
	}
	results := make([][]float32, 4)
	var wg sync.WaitGroup
	for _, c := range comms {
		wg.Add(1)
		go func(c *hcomm.Comm) {
			defer wg.Done()
			r := float32(c.Rank())
			send := []float32{r, 10 * r, 100 * r}
			recv := make([]float32, len(send))
			if err := collectives.AllReduceSlice(context.Background(), c, send, recv, hcomm.Sum, nil); err != nil {
				panic(err)
			}
			results[c.Rank()] = recv
		}(c)
	}
	wg.Wait()
	for _, c := range comms {
		c.Destroy()
	}
	for r, res := range results {
		fmt.Println("rank", r, res)
	}
	// Output:
	// rank 0 [6 60 600]
	// rank 1 [6 60 600]
	// rank 2 [6 60 600]
	// rank 3 [6 60 600]
}
