package collectives

import (
	"strings"
	"testing"
)

// TestDBTrees: at every rank count from 1 to 130, each of the two trees
// spans the ranks — one root, every other rank one parent, which lists it
// as a child, and every rank reached from the root — and no rank has
// children in both trees but, where n is odd, at most two; and a rank's
// peers are its parents and children in both trees.
func TestDBTrees(t *testing.T) {
	for n := 1; n <= 130; n++ {
		trees := dbTrees(n)
		for j, tr := range trees {
			roots := 0
			for r := 0; r < n; r++ {
				p := tr.parent[r]
				if p < 0 {
					roots++
					continue
				}
				found := false
				for _, k := range tr.kids[p] {
					found = found || k == r
				}
				if !found {
					t.Fatalf("n=%d tree %d: rank %d's parent %d does not list it", n, j, r, p)
				}
			}
			if roots != 1 {
				t.Fatalf("n=%d tree %d: %d roots", n, j, roots)
			}
			seen := make([]bool, n)
			var walk func(r, depth int)
			walk = func(r, depth int) {
				if seen[r] || depth > n {
					t.Fatalf("n=%d tree %d: rank %d reached twice", n, j, r)
				}
				seen[r] = true
				for _, k := range tr.kids[r] {
					if tr.parent[k] != r {
						t.Fatalf("n=%d tree %d: rank %d lists %d, whose parent is %d", n, j, r, k, tr.parent[k])
					}
					walk(k, depth+1)
				}
			}
			for r := 0; r < n; r++ {
				if tr.parent[r] < 0 {
					walk(r, 0)
				}
			}
			for r, ok := range seen {
				if !ok {
					t.Fatalf("n=%d tree %d: rank %d not reached", n, j, r)
				}
			}
		}
		both := 0
		for r := 0; r < n; r++ {
			if len(trees[0].kids[r]) > 0 && len(trees[1].kids[r]) > 0 {
				both++
			}
		}
		if n%2 == 0 && both > 0 || both > 2 {
			t.Fatalf("n=%d: %d ranks have children in both trees", n, both)
		}
		for me := 0; me < n; me++ {
			want := map[int]bool{}
			for _, tr := range trees {
				if p := tr.parent[me]; p >= 0 {
					want[p] = true
				}
				for _, k := range tr.kids[me] {
					want[k] = true
				}
			}
			got := dbtPeers(me, trees)
			if len(got) != len(want) {
				t.Fatalf("n=%d rank %d: peers %v, want %v", n, me, got, want)
			}
			for _, p := range got {
				if !want[p] {
					t.Fatalf("n=%d rank %d: peer %d is no parent or child", n, me, p)
				}
			}
		}
	}
}

// TestCrowdedChoice: on a crowded host an all-reduce of more than
// helloFullMax ranks that the model gave to halving-doubling, the ring or
// the double binary tree takes the binomial tree; nothing else changes.
func TestCrowdedChoice(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		k          kind
		n          int
		bytes      int64
		mapped     bool
		crowded    bool
		algo, want Algorithm
	}{
		{kAllReduce, 16, mib, true, true, AlgoHD, AlgoTree},
		{kAllReduce, 64, 64 * mib, false, true, AlgoRing, AlgoTree},
		{kAllReduce, 64, mib, false, true, AlgoDBTree, AlgoTree},
		{kAllReduce, 16, mib, false, true, AlgoRD, AlgoRD},     // inline: the handshake's own tree
		{kAllReduce, 16, mib, false, true, AlgoHier, AlgoHier}, // across hosts
		{kAllReduce, 16, mib, false, false, AlgoHD, AlgoHD},
		{kAllReduce, 8, mib, true, true, AlgoRing, AlgoRing}, // mapped: the tuning table's
		{kAllReduce, 8, mib, false, true, AlgoRing, AlgoTree},
		{kAllReduce, 4, mib, false, true, AlgoRing, AlgoTree},
		{kAllReduce, 4, crowdedTreeMax, false, true, AlgoRing, AlgoTree},
		{kAllReduce, 4, crowdedTreeMax + 1, false, true, AlgoRing, AlgoRing},
		{kAllReduce, 4, mib, false, false, AlgoRing, AlgoRing},
		{kAllReduce, 3, mib, false, true, AlgoRing, AlgoRing},
		{kAllReduce, 2, mib, false, true, AlgoHD, AlgoHD},
		{kReduceScatter, 16, mib, false, true, AlgoRing, AlgoRing},
	} {
		if got := crowdedChoice(c.k, c.n, c.bytes, c.mapped, c.crowded, c.algo); got != c.want {
			t.Errorf("%v of %d bytes among %d, mapped %v, crowded %v, model's %v: %v, want %v", c.k, c.bytes, c.n, c.mapped, c.crowded, c.algo, got, c.want)
		}
	}
}

// TestDBTreeNotPriced: the selector never picks the double binary tree
// (its trees share a stream: cost.go), and Predict says so by name.
func TestDBTreeNotPriced(t *testing.T) {
	cm := DefaultCostModel()
	for _, n := range []int{16, 256, 4096} {
		l, err := newLayout(n, 200<<20)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range []int64{1 << 20, 16 << 20, 256 << 20} {
			if a := choose(kAllReduce, b, n, l, cm, false, false, false); a == AlgoDBTree {
				t.Errorf("%d ranks, %d bytes: the selector picked dbtree", n, b)
			}
		}
	}
	if _, err := cm.Predict("AllReduce", AlgoDBTree, 64, 1<<20, 200<<20, false); err == nil || !strings.Contains(err.Error(), "dbtree") {
		t.Errorf("Predict(dbtree): %v, want an error naming it", err)
	}
}
