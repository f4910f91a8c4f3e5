package collectives

import (
	"fmt"
	"math"
	"math/bits"
	"strings"
	"time"
)

// What each schedule costs under a CostModel: a formula of the rank count n,
// the message's bytes S (per rank; for the reduce-scatter, the whole input)
// and the link's α (a hand-off on the critical path), o (a message sent or
// received), β (a byte moved) and γ (a byte reduced). The formulas follow the
// schedules in this package, not textbook ideals: a pipelined schedule moves
// its data in pieces of the layout's piece size, each piece a message; the
// ring all-reduce's all-gather reads every peer's result; the handshake is
// part of every collective (one round with every peer up to helloFullMax
// ranks, the butterfly above). costOf returns +Inf for a schedule that cannot
// carry the call (a one-shot message larger than the hello slots).

// memBeta is the time per byte of a local copy (a memmove), whatever the
// link class.
const memBeta = 0.08e-9

// cacheBytes is about the message size above which a schedule that makes
// several passes over the whole message no longer finds it in cache.
const cacheBytes = 8 << 20

// shape is what a cost formula needs to know about a call.
type shape struct {
	k      kind
	n      int
	bytes  int64
	inline int64 // the hello slots' payload
	piece  int64 // the pipeline's piece
	mapped bool  // every peer's memory is mapped (reads are memmoves)
}

// lg2 is ⌊log2 n⌋ (the butterfly's rounds), fold whether n is not a power
// of two (two more hand-offs), depth ⌈log2 n⌉ (a binomial tree's height).
func lg2(n int) int   { return bits.Len(uint(n)) - 1 }
func fold(n int) bool { return n&(n-1) != 0 }
func depth(n int) int { return bits.Len(uint(n - 1)) }

// handshake is what opening a collective costs (no inline payload).
func handshake(n int, lc LinkCost) float64 {
	if n <= 1 {
		return 0
	}
	if n <= helloFullMax {
		return lc.Alpha + 2*float64(n-1)*lc.Overhead
	}
	return butterflyCost(n, lc, 0, 0)
}

// butterflyCost is the butterfly with payload bytes on each hello and
// reduce bytes combined per round.
func butterflyCost(n int, lc LinkCost, payload, red float64) float64 {
	rounds := float64(lg2(n))
	step := lc.Alpha + 2*lc.Overhead + payload*lc.Beta
	c := rounds * (step + red*lc.Gamma)
	if fold(n) {
		c += 2*step + red*lc.Gamma
	}
	return c
}

// oneShotPayload is what each hello of the one-shot form of collective k
// carries for a call of bytes per rank among n ranks: the all-to-all's
// block for one peer, the reduce-scatter's part, the message otherwise.
func oneShotPayload(k kind, bytes int64, n int) int64 {
	if (k == kAlltoAll || k == kReduceScatter) && n > 0 {
		return bytes / int64(n)
	}
	return bytes
}

// rdPayload is what each hello of the recursive-doubling form of collective
// k carries for a call of bytes per rank among n ranks: the whole output for
// the all-gather, the message otherwise.
func rdPayload(k kind, bytes int64, n int) int64 {
	if k == kAllGather {
		return bytes * int64(n)
	}
	return bytes
}

// bruckBlocks is how many blocks Bruck's all-to-all among n ranks moves in
// the round of distance h: the indices in [1, n) with bit h set.
func bruckBlocks(n, h int) int {
	// Whole periods of 2h indices hold h each, the partial one what of
	// it lies past h.
	return n/(2*h)*h + max(0, n%(2*h)-h)
}

