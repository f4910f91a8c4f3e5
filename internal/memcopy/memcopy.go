// Package memcopy copies memory with non-temporal ("streaming") stores, for
// copies whose destination is not read again soon: a collective's output.
//
// A plain copy first reads every destination cache line it overwrites (the
// read-for-ownership) and leaves the destination in cache, evicting what the
// next steps need. Streaming stores skip both, so a copy into cold memory
// moves two thirds of the bytes a plain copy moves. Go's copy() switches to
// streaming stores by itself only from 1 MiB up; hcomm's schedules move
// pieces smaller than that and know better than a size threshold which
// copies are final, so they ask for it.
//
// Why not always: a destination that is read right after (a peer's slot that
// the peer reduces next) must stay in cache; streaming it out to memory costs
// the reader a trip to DRAM.
package memcopy

import (
	"strconv"
	"strings"
	"sync/atomic"
	"unsafe"
)

// minStream is the smallest copy worth streaming: below it the copy fits in
// cache and the fence that ends a streaming copy costs more than it saves.
const minStream = 64 << 10

// Stream copies src into dst (min(len(dst), len(src)) bytes, like copy) with
// non-temporal stores where the CPU has them (amd64 with AVX2) and the copy
// is at least 64 KiB; otherwise it is copy(). The regions must not overlap.
// It returns the number of bytes copied.
func Stream(dst, src []byte) int {
	n := min(len(dst), len(src))
	if n < minStream || !haveStream {
		return copy(dst, src)
	}
	// Align the destination to 32 bytes with an ordinary copy of the head.
	head := int(-uintptr(unsafe.Pointer(unsafe.SliceData(dst))) & 31)
	copy(dst[:head], src[:head])
	body := (n - head) &^ 127
	streamCopy(&dst[head], &src[head], body)
	copy(dst[head+body:n], src[head+body:n])
	return n
}

// ReadPlainMax is the largest copy out of a peer's memory into this rank's
// output that Read does plainly; larger ones stream. It is half the L2
// cache of a core (sysfs's, read at start; readPlainDefault where it cannot
// be read), within [readPlainLow, readPlainHigh]: up to it, source and
// output fit in the cache of the core that reads the output next, and a
// plain copy measured faster; beyond it, the output evicts the source as it
// is written, and streaming wins. On the Intel Xeon of stop 26 (2 MiB of L2
// a core), 2 ranks in process, broadcast read from the root's buffer,
// interleaved: 1 MiB 44–48 µs plain (one launch 65) against 56–95
// streamed, the 1 MiB all-gather's 512 KiB reads 37–52 against 49–54;
// 2 MiB 131–144 streamed against 169–188 plain; 4 MiB alike. (Stop 20,
// same machine kind, between 2 processes: 64 KiB 6.4–6.6 µs streamed
// against 4.6–4.8 plain, 256 KiB 20.8–21.5 against 15.5–23.6.)
var ReadPlainMax = readPlainFor(l2Bytes())

// sharers is the most ranks known to share a core of this host
// (ShareCores); 0: none said.
var sharers atomic.Int32

// ShareCores tells Read that ranks ranks run on this host's cpus cores:
// ranks that share a core share its L2 cache, and Read's plain copies stop
// at their share of it (never below readPlainLow). 4 ranks on 2 cores, 1
// MiB broadcast read from the root's buffer: 111–119 µs streamed against
// 116–122 plain in process, 113–123 against 121–188 between processes.
// The most ranks a core said holds for the process's life.
func ShareCores(ranks, cpus int) {
	if ranks <= 0 || cpus <= 0 {
		return
	}
	k := int32(min((ranks+cpus-1)/cpus, 1<<20))
	for {
		cur := sharers.Load()
		if k <= cur || sharers.CompareAndSwap(cur, k) {
			return
		}
	}
}

// plainLimit is the largest copy Read does plainly now.
func plainLimit() int { return max(ReadPlainMax/int(max(sharers.Load(), 1)), readPlainLow) }

const (
	readPlainDefault = 512 << 10
	readPlainLow     = 512 << 10 // as measured in stop 20, wherever the cache gives less
	readPlainHigh    = 8 << 20
)

// readPlainFor is ReadPlainMax for a core whose L2 cache holds l2 bytes (0:
// unknown).
func readPlainFor(l2 int64) int {
	if l2 <= 0 {
		return readPlainDefault
	}
	return int(min(max(l2/2, readPlainLow), readPlainHigh))
}

// Read is Stream for a copy read out of a peer's memory into an output:
// plain up to ReadPlainMax bytes (divided among the ranks that share a
// core: ShareCores), streamed beyond.
func Read(dst, src []byte) int {
	if min(len(dst), len(src)) <= plainLimit() {
		return copy(dst, src)
	}
	return Stream(dst, src)
}

// parseSize reads sysfs's cache sizes: "2048K", "1M", "512" (bytes); 0
// for anything else.
func parseSize(s string) int64 {
	mul := int64(1)
	switch {
	case strings.HasSuffix(s, "K"):
		mul, s = 1<<10, strings.TrimSuffix(s, "K")
	case strings.HasSuffix(s, "M"):
		mul, s = 1<<20, strings.TrimSuffix(s, "M")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return n * mul
}
