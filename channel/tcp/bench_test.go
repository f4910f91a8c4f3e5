package tcp

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/internal/units"
)

// BenchmarkWrite measures one channel's write bandwidth from rank 0 to rank 1
// over loopback: b.N writes, then a fence so that every byte counted is
// applied at the peer.
func BenchmarkWrite(b *testing.B) {
	for _, size := range []int{4 << 10, 1 << 20, 64 << 20} {
		for _, streams := range []int{1, 2, 4} {
			b.Run(fmt.Sprintf("size=%s/streams=%d", units.SizeIEC(int64(size)), streams), func(b *testing.B) {
				o := Options{Streams: streams}
				p := connectPair(b, o, o, int64(size), 1)
				src := p.r0.bytes(b)
				tr := p.c0.Transport
				stop := make(chan struct{}) // as a stream task gets it; never closed here
				b.SetBytes(int64(size))
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					if err := tr.Write(stop, p.r1.buf.Addr, src); err != nil {
						b.Fatal(err)
					}
				}
				if err := tr.Fence(nil); err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}

// BenchmarkWriteBothWays has both ranks write to each other at once, as the
// two ranks of a ring allreduce do; MB/s is the bandwidth of each direction.
func BenchmarkWriteBothWays(b *testing.B) {
	for _, size := range []int{1 << 20, 16 << 20} {
		for _, streams := range []int{1, 2, 4} {
			b.Run(fmt.Sprintf("size=%s/streams=%d", units.SizeIEC(int64(size)), streams), func(b *testing.B) {
				o := Options{Streams: streams}
				p := connectPair(b, o, o, int64(size), 1)
				src1 := p.r1.bytes(b)
				stop := make(chan struct{})
				errc := make(chan error, 1)
				b.SetBytes(int64(size))
				b.ResetTimer()
				go func() {
					for range b.N {
						if err := p.c1.Transport.Write(stop, p.r0.buf.Addr, src1); err != nil {
							errc <- err
							return
						}
					}
					errc <- p.c1.Transport.Fence(nil)
				}()
				src0 := p.r0.bytes(b)
				for range b.N {
					if err := p.c0.Transport.Write(stop, p.r1.buf.Addr, src0); err != nil {
						b.Fatal(err)
					}
				}
				if err := p.c0.Transport.Fence(nil); err != nil {
					b.Fatal(err)
				}
				if err := <-errc; err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}

// BenchmarkWriteNotifyRoundTrip measures the latency of a handshake: rank 0
// writes 8 bytes and records rank 1's notify; rank 1 waits, then records
// rank 0's notify, which rank 0 waits for. One iteration is one round trip.
func BenchmarkWriteNotifyRoundTrip(b *testing.B) {
	for _, streams := range []int{1, 2} {
		b.Run(fmt.Sprintf("streams=%d", streams), func(b *testing.B) {
			o := Options{Streams: streams}
			p := connectPair(b, o, o, 4096, 1)
			src := p.r0.bytes(b)[:8]
			stop := make(chan struct{})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			echo := echoNotifies(ctx, p.c1, stop, false)
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				if err := p.c0.Transport.Write(stop, p.r1.buf.Addr, src); err != nil {
					b.Fatal(err)
				}
				if err := p.c0.Transport.NotifyRecord(stop, 0); err != nil {
					b.Fatal(err)
				}
				if err := p.c0.Notifies[0].WaitNow(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(time.Since(start).Microseconds())/float64(b.N), "µs/roundtrip")
			b.StopTimer()
			cancel()
			<-echo
		})
	}
}
