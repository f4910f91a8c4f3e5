package units

import "testing"

func TestSize(t *testing.T) {
	for _, tc := range []struct {
		n       int64
		size    string
		sizeIEC string
	}{
		{0, "0", "0B"},
		{1, "1", "1B"},
		{8, "8", "8B"},
		{1000, "1000", "1000B"},
		{1023, "1023", "1023B"},
		{1 << 10, "1K", "1KiB"},
		{1536, "1536", "1536B"}, // not a whole number of KiB: never rounded
		{3 << 10, "3K", "3KiB"}, // a multiple of K, not of a power of two
		{1 << 20, "1M", "1MiB"},
		{1<<20 + 1<<10, "1025K", "1025KiB"},
		{64 << 20, "64M", "64MiB"},
		{1024 << 20, "1G", "1GiB"},
		{5 << 30, "5G", "5GiB"},
		{1<<30 + 1, "1073741825", "1073741825B"},
		{1 << 62, "4294967296G", "4294967296GiB"},
		{-4096, "-4096", "-4096B"},
	} {
		if got := Size(tc.n); got != tc.size {
			t.Errorf("Size(%d) = %q; want %q", tc.n, got, tc.size)
		}
		if got := SizeIEC(tc.n); got != tc.sizeIEC {
			t.Errorf("SizeIEC(%d) = %q; want %q", tc.n, got, tc.sizeIEC)
		}
	}
}
