package collectives

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/hcomm"
)

func TestParseHCCLAlgo(t *testing.T) {
	cases := []struct {
		in   string
		want map[kind]Algorithm
		err  string
	}{
		{"", map[kind]Algorithm{}, ""},
		{"level0:NA;level1:ring", map[kind]Algorithm{kAllReduce: AlgoRing, kBroadcast: AlgoRing, kAllGather: AlgoRing,
			kReduceScatter: AlgoRing, kReduceScatterV: AlgoRing, kReduce: AlgoRing}, ""},
		{"level0:NA;level1:H-D_R", map[kind]Algorithm{kAllReduce: AlgoHD}, ""},
		{"allreduce=level0:NA;level1:ring/allgather=level0:NA;level1:fullmesh",
			map[kind]Algorithm{kAllReduce: AlgoRing, kAllGather: AlgoDirect, kAllGatherV: AlgoDirect}, ""},
		{"alltoall=level0:NA;level1:pairwise", map[kind]Algorithm{kAlltoAll: AlgoPairwise, kAlltoAllV: AlgoPairwise}, ""},
		// "allgather" covers AllGatherV, which has no ring: the ring applies to AllGather alone.
		{"allgather=level0:NA;level1:ring", map[kind]Algorithm{kAllGather: AlgoRing}, ""},
		{"level0:NA;level1:NA", map[kind]Algorithm{}, ""},
		{"level0:NA;level1:ordered", map[kind]Algorithm{kAllReduce: AlgoOrdered, kReduceScatter: AlgoOrdered,
			kReduceScatterV: AlgoOrdered, kReduce: AlgoOrdered}, ""},
		{"level0:NA;level1:NHR", nil, `algorithm "NHR" is not available`},
		{"allreduce=level0:NA;level1:pairwise", nil, "AllReduce has no pairwise"},
		{"bogus=level1:ring", nil, `unknown collective "bogus"`},
		{"level9:ring", nil, `unknown level "level9"`},
		{"ring", nil, "want levelN:algorithm"},
	}
	for _, tc := range cases {
		got, err := parseAlgo(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("parseAlgo(%q) error %v, want one containing %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("parseAlgo(%q): %v", tc.in, err)
			continue
		}
		if len(got) != len(tc.want) {
			t.Errorf("parseAlgo(%q) = %v, want %v", tc.in, got, tc.want)
			continue
		}
		for k, a := range tc.want {
			if got[k] != a {
				t.Errorf("parseAlgo(%q)[%v] = %v, want %v", tc.in, k, got[k], a)
			}
		}
	}
}

func TestHeaderRoundTripAndRejects(t *testing.T) {
	h := header{kind: kReduce, dt: 4, op: 2, algo: AlgoRing, flags: flagOp | flagRoot, root: 3, count: 1 << 40, seq: 77, extra: 5, from: 2, size: 8}
	b := make([]byte, headerSize)
	h.encode(b)
	got, err := decodeHeader(b)
	if err != nil || got != h {
		t.Fatalf("round trip: %+v, %v; want %+v", got, err, h)
	}
	if _, err := decodeHeader(b[:10]); err == nil {
		t.Error("a short header was accepted")
	}
	b[0] = 'X'
	if _, err := decodeHeader(b); err == nil {
		t.Error("a header with a wrong magic was accepted")
	}
	h.encode(b)
	b[4] = 9
	if _, err := decodeHeader(b); err == nil {
		t.Error("a header of another version was accepted")
	}
}

// FuzzDecodeHeader: whatever a peer writes into a hello slot, decoding never
// panics, and what decodes re-encodes to the same header.
func FuzzDecodeHeader(f *testing.F) {
	b := make([]byte, headerSize)
	header{kind: kAllReduce, dt: 4, count: 1024, seq: 1, size: 2}.encode(b)
	f.Add(b)
	f.Add([]byte("HCOL"))
	f.Add(make([]byte, 80))
	f.Fuzz(func(t *testing.T, in []byte) {
		h, err := decodeHeader(in)
		if err != nil {
			return
		}
		out := make([]byte, headerSize)
		h.encode(out)
		h2, err := decodeHeader(out)
		if err != nil || h2 != h {
			t.Fatalf("re-decode: %+v, %v; want %+v", h2, err, h)
		}
	})
}

// BenchmarkHelloCheck is the work the handshake's comparison adds per peer
// (what HCOMM_COLL_CHECK=0 skips): decode the peer's header and compare it
// with this rank's. A collective pays it once per peer it greets.
func BenchmarkHelloCheck(b *testing.B) {
	h := header{kind: kAllReduce, dt: hcomm.Float32, op: hcomm.Sum, flags: flagOp, count: 1024, seq: 7, from: 1, size: 4, algo: AlgoOneShot}
	buf := make([]byte, headerSize)
	h.encode(buf)
	mine := h
	mine.from = 0
	b.ReportAllocs()
	for b.Loop() {
		got, err := decodeHeader(buf)
		if err != nil || !got.same(mine) || got.seq != mine.seq {
			b.Fatal("headers differ")
		}
	}
}

// The all-gather reads from a window directly whatever the rank count;
// staged, two mapped ranks read each other's published pieces (direct) up to
// 1 MiB a rank and take the ring above; over tcp, the ring.
func TestChooseAllGatherWindowed(t *testing.T) {
	l, err := newLayout(2, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	if a := choose(kAllGather, 64<<20, 2, l, DefaultCostModel(), true, false, false); a != AlgoRing {
		t.Errorf("2 ranks, staged: %v, want ring", a)
	}
	for _, n := range []int64{l.inline() + 1, 512 << 10, 1 << 20} {
		if a := choose(kAllGather, n, 2, l, DefaultCostModel(), true, false, false); a != AlgoDirect {
			t.Errorf("2 mapped ranks, staged, %d bytes a rank: %v, want direct", n, a)
		}
		if a := choose(kAllGather, n, 2, l, DefaultCostModel(), false, false, false); a != AlgoRing {
			t.Errorf("2 ranks over tcp, staged, %d bytes a rank: %v, want ring", n, a)
		}
	}
	if a := choose(kAllGather, 1<<20+1, 2, l, DefaultCostModel(), true, false, false); a != AlgoRing {
		t.Errorf("2 mapped ranks, staged, 1 MiB and a byte a rank: %v, want ring", a)
	}
	if a := choose(kAllGather, 64<<20, 2, l, DefaultCostModel(), true, false, true); a != AlgoDirect {
		t.Errorf("2 ranks, windowed: %v, want direct", a)
	}
	if a := choose(kAllGather, 64<<20, 2, l, DefaultCostModel(), false, false, true); a != AlgoRing {
		t.Errorf("2 ranks over tcp, windowed: %v, want ring", a)
	}
}

// A small all-reduce or broadcast is one-shot, but over the network among
// 4 or 8 ranks it is recursive doubling (fewer messages a rank); with a
// fold (3, 5, 6 ranks), 2 ranks, mapped memory or other collectives the
// one-shot stays.
func TestChooseSmallAllReduce(t *testing.T) {
	for _, tc := range []struct {
		k      kind
		n      int
		mapped bool
		want   Algorithm
	}{
		{kAllReduce, 4, false, AlgoRD},
		{kAllReduce, 8, false, AlgoRD},
		{kAllReduce, 3, false, AlgoOneShot},
		{kAllReduce, 6, false, AlgoOneShot},
		{kAllReduce, 2, false, AlgoOneShot},
		{kAllReduce, 4, true, AlgoOneShot},
		{kBroadcast, 4, false, AlgoRD},
		{kBroadcast, 8, false, AlgoRD},
		{kBroadcast, 3, false, AlgoOneShot},
		{kBroadcast, 5, false, AlgoOneShot},
		{kBroadcast, 2, false, AlgoOneShot},
		{kBroadcast, 4, true, AlgoOneShot},
		{kReduce, 4, false, AlgoOneShot},
	} {
		l, err := newLayout(tc.n, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		for _, bytes := range []int64{16, l.inline()} {
			if a := choose(tc.k, bytes, tc.n, l, DefaultCostModel(), tc.mapped, false, false); a != tc.want {
				t.Errorf("%v of %d bytes, %d ranks, mapped %v: %v, want %v", tc.k, bytes, tc.n, tc.mapped, a, tc.want)
			}
		}
		if a := choose(tc.k, l.inline()+1, tc.n, l, DefaultCostModel(), tc.mapped, false, false); a == AlgoRD || a == AlgoOneShot {
			t.Errorf("%v past the inline limit, %d ranks: %v", tc.k, tc.n, a)
		}
	}
}

// Among 4 or 8 ranks of one host an all-reduce past mappedRDMin (and
// within what a hello carries) is recursive doubling; at it, with 2 or 3
// ranks, or over the network's rule, the one-shot stays.
func TestChooseMappedAllReduce(t *testing.T) {
	for _, tc := range []struct {
		n     int
		bytes int64
		want  Algorithm
	}{
		{4, mappedRDMin, AlgoOneShot},
		{4, mappedRDMin + 1, AlgoRD},
		{8, 64 << 10, AlgoRD},
		{2, 64 << 10, AlgoOneShot},
		{3, 64 << 10, AlgoOneShot},
	} {
		l, err := newLayout(tc.n, 256<<20)
		if err != nil {
			t.Fatal(err)
		}
		if tc.bytes > l.inline() {
			t.Fatalf("%d bytes exceed the %d-byte hellos of %d ranks: the case tests nothing", tc.bytes, l.inline(), tc.n)
		}
		if a := choose(kAllReduce, tc.bytes, tc.n, l, DefaultCostModel(), true, false, false); a != tc.want {
			t.Errorf("all-reduce of %d bytes among %d mapped ranks: %v, want %v", tc.bytes, tc.n, a, tc.want)
		}
	}
}

// Over a network an all-gather or a reduce-scatter among 4 or 8 ranks
// whose hellos fit takes recursive doubling (the all-gather's rounds carry
// only the blocks held so far, the reduce-scatter halves); 2 and 3 ranks,
// mapped memory and data past a hello stay as they were.
func TestChooseNetworkRD(t *testing.T) {
	for _, k := range []kind{kAllGather, kReduceScatter} {
		for _, tc := range []struct {
			n      int
			bytes  int64 // the selector's: per rank (all-gather), in all (reduce-scatter)
			mapped bool
			want   Algorithm
		}{
			{4, 16 << 10, false, AlgoRD},
			{8, 1 << 10, false, AlgoRD},
			{4, 16, false, AlgoRD},
			{2, 16 << 10, false, AlgoOneShot},
			{3, 16 << 10, false, AlgoOneShot},
			{4, 16 << 10, true, AlgoOneShot},
		} {
			l, err := newLayout(tc.n, 256<<20)
			if err != nil {
				t.Fatal(err)
			}
			if rdPayload(k, tc.bytes, tc.n) > l.inline() {
				t.Fatalf("%v of %d bytes among %d ranks exceeds the %d-byte hellos: the case tests nothing", k, tc.bytes, tc.n, l.inline())
			}
			if a := choose(k, tc.bytes, tc.n, l, DefaultCostModel(), tc.mapped, false, false); a != tc.want {
				t.Errorf("%v of %d bytes among %d ranks (mapped %v): %v, want %v", k, tc.bytes, tc.n, tc.mapped, a, tc.want)
			}
		}
	}
	l, _ := newLayout(4, 256<<20)
	if a := choose(kAllGather, l.inline()/4+1, 4, l, DefaultCostModel(), false, false, false); a == AlgoRD {
		t.Errorf("all-gather whose output exceeds a hello among 4 network ranks: rd")
	}
	if a := choose(kReduceScatter, l.inline()+1, 4, l, DefaultCostModel(), false, false, false); a == AlgoRD {
		t.Errorf("reduce-scatter whose input exceeds a hello among 4 network ranks: rd")
	}
}

// The ordered algorithm is for HCCL_DETERMINISTIC=strict (or when asked
// for): without strict the selector keeps the ring for reduce-scatter, whose
// last listed algorithm ordered now is.
func TestChooseOrderedOnlyWhenStrict(t *testing.T) {
	l, err := newLayout(4, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []kind{kAllReduce, kReduceScatter, kReduceScatterV, kReduce} {
		if a := choose(k, 64<<20, 4, l, DefaultCostModel(), true, false, false); a == AlgoOrdered {
			t.Errorf("%v, 64 MiB, not strict: the selector chose ordered", k)
		}
		if a, err := strictAlgo(nil, "x", k, AlgoAuto, "", 64<<20, l); err != nil || a != AlgoOrdered {
			t.Errorf("%v, 64 MiB, strict: %v, %v; want ordered", k, a, err)
		}
		want := AlgoOneShot
		if !has(k, AlgoOneShot) {
			want = AlgoOrdered
		}
		if a, err := strictAlgo(nil, "x", k, AlgoAuto, "", 8, l); err != nil || a != want {
			t.Errorf("%v, 8 bytes, strict: %v, %v; want %v", k, a, err, want)
		}
	}
}

// The inline poll is on by default, and off by default when the
// communicator's processes on the host outnumber its cores (a polling
// caller takes the core its peer needs); the variable overrides both ways.
func TestHelloPollDefault(t *testing.T) {
	for _, c := range []struct {
		env          string
		procs, cores int
		want         time.Duration
	}{
		{"", 1, 2, helloPoll}, {"", 2, 2, helloPoll}, {"", 4, 2, -1}, {"", 64, 32, -1},
		{"off", 1, 2, -1}, {"20us", 4, 2, 20 * time.Microsecond}, {"0", 1, 8, -1},
	} {
		t.Setenv("HCOMM_HELLO_POLL", c.env)
		got, err := envHelloPoll(c.procs, c.cores)
		if err != nil || got != c.want {
			t.Errorf("HCOMM_HELLO_POLL=%q, %d processes on %d cores: %v, %v; want %v", c.env, c.procs, c.cores, got, err, c.want)
		}
	}
}

// TestPreferLent: the all-gather takes the direct schedule (its lent form)
// over tcp from above the inline size up to lentMax, and among the ranks of
// one process at any size above it, between processes of a host that read
// lent memory from readMin on; not over shm with HCOMM_SHM_CMA_DISABLE, not above lentMax over tcp or at
// the inline size, not above helloFullMax ranks, not in place of a
// two-level choice, and no other collective.
func TestPreferLent(t *testing.T) {
	l, err := newLayout(4, 256<<20)
	if err != nil {
		t.Fatal(err)
	}
	in := l.inline()
	tcp := &state{lay: l, netLends: true}
	proc := &state{lay: l, mapped: true, allInproc: true, netLends: true}
	shm := &state{lay: l, mapped: true, netLends: true}
	cma := &state{lay: l, mapped: true, netLends: true, cma: true}
	for _, tc := range []struct {
		name  string
		st    *state
		k     kind
		n     int
		bytes int64
		in    Algorithm
		want  Algorithm
	}{
		{"tcp above inline", tcp, kAllGather, 4, in + 1, AlgoRing, AlgoDirect},
		{"tcp at lentMax", tcp, kAllGather, 4, lentMax, AlgoRing, AlgoDirect},
		{"tcp past lentMax", tcp, kAllGather, 4, lentMax + 1, AlgoRing, AlgoRing},
		{"tcp at inline", tcp, kAllGather, 4, in, AlgoOneShot, AlgoOneShot},
		{"tcp, 9 ranks", tcp, kAllGather, 9, in + 1, AlgoRing, AlgoRing},
		{"tcp, two levels", tcp, kAllGather, 4, in + 1, AlgoHier, AlgoHier},
		{"tcp broadcast", tcp, kBroadcast, 4, in + 1, AlgoTree, AlgoTree},
		{"tcp all-to-all", tcp, kAlltoAll, 4, in + 1, AlgoPairwise, AlgoPairwise},
		{"tcp but some peers elsewhere", &state{lay: l}, kAllGather, 4, in + 1, AlgoRing, AlgoRing},
		{"in process, 4 MiB", proc, kAllGather, 2, 4 << 20, AlgoRing, AlgoDirect},
		{"in process, 64 MiB", proc, kAllGather, 4, 64 << 20, AlgoRing, AlgoDirect},
		{"in process, at inline", proc, kAllGather, 2, in, AlgoOneShot, AlgoDirect},
		{"in process, below the read lane's least input", proc, kAllGather, 8, inprocGatherMin(8) - 1, AlgoOneShot, AlgoOneShot},
		{"in process, at the read lane's least input", proc, kAllGather, 8, inprocGatherMin(8), AlgoOneShot, AlgoDirect},
		{"in process, all-to-all blocks at readMin", proc, kAlltoAll, 4, 4 * readMin, AlgoOneShot, AlgoPairwise},
		{"in process, all-to-all of a rank a core", proc, kAlltoAll, 2, 2 * inprocPairMin, AlgoOneShot, map[bool]Algorithm{true: AlgoPairwise, false: AlgoOneShot}[runtime.NumCPU() >= 2]},
		{"in process, all-to-all of a rank a core, small blocks", proc, kAlltoAll, 2, 2*inprocPairMin - 1, AlgoOneShot, AlgoOneShot},
		{"in process, all-to-all of more ranks than cores", proc, kAlltoAll, runtime.NumCPU() + 1, 64, AlgoOneShot, AlgoOneShot},
		// Stop 47: between 2 ranks the hellos win to 4 KiB blocks and 2 KiB
		// all-gather inputs (the read lane took them from 1 and 2 KiB on).
		{"in process, 2 ranks, all-to-all of 4 KiB blocks", proc, kAlltoAll, 2, 2 * 4096, AlgoOneShot, AlgoOneShot},
		{"in process, 2 ranks, all-gather of 2 KiB inputs", proc, kAllGather, 2, 2048, AlgoOneShot, AlgoOneShot},
		{"in process, 9 ranks", proc, kAllGather, 9, 64 << 20, AlgoRing, AlgoRing},
		{"in process, broadcast at pairReadMin", proc, kBroadcast, 4, pairReadMin, AlgoOneShot, AlgoDirect},
		{"in process, broadcast below pairReadMin", proc, kBroadcast, 4, pairReadMin - 1, AlgoOneShot, AlgoOneShot},
		{"shm, CMA off", shm, kAllGather, 4, in + 1, AlgoRing, AlgoRing},
		{"shm, CMA off, 64 MiB", shm, kAllGather, 4, 64 << 20, AlgoRing, AlgoRing},
		{"shm reads, below readMin", cma, kAllGather, 4, readMin - 1, AlgoRing, AlgoRing},
		{"shm reads, above inline and readMin", cma, kAllGather, 4, max(readMin, in+1), AlgoRing, AlgoDirect},
		{"shm reads, 64 MiB", cma, kAllGather, 4, 64 << 20, AlgoRing, AlgoDirect},
		{"shm reads, 9 ranks", cma, kAllGather, 9, 64 << 20, AlgoRing, AlgoRing},
		{"shm reads, broadcast", cma, kBroadcast, 4, 64 << 20, AlgoRing, AlgoDirect},
		{"shm reads, broadcast at readMin", cma, kBroadcast, 4, readMin, AlgoOneShot, AlgoDirect},
		{"shm reads, broadcast below readMin", cma, kBroadcast, 4, readMin - 1, AlgoOneShot, AlgoOneShot},
		{"shm reads, 2 ranks, broadcast at pairReadMin", cma, kBroadcast, 2, pairReadMin, AlgoOneShot, AlgoDirect},
		{"shm reads, 2 ranks, broadcast below pairReadMin", cma, kBroadcast, 2, pairReadMin - 1, AlgoOneShot, AlgoOneShot},
		{"shm reads, all-gather at readMin", cma, kAllGather, 2, readMin, AlgoOneShot, AlgoDirect},
		{"shm reads, 2 ranks, all-gather at gatherReadMin", cma, kAllGather, 2, gatherReadMin(2), AlgoOneShot, AlgoDirect},
		{"shm reads, 2 ranks, all-gather below gatherReadMin", cma, kAllGather, 2, gatherReadMin(2) - 1, AlgoOneShot, AlgoOneShot},
		{"shm reads, 4 ranks, all-gather below readMin", cma, kAllGather, 4, readMin - 1, AlgoOneShot, AlgoOneShot},
		{"shm reads, 2 ranks, all-to-all blocks at pairReadMin", cma, kAlltoAll, 2, 2 * pairReadMin, AlgoOneShot, AlgoPairwise},
		{"shm reads, 2 ranks, all-to-all blocks below pairReadMin", cma, kAlltoAll, 2, 2*pairReadMin - 1, AlgoOneShot, AlgoOneShot},
		{"shm reads, all-to-all blocks at readMin", cma, kAlltoAll, 4, 4 * readMin, AlgoOneShot, AlgoPairwise},
		{"shm reads, all-to-all blocks below readMin", cma, kAlltoAll, 4, 4*readMin - 1, AlgoOneShot, AlgoOneShot},
		{"shm, CMA off, all-to-all", shm, kAlltoAll, 4, 64 << 20, AlgoOneShot, AlgoOneShot},
		{"shm reads, all-reduce", cma, kAllReduce, 4, 64 << 20, AlgoRing, AlgoDirect},
		{"shm reads, all-reduce blocks at arDirectMin", cma, kAllReduce, 4, 4 * arDirectMin, AlgoRing, AlgoDirect},
		{"shm reads, all-reduce blocks below arDirectMin", cma, kAllReduce, 4, 4*arDirectMin - 1, AlgoRing, AlgoRing},
		{"shm reads, 2 ranks, all-reduce blocks at arDirectMin", cma, kAllReduce, 2, 2 * arDirectMin, AlgoHD, AlgoDirect},
		{"shm reads, 2 ranks, all-reduce blocks below arDirectMin", cma, kAllReduce, 2, 2*arDirectMin - 1, AlgoHD, AlgoHD},
		{"shm reads, 9 ranks, all-reduce", cma, kAllReduce, 9, 64 << 20, AlgoRing, AlgoRing},
		{"shm reads, all-reduce over two levels", cma, kAllReduce, 4, 64 << 20, AlgoHier, AlgoHier},
		{"shm, CMA off, all-reduce", shm, kAllReduce, 4, 64 << 20, AlgoRing, AlgoRing},
		{"in process, all-reduce", proc, kAllReduce, 2, 1 << 20, AlgoHD, AlgoDirect},
		{"in process, all-reduce blocks below arDirectMin", proc, kAllReduce, 3, 3*arDirectMin - 1, AlgoRing, AlgoRing},
		{"tcp all-reduce", tcp, kAllReduce, 2, 64 << 20, AlgoHD, AlgoHD},
	} {
		if got := preferLent(tc.k, tc.bytes, tc.n, tc.st, tc.in); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestLayoutGatherPiece: the layout's regions never overlap nor pass the
// buffer, for every rank count and buffer size tried; a gather slot is twice
// the pipeline's piece where the buffer has room (gatherPiece: the default
// buffer has), and the piece where it has not.
func TestLayoutGatherPiece(t *testing.T) {
	for _, n := range []int{2, 3, 4, 8, 16, 64} {
		for _, size := range []int64{64 << 10, 200 << 10, 1 << 20, 5<<20 + 4096, 16 << 20, 200 << 20} {
			l, err := newLayout(n, size)
			if err != nil {
				continue // too small for n ranks: refused, nothing laid out
			}
			if l.gpiece != l.piece && l.gpiece != 2*l.piece {
				t.Fatalf("n=%d size=%d: gather slots of %d bytes, pieces of %d", n, size, l.gpiece, l.piece)
			}
			if end := l.inboxSlotOff(n-1, 1) + l.piece; end > l.gatherSlotOff(0) {
				t.Fatalf("n=%d size=%d: the inbox slots end at %d, past the first gather slot at %d", n, size, end, l.gatherSlotOff(0))
			}
			if end := l.gatherSlotOff(1) + l.gpiece; end > l.scratchOff() {
				t.Fatalf("n=%d size=%d: the gather slots end at %d, past the scratch slot at %d", n, size, end, l.scratchOff())
			}
			if end := l.scratchOff() + l.piece; end > size {
				t.Fatalf("n=%d size=%d: the scratch slot ends at %d, past the buffer", n, size, end)
			}
		}
	}
	l, err := newLayout(4, 200<<20) // HCCL_BUFFSIZE's default
	if err != nil {
		t.Fatal(err)
	}
	if l.gpiece != 2*l.piece {
		t.Fatalf("default buffer: gather slots of %d bytes, want twice the piece (%d)", l.gpiece, l.piece)
	}
	l, err = newLayout(4, 200<<10)
	if err != nil {
		t.Fatal(err)
	}
	if l.gpiece != l.piece || l.gatherSlotOff(1)+l.gpiece > l.scratchOff() {
		t.Fatalf("small buffer: gather slots of %d bytes, pieces of %d", l.gpiece, l.piece)
	}
}

// TestEnvCrowded: HCOMM_CROWDED forces either answer, unset leaves the
// detected one, and anything else is refused by name.
func TestEnvCrowded(t *testing.T) {
	for _, c := range []struct {
		env            string
		detected, want bool
		err            string
	}{
		{"", true, true, ""}, {"", false, false, ""},
		{"1", false, true, ""}, {"0", true, false, ""},
		{"yes", true, false, `HCOMM_CROWDED="yes"`},
	} {
		t.Setenv("HCOMM_CROWDED", c.env)
		got, err := envCrowded(c.detected)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("HCOMM_CROWDED=%q: %v, want an error naming %s", c.env, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("HCOMM_CROWDED=%q detected=%v: %v, %v; want %v", c.env, c.detected, got, err, c.want)
		}
	}
}
