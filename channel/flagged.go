package channel

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/hcomm-dev/hcomm/device"
)

// FlagWriter is implemented by a transport that stores into the peer's
// memory itself, mapped in this process (inproc, shm): the data plane of a
// low-latency protocol in the spirit of NCCL's LL, in two forms: lines
// (WriteLine: up to 56 bytes and a flag word in one cache line, see LineSize)
// and flagged words. As flagged words, data travels in 8-byte
// words, 4 bytes of data beside a 4-byte flag, each word one atomic store,
// so that a receiver polling its own memory (TakeFlagged) sees a word's data
// as soon as it sees the word's flag: the data and the signal that it has
// landed are one store, and a hand-off costs one cache line's transfer per
// 32 bytes of data, with no notify record or wait. The flag names the
// exchange (a sequence number, say), so that words left from an earlier
// exchange through the same memory never pass for the current one; a
// receiver must therefore know the flag it waits for, and a sender must not
// rewrite words the receiver has not taken yet (a protocol double-buffers
// its slots).
//
// A transport that cannot store into the peer's memory (tcp) does not
// implement it: callers use Write and a notify there.
type FlagWriter interface {
	// WriteFlagged stores src into the peer's memory at dst as flagged
	// words (PutFlagged): len(src) must be a multiple of 4, dst 8-byte
	// aligned, and [dst, dst+2*len(src)) inside the peer's registered
	// memory. It does not wait for anything; stop is not watched.
	WriteFlagged(stop <-chan struct{}, dst device.Ptr, src []byte, flag uint32) error

	// WriteLine stores src (at most LineData bytes) into the peer's line
	// at dst (PutLine): dst 8-byte aligned, the LineSize bytes at dst
	// inside the peer's registered memory. It does not wait; stop is not
	// watched.
	WriteLine(stop <-chan struct{}, dst device.Ptr, src []byte, flag uint32) error

	// PrepareLine checks the line at dst once (as WriteLine does) and
	// returns a LinePut that stores into it without the checks.
	PrepareLine(dst device.Ptr) (LinePut, error)
}

// LinePut is a line of the peer's memory prepared by PrepareLine.
type LinePut interface {
	// Put stores src (at most LineData bytes) into the line, then the
	// line's flag word (PutLine). It fails once either end of the channel
	// is closed.
	Put(src []byte, flag uint32) error
}

// A line is the other form of flagged data, for a message that fits a
// cache line: LineSize bytes, the first 8 a flag word, the rest
// (LineData) data. A writer copies the data in with plain stores and then
// stores the flag word with one release store (storeRelease); a reader that
// loads the flag word atomically and finds the flag it waits for reads the
// data after it and sees what was written before the flag. The data and
// its signal then cost one cache line's transfer when the line is 64-byte
// aligned, where flagged words (PutFlagged) cost a store per 4 bytes. On
// amd64 the release store is a plain store, which does not wait for the
// line to reach the writer's cache (an atomic.StoreUint64 does: 2 ranks'
// 16-byte all-reduce 0.54–0.73 → 0.36–0.48 µs in one process, 0.56–0.61 →
// 0.43–0.44 between processes). A release store is not a full barrier: a
// load the writer makes after it may be done before the line is visible to
// the peer, so a protocol in which each side stores and then loads what the
// other stored (a sleeper's wake word against the line it sleeps for) puts
// a Fence between its PutLine and its load; flagged words (PutFlagged) are
// sequentially consistent atomic stores and need none. As with flagged
// words, a sender must not rewrite a line the receiver has not taken.
const (
	LineSize = 64
	LineData = LineSize - 8
)

// lineTag is the flag word's high half: a word of zeroed or foreign memory
// does not pass for a flag.
const lineTag = 0x4c494e45 // "LINE"

// lineWord is the flag word that carries flag.
func lineWord(flag uint32) uint64 { return lineTag<<32 | uint64(flag) }

