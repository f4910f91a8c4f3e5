// Package units writes byte counts for people: on the size axes of the plots
// that hcomm bench and hcomm sim draw, and in the names of benchmarks.
package units

import "strconv"

// Size writes n bytes as hcomm bench's -b and -e flags take them (binary, as
// hccl_test and nccl-tests: 1K = 1024): the largest of G, M and K that
// divides n, or plain bytes — 4K, 1M, 2G, 1536, 0. It never rounds, so
// bench.ParseSize reads back n. Safe for concurrent use.
func Size(n int64) string {
	return write(n, "", "K", "M", "G")
}

// SizeIEC writes n bytes with an IEC unit, as the repository's benchmarks
// name their sizes: the largest of GiB, MiB and KiB that divides n, or bytes
// — 8B, 4KiB, 64MiB, 1536B. It never rounds, so two sizes never share a
// name. Safe for concurrent use.
func SizeIEC(n int64) string {
	return write(n, "B", "KiB", "MiB", "GiB")
}

// write is Size and SizeIEC with the unit names given: b for bytes, then
// kibi, mebi and gibi.
func write(n int64, b, k, m, g string) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return strconv.FormatInt(n>>30, 10) + g
	case n >= 1<<20 && n%(1<<20) == 0:
		return strconv.FormatInt(n>>20, 10) + m
	case n >= 1<<10 && n%(1<<10) == 0:
		return strconv.FormatInt(n>>10, 10) + k
	}
	return strconv.FormatInt(n, 10) + b
}
