package collectives

import (
	"fmt"
	"math"
	"os"
	"strings"
)

// Algorithm names a schedule. The zero value lets the selector choose. The
// values travel in the handshake header: ranks that pick different
// algorithms for one collective (a different HCCL_ALGO) get ErrMismatch.
type Algorithm int

const (
	AlgoAuto     Algorithm = iota // the selector decides by collective, size, rank count and transport
	AlgoOneShot                   // data travels inline with the handshake: one hand-off, for small messages
	AlgoRing                      // ring, pipelined in pieces through the peers' inboxes: every link carries the data once
	AlgoDirect                    // every rank reads each piece straight from its owner's HCCL buffer: one copy per receiver (mesh)
	AlgoPairwise                  // n-1 rounds, in round r rank i exchanges with ranks i+r and i-r (all-to-all, scatter, gather)
	AlgoHD                        // recursive halving-doubling (HCCL's H-D_R), folding rank counts that are not powers of two
	AlgoHier                      // two levels, shared memory within each host and one rank per host on the network (all-reduce, all-gather, broadcast, reduce-scatter, all-to-all)
	AlgoTree                      // binomial tree, pipelined in pieces: log2(n) hops (broadcast, reduce; all-reduce as a reduce and a broadcast)
	AlgoOrdered                   // every rank reduces its piece from all ranks' inputs in rank order: the same bits whatever the transport (HCCL_DETERMINISTIC=strict)
	AlgoRD                        // recursive doubling: log2(n) exchanges of the whole (small) message, inline with the butterfly handshake
	AlgoBruck                     // Bruck: ⌈log2 n⌉ rounds at distances 1, 2, 4, … through the pipes (all-gather; all-to-all of small blocks)
	AlgoDBTree                    // double binary tree: half the message up and down each of two binary trees, in pieces (all-reduce, by name only: its trees share one stream)
)

func (a Algorithm) String() string {
	switch a {
	case AlgoAuto:
		return "auto"
	case AlgoOneShot:
		return "oneshot"
	case AlgoRing:
		return "ring"
	case AlgoDirect:
		return "direct"
	case AlgoPairwise:
		return "pairwise"
	case AlgoHD:
		return "hd"
	case AlgoHier:
		return "hier"
	case AlgoTree:
		return "tree"
	case AlgoOrdered:
		return "ordered"
	case AlgoRD:
		return "rd"
	case AlgoBruck:
		return "bruck"
	case AlgoDBTree:
		return "dbtree"
	}
	return fmt.Sprintf("Algorithm(%d)", int(a))
}

// algorithms lists, per collective, the schedules it has, in the order the
// selector considers them.
var algorithms = [kSendRecv + 1][]Algorithm{
	kAllReduce:      {AlgoOneShot, AlgoRD, AlgoHD, AlgoTree, AlgoDBTree, AlgoHier, AlgoRing, AlgoDirect, AlgoOrdered},
	kBroadcast:      {AlgoOneShot, AlgoRD, AlgoDirect, AlgoTree, AlgoHier, AlgoRing},
	kAllGather:      {AlgoOneShot, AlgoRD, AlgoDirect, AlgoHier, AlgoRing, AlgoBruck},
	kAllGatherV:     {AlgoDirect},
	kReduceScatter:  {AlgoOneShot, AlgoRD, AlgoHier, AlgoRing, AlgoOrdered},
	kReduceScatterV: {AlgoRing, AlgoOrdered},
	kReduce:         {AlgoOneShot, AlgoRD, AlgoTree, AlgoRing, AlgoOrdered},
	kScatter:        {AlgoPairwise},
	kGather:         {AlgoPairwise},
	kAlltoAll:       {AlgoOneShot, AlgoBruck, AlgoHier, AlgoPairwise},
	kAlltoAllV:      {AlgoPairwise},
	kBarrier:        {AlgoOneShot},
}

func has(k kind, a Algorithm) bool {
	if int(k) >= len(algorithms) {
		return false
	}
	for _, x := range algorithms[k] {
		if x == a {
			return true
		}
	}
	return false
}

// mappedRDMin is the all-reduce above which choose takes recursive
// doubling over the one-shot among 4 or 8 ranks of one host.
const mappedRDMin = 48 << 10