// costOf returns the modelled time (seconds) of algorithm a for the call.
func costOf(a Algorithm, sh shape, lc LinkCost) float64 {
	n, S := sh.n, float64(sh.bytes)
	inf := math.Inf(1)
	if a == AlgoOneShot && oneShotPayload(sh.k, sh.bytes, sh.n) > sh.inline || a == AlgoRD && rdPayload(sh.k, sh.bytes, sh.n) > sh.inline {
		return inf
	}
	if n <= 1 {
		return 0
	}
	N := float64(n)
	pieces := math.Max(1, math.Ceil(S/float64(sh.piece)))
	P := math.Min(S, float64(sh.piece))
	hs := handshake(n, lc)
	// A full-mesh step: one hand-off, a message to and from every peer.
	mesh := lc.Alpha + 2*(N-1)*lc.Overhead
	switch sh.k {
	case kAllReduce:
		switch a {
		case AlgoOneShot:
			// Every rank's input to every peer, then n-1 reductions.
			return mesh + (N-1)*S*lc.Beta + (N-1)*S*lc.Gamma
		case AlgoRD:
			return butterflyCost(n, lc, S, S)
		case AlgoHD:
			// Rabenseifner: halving then doubling, every byte through the
			// pipes, so that the doubling half also copies what it
			// receives out of the inbox (a memory pass the ring's direct
			// reads do not make); and above cacheBytes its log2(n) passes
			// over the whole message no longer find it in cache, where
			// the ring's blocks of n pieces do.
			p := float64(int(1) << lg2(n))
			beta, gamma := lc.Beta, lc.Gamma
			if sh.bytes > cacheBytes {
				beta, gamma = 1.5*beta, 1.5*gamma
			}
			c := hs + 2*float64(lg2(n))*lc.Alpha + 2*(p-1)/p*S*beta + (p-1)/p*S*gamma + (p-1)/p*S*memBeta
			c += 2 * 2 * float64(lg2(n)) * math.Max(1, math.Ceil(S/2/float64(sh.piece))) * lc.Overhead
			if fold(n) {
				c += 2*(lc.Alpha+2*pieces*lc.Overhead+S*lc.Beta) + S*lc.Gamma
			}
			return c
		case AlgoTree:
			// Reduce up the tree, broadcast down it, pipelined in pieces:
			// each stage a rank's children's pieces in and one out.
			d := float64(depth(n))
			stage := d * (2*lc.Overhead + P*(lc.Beta+lc.Gamma))
			return hs + 2*d*(lc.Alpha+2*lc.Overhead+P*lc.Beta) + d*P*lc.Gamma + 2*(pieces-1)*stage
		case AlgoDBTree:
			// Not offered: the two trees' pieces are issued in turn on one
			// stream, so a rank's wait in one tree holds up its part in the
			// other, and the pieces do not flow as two independent
			// pipelines would (the simulator, 64 ranks, 1 MiB: 164 ms
			// against halving-doubling's 27). HCCL_ALGO or
			// Options.Algorithm still runs it.
			return inf
		case AlgoRing:
			// A reduce-scatter around the ring, then every rank reads the
			// others' results: per block of n pieces, n-1 pipe steps and
			// n-1 reads, and a publish (a hand-off, then a read's round
			// trip) with a copy of the rank's own piece.
			blocks := math.Max(1, math.Ceil(S/(N*float64(sh.piece))))
			return hs + 2*(N-1)*lc.Alpha + 2*lc.Alpha + blocks*4*(N-1)*lc.Overhead + 2*(N-1)/N*S*lc.Beta + (N-1)/N*S*lc.Gamma + S/N*memBeta
		case AlgoDirect:
			if !sh.mapped {
				return costOf(AlgoRing, sh, lc) // where ranks cannot read each other: the ring (ardirect.go)
			}
			// Each rank reads its block of every peer's input and reduces
			// it, a piece at a time, says so, and reads every peer's
			// reduced block: two hand-offs, each byte read once.
			reads := math.Max(1, math.Ceil(S/N/arDirectPiece))
			return hs + 2*lc.Alpha + 2*(N-1)*(reads+1)*lc.Overhead + (N-1)/N*S*(2*lc.Beta+lc.Gamma)
		}
	case kBroadcast:
		switch a {
		case AlgoOneShot:
			return mesh + (N-1)*S*lc.Beta
		case AlgoRD:
			return butterflyCost(n, lc, S, 0)
		case AlgoDirect:
			// The root publishes each piece; every rank reads it: in
			// parallel where memory is mapped, through the root's link
			// otherwise.
			readers := 1.0
			if !sh.mapped {
				readers = N - 1
			}
			return hs + 2*lc.Alpha + pieces*2*(N-1)*lc.Overhead + S*lc.Beta + readers*S*lc.Beta
		case AlgoTree:
			d := float64(depth(n))
			return hs + d*(lc.Alpha+2*lc.Overhead+P*lc.Beta) + (pieces-1)*d*(2*lc.Overhead+P*lc.Beta)
		case AlgoRing:
			return hs + (N-1)*(lc.Alpha+2*lc.Overhead+P*lc.Beta) + (pieces-1)*(4*lc.Overhead+P*lc.Beta)
		}
	case kReduce:
		switch a {
		case AlgoOneShot:
			return mesh + (N-1)*S*(lc.Beta+lc.Gamma)
		case AlgoRD:
			return butterflyCost(n, lc, S, S)
		case AlgoTree:
			d := float64(depth(n))
			return hs + d*(lc.Alpha+2*lc.Overhead+P*(lc.Beta+lc.Gamma)) + (pieces-1)*d*(2*lc.Overhead+P*(lc.Beta+lc.Gamma))
		case AlgoRing:
			blocks := math.Max(1, math.Ceil(S/(N*float64(sh.piece))))
			return hs + (N-1)*lc.Alpha + blocks*2*(N-1)*lc.Overhead + (N-1)/N*S*(lc.Beta+lc.Gamma) + lc.Alpha + (N-1)/N*S*lc.Beta
		}
	case kAllGather, kAllGatherV:
		switch a {
		case AlgoOneShot:
			return mesh + (N-1)*S*lc.Beta
		case AlgoRD:
			// Each round's hello carries the blocks a rank holds so far:
			// S, 2S, 4S, ..., (p-1)S in all; a fold adds the input in and
			// the whole output back.
			p := float64(int(1) << lg2(n))
			step := lc.Alpha + 2*lc.Overhead
			c := float64(lg2(n))*step + (p-1)*S*lc.Beta
			if fold(n) {
				c += 2*step + (1+N)*S*lc.Beta
			}
			return c + N*S*memBeta
		case AlgoDirect:
			// Each rank publishes its input and reads every other's:
			// a publish and a read per piece and peer.
			return hs + 2*lc.Alpha + pieces*4*(N-1)*lc.Overhead + S*lc.Beta + (N-1)*S*lc.Beta
		case AlgoRing:
			return hs + (N-1)*(lc.Alpha+pieces*2*lc.Overhead) + (N-1)*S*(lc.Beta+memBeta)
		case AlgoBruck:
			return hs + float64(depth(n))*lc.Alpha + (N-1)*pieces*2*lc.Overhead + (N-1)*S*(lc.Beta+memBeta)
		}
	case kReduceScatter, kReduceScatterV:
		switch a {
		case AlgoOneShot:
			// Each peer's part in its hello, then n-1 reductions of a part.
			return mesh + (N-1)/N*S*(lc.Beta+lc.Gamma)
		case AlgoRD:
			if sh.k == kReduceScatter && n&(n-1) == 0 {
				// Recursive halving: S/2, S/4, ... sent and reduced.
				return float64(lg2(n))*(lc.Alpha+2*lc.Overhead) + (N-1)/N*S*(lc.Beta+lc.Gamma)
			}
			return butterflyCost(n, lc, S, S)
		case AlgoRing:
			return hs + (N-1)*(lc.Alpha+2*math.Max(1, math.Ceil(S/N/float64(sh.piece)))*lc.Overhead) + (N-1)/N*S*(lc.Beta+lc.Gamma)
		}
	case kAlltoAll, kAlltoAllV:
		B := S / N // a block: what each peer gets
		switch a {
		case AlgoOneShot:
			// Each peer's block in its hello, then copied out.
			return mesh + (N-1)*B*(lc.Beta+memBeta)
		case AlgoBruck:
			// ⌈log2 n⌉ rounds, one after the other (a round sends what
			// the one before received); the round of distance h moves
			// the blocks whose index has bit h set, about half of them,
			// packed and unpacked through the scratch slot and the inbox.
			c := hs
			for h := 1; h < n; h *= 2 {
				m := float64(bruckBlocks(n, h)) * B
				c += lc.Alpha + 2*math.Max(1, math.Ceil(m/float64(sh.piece)))*lc.Overhead + m*(lc.Beta+2*memBeta)
			}
			return c
		case AlgoPairwise:
			// n-1 rounds, a block to one peer and one from another in
			// each; above helloFullMax ranks the butterfly opens the call
			// and a hello with every peer then carries the send counts.
			c := hs + (N-1)*(lc.Alpha+2*math.Max(1, math.Ceil(B/float64(sh.piece)))*lc.Overhead) + (N-1)*B*(lc.Beta+memBeta)
			if n > helloFullMax {
				c += mesh
			}
			return c
		}
	case kBarrier:
		return hs
	}
	// A collective with one schedule (all-to-all, scatter, gather): what a
	// pairwise exchange costs.
	return hs + (N-1)*(lc.Alpha+2*lc.Overhead) + (N-1)/N*S*lc.Beta
}

