package device_test

import (
	"strconv"
	"testing"

	"github.com/hcomm-dev/hcomm/device"
)

// BenchmarkEmptyTask: enqueue one empty task and wait for its completion.
func BenchmarkEmptyTask(b *testing.B) {
	d, _ := device.Open(0)
	defer d.Close()
	s, _ := d.CreateStream()
	e, _ := d.CreateEventWithFlags(device.EventDisableTiming)
	nop := func(<-chan struct{}) error { return nil }
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		s.Launch("nop", nop)
		e.Record(s)
		if err := e.SynchronizeWithTimeout(-1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEventCrossStreamWait: record on one stream, wait on another, and
// see the waiting stream's next task complete.
func BenchmarkEventCrossStreamWait(b *testing.B) {
	d, _ := device.Open(0)
	defer d.Close()
	s1, _ := d.CreateStream()
	s2, _ := d.CreateStream()
	e, _ := d.CreateEventWithFlags(device.EventDisableTiming)
	done, _ := d.CreateEventWithFlags(device.EventDisableTiming)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		e.Record(s1)
		s2.WaitEvent(e)
		done.Record(s2)
		if err := done.SynchronizeWithTimeout(-1); err != nil {
			b.Fatal(err)
		}
	}
}

const copySize = 64 << 20

// BenchmarkMemcpyAsyncD2D: a 64 MiB device-to-device MemcpyAsync, synchronized.
func BenchmarkMemcpyAsyncD2D(b *testing.B) {
	d, _ := device.Open(0)
	defer d.Close()
	s, _ := d.CreateStream()
	src, _ := d.Malloc(copySize)
	dst, _ := d.Malloc(copySize)
	d.Memset(src, copySize, 1)
	d.Memset(dst, copySize, 2)
	b.SetBytes(copySize)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s.MemcpyAsync(dst, src, copySize, device.MemcpyDeviceToDevice)
		if err := s.SynchronizeWithTimeout(-1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGoCopy: Go's copy() of 64 MiB between the same kind of mappings,
// the yardstick for BenchmarkMemcpyAsyncD2D.
func BenchmarkGoCopy(b *testing.B) {
	d, _ := device.Open(0)
	defer d.Close()
	src, _ := d.Malloc(copySize)
	dst, _ := d.Malloc(copySize)
	d.Memset(src, copySize, 1)
	d.Memset(dst, copySize, 2)
	sb, _ := d.Bytes(src, copySize)
	db, _ := d.Bytes(dst, copySize)
	b.SetBytes(copySize)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		copy(db, sb)
	}
}

// BenchmarkMallocFree: one Malloc and its Free. Each allocation is a memory
// file reserved in full (fallocate), so the cost grows with the size even
// though no page is touched.
func BenchmarkMallocFree(b *testing.B) {
	d, _ := device.Open(0)
	defer d.Close()
	for _, size := range []int64{4 << 10, 64 << 20} {
		b.Run(strconv.FormatInt(size>>10, 10)+"KiB", func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				p, err := d.Malloc(size)
				if err != nil {
					b.Fatal(err)
				}
				if err := d.Free(p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