// choose is the selector: the algorithm for a collective of kind k moving
// bytes per rank (the size the one-shot path would carry inline) among n
// ranks, given the layout, the cost model, and whether every peer's memory
// is mapped (inproc, shm: a read is a memmove) or behind a network (tcp: a
// read is a round trip). First the rules the model does not see:
//
//   - ranks that span hosts reduce in two levels (hier) above the inline
//     size (the two-level all-gather and broadcast are chooseLevels',
//     which the caller asks after choose);
//   - where memory is mapped, an all-gather from a window reads in place
//     (direct);
//   - up to helloFullMax ranks, what fits a hello slot goes one-shot —
//     but among 4 or 8 ranks over a network an all-reduce, a broadcast,
//     an all-gather and a reduce-scatter take recursive doubling, and in
//     mapped memory an all-reduce above mappedRDMin — and
//     the rest is the tuning table's (tuning.go), whose rows cite their
//     measurements (made at 2 to 8 ranks); preferLent (lent.go) then turns
//     the choice into a schedule that writes or reads the peers' buffers
//     in place where the transport allows it;
//   - the direct schedules are for mapped memory only (over a network a
//     read is a round trip per piece and peer);
//   - above helloFullMax ranks every collective opens with the butterfly,
//     and the one-shot schedules (a hello to every peer) are left out, so
//     that a mismatch reaches every rank;
//   - ordered is HCCL_DETERMINISTIC=strict's (strictAlgo), never chosen
//     here.
//
// Above helloFullMax ranks it picks the schedule whose modelled time
// (costOf, under the link class's LinkCost) is least among those that can
// carry the call; a broadcast on mapped memory above the inline size reads
// the root's pieces (direct) and a reduce above it takes the tree, as the
// table measured. The choice depends only on what every rank knows alike
// (k, bytes, n, the layout, the model and the transport), so that every
// rank makes it.
func choose(k kind, bytes int64, n int, l layout, cm CostModel, mapped, multiHost, windowed bool) Algorithm {
	if k == kAllReduce && multiHost && bytes > l.inline() {
		return AlgoHier
	}
	if k == kAllGather && mapped && windowed {
		// From a window a direct read is the only copy: it wins with two
		// ranks too (BENCHMARKS.md).
		return AlgoDirect
	}
	if n <= helloFullMax {
		if (k == kAllReduce || k == kBroadcast) && !mapped && n >= 4 && n&(n-1) == 0 && bytes <= l.inline() {
			// Over the network a message costs each end a system call and
			// a wake-up: recursive doubling's log2(n) messages a rank
			// beat the one-shot's n-1 (stop 14, tcp, 4 processes: 16 B
			// rd 79–132 µs against oneshot 82–183; 1 KiB 74–121 against
			// 131–200; 64 KiB 254–494 against 364–421). So for the
			// broadcast, whose root's data rides the butterfly from the
			// ranks that hold it (stop 48, tcp, 200–400 calls a launch,
			// two launches each, µs, oneshot against rd: 4 processes 16
			// B 42–58 / 35–38, 4 KiB 43–45 / 36–39, 64 KiB 61–63 /
			// 51–55; 8 processes 16 B 183–221 / 95–99, 4 KiB 186–194 /
			// 100–108). With a fold (n not a power of two) rd takes two
			// rounds more: on this project's crowded loopback it still
			// won (stop 48: 3 processes 10 %, 5–7 processes 30–40 %),
			// but those rounds cost a network's latency each where the
			// one-shot's messages go at once (hcomm sim, 3 ranks, α 20
			// µs on 2 cores: 122 µs against 67), and the selector does
			// not know the latency here: the one-shot stays.
			return AlgoRD
		}
		if k == kAllGather && !mapped && n >= 4 && n&(n-1) == 0 && rdPayload(k, bytes, n) <= l.inline() {
			// The same over the network for the all-gather, whose
			// rounds carry only the blocks a rank holds so far (stop 24,
			// tcp, 4 processes, two launches each: 4 KiB of output rd
			// 34–36 µs against oneshot 42–44, 16 KiB 39–42 against 46–57,
			// 64 KiB 61–63 against 72–75).
			return AlgoRD
		}
		if k == kReduceScatter && !mapped && n >= 4 && n&(n-1) == 0 && bytes <= l.inline() {
			// And the reduce-scatter, which halves there (reduceScatterRD):
			// log2(n) hand-offs where the one-shot takes n-1, the same
			// bytes (stop 24, tcp, 4 processes, two launches each: 4 KiB
			// in all 32.5–33.0 µs against 45.9–52.0, 64 KiB 49.2–51.8
			// against 62.7–67.9).
			return AlgoRD
		}
		if k == kAllReduce && mapped && n >= 4 && n&(n-1) == 0 && bytes > mappedRDMin && bytes <= l.inline() {
			// Between ranks of one host, once the data outweighs the
			// hand-offs, recursive doubling's log2(n) exchanges move less
			// than the one-shot's n-1 writes and n-1 reductions, lane or
			// not (stop 23, 4 ranks, 64 KiB, three launches each: in
			// process 51–59 µs against 61–69, 4 shm processes 42–51
			// against 55–64, Open MPI 63–69; at 48 KiB alike, 44–55
			// against 44–54; 2 ranks stay one-shot: 17–19 against 13).
			return AlgoRD
		}
		// The all-to-all's one-shot carries a block per hello, so it runs
		// up to n hellos' worth; the reduce-scatter's a part per hello
		// too, but past a hello's worth in all the ring's pipelined
		// reduction is what was measured (tuning.go): one-shot up to there.
		if has(k, AlgoOneShot) && (k == kAlltoAll && oneShotPayload(k, bytes, n) <= l.inline() || bytes <= l.inline()) {
			return AlgoOneShot
		}
		if a, ok := tunedAlgo(k, bytes, n, mapped); ok {
			return a
		}
	}
	if k == kBroadcast && mapped && bytes > l.inline() {
		return AlgoDirect
	}
	if k == kReduce && bytes > l.inline() {
		return AlgoTree
	}
	sh := shape{k: k, n: n, bytes: bytes, inline: l.inline(), piece: l.piece, mapped: mapped}
	lc := cm.class(mapped)
	best, bestCost := Algorithm(-1), math.Inf(1)
	for _, a := range algorithms[k] {
		switch {
		case a == AlgoOrdered || a == AlgoHier:
			continue
		case a == AlgoDirect && k == kAllReduce:
			continue // where ranks read each other's memory: preferLent
		case a == AlgoDirect && !mapped:
			continue
		case a == AlgoOneShot && n > helloFullMax:
			continue
		case a == AlgoBruck && k == kAlltoAll && n <= helloFullMax:
			// Not measured among the tuning table's rank counts, where
			// it saves at most a few hand-offs for its extra copies:
			// pairwise, as before there was a choice.
			continue
		}
		if c := costOf(a, sh, lc); c < bestCost {
			best, bestCost = a, c
		}
	}
	if best < 0 {
		// Nothing the model can carry (one schedule, and it cannot):
		// the last listed, as before there was a model.
		return algorithms[k][len(algorithms[k])-1]
	}
	return best
}

