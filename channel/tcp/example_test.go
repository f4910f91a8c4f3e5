package tcp_test

import (
	"context"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/channel/tcp"
	"github.com/hcomm-dev/hcomm/device"
)

// Two ranks in one process connect a tcp channel over loopback; rank 0
// writes into rank 1's HCCL buffer and records rank 1's notify; rank 1's wait
// returns once the bytes are there. Between processes, Exchange would be
// carried by the bootstrap's store instead of Go channels.
func ExampleDialer_Connect() {
	secret := []byte("from the root info")
	var locals [2]*channel.Local
	var dialers [2]*tcp.Dialer
	for r := range 2 {
		dev, err := device.Open(r)
		if err != nil {
			log.Fatal(err)
		}
		defer dev.Close()
		buf, err := dev.Malloc(1 << 20)
		if err != nil {
			log.Fatal(err)
		}
		hccl := channel.Mem{Tag: "hccl buffer", Addr: buf, Size: 1 << 20}
		reg := &channel.Registry{}
		reg.Add(hccl)
		locals[r] = &channel.Local{Rank: r, Peer: 1 - r, Device: dev, Registry: reg, HCCLBuf: hccl, NotifyNum: 1}
		d, err := tcp.NewDialer(tcp.Options{Addr: "127.0.0.1", Streams: 2, Secret: secret})
		if err != nil {
			log.Fatal(err)
		}
		defer d.Close()
		dialers[r] = d
	}
	// Exchange: each end sends its hello and receives the other's.
	boxes := [2]chan []byte{make(chan []byte, 1), make(chan []byte, 1)}
	exchange := func(r int) channel.Exchange {
		return func(ctx context.Context, mine []byte) ([]byte, error) {
			boxes[1-r] <- mine
			return <-boxes[r], nil
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var conns [2]*channel.Conn
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := dialers[r].Connect(ctx, locals[r], exchange(r))
			if err != nil {
				log.Fatal(err)
			}
			conns[r] = c
		}()
	}
	wg.Wait()
	defer conns[0].Transport.Close()
	defer conns[1].Transport.Close()

	// Rank 0: write, then record rank 1's notify 0.
	msg := []byte("hello over tcp")
	src, _ := locals[0].Device.Bytes(locals[0].HCCLBuf.Addr, int64(len(msg)))
	copy(src, msg)
	dst := conns[0].RemoteMems[0].Addr // rank 1's HCCL buffer
	if err := conns[0].Transport.Write(nil, dst, src); err != nil {
		log.Fatal(err)
	}
	if err := conns[0].Transport.NotifyRecord(nil, 0); err != nil {
		log.Fatal(err)
	}
	// Rank 1: wait, then read its own buffer.
	if err := conns[1].Notifies[0].WaitNow(ctx); err != nil {
		log.Fatal(err)
	}
	got, _ := locals[1].Device.Bytes(locals[1].HCCLBuf.Addr, int64(len(msg)))
	fmt.Printf("rank 1 has %q\n", got)
	// Output: rank 1 has "hello over tcp"
}
