package collectives

import "sync/atomic"

// The selector's thresholds and the pipelines' piece sizes, as data: one row
// per collective, transport class, band of rank counts and range of message
// sizes, each citing the measurement that put it there. choose reads the
// algorithm from the first row that matches a call; the schedules read the
// piece from the first row that matches the call and the algorithm it runs
// (pieceFor). "Retuning the selector" in BENCHMARKS.md gives the commands
// that produce the measurements, so that the table can be redone on another
// machine.
//
// Every rank of a collective must read the same row: a row depends only on
// what every rank of the call knows alike — the collective, the bytes per
// rank choose is given, the rank count and whether every peer is mapped — and
// the algorithm a row gives travels in the handshake, which checks it.

// linkClass is how a rank reaches its peers, as the tuning table tells
// transports apart.
type linkClass uint8

const (
	linkMapped  linkClass = iota // every peer's memory is mapped (inproc, shm): a read or a write is a memmove, a notify a cache line
	linkNetwork                  // some peer is behind a network (tcp): every hand-off crosses a socket and wakes a thread
)

func (c linkClass) String() string {
	if c == linkMapped {
		return "mapped"
	}
	return "network"
}

func classOf(mapped bool) linkClass {
	if mapped {
		return linkMapped
	}
	return linkNetwork
}

// tuneRow is one row of the tuning table: for collective k over class, with
// minRanks to maxRanks ranks (maxRanks 0: no bound) and messages of at most
// upTo bytes per rank (0: any size) — the bytes choose is given — run algo
// with pipeline pieces of piece bytes (0: the layout's slot, pieceMax or
// less). measured names the measurement.
type tuneRow struct {
	k                  kind
	class              linkClass
	minRanks, maxRanks int
	upTo               int64
	algo               Algorithm
	piece              int64
	measured           string
}

func (r *tuneRow) matches(k kind, bytes int64, n int, class linkClass) bool {
	return r.k == k && r.class == class && n >= r.minRanks && (r.maxRanks == 0 || n <= r.maxRanks) &&
		(r.upTo == 0 || bytes <= r.upTo)
}

