package memcopy

import (
	"bytes"
	"fmt"
	"testing"
)

func TestStreamCopiesEveryByte(t *testing.T) {
	testCopiesEveryByte(t, Stream, []int{0, 1, 31, 127, minStream - 1, minStream, minStream + 1, minStream + 127, 1<<20 + 3})
}

// TestReadCopiesEveryByte: Read, plain below ReadMin and streamed from it.
func TestReadCopiesEveryByte(t *testing.T) {
	testCopiesEveryByte(t, Read, []int{0, 1, 127, ReadMin - 1, ReadMin, ReadMin + 127})
}

func testCopiesEveryByte(t *testing.T, cp func(dst, src []byte) int, sizes []int) {
	for _, n := range sizes {
		for _, off := range []int{0, 1, 7, 31} {
			src := make([]byte, n+64)
			for i := range src {
				src[i] = byte(i*7 + 3)
			}
			dst := make([]byte, n+64)
			for i := range dst {
				dst[i] = 0xEE
			}
			if got := cp(dst[off:off+n], src[5:5+n]); got != n {
				t.Fatalf("n %d off %d: copied %d", n, off, got)
			}
			if !bytes.Equal(dst[off:off+n], src[5:5+n]) {
				t.Fatalf("n %d off %d: wrong bytes", n, off)
			}
			for i := range dst {
				if (i < off || i >= off+n) && dst[i] != 0xEE {
					t.Fatalf("n %d off %d: byte %d outside the destination changed", n, off, i)
				}
			}
		}
	}
}

func TestStreamShortSide(t *testing.T) {
	src := make([]byte, 200<<10)
	for i := range src {
		src[i] = byte(i)
	}
	dst := make([]byte, 100<<10)
	if got := Stream(dst, src); got != len(dst) || !bytes.Equal(dst, src[:len(dst)]) {
		t.Fatalf("short dst: copied %d", got)
	}
}

func BenchmarkStream(b *testing.B) {
	for _, size := range []int{256 << 10, 1 << 20, 64 << 20} {
		src, dst := make([]byte, size), make([]byte, size)
		for i := range src {
			src[i], dst[i] = byte(i), byte(i+1) // fault the pages in: no zero-page reads
		}
		b.Run(fmt.Sprintf("%dKiB/stream", size>>10), func(b *testing.B) {
			b.SetBytes(int64(size))
			for i := 0; i < b.N; i++ {
				Stream(dst, src)
			}
		})
		b.Run(fmt.Sprintf("%dKiB/copy", size>>10), func(b *testing.B) {
			b.SetBytes(int64(size))
			for i := 0; i < b.N; i++ {
				copy(dst, src)
			}
		})
	}
}