// CheckLine checks the arguments of a line write of n bytes of data to dst:
// n at most LineData, dst 8-byte aligned.
func CheckLine(dst device.Ptr, n int) error {
	if n < 0 || n > LineData {
		return fmt.Errorf("line write of %d bytes: a line carries at most %d", n, LineData)
	}
	if dst%8 != 0 {
		return fmt.Errorf("line write to %#x: want an 8-byte aligned address", uintptr(dst))
	}
	return nil
}

// PutLine stores src (at most LineData bytes) into line[8:], then flag into
// the line's first word with one release store (see Fence). line must be
// LineSize bytes, 8-byte aligned in memory.
func PutLine(line, src []byte, flag uint32) {
	_ = line[LineSize-1]
	copy(line[8:LineSize], src)
	storeRelease((*uint64)(unsafe.Pointer(&line[0])), lineWord(flag))
}

// TakeLine polls a line stored by a peer's PutLine: when its flag word
// carries flag, it copies len(dst) (at most LineData) bytes of its data into
// dst and reports true; otherwise it reports false without touching dst. It
// never waits. line must be LineSize bytes, 8-byte aligned in memory.
func TakeLine(dst, line []byte, flag uint32) bool {
	_ = line[LineSize-1]
	if atomic.LoadUint64((*uint64)(unsafe.Pointer(&line[0]))) != lineWord(flag) {
		return false
	}
	copy(dst, line[8:LineSize])
	return true
}

// FlaggedLen returns the bytes n bytes of data (a multiple of 4) take as
// flagged words: twice as many.
func FlaggedLen(n int) int { return 2 * n }

// CheckFlagged checks the arguments of a flagged write of n bytes of data to
// dst: n a multiple of 4, dst 8-byte aligned.
func CheckFlagged(dst device.Ptr, n int) error {
	if n%4 != 0 {
		return fmt.Errorf("flagged write of %d bytes: want a multiple of 4", n)
	}
	if dst%8 != 0 {
		return fmt.Errorf("flagged write to %#x: want an 8-byte aligned address", uintptr(dst))
	}
	return nil
}

// PutFlagged stores src into words as flagged words: word i (8 bytes,
// little-endian) holds src[4i:4i+4] in its low half and flag in its high
// half, written with one atomic store. words must be 8-byte aligned in
// memory and hold 2*len(src) bytes; len(src) must be a multiple of 4. The
// words are stored in order, the last one last.
func PutFlagged(words, src []byte, flag uint32) {
	n := len(src) / 4
	if n == 0 {
		return
	}
	_ = words[8*n-1]
	w := unsafe.Slice((*uint64)(unsafe.Pointer(&words[0])), n)
	hi := uint64(flag) << 32
	for i := range w {
		atomic.StoreUint64(&w[i], hi|uint64(binary.LittleEndian.Uint32(src[4*i:])))
	}
}

// TakeFlagged polls words, stored by a peer's WriteFlagged: when every word
// carries flag, it copies their data into dst (len(words)/2 bytes) and
// reports true; otherwise it reports false, and the words still on their way
// will be seen by a later poll (dst may hold part of the data). It never
// waits. words must be 8-byte aligned in memory and 2*len(dst) long.
func TakeFlagged(dst, words []byte, flag uint32) bool {
	n := len(dst) / 4
	if n == 0 {
		return true
	}
	_ = words[8*n-1]
	w := unsafe.Slice((*uint64)(unsafe.Pointer(&words[0])), n)
	// The last word first: a writer stores in order, so when the last
	// word is there the others usually are too, and a poll that finds
	// nothing reads one word.
	if uint32(atomic.LoadUint64(&w[n-1])>>32) != flag {
		return false
	}
	for i := range w {
		v := atomic.LoadUint64(&w[i])
		if uint32(v>>32) != flag {
			return false
		}
		binary.LittleEndian.PutUint32(dst[4*i:], uint32(v))
	}
	return true
}

// Aligned8 reports whether b starts at an 8-byte aligned address (the
// memory PutFlagged and TakeFlagged work on must).
func Aligned8(b []byte) bool {
	return len(b) == 0 || uintptr(unsafe.Pointer(&b[0]))%8 == 0
}
