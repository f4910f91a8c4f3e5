package collectives

import "testing"

// TestTuningTable checks the table as data: every row names an algorithm its
// collective has, a rank band and a piece that make sense and the
// measurement it came from, and no row is shadowed by the rows above it (it
// matches some call they do not).
func TestTuningTable(t *testing.T) {
	sizes := func(r tuneRow) []int64 {
		s := []int64{1, 64 << 10, 1 << 20, 64 << 20}
		if r.upTo > 0 {
			s = append(s, r.upTo)
		}
		return s
	}
	for i, r := range tuning {
		if !has(r.k, r.algo) {
			t.Errorf("row %d: %v has no %v algorithm (it has %v)", i, r.k, r.algo, algorithms[r.k])
		}
		if r.minRanks < 2 || (r.maxRanks != 0 && r.maxRanks < r.minRanks) {
			t.Errorf("row %d (%v): ranks [%d, %d] is not a band of two or more", i, r.k, r.minRanks, r.maxRanks)
		}
		if r.piece < 0 || r.piece%64 != 0 || r.upTo < 0 {
			t.Errorf("row %d (%v): piece %d must be a non-negative multiple of 64, upTo %d non-negative", i, r.k, r.piece, r.upTo)
		}
		if r.measured == "" {
			t.Errorf("row %d (%v %v): no measurement cited", i, r.k, r.class)
		}
		reached := false
		top := r.maxRanks
		if top == 0 {
			top = 16
		}
		for n := r.minRanks; n <= top; n++ {
			for _, b := range sizes(r) {
				if !r.matches(r.k, b, n, r.class) {
					continue
				}
				first := -1
				for j := range tuning {
					if tuning[j].matches(r.k, b, n, r.class) {
						first = j
						break
					}
				}
				reached = reached || first == i
			}
		}
		if !reached {
			t.Errorf("row %d (%v %v ranks [%d, %d] up to %d): every call it matches matches a row above it", i, r.k, r.class, r.minRanks, r.maxRanks, r.upTo)
		}
	}
}

// TestChooseReadsTable: above the inline size, choose gives what the table
// gives for every collective with rows, both classes and 2 to 9 ranks, and
// the collective's last listed algorithm where the table has no row.
func TestChooseReadsTable(t *testing.T) {
	l, err := newLayout(4, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	for k := kAllReduce; int(k) < len(algorithms); k++ {
		if len(algorithms[k]) == 0 {
			continue
		}
		for _, mapped := range []bool{true, false} {
			for n := 2; n <= helloFullMax; n++ { // above, the cost model decides (TestChooseByCost)
				for _, b := range []int64{l.inline() + 1, treeMax, treeMax + 1, hdMax, hdMax + 1} {
					if oneShotPayload(k, b, n) <= l.inline() {
						b *= int64(n) // the all-to-all's one-shot carries a block per hello: past it
					}
					got := choose(k, b, n, l, DefaultCostModel(), mapped, false, false)
					want, ok := tunedAlgo(k, b, n, mapped)
					if !ok {
						want = algorithms[k][len(algorithms[k])-1]
					}
					if got != want {
						t.Errorf("choose(%v, %d bytes, %d ranks, mapped=%v) = %v, want %v", k, b, n, mapped, got, want)
					}
					if !has(k, got) {
						t.Errorf("choose(%v, %d bytes, %d ranks, mapped=%v) = %v, which %v does not have", k, b, n, mapped, got, k)
					}
				}
			}
		}
	}
}

// TestPieceFor: a row's piece is bounded by the slot and rounded to 64
// bytes, applies only to its algorithm, and the override wins; without a
// row, a network's piece is netPiece (netPiece2 between 2 ranks; the slot,
// when smaller), memory's the slot.
func TestPieceFor(t *testing.T) {
	saved := tuning
	defer func() { tuning = saved }()
	tuning = []tuneRow{
		{k: kBroadcast, class: linkNetwork, minRanks: 2, upTo: 1 << 20, algo: AlgoRing, piece: 100 << 10, measured: "test"},
		{k: kBroadcast, class: linkNetwork, minRanks: 2, algo: AlgoRing, piece: 4 << 20, measured: "test"},
	}
	cases := []struct {
		algo   Algorithm
		bytes  int64
		mapped bool
		slot   int64
		want   int64
	}{
		{AlgoRing, 1 << 20, false, 512 << 10, 100 << 10},
		{AlgoRing, 1<<20 + 1, false, 512 << 10, 512 << 10}, // bounded by the slot
		{AlgoRing, 1<<20 + 1, false, 8 << 20, 4 << 20},
		{AlgoTree, 1 << 20, false, 512 << 10, netPiece},  // another algorithm over a network: netPiece
		{AlgoTree, 1 << 20, false, 128 << 10, 128 << 10}, // netPiece bounded by the slot
		{AlgoTree, 1 << 20, true, 512 << 10, 512 << 10},  // another algorithm, mapped: the slot
		{AlgoRing, 1 << 20, true, 512 << 10, 512 << 10},  // another class: the slot
		{AlgoRing, 1 << 20, false, 1000, 960},            // rounded down to 64
	}
	for _, c := range cases {
		if got := pieceFor(kBroadcast, c.algo, c.bytes, 4, c.mapped, c.slot); got != c.want {
			t.Errorf("pieceFor(broadcast, %v, %d bytes, mapped=%v, slot %d) = %d, want %d", c.algo, c.bytes, c.mapped, c.slot, got, c.want)
		}
	}
	// Between 2 ranks over a network, netPiece2 (bounded by the slot);
	// mapped, the slot.
	for _, c := range []struct {
		mapped     bool
		slot, want int64
	}{{false, 8 << 20, netPiece2}, {false, 300 << 10, 300 << 10}, {true, 8 << 20, 8 << 20}} {
		if got := pieceFor(kBroadcast, AlgoTree, 1<<20, 2, c.mapped, c.slot); got != c.want {
			t.Errorf("pieceFor(broadcast, tree, 2 ranks, mapped=%v, slot %d) = %d, want %d", c.mapped, c.slot, got, c.want)
		}
	}
	restore := SetPieceOverride(4 << 10)
	if got := pieceFor(kBroadcast, AlgoRing, 1<<20, 4, false, 512<<10); got != 4<<10 {
		t.Errorf("with the override at 4 KiB: pieceFor = %d, want 4096", got)
	}
	restore()
	if got := pieceFor(kBroadcast, AlgoRing, 1<<20, 4, false, 512<<10); got != 100<<10 {
		t.Errorf("after the override's restore: pieceFor = %d, want %d", got, 100<<10)
	}
}
