package collectives

import (
	"math"
	"strings"
	"testing"
)

func TestParseCostModel(t *testing.T) {
	base := DefaultCostModel()
	m, err := ParseCostModel("network:alpha=35us,o=10us,beta=5GB/s;mapped:gamma=0.5ns", base)
	if err != nil {
		t.Fatal(err)
	}
	near := func(got, want float64) bool { return math.Abs(got-want) <= 1e-9*math.Abs(want) }
	if !near(m.Network.Alpha, 35e-6) || !near(m.Network.Overhead, 10e-6) || !near(m.Network.Beta, 0.2e-9) {
		t.Errorf("network = %+v, want alpha 35us, overhead 10us, beta 0.2ns", m.Network)
	}
	if !near(m.Mapped.Gamma, 0.5e-9) || m.Mapped.Alpha != base.Mapped.Alpha || m.Network.Gamma != base.Network.Gamma {
		t.Errorf("terms not named changed: %+v", m)
	}
	if m, err := ParseCostModel("  ", base); err != nil || m != base {
		t.Errorf("empty: %+v, %v; want the base", m, err)
	}
	for in, want := range map[string]string{
		"network:alpha=-1us":       "finite value",
		"network:beta=0GB/s":       "positive",
		"network:beta=3furlongs/s": "unit",
		"network:alpha=fast":       `alpha="fast"`,
		"network:delta=1":          `unknown term "delta"`,
		"disk:alpha=1us":           `unknown link class "disk"`,
		"alpha=1us":                "want class:term=value",
		"network:alpha":            "want term=value",
		"network:gamma=NaN":        "finite value",
		"network:alpha=+Inf":       "finite value",
	} {
		if _, err := ParseCostModel(in, base); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseCostModel(%q) = %v, want an error containing %q", in, err, want)
		}
	}
}

// TestPredictClosedForms: the model's formulas for the simplest cases, by
// hand — the butterfly all-reduce at a power of two is log2(n) rounds of
// α + 2o + Sβ + Sγ; the one-shot is a full-mesh step, n-1 inputs moved and
// reduced; a rank count that is not a power of two adds the fold's two
// hand-offs and one reduction.
func TestPredictClosedForms(t *testing.T) {
	lc := LinkCost{Alpha: 10e-6, Overhead: 1e-6, Beta: 1e-9, Gamma: 0.5e-9}
	m := CostModel{Mapped: lc, Network: lc}
	const S = 1000
	cases := []struct {
		coll string
		a    Algorithm
		n    int
		want float64
	}{
		{"AllReduce", AlgoRD, 16, 4 * (10e-6 + 2e-6 + S*1e-9 + S*0.5e-9)},
		{"AllReduce", AlgoRD, 11, 3*(10e-6+2e-6+S*1e-9+S*0.5e-9) + 2*(10e-6+2e-6+S*1e-9) + S*0.5e-9},
		{"AllReduce", AlgoOneShot, 4, 10e-6 + 6e-6 + 3*S*1e-9 + 3*S*0.5e-9},
		{"Barrier", AlgoOneShot, 16, 4 * (10e-6 + 2e-6)},
		// Bruck's all-to-all: the butterfly, then log2(n) rounds of half
		// the message, each a hand-off, a piece each way, and the bytes
		// moved, packed and unpacked.
		{"AlltoAll", AlgoBruck, 16, 4*(10e-6+2e-6) + 4*(10e-6+2e-6+S/2*(1e-9+2*memBeta))},
		// Pairwise: n-1 rounds of a block each way, and the counts' hello
		// to every peer after the butterfly.
		{"AlltoAll", AlgoPairwise, 16, 4*(10e-6+2e-6) + 15*(10e-6+2e-6) + 15*S/16*(1e-9+memBeta) + 10e-6 + 30e-6},
	}
	for _, tc := range cases {
		got, err := m.Predict(tc.coll, tc.a, tc.n, S, 64<<20, false)
		if err != nil {
			t.Fatal(err)
		}
		if d := got.Seconds() - tc.want; d > 1e-9 || d < -1e-9 {
			t.Errorf("%s %v, %d ranks: %v, want %.3gs", tc.coll, tc.a, tc.n, got, tc.want)
		}
	}
	// The direct all-reduce: between ranks that read each other, the
	// handshake, two hand-offs, a read (and the done) a peer for each piece
	// of the block and for the reduced block, every byte of the n-1 blocks
	// read twice and reduced once; over a network, the ring it runs.
	got, err := m.Predict("AllReduce", AlgoDirect, 4, S, 64<<20, true)
	if want := handshake(4, lc) + 2*10e-6 + 2*3*2*1e-6 + 3.0/4*S*(2e-9+0.5e-9); err != nil || math.Abs(got.Seconds()-want) > 1e-9 {
		t.Errorf("AllReduce direct, 4 mapped ranks: %v, %v, want %.3gs", got, err, want)
	}
	got, err = m.Predict("AllReduce", AlgoDirect, 4, S, 64<<20, false)
	ring, _ := m.Predict("AllReduce", AlgoRing, 4, S, 64<<20, false)
	if err != nil || got != ring {
		t.Errorf("AllReduce direct over a network: %v, %v, want the ring's %v", got, err, ring)
	}
	for _, bad := range []struct {
		coll  string
		a     Algorithm
		n     int
		bytes int64
		want  string
	}{
		{"AllReduce", AlgoRD, 16, 1 << 30, "cannot carry"},
		{"AllGather", AlgoHD, 16, 8, "has no hd"},
		{"Frobnicate", AlgoRing, 16, 8, "unknown collective"},
		{"AllReduce", AlgoRing, 0, 8, "0 ranks"},
		{"AllReduce", AlgoRing, 4, -1, "-1 bytes"},
	} {
		if _, err := m.Predict(bad.coll, bad.a, bad.n, bad.bytes, 64<<20, false); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Predict(%s, %v, %d, %d) = %v, want an error containing %q", bad.coll, bad.a, bad.n, bad.bytes, err, bad.want)
		}
	}
}

