//go:build amd64 && !purego

package memcopy

import "golang.org/x/sys/cpu"

var haveStream = cpu.X86.HasAVX2

// streamCopy copies n bytes (a multiple of 128) from src to dst (32-byte
// aligned) with VMOVNTDQ stores and ends with SFENCE.
//
//go:noescape
func streamCopy(dst, src *byte, n int)