// tuning is the table; the first matching row wins, so a band's rows go from
// small messages to large. A collective without a row takes the last
// algorithm it lists (choose). Messages that fit a hello slot go one-shot
// before the table is consulted. "sitting 5" is BENCHMARKS.md's "Every
// collective and algorithm, ranks in one process (issue 5)": busbw in GB/s,
// BenchmarkCollectives, medians of three passes, 2026-11-23; "stop 12" is
// BENCHMARKS.md's section of that name (BenchmarkTuning, 2026-11-24).
var tuning = []tuneRow{
	// All-reduce. Two ranks: halving-doubling is one exchange each way
	// with no publish step (sitting 5: 1 MiB hd 11.85, ring 8.32; 8 MiB
	// 8.76 against 6.38; 64 MiB ring 6.64 against 5.65). More ranks: the
	// ring's cache-sized blocks (4 ranks: 1 MiB ring 4.91, hd 3.18; 8 MiB
	// 4.18 against 3.65).
	{k: kAllReduce, class: linkMapped, minRanks: 2, maxRanks: 2, upTo: hdMax, algo: AlgoHD, measured: "sitting 5, AllReduce 2 ranks"},
	{k: kAllReduce, class: linkMapped, minRanks: 2, algo: AlgoRing, measured: "sitting 5, AllReduce"},
	// Over tcp, 2 ranks: halving-doubling in netPiece's pieces, its
	// all-gather half by lent pipes (hd.go). Stop 21 gave up to 1 MiB a
	// row of 512 KiB pieces, each half in one write (1 MiB busbw
	// 2.94–3.03 against 2.75–2.92 in 256 KiB); by stop 30 those writes ran
	// bimodal launch to launch on this VM, 1 MiB in 327–336 µs or
	// 419–447 (lent: 296–304 or 454–492), against 361–378 in 256 KiB
	// pieces (lent: 331–404, median 345), six launches each, interleaved.
	// Stop 51 found the bimodality bbr's, the host's congestion control:
	// under the cubic that hcomm now gives a 2-rank communicator's
	// same-host sockets, 512 KiB pieces won again (netPiece2).
	{k: kAllReduce, class: linkNetwork, minRanks: 2, maxRanks: 2, upTo: hdMax, algo: AlgoHD, measured: "stop 12, AllReduce tcp 2 ranks: hd 0.33 / 0.42 / 0.31, ring 0.21 / 0.38 / 0.28 at 256 KiB / 1 MiB / 4 MiB"},
	{k: kAllReduce, class: linkNetwork, minRanks: 2, algo: AlgoRing, measured: "sitting 5, AllReduce 4 ranks (mapped figures; not re-measured over tcp)"},

	// Broadcast. Mapped: every reader reads the root's piece straight into
	// its buffer (sitting 5: 2 ranks 1 MiB direct 11.04, ring 8.76, tree
	// 8.22; 4 ranks 1 MiB 6.15, 5.39, 5.65; 8 MiB 6.41, 6.09, 6.14).
	// Network: log2(n) hops down a tree for mid-size messages with more
	// than two ranks (with two the tree is the ring), the ring's single
	// pass over each link above treeMax.
	{k: kBroadcast, class: linkMapped, minRanks: 2, algo: AlgoDirect, measured: "sitting 5, Broadcast"},
	{k: kBroadcast, class: linkNetwork, minRanks: 3, upTo: treeMax, algo: AlgoTree, measured: "treeMax as select.go had it; not re-measured"},
	{k: kBroadcast, class: linkNetwork, minRanks: 2, algo: AlgoRing, measured: "stop 12, Broadcast tcp 2 ranks (the tree is the ring there); above treeMax as select.go had it"},

	// Reduce: up the tree each piece is written once and reduced once per
	// hop; the ring's reduce-scatter plus gather moves more (sitting 5: 2
	// ranks 1 MiB tree 18.97, ring 12.97; 4 ranks 64 MiB 4.24 against 3.85).
	{k: kReduce, class: linkMapped, minRanks: 2, algo: AlgoTree, measured: "sitting 5, Reduce"},
	{k: kReduce, class: linkNetwork, minRanks: 2, algo: AlgoTree, measured: "sitting 5, Reduce (mapped figures)"},

	// All-gather. Two ranks: the ring is one write and one copy per piece
	// with no publish step (sitting 5: 1 MiB ring 4.88, direct 4.25; 8 MiB
	// 4.75 against 4.45). More, mapped: reading each owner's piece beats
	// forwarding it n-1 times (4 ranks: 1 MiB direct 3.96, ring 3.04).
	// Network: the ring, every link carrying the data once. Two ranks over
	// shm up to 1 MiB a rank: reading the peer's published pieces (direct)
	// beats the ring's write and copy (stop 18: 256 KiB and 1 MiB of
	// output, direct 39 and 96 µs against the ring's 54 and 184; 4 MiB 440
	// against 428; 64 MiB 11.7 ms against 7.7).
	{k: kAllGather, class: linkMapped, minRanks: 2, maxRanks: 2, upTo: 1 << 20, algo: AlgoDirect, measured: "stop 18, AllGather shm 2 ranks, direct against ring (BENCHMARKS.md)"},
	{k: kAllGather, class: linkMapped, minRanks: 2, maxRanks: 2, algo: AlgoRing, measured: "sitting 5, AllGather 2 ranks; stop 12"},
	{k: kAllGather, class: linkMapped, minRanks: 3, algo: AlgoDirect, measured: "sitting 5, AllGather 4 ranks; stop 12"},
	{k: kAllGather, class: linkNetwork, minRanks: 2, algo: AlgoRing, measured: "as select.go had it: direct over tcp is a read round trip per piece; not re-measured"},

	// Reduce-scatter: the ring (ordered is for HCCL_DETERMINISTIC=strict).
	{k: kReduceScatter, class: linkMapped, minRanks: 2, algo: AlgoRing, measured: "sitting 5, ReduceScatter: the only non-strict algorithm"},
	{k: kReduceScatter, class: linkNetwork, minRanks: 2, algo: AlgoRing, measured: "the only non-strict algorithm"},
	{k: kReduceScatterV, class: linkMapped, minRanks: 2, algo: AlgoRing, measured: "as ReduceScatter"},
	{k: kReduceScatterV, class: linkNetwork, minRanks: 2, algo: AlgoRing, measured: "as ReduceScatter"},
}

