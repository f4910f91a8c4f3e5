package collectives

import (
	"math"
	"testing"
)

// overflows is checkArgs's and the batch's byte-count bound: exact at the
// edge, where count x m is math.MaxInt64 or one element past it.
func TestOverflowsAtTheEdge(t *testing.T) {
	for _, c := range []struct {
		count, m int64
		want     bool
	}{
		{0, 8, false},
		{math.MaxInt64, 1, false},
		{math.MaxInt64 / 8, 8, false},
		{math.MaxInt64/8 + 1, 8, true},
		{1 << 62, 2, true},
		{1<<62 - 1, 2, false},
		{math.MaxInt64, 2, true},
		{math.MaxInt64 / 24, 24, false},
		{math.MaxInt64/24 + 1, 24, true},
	} {
		if got := overflows(c.count, c.m); got != c.want {
			t.Errorf("overflows(%d, %d) = %v, want %v", c.count, c.m, got, c.want)
		}
	}
}
