package collectives_test

import (
	"fmt"
	"sync"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// Every rank of a ring sends to its right and receives from its left,
// listing the send first: without a group each send would wait for a
// receive its neighbour has not called yet, around the ring for good.
// Inside a group, GroupEnd fuses them into one exchange.
func ExampleGroupStart() {
	const n = 4
	comms, err := hcomm.InitAll(n, &hcomm.Config{BufferSize: 1 << 20})
	if err != nil {
		panic(err)
	}
	got := make([]byte, n)
	var wg sync.WaitGroup
	for _, c := range comms {
		wg.Add(1)
		go func(c *hcomm.Comm) {
			defer wg.Done()
			dev, r := c.Device(), c.Rank()
			s, _ := dev.CreateStream()
			defer s.Destroy()
			send, _ := dev.Malloc(1)
			recv, _ := dev.Malloc(1)
			defer dev.Free(send)
			defer dev.Free(recv)
			dev.MemcpyHtoD(send, []byte{byte(10 + r)})
			right, left := (r+1)%n, (r+n-1)%n
			calls := []func() error{
				func() error { return collectives.Send(send, 1, hcomm.Uint8, right, c, s) },
				func() error { return collectives.Recv(recv, 1, hcomm.Uint8, left, c, s) },
			}
			collectives.GroupStart(c)
			for _, call := range calls {
				if err := call(); err != nil {
					panic(err)
				}
			}
			if err := collectives.GroupEnd(c); err != nil {
				panic(err)
			}
			if err := s.SynchronizeWithTimeout(time.Minute); err != nil {
				panic(err)
			}
			b := make([]byte, 1)
			dev.MemcpyDtoH(b, recv)
			got[r] = b[0]
		}(c)
	}
	wg.Wait()
	for _, c := range comms {
		c.Destroy()
	}
	fmt.Println(got)
	// Output: [13 10 11 12]
}