// crowdedChoice returns the binomial tree for an all-reduce of more than
// helloFullMax ranks that the cost model gave to halving-doubling, the ring
// or the double binary tree, where some host's ranks outnumber its cores
// (crowded, hcomm.Comm.Crowded: every rank decides alike), else algo. The
// model prices a schedule by its critical path, as if every rank had a
// core; on a crowded host the ranks take turns on the cores, and a
// collective costs the processor time of all its messages, of which the
// tree sends fewest — each piece once up and once down each link — where
// halving-doubling sends n·log2(n) a round and the ring n a step. Over tcp,
// all-reduce, µs (stop 27, two launches each): 16 processes on 2 cores
// 256 KiB tree 2030–2035 against hd 2757–3011, 1 MiB 5774–6049 against
// 6222–6445, 4 MiB 21931–23768 against ring 25089–27390, 16 MiB 91860
// against the model's choice 111664 (Open MPI 167330); 32 processes 256
// KiB 4001–4017 against hd 5813–5843, 1 MiB 12459–14039 against
// 15470–16659; 64 processes 1 MiB 33379–33893 against hd 39378–41186, 4
// MiB 113903 against the model's choice 136865 (Open MPI 183346), 16 MiB
// 447790–474613 against ring 1230774–1375172 (Open MPI 682741). The double
// binary tree fell between (16 processes 1 MiB 6207–6269, 64 processes 16
// MiB 550296–584057).
//
// Over a network the same holds from 4 ranks on (network: some peer is
// over tcp, every rank knows alike), up to crowdedTreeMax: 4 and 8 tcp
// processes on 2 cores, each bound to a core by hcomm run (stop 31, µs,
// medians of three to five launches): 4 processes 256 KiB tree 296 against
// ring 398, 1 MiB 924 against 1133, 16 MiB 16331 against 19189 (64 MiB
// alike, 71–98 ms against 77); 8 processes 256 KiB 758 against 1435, 1 MiB
// 2353 against 2931. 3 processes tie (1 MiB 901 against 922), and between
// processes of one host (shm) the ring stays far ahead (4 processes 1 MiB
// 468 against 836).
func crowdedChoice(k kind, n int, bytes int64, mapped, crowded bool, algo Algorithm) Algorithm {
	if !crowded || k != kAllReduce || algo != AlgoHD && algo != AlgoRing && algo != AlgoDBTree {
		return algo
	}
	if n > helloFullMax || !mapped && n >= 4 && bytes <= crowdedTreeMax {
		return AlgoTree
	}
	return algo
}