// TestChooseByCost: the selector's choices under the default model over a
// network, from 2 ranks to 4096: the one-shot for small messages among few
// ranks; recursive doubling for small ones among many (log2 n hand-offs
// where the one-shot's handshake costs 2(n-1) messages per rank);
// halving-doubling for mid sizes; the ring where bandwidth dominates; the
// tree for broadcasts between rd's and the ring's sizes; Bruck for
// all-to-alls of small blocks (log2 n rounds where pairwise takes n-1, and
// no hello to every peer), pairwise for large ones (each byte moved once
// where Bruck moves half of them log2 n times). Every choice is the cheapest
// schedule the model knows for the call, and a model without latency terms
// takes the ring.
func TestChooseByCost(t *testing.T) {
	cm := DefaultCostModel()
	cases := []struct {
		k     kind
		n     int
		bytes int64
		want  Algorithm
	}{
		{kAllReduce, 2, 16, AlgoOneShot},
		{kAllReduce, 2, 1 << 20, AlgoHD},
		{kAllReduce, 2, 64 << 20, AlgoRing},
		{kAllReduce, 16, 16, AlgoRD},
		{kAllReduce, 16, 64 << 10, AlgoRD},
		{kAllReduce, 16, 1 << 20, AlgoHD},
		{kAllReduce, 16, 64 << 20, AlgoRing},
		{kAllReduce, 64, 16, AlgoRD},
		{kAllReduce, 64, 1 << 20, AlgoHD},
		{kAllReduce, 1024, 16, AlgoRD},
		{kAllReduce, 1024, 1 << 20, AlgoHD},
		{kAllReduce, 4096, 16, AlgoRD},
		{kAllReduce, 4096, 16 << 20, AlgoHD},
		{kBroadcast, 16, 16, AlgoRD},
		{kAllGather, 16, 16, AlgoRD},
		{kAllGather, 16, 64 << 10, AlgoBruck},
		{kAllGather, 2, 64 << 20, AlgoRing},
		{kReduceScatter, 64, 4096, AlgoRD},
		{kReduceScatter, 64, 16 << 20, AlgoRing},
		{kBroadcast, 64, 1 << 20, AlgoTree},
		{kBroadcast, 64, 64 << 20, AlgoRing},
		{kBroadcast, 4096, 16 << 20, AlgoTree},
		{kReduce, 1024, 16, AlgoRD},
		{kReduce, 1024, 1 << 20, AlgoTree},
		{kBarrier, 4096, 0, AlgoOneShot},
		{kAlltoAll, 8, 1 << 10, AlgoOneShot}, // a block per hello: one hand-off deep
		{kAlltoAll, 8, 8 << 20, AlgoPairwise},
		{kAlltoAll, 16, 1 << 10, AlgoBruck},
		{kAlltoAll, 64, 256 << 10, AlgoBruck},
		{kAlltoAll, 256, 16, AlgoBruck},
		{kAlltoAll, 16, 64 << 20, AlgoPairwise},
		{kAlltoAll, 256, 64 << 20, AlgoPairwise},
	}
	for _, tc := range cases {
		l, err := newLayout(tc.n, 400<<20)
		if err != nil {
			t.Fatal(err)
		}
		got := choose(tc.k, tc.bytes, tc.n, l, cm, false, false, false)
		if got != tc.want {
			t.Errorf("%v, %d ranks, %d bytes over a network: %v, want %v", tc.k, tc.n, tc.bytes, got, tc.want)
		}
		if tc.n <= helloFullMax {
			continue // the tuning table's (tuning.go), measured
		}
		sh := shape{k: tc.k, n: tc.n, bytes: tc.bytes, inline: l.inline(), piece: l.piece}
		for _, a := range algorithms[tc.k] {
			if a == AlgoOrdered || a == AlgoHier || a == AlgoDirect || a == AlgoOneShot && tc.n > helloFullMax {
				continue
			}
			if costOf(a, sh, cm.Network) < costOf(got, sh, cm.Network) {
				t.Errorf("%v, %d ranks, %d bytes: chose %v, but %v costs less", tc.k, tc.n, tc.bytes, got, a)
			}
		}
	}
	if a, err := cm.Choose("AllReduce", 4096, 16, 400<<20, false); err != nil || a != AlgoRD {
		t.Errorf("Choose(AllReduce, 4096 ranks, 16 bytes) = %v, %v; want rd", a, err)
	}
	if _, err := cm.Choose("AllReduce", 0, 16, 400<<20, false); err == nil {
		t.Error("Choose with 0 ranks: no error")
	}
	bw, err := ParseCostModel("network:alpha=0,o=0", cm)
	if err != nil {
		t.Fatal(err)
	}
	l, _ := newLayout(16, 400<<20)
	if got := choose(kAllReduce, 16<<20, 16, l, bw, false, false, false); got != AlgoRing {
		t.Errorf("16 ranks, 16 MiB, no latency: %v, want ring", got)
	}
}

