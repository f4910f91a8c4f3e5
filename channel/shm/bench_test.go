//go:build linux

package shm_test

import (
	"strings"
	"testing"

	"github.com/hcomm-dev/hcomm/internal/units"
)

// BenchmarkWrite: one-sided writes into the peer process's HCCL buffer
// (a copy into its pages, mapped here), from this process's device memory.
func BenchmarkWrite(b *testing.B) {
	p := startPeer(b, 64<<20)
	for _, size := range []int64{4 << 10, 1 << 20, 64 << 20} {
		b.Run(units.SizeIEC(size), func(b *testing.B) {
			src := p.e.bytes(p.e.buf, size)
			dst := p.remote(0).Addr
			b.SetBytes(size)
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if err := p.e.tr.Write(nil, dst, src); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkWriteHandshake: a write then a notify record, and the peer's
// answer (it waits, writes 8 bytes back and records): a p2p transfer that
// the receiver knows is complete, as the data plane's handshake does it.
func BenchmarkWriteHandshake(b *testing.B) {
	p := startPeer(b, 64<<20)
	for _, size := range []int64{4 << 10, 1 << 20, 64 << 20} {
		b.Run(units.SizeIEC(size), func(b *testing.B) {
			src := p.e.bytes(p.e.buf, size)
			dst := p.remote(0).Addr
			p.send("pingpong %d", b.N)
			b.SetBytes(size)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := p.e.tr.Write(nil, dst, src); err != nil {
					b.Fatal(err)
				}
				if err := p.e.tr.NotifyRecord(nil, 0); err != nil {
					b.Fatal(err)
				}
				if err := p.e.wait(0); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if r := p.recv(); !strings.HasPrefix(r, "ok") {
				b.Fatalf("peer: %s", r)
			}
		})
	}
}

// BenchmarkRead: one-sided reads of the peer's HCCL buffer.
func BenchmarkRead(b *testing.B) {
	p := startPeer(b, 64<<20)
	for _, size := range []int64{4 << 10, 1 << 20, 64 << 20} {
		b.Run(units.SizeIEC(size), func(b *testing.B) {
			dst := p.e.bytes(p.e.buf, size)
			src := p.remote(0).Addr
			b.SetBytes(size)
			for i := 0; i < b.N; i++ {
				if err := p.e.tr.Read(nil, dst, src); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPingPong: an 8-byte write and a notify record to the peer
// process, which waits, writes 8 bytes back and records: one op is a round
// trip; µs/one-way is half of it.
func BenchmarkPingPong(b *testing.B) {
	p := startPeer(b, 1<<20)
	src := p.e.bytes(p.e.buf.Add(4096), 8)
	dst := p.remote(0).Addr
	p.send("pingpong %d", b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := p.e.tr.Write(nil, dst, src); err != nil {
			b.Fatal(err)
		}
		if err := p.e.tr.NotifyRecord(nil, 0); err != nil {
			b.Fatal(err)
		}
		if err := p.e.wait(0); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if r := p.recv(); !strings.HasPrefix(r, "ok") {
		b.Fatalf("peer: %s", r)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2/1000, "µs/one-way")
}
