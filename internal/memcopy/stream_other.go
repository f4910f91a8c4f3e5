//go:build !amd64 || purego

package memcopy

const haveStream = false

func streamCopy(dst, src *byte, n int) { panic("memcopy: no streaming copy on this platform") }
