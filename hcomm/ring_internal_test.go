package hcomm

import "testing"

// The gather's tree covers every rank once: each rank but 0 is a child of
// its parent, a rank's subtree is itself and its children's subtrees one
// after the other, and the depth is at most log_k n.
func TestGatherTree(t *testing.T) {
	for n := 1; n <= 600; n++ {
		depth := 0
		for r := 0; r < n; r++ {
			if r > 0 {
				p := treeParent(r)
				found := false
				for _, c := range treeChildren(p, n) {
					found = found || c == r
				}
				if p >= r || !found {
					t.Fatalf("n=%d: rank %d's parent %d does not list it among its children %v", n, r, p, treeChildren(p, n))
				}
			}
			next := r + 1
			for _, c := range treeChildren(r, n) {
				if c != next {
					t.Fatalf("n=%d: rank %d's children %v do not follow one another (want %d next)", n, r, treeChildren(r, n), next)
				}
				next += treeSpan(c, n)
			}
			if next != r+treeSpan(r, n) {
				t.Fatalf("n=%d: rank %d's subtree spans %d ranks, its children end at %d", n, r, treeSpan(r, n), next)
			}
			d := 0
			for q := r; q != 0; q = treeParent(q) {
				d++
			}
			depth = max(depth, d)
		}
		want := 0
		for p := 1; p < n; p *= treeRadix {
			want++
		}
		if depth > want {
			t.Fatalf("n=%d: depth %d, want at most %d", n, depth, want)
		}
	}
}