// envCrowded returns whether the collectives choose the schedules of a
// crowded communicator — the handshake down a binomial tree above
// helloFullMax ranks (envTree), the all-reduce down the tree
// (crowdedChoice) — from HCOMM_CROWDED: 1 or 0, or unset for detected, the
// communicator's own answer (hcomm.Comm.Crowded: some host's ranks'
// processes outnumber its processors). Anything else is an error naming
// the variable. It moves the schedule choice only: how a wait spins or
// sleeps follows the host as it is. Two uses: a host whose processors are
// rationed in a way the ranks cannot see (a container's CPU quota under
// cgroups, which leaves runtime.NumCPU and the affinity as they were)
// says 1; a small machine standing in for a cluster of uncrowded hosts
// says 0, so that its ranks run what those hosts' ranks would — the
// schedules the simulator's slowdown model times (channel/sim), and its
// validation runs (BENCHMARKS.md, stop 32). Set it alike on every rank:
// ranks that choose different schedules wait for messages that never come,
// until the execution timeout.
func envCrowded(detected bool) (bool, error) {
	switch v := os.Getenv("HCOMM_CROWDED"); v {
	case "":
		return detected, nil
	case "1":
		return true, nil
	case "0":
		return false, nil
	default:
		return false, fmt.Errorf("collectives: HCOMM_CROWDED=%q: want 1 (the schedules of a crowded host), 0 (of hosts with a processor a rank) or unset (as detected)", v)
	}
}

// crowdedTreeMax is the largest all-reduce (bytes per rank) that a crowded
// communicator of up to helloFullMax ranks over a network runs down the
// tree instead of the ring (crowdedChoice).
const crowdedTreeMax = 16 << 20