// Choose returns the algorithm the selector picks under this model for the
// named collective among ranks ranks on one host (no two-level schedule, no
// window), with bytes per rank (for ReduceScatter, the whole input), over
// links of the mapped or network class, with an HCCL buffer of bufSize
// bytes; HCCL_ALGO and Options.Algorithm, which override the selector, are
// not consulted, nor is the tcp-only preference for the lent direct
// all-gather (lent.go: a network class that is not tcp, the simulator's,
// has no lent writes). Bad input is an error, as for Predict.
func (m CostModel) Choose(collective string, ranks int, bytes, bufSize int64, mapped bool) (Algorithm, error) {
	k, l, err := predictArgs("Choose", collective, ranks, bytes, bufSize)
	if err != nil {
		return AlgoAuto, err
	}
	return choose(k, bytes, ranks, l, m, mapped, false, false), nil
}

// predictArgs checks Predict's and Choose's arguments and returns the
// collective's kind and the layout.
func predictArgs(fn, collective string, ranks int, bytes, bufSize int64) (kind, layout, error) {
	var k kind
	for i, name := range kindNames {
		if name != "" && strings.EqualFold(name, collective) {
			k = kind(i)
		}
	}
	switch {
	case k == 0 || k == kSendRecv:
		return 0, layout{}, fmt.Errorf("collectives: %s: unknown collective %q", fn, collective)
	case ranks < 1:
		return 0, layout{}, fmt.Errorf("collectives: %s: %d ranks", fn, ranks)
	case bytes < 0:
		return 0, layout{}, fmt.Errorf("collectives: %s: %d bytes", fn, bytes)
	}
	l, err := newLayout(ranks, bufSize)
	if err != nil {
		return 0, layout{}, fmt.Errorf("collectives: %s: %w", fn, err)
	}
	return k, l, nil
}

