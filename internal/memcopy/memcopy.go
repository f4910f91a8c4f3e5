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

import "unsafe"

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

// ReadMin is where a copy out of a peer's memory into this rank's output
// starts streaming (Read): below it the output fits in the cache of the
// core that reads it next, and a plain copy measured faster (2 processes,
// broadcast read from the root's buffer, Intel Xeon of stop 20: 64 KiB
// 6.4–6.6 µs streamed against 4.6–4.8 plain, 256 KiB 20.8–21.5 against
// 15.5–23.6; in one process 7.8–8.1 against 5.8–6.3 at 64 KiB).
const ReadMin = 512 << 10

// Read is Stream for a copy read out of a peer's memory into an output:
// streamed from ReadMin bytes, plain below.
func Read(dst, src []byte) int {
	if min(len(dst), len(src)) < ReadMin {
		return copy(dst, src)
	}
	return Stream(dst, src)
}