// TestChooseLevels: across hosts, the two-level all-gather, broadcast and
// reduce-scatter where the model finds them cheaper than the flat choice —
// mid sizes, among enough hosts and ranks per host — and the flat one for
// small calls (the butterfly's log2 n hand-offs), on one host, where the
// leaders' step is the whole of the work (two ranks per host, large
// messages: the flat ring's single pass over each link then wins), and
// for a reduce-scatter larger than the leaders' working space.
func TestChooseLevels(t *testing.T) {
	cm := DefaultCostModel()
	shaped := func(hosts, per int) *hier {
		h := &hier{hosts: hosts}
		for i := 0; i < hosts; i++ {
			var g []int
			for j := 0; j < per; j++ {
				g = append(g, i*per+j)
			}
			h.groups = append(h.groups, g)
		}
		return h
	}
	for _, tc := range []struct {
		k          kind
		hosts, per int
		bytes      int64
		flat, want Algorithm
	}{
		{kAllGather, 16, 4, 16, AlgoRD, AlgoRD},
		{kAllGather, 16, 4, 1 << 20, AlgoBruck, AlgoHier},
		{kAllGather, 4, 2, 16 << 20, AlgoRing, AlgoRing},
		{kBroadcast, 16, 4, 1 << 20, AlgoTree, AlgoHier},
		{kBroadcast, 4, 4, 16 << 20, AlgoRing, AlgoHier},
		{kBroadcast, 1, 16, 1 << 20, AlgoTree, AlgoTree},
		{kReduceScatter, 16, 4, 1 << 20, AlgoRing, AlgoHier},
		{kReduceScatter, 4, 4, 64 << 20, AlgoRing, AlgoRing}, // more than the leaders' working space
		// The all-to-all's hosts-1 packs a leader against the flat
		// schedule's blocks from every rank, sharing each host's link.
		{kAlltoAll, 4, 4, 4096, AlgoBruck, AlgoHier},
		{kAlltoAll, 16, 4, 1 << 20, AlgoBruck, AlgoHier},
		{kAlltoAll, 4, 4, 8 << 20, AlgoPairwise, AlgoPairwise}, // more than the leaders' working space
		{kAlltoAll, 4, 2, 4096, AlgoOneShot, AlgoOneShot},
	} {
		n := tc.hosts * tc.per
		l, err := newLayout(n, 16<<20)
		if err != nil {
			t.Fatal(err)
		}
		if flat := choose(tc.k, tc.bytes, n, l, cm, false, true, false); flat != tc.flat {
			t.Errorf("%v, %d hosts x %d, %d bytes: flat choice %v, want %v", tc.k, tc.hosts, tc.per, tc.bytes, flat, tc.flat)
		}
		if got := chooseLevels(tc.k, tc.bytes, tc.flat, l, cm, false, shaped(tc.hosts, tc.per)); got != tc.want {
			t.Errorf("%v, %d hosts x %d, %d bytes: %v, want %v", tc.k, tc.hosts, tc.per, tc.bytes, got, tc.want)
		}
	}
}