// chooseLevels returns AlgoHier where the two-level form of collective k
// (all-gather, broadcast, reduce-scatter, all-to-all) is modelled to beat flat, the flat selector's
// choice, among the host groups of h (st.shape), else flat: the flat
// schedule under the link class of the whole communicator (network: its
// slowest links set its pace) with each host's ranks sharing its link, the
// two-level one as the sum of its steps,
// each the choice of its level's selector, within a host under the mapped
// class and among the leaders under the network's. The choice depends only
// on what every rank knows alike.
func chooseLevels(k kind, bytes int64, flat Algorithm, l layout, cm CostModel, mapped bool, h *hier) Algorithm {
	if k != kAllGather && k != kBroadcast && k != kReduceScatter && k != kAlltoAll || h.hosts < 2 {
		return flat
	}
	if k == kAlltoAll && !uniformHosts(h.groups) {
		return flat // alltoAllHier's packs are runs of a host's consecutive ranks
	}
	m := 0
	for _, g := range h.groups {
		m = max(m, len(g))
	}
	if k == kReduceScatter && (int64(l.n)+int64(m))*(bytes/int64(l.n)) > l.bufSize-l.inboxOff {
		return flat // the leaders' working space would not hold it (hierRSFits)
	}
	if k == kAlltoAll && 2*int64(m)*bytes > l.bufSize-l.inboxOff {
		return flat // the leaders' working space would not hold it (hierA2AFits)
	}
	lay0, err0 := newLayout(m, l.bufSize)
	lay1, err1 := newLayout(h.hosts, l.bufSize)
	if err0 != nil || err1 != nil {
		return flat
	}
	at := func(k kind, a Algorithm, n int, bytes int64, lay layout, mapped bool) float64 {
		if a == AlgoAuto {
			a = choose(k, bytes, n, lay, cm, mapped, false, false)
		}
		return costOf(a, shape{k: k, n: n, bytes: bytes, inline: lay.inline(), piece: lay.piece, mapped: mapped}, cm.class(mapped))
	}
	// The two-level call opens with its own handshake among all the ranks.
	two := handshake(l.n, cm.class(mapped))
	if k == kAllGather {
		// The host's blocks to each of its ranks (AllGatherV: direct),
		// the hosts' among the leaders, the whole output to each host.
		total := bytes * int64(l.n)
		two += at(kAllGatherV, AlgoDirect, m, bytes, lay0, true) +
			at(kAllGather, AlgoAuto, h.hosts, int64(m)*bytes, lay1, false) +
			at(kBroadcast, AlgoAuto, m, total, lay0, true)
	} else if k == kReduceScatter {
		// The whole input reduced to the leader, reduce-scattered among
		// the leaders, the host's blocks scattered to its ranks.
		two += at(kReduce, AlgoAuto, m, bytes, lay0, true) +
			at(kReduceScatter, AlgoAuto, h.hosts, bytes, lay1, false) +
			at(kScatter, AlgoPairwise, m, int64(m)*(bytes/int64(l.n)), lay0, true)
	} else if k == kAlltoAll {
		// The host's send buffers gathered to the leader, packed for the
		// hosts, exchanged among the leaders (m·m blocks a pair), sorted
		// into the ranks' receive orders and scattered to them.
		host := int64(m) * bytes
		two += at(kGather, AlgoPairwise, m, host, lay0, true) +
			at(kAlltoAll, AlgoAuto, h.hosts, host, lay1, false) +
			at(kScatter, AlgoPairwise, m, host, lay0, true) + 2*float64(host)*memBeta
	} else {
		two += at(kBroadcast, AlgoAuto, h.hosts, bytes, lay1, false) + at(kBroadcast, AlgoAuto, m, bytes, lay0, true)
	}
	// The flat schedule: where the ranks of a host talk across hosts at
	// once (all but the ring, whose only links across hosts are one per
	// host where the hosts hold consecutive ranks) they share the host's
	// network link, m to a link.
	lc := cm.class(mapped)
	if flat != AlgoRing {
		lc.Beta *= float64(m)
	}
	if two < costOf(flat, shape{k: k, n: l.n, bytes: bytes, inline: l.inline(), piece: l.piece, mapped: mapped}, lc) {
		return AlgoHier
	}
	return flat
}

// treeMax is the largest message the selector sends down (or up) a tree
// where a read crosses a network: above it the ring's single pass over each
// link wins (tuning.go).
const treeMax = 1 << 20

// hdMax is the largest message (bytes per rank) the selector gives to
// halving-doubling (tuning.go).
const hdMax = 8 << 20

// hcclAlgoNames maps HCCL_ALGO's algorithm names (and hcomm's own) to
// schedules (names are case-insensitive). HCCL's NHR, NHR_V1, AHC and pipeline have no hcomm
// counterpart yet and are refused by name.
var hcclAlgoNames = map[string]Algorithm{
	"ring":     AlgoRing,
	"h-d_r":    AlgoHD,
	"hd":       AlgoHD,
	"hier":     AlgoHier,
	"tree":     AlgoTree,
	"nb":       AlgoTree, // HCCL's NB: a nonuniform bruck/tree; hcomm's binomial tree is the nearest
	"pairwise": AlgoPairwise,
	"fullmesh": AlgoDirect,
	"mesh":     AlgoDirect,
	"direct":   AlgoDirect,
	"oneshot":  AlgoOneShot,
	"ordered":  AlgoOrdered,
	"rd":       AlgoRD,
	"bruck":    AlgoBruck,
	"dbtree":   AlgoDBTree,
	"na":       AlgoAuto,
}

