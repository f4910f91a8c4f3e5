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
// low-latency protocol in the spirit of NCCL's LL. Data travels in 8-byte
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
