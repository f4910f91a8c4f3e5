package collectives

import (
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
)

// LinkCost is what moving data over one class of link costs, the terms of
// the selector's cost model (Hockney's α–β model with a reduction term γ and
// LogP's per-message overhead o):
//
//   - Alpha: the latency of one hand-off on a schedule's critical path — a
//     write and its notify, from the sender's call to the receiver's wait
//     returning;
//   - Overhead: the time a rank spends on each message it sends or receives,
//     which adds up when a rank talks to many peers in one step (a full-mesh
//     handshake) and which hides nothing on a host whose cores are all busy;
//   - Beta: time per byte moved;
//   - Gamma: time per byte reduced (one element-wise op over two inputs).
//
// All four are in seconds (per byte for Beta and Gamma). A LinkCost is a
// value; it is safe to copy and to share.
type LinkCost struct {
	Alpha    float64
	Overhead float64
	Beta     float64
	Gamma    float64
}

// CostModel is the selector's view of the machine: one LinkCost per link
// class. Mapped is the class where every peer's memory is mapped (inproc,
// shm: a read is a memmove; HCCL's level0 inside a server); Network is the
// class behind a network transport (tcp; HCCL's level1 among servers). A
// communicator uses Mapped when all its channels are mapped, Network
// otherwise; the two-level schedules use Mapped inside a host and Network
// among hosts.
//
// DefaultCostModel is fitted from 2- and 4-rank runs on one host (the
// measurements are in BENCHMARKS.md); HCOMM_COST_MODEL replaces any of its
// terms (ParseCostModel gives the syntax). A CostModel is a value, safe to
// copy and to share.
type CostModel struct {
	Mapped  LinkCost
	Network LinkCost
}

// DefaultCostModel returns the cost model the selector uses when
// HCOMM_COST_MODEL is not set.
func DefaultCostModel() CostModel {
	return CostModel{
		// inproc and shm: a hand-off is a flag in shared memory and a
		// wake-up; a byte is a memmove.
		Mapped: LinkCost{Alpha: 8e-6, Overhead: 1e-6, Beta: 0.08e-9, Gamma: 0.1e-9},
		// tcp over loopback: a hand-off is a system call each side and a
		// wake-up; each message costs its sender and receiver a system call.
		Network: LinkCost{Alpha: 40e-6, Overhead: 12e-6, Beta: 0.6e-9, Gamma: 0.1e-9},
	}
}

// class returns the LinkCost of a link class.
func (m CostModel) class(mapped bool) LinkCost {
	if mapped {
		return m.Mapped
	}
	return m.Network
}

// ParseCostModel parses a cost model: semicolon-separated classes ("mapped"
// or "network", also "shm", "level0", "tcp", "level1"), each a colon and
// comma-separated terms alpha, overhead (or o), beta and gamma, starting from
// base; terms and classes not named keep base's values. Latencies take a
// number with a unit ("35us") or seconds ("3.5e-5"); beta and gamma take seconds per
// byte ("0.6ns" is 0.6e-9), or a bandwidth with a unit ("5GB/s", "800MB/s").
// Example:
//
//	network:alpha=35us,o=10us,beta=5GB/s;mapped:alpha=6us
//
// A term that is negative, not finite, unknown or unparsable is an error
// naming it.
func ParseCostModel(s string, base CostModel) (CostModel, error) {
	m := base
	s = strings.TrimSpace(s)
	if s == "" {
		return m, nil
	}
	for _, part := range strings.Split(s, ";") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, terms, ok := strings.Cut(part, ":")
		if !ok {
			return base, fmt.Errorf("cost model %q: %q: want class:term=value,...", s, part)
		}
		var lc *LinkCost
		switch strings.ToLower(strings.TrimSpace(name)) {
		case "mapped", "shm", "inproc", "level0":
			lc = &m.Mapped
		case "network", "net", "tcp", "level1":
			lc = &m.Network
		default:
			return base, fmt.Errorf("cost model %q: unknown link class %q (have mapped, network)", s, name)
		}
		for _, t := range strings.Split(terms, ",") {
			t = strings.TrimSpace(t)
			if t == "" {
				continue
			}
			key, val, ok := strings.Cut(t, "=")
			if !ok {
				return base, fmt.Errorf("cost model %q: %q: want term=value", s, t)
			}
			key = strings.ToLower(strings.TrimSpace(key))
			val = strings.TrimSpace(val)
			var (
				v   float64
				err error
			)
			switch key {
			case "alpha", "a", "overhead", "o":
				v, err = parseSeconds(val)
			case "beta", "b", "gamma", "g":
				v, err = parsePerByte(val)
			default:
				return base, fmt.Errorf("cost model %q: unknown term %q (have alpha, overhead, beta, gamma)", s, key)
			}
			if err != nil {
				return base, fmt.Errorf("cost model %q: %s=%q: %v", s, key, val, err)
			}
			if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
				return base, fmt.Errorf("cost model %q: %s=%q: want a finite value ≥ 0", s, key, val)
			}
			switch key {
			case "alpha", "a":
				lc.Alpha = v
			case "overhead", "o":
				lc.Overhead = v
			case "beta", "b":
				lc.Beta = v
			default:
				lc.Gamma = v
			}
		}
	}
	return m, nil
}

// parseSeconds parses a latency: a number with a unit (ns, us, µs, ms, s:
// fractions of a nanosecond are kept, unlike time.ParseDuration) or a bare
// number of seconds.
func parseSeconds(v string) (float64, error) {
	units := []struct {
		suffix string
		mul    float64
	}{{"ns", 1e-9}, {"us", 1e-6}, {"µs", 1e-6}, {"ms", 1e-3}, {"s", 1}}
	for _, u := range units {
		if x, ok := strings.CutSuffix(v, u.suffix); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(x), 64)
			return f * u.mul, err
		}
	}
	return strconv.ParseFloat(v, 64)
}

// parsePerByte parses a time per byte: a number of seconds, a duration
// ("0.6ns"), or a bandwidth ("5GB/s", "800MB/s", "1.2GiB/s"), whose inverse
// it returns.
func parsePerByte(v string) (float64, error) {
	if num, ok := strings.CutSuffix(v, "/s"); ok {
		units := []struct {
			suffix string
			mul    float64
		}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1}}
		for _, u := range units {
			if x, ok := strings.CutSuffix(num, u.suffix); ok {
				bw, err := strconv.ParseFloat(strings.TrimSpace(x), 64)
				if err != nil {
					return 0, err
				}
				if bw <= 0 {
					return 0, fmt.Errorf("bandwidth must be positive")
				}
				return 1 / (bw * u.mul), nil
			}
		}
		return 0, fmt.Errorf("unknown bandwidth unit (have B, KB, MB, GB, KiB, MiB, GiB per second)")
	}
	return parseSeconds(v)
}

// envCostModel reads HCOMM_COST_MODEL over the defaults.
func envCostModel() (CostModel, error) {
	m, err := ParseCostModel(os.Getenv("HCOMM_COST_MODEL"), DefaultCostModel())
	if err != nil {
		return m, fmt.Errorf("HCOMM_COST_MODEL: %w", err)
	}
	return m, nil
}