// Predict returns what the cost model expects the named collective
// ("AllReduce", "Broadcast", ... as Algorithms takes) to take with algorithm
// a among ranks ranks, bytes per rank (for ReduceScatter, the whole input),
// over links of the mapped (inproc, shm) or network class, with an HCCL
// buffer of bufSize bytes (it sets the inline size and the pipeline's
// piece). An algorithm the collective lacks, or a message the algorithm
// cannot carry, is an error. It is what the selector compares: the
// simulator shows it beside its own prediction.
func (m CostModel) Predict(collective string, a Algorithm, ranks int, bytes, bufSize int64, mapped bool) (time.Duration, error) {
	k, l, err := predictArgs("Predict", collective, ranks, bytes, bufSize)
	if err != nil {
		return 0, err
	}
	if !has(k, a) {
		return 0, fmt.Errorf("collectives: Predict: %v has no %v algorithm (it has %v)", k, a, algorithms[k])
	}
	if a == AlgoDBTree {
		return 0, fmt.Errorf("collectives: Predict: the model does not price %v (its two trees share one stream; the selector never picks it)", a)
	}
	c := costOf(a, shape{k: k, n: ranks, bytes: bytes, inline: l.inline(), piece: l.piece, mapped: mapped}, m.class(mapped))
	if math.IsInf(c, 1) {
		return 0, fmt.Errorf("collectives: Predict: %v cannot carry %d bytes with a %d-byte HCCL buffer (inline %d)", a, bytes, bufSize, l.inline())
	}
	return time.Duration(c * 1e9), nil
}