var opNames = map[string][]kind{
	"allreduce":     {kAllReduce},
	"broadcast":     {kBroadcast},
	"allgather":     {kAllGather, kAllGatherV},
	"reducescatter": {kReduceScatter, kReduceScatterV},
	"reduce":        {kReduce},
	"scatter":       {kScatter},
	"gather":        {kGather},
	"alltoall":      {kAlltoAll, kAlltoAllV},
	"alltoallv":     {kAlltoAllV},
}

// parseAlgo parses HCCL_ALGO: "level0:NA;level1:ring" for every collective,
// or per collective "allreduce=level0:NA;level1:ring/allgather=level0:NA;level1:fullmesh".
// A flat hcomm communicator has one level: the level1 algorithm is used
// when it is set and not NA, else level0's (NA = let hcomm choose). The
// result maps a collective to its forced algorithm.
func parseAlgo(v string) (map[kind]Algorithm, error) {
	out := make(map[kind]Algorithm)
	v = strings.TrimSpace(v)
	if v == "" {
		return out, nil
	}
	parseLevels := func(spec string) (Algorithm, error) {
		var lv0, lv1 Algorithm
		for _, part := range strings.Split(spec, ";") {
			part = strings.TrimSpace(part)
			if part == "" {
				continue
			}
			lvl, name, ok := strings.Cut(part, ":")
			if !ok {
				return 0, fmt.Errorf("%q: want levelN:algorithm", part)
			}
			a, ok := hcclAlgoNames[strings.ToLower(strings.TrimSpace(name))]
			if !ok {
				return 0, fmt.Errorf("%q: algorithm %q is not available in hcomm (have ring, H-D_R, rd, bruck, hier, NB/tree, pairwise, fullmesh, oneshot, ordered, NA)", part, name)
			}
			switch strings.ToLower(strings.TrimSpace(lvl)) {
			case "level0":
				lv0 = a
			case "level1", "level2", "level3":
				if a != AlgoAuto {
					lv1 = a
				}
			default:
				return 0, fmt.Errorf("%q: unknown level %q", part, lvl)
			}
		}
		if lv1 != AlgoAuto {
			return lv1, nil
		}
		return lv0, nil
	}
	if !strings.Contains(v, "=") {
		a, err := parseLevels(v)
		if err != nil {
			return nil, fmt.Errorf("HCCL_ALGO=%q: %v", v, err)
		}
		for k := range algorithms {
			if a != AlgoAuto && has(kind(k), a) {
				out[kind(k)] = a
			}
		}
		return out, nil
	}
	for _, item := range strings.Split(v, "/") {
		op, spec, ok := strings.Cut(item, "=")
		if !ok {
			return nil, fmt.Errorf("HCCL_ALGO=%q: %q: want op=levels", v, item)
		}
		ks, ok := opNames[strings.ToLower(strings.TrimSpace(op))]
		if !ok {
			return nil, fmt.Errorf("HCCL_ALGO=%q: unknown collective %q", v, op)
		}
		a, err := parseLevels(spec)
		if err != nil {
			return nil, fmt.Errorf("HCCL_ALGO=%q: %v", v, err)
		}
		if a == AlgoAuto {
			continue
		}
		// "allgather" names AllGather and AllGatherV: the algorithm applies
		// to those of them that have it (AllGatherV has only direct).
		applied := false
		for _, k := range ks {
			if has(k, a) {
				out[k], applied = a, true
			}
		}
		if !applied {
			return nil, fmt.Errorf("HCCL_ALGO=%q: %v has no %v algorithm (it has %v)", v, ks[0], a, algorithms[ks[0]])
		}
	}
	return out, nil
}

// envAlgo reads HCCL_ALGO once per communicator (at its first collective).
func envAlgo() (map[kind]Algorithm, error) { return parseAlgo(os.Getenv("HCCL_ALGO")) }

// Algorithms returns the algorithms the named collective has ("AllReduce",
// "AllGather", ...), in the order the selector considers them; nil for an
// unknown name.
func Algorithms(collective string) []Algorithm {
	for k, name := range kindNames {
		if name != "" && strings.EqualFold(name, collective) {
			return append([]Algorithm(nil), algorithms[kind(k)]...)
		}
	}
	return nil
}
