package memcopy

import (
	"bytes"
	"fmt"
	"testing"
)

func TestStreamCopiesEveryByte(t *testing.T) {
	testCopiesEveryByte(t, Stream, []int{0, 1, 31, 127, minStream - 1, minStream, minStream + 1, minStream + 127, 1<<20 + 3})
}

// TestReadCopiesEveryByte: Read, plain up to ReadPlainMax and streamed beyond.
func TestReadCopiesEveryByte(t *testing.T) {
	testCopiesEveryByte(t, Read, []int{0, 1, 127, ReadPlainMax, ReadPlainMax + 1, ReadPlainMax + 127})
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

// TestReadPlainMaxFollowsTheCache: half the L2 cache, within its bounds, and
// the default where the cache is unknown; sysfs's sizes parsed.
func TestReadPlainMaxFollowsTheCache(t *testing.T) {
	for _, c := range []struct {
		l2   int64
		want int
	}{{0, readPlainDefault}, {-1, readPlainDefault}, {2 << 20, 1 << 20}, {512 << 10, readPlainLow}, {256 << 10, readPlainLow}, {1 << 30, readPlainHigh}, {1 << 20, 512 << 10}} {
		if got := readPlainFor(c.l2); got != c.want {
			t.Errorf("readPlainFor(%d) = %d, want %d", c.l2, got, c.want)
		}
	}
	for s, want := range map[string]int64{"2048K": 2 << 20, "1M": 1 << 20, "4096": 4096, "": 0, "12Q": 0, "-5K": 0} {
		if got := parseSize(s); got != want {
			t.Errorf("parseSize(%q) = %d, want %d", s, got, want)
		}
	}
	if ReadPlainMax < readPlainLow || ReadPlainMax > readPlainHigh {
		t.Errorf("ReadPlainMax %d outside [%d, %d]", ReadPlainMax, readPlainLow, readPlainHigh)
	}
}

// TestShareCoresDividesThePlainCopies: ranks sharing a core share its
// cache; the most ranks a core said holds, and nonsense is ignored.
func TestShareCoresDividesThePlainCopies(t *testing.T) {
	old, oldMax := sharers.Load(), ReadPlainMax
	defer func() { sharers.Store(old); ReadPlainMax = oldMax }()
	ReadPlainMax = 6 << 20 // a core with 12 MiB of L2
	sharers.Store(0)
	if got := plainLimit(); got != ReadPlainMax {
		t.Fatalf("no sharing said: plain up to %d, want %d", got, ReadPlainMax)
	}
	ShareCores(2, 2)
	ShareCores(0, 2)
	ShareCores(4, -1)
	if got := plainLimit(); got != ReadPlainMax {
		t.Fatalf("a rank a core: plain up to %d, want %d", got, ReadPlainMax)
	}
	ShareCores(5, 2) // 3 a core
	ShareCores(4, 2)
	if got := plainLimit(); got != 2<<20 {
		t.Fatalf("5 ranks on 2 cores, then 4: plain up to %d, want %d", got, 2<<20)
	}
	n := plainLimit() + 1
	testCopiesEveryByte(t, Read, []int{n - 1, n})
	ShareCores(64, 2)
	if got := plainLimit(); got != readPlainLow {
		t.Fatalf("32 ranks a core: plain up to %d, want the floor %d", got, readPlainLow)
	}
}
