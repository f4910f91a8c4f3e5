package reduce

import (
	"encoding/binary"
	"unsafe"
)

// run feeds kernel count elements of T from the byte buffers: in place where
// the machine allows it (directView), else through runChunked. chunked forces
// the copying path (tests run it on every machine).
func run[T element](dst, a, b []byte, count int, kernel func(d, x, y []T), chunked bool) {
	if directView && !chunked {
		kernel(view[T](dst, count), view[T](a, count), view[T](b, count))
		return
	}
	runChunked(dst, a, b, count, kernel)
}

// view reinterprets b as count elements of T; len(b) >= count*sizeof(T). Only
// used where directView holds; checkptr accepts unaligned pointers to
// pointer-free types.
func view[T element](b []byte, count int) []T {
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), count)
}

// chunk is how many elements runChunked copies at a time.
const chunk = 256

// runChunked decodes up to chunk little-endian elements of a and b at a time
// into aligned native arrays with encoding/binary, runs kernel, and encodes
// the result into dst. Each chunk of a and b is read before that chunk of dst
// is written, so dst may be a or b.
func runChunked[T element](dst, a, b []byte, count int, kernel func(d, x, y []T)) {
	var bd, ba, bb [chunk]T
	es := int(unsafe.Sizeof(bd[0]))
	for off := 0; off < count; off += chunk {
		n := min(chunk, count-off)
		decode(ba[:n], a[off*es:])
		decode(bb[:n], b[off*es:])
		kernel(bd[:n], ba[:n], bb[:n])
		encode(dst[off*es:], bd[:n])
	}
}

func decode[T element](d []T, src []byte) {
	switch unsafe.Sizeof(d[0]) {
	case 1:
		for i := range d {
			v := src[i]
			d[i] = *(*T)(unsafe.Pointer(&v))
		}
	case 2:
		for i := range d {
			v := binary.LittleEndian.Uint16(src[2*i:])
			d[i] = *(*T)(unsafe.Pointer(&v))
		}
	case 4:
		for i := range d {
			v := binary.LittleEndian.Uint32(src[4*i:])
			d[i] = *(*T)(unsafe.Pointer(&v))
		}
	case 8:
		for i := range d {
			v := binary.LittleEndian.Uint64(src[8*i:])
			d[i] = *(*T)(unsafe.Pointer(&v))
		}
	}
}

func encode[T element](dst []byte, s []T) {
	switch unsafe.Sizeof(s[0]) {
	case 1:
		for i := range s {
			dst[i] = *(*uint8)(unsafe.Pointer(&s[i]))
		}
	case 2:
		for i := range s {
			binary.LittleEndian.PutUint16(dst[2*i:], *(*uint16)(unsafe.Pointer(&s[i])))
		}
	case 4:
		for i := range s {
			binary.LittleEndian.PutUint32(dst[4*i:], *(*uint32)(unsafe.Pointer(&s[i])))
		}
	case 8:
		for i := range s {
			binary.LittleEndian.PutUint64(dst[8*i:], *(*uint64)(unsafe.Pointer(&s[i])))
		}
	}
}