// tunedAlgo returns the algorithm the table gives a call of collective k
// moving bytes per rank among n ranks, and whether a row matched.
func tunedAlgo(k kind, bytes int64, n int, mapped bool) (Algorithm, bool) {
	class := classOf(mapped)
	for i := range tuning {
		if r := &tuning[i]; r.matches(k, bytes, n, class) {
			return r.algo, true
		}
	}
	return AlgoAuto, false
}

// pieceFor returns the pipeline piece, in bytes, for a call of collective k
// running algo on bytes per rank among n ranks: the first matching row's
// piece for that algorithm, bounded by the layout's slot, or the slot
// (where some peer is behind a network, at most netPiece, or netPiece2
// between 2 ranks). The
// result is a multiple of 64 bytes (every element size divides it), and at
// least 64. AlltoAllV's bytes per rank differ between ranks, so its piece
// does not depend on them: only rows without a size bound apply to it.
func pieceFor(k kind, algo Algorithm, bytes int64, n int, mapped bool, slot int64) int64 {
	if v := pieceOverride.Load(); v > 0 {
		return max(64, min(slot, v)&^63)
	}
	if k == kAlltoAllV {
		bytes = 1 << 62
	}
	class := classOf(mapped)
	for i := range tuning {
		r := &tuning[i]
		if r.algo != algo || r.piece == 0 || !r.matches(k, bytes, n, class) {
			continue
		}
		return max(64, min(slot, r.piece)&^63)
	}
	if !mapped {
		if n == 2 {
			return min(slot, netPiece2)
		}
		return min(slot, netPiece)
	}
	return slot
}

// netPiece bounds the pipes' piece where some peer is behind a network
// (tcp). Interleaved with the 512 KiB slot's piece over tcp (Intel Xeon,
// stop 21): 4 processes 64 MiB all-reduce 93.9–94.5 ms against 77.1–82.3
// in 256 KiB pieces, all-to-all 57.6–58.6 against 41.9–44.2, all-gather
// 45.6–51.5 against 42.7–42.9; 4 MiB all-reduce 6.10–6.66 ms against
// 4.61–4.99, reduce-scatter 2.58–3.08 against 2.28–2.60, all-gather
// 2.99–3.12 against 2.57–2.58; 2 processes 4 MiB all-reduce 1.85–1.97
// against 1.59–1.74, 64 MiB 35.3–38.2 against 31.6–31.7; 1 MiB alike
// either way. 128 KiB pieces measured between the two. The broadcast's
// lent pipes (broadcast.go) alike: 2 processes 1 MiB 273 µs in 512 KiB
// pieces against 183–199, 4 processes 4 MiB 2.09–2.89 ms against
// 1.60–2.13.
const netPiece = 256 << 10

// netPiece2 is netPiece for 2 ranks. Where both are on one host, hcomm
// gives their sockets cubic (hcomm's tcpLocalCongestion), and under it the
// larger pieces win: 2 processes on 2 cores over tcp loopback, µs, medians
// of four launches interleaved, 256 KiB against 512 KiB pieces (stop 51):
// 1 MiB broadcast 110.4 against 99.4, all-reduce 241 against 219,
// reduce-scatter 145 against 128, all-gather and all-to-all alike; 4 MiB
// broadcast 594 against 498, all-reduce 1009 against 920; 64 MiB
// broadcast 12.4 ms against 11.2, all-gather 10.5 against 9.4,
// reduce-scatter 11.6 against 10.6, all-reduce 16.6 against 15.4 (16.7
// against 17.5 in another three). Under bbr, the host's default there,
// 512 KiB pieces lose (1 MiB broadcast 178 µs against 135): that, or an
// older kernel, may be what stop 21 measured.
const netPiece2 = 512 << 10

// pieceOverride, when positive, replaces every row's piece and the slot's
// default (bounded by the slot all the same): BenchmarkTuning sweeps piece
// sizes through it, the same for every rank of the process. Tests only.
var pieceOverride atomic.Int64
