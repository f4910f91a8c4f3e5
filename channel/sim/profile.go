package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
)

// Level is the cost of a message on one level of the network: Alpha, the
// latency of a message of any size, in microseconds; Overhead, the
// processor time a message of any size costs at each end — the sender's
// before its bytes go, the receiver's once it has them (LogP's o: system
// calls, copies of headers) — in microseconds; and Beta, the time a byte
// holds the sender and its link, in nanoseconds (1/Beta is the bandwidth in
// GB/s).
type Level struct {
	AlphaUs       float64 `json:"alpha_us"`
	OverheadUs    float64 `json:"overhead_us,omitempty"`
	BetaNsPerByte float64 `json:"beta_ns_per_byte"`
}

// Profile is the simulator's link profile: the cost of a message between two
// ranks of one host (Intra) and of two hosts (Inter), the cost of a byte
// copied or reduced locally (GammaNsPerByte, nanoseconds), and the shape of
// the cluster — Hosts hosts of RanksPerHost ranks each, ranks numbered host
// by host.
//
// Cores is the number of processors of each host; 0 means one per rank.
// A host's ranks share its processors: every charge of processor time (a
// message's overhead and bytes at either end, a local copy, a wake-up) runs
// on the processor of its host that is free earliest, so ranks that
// outnumber the cores take turns, and a schedule's cost on a crowded host
// is its processor time as much as its rounds. A rank of a crowded host
// (more ranks than cores) whose wait blocks — the record was not there yet
// — sleeps, and runs on WakeUs microseconds after the record arrives: the
// latency of being woken, not processor time (a rank with a core of its
// own polls instead, and pays nothing). Where a processor that has nothing
// to run halts, as a virtual machine's does, that latency is the halted
// processor's wake-up: 25–40 µs per hop of a token passed around 4 to 64
// Go processes on the 2 cores of the machine hcomm was measured on, 6 µs
// between 2 (whose processors never halt).
//
// OversubExp, when set, chooses the other model of a crowded host, the
// slowdown: its cores are not shared out, but every cost of its ranks is
// multiplied by (RanksPerHost/Cores)^OversubExp, and its ranks run what
// ranks with a core each run (the butterfly, not Crowded's tree). Cruder
// — it charges a rank that sleeps as if it ran, and times schedules the
// real ranks of a crowded host do not run unless HCOMM_CROWDED=0 tells
// them to (the ones measured runs must run to be compared with it) — but
// fitted to 2–4 processes it predicted 16 and 64 processes on this 2-core
// VM better than the shared cores with the probe's switch and wake-up
// (BENCHMARKS.md, stops 28 and 32). It excludes WakeUs and SwitchUs.
//
// The JSON form is the one `hcomm sim fit` writes and `hcomm sim -profile`
// reads:
//
//	{"intra": {"alpha_us": 30, "overhead_us": 5, "beta_ns_per_byte": 0.4},
//	 "inter": {"alpha_us": 30, "overhead_us": 5, "beta_ns_per_byte": 0.4},
//	 "gamma_ns_per_byte": 0.1, "hosts": 1, "ranks_per_host": 16, "cores": 2,
//	 "wake_us": 20}
type Profile struct {
	Intra          Level   `json:"intra"`
	Inter          Level   `json:"inter"`
	GammaNsPerByte float64 `json:"gamma_ns_per_byte"`
	Hosts          int     `json:"hosts"`
	RanksPerHost   int     `json:"ranks_per_host"`
	Cores          int     `json:"cores,omitempty"`
	WakeUs         float64 `json:"wake_us,omitempty"`
	SwitchUs       float64 `json:"switch_us,omitempty"`
	OversubExp     float64 `json:"oversub_exponent,omitempty"`
}

// MaxRanks bounds Hosts × RanksPerHost: each rank of a simulation is a
// communicator in this process.
const MaxRanks = 1 << 16

// Ranks returns Hosts × RanksPerHost.
func (p Profile) Ranks() int { return p.Hosts * p.RanksPerHost }

// Validate reports the first thing wrong with p, naming the field: a cost
// that is negative or not a number, a shape that is not positive, or one
// whose rank count exceeds MaxRanks.
func (p Profile) Validate() error {
	for _, f := range []struct {
		name string
		v    float64
	}{
		{"intra.alpha_us", p.Intra.AlphaUs}, {"intra.overhead_us", p.Intra.OverheadUs}, {"intra.beta_ns_per_byte", p.Intra.BetaNsPerByte},
		{"inter.alpha_us", p.Inter.AlphaUs}, {"inter.overhead_us", p.Inter.OverheadUs}, {"inter.beta_ns_per_byte", p.Inter.BetaNsPerByte},
		{"gamma_ns_per_byte", p.GammaNsPerByte}, {"wake_us", p.WakeUs}, {"switch_us", p.SwitchUs},
	} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) || f.v < 0 {
			return fmt.Errorf("sim: profile %s is %v: want a finite cost >= 0", f.name, f.v)
		}
	}
	if p.Hosts <= 0 {
		return fmt.Errorf("sim: profile hosts is %d: want at least 1", p.Hosts)
	}
	if p.RanksPerHost <= 0 {
		return fmt.Errorf("sim: profile ranks_per_host is %d: want at least 1", p.RanksPerHost)
	}
	if p.Hosts > MaxRanks/p.RanksPerHost {
		return fmt.Errorf("sim: profile hosts %d × ranks_per_host %d is more than %d ranks", p.Hosts, p.RanksPerHost, MaxRanks)
	}
	if math.IsNaN(p.OversubExp) || math.IsInf(p.OversubExp, 0) || p.OversubExp < 0 || p.OversubExp > 4 {
		return fmt.Errorf("sim: profile oversub_exponent is %v: want 0 (the shared cores) up to 4", p.OversubExp)
	}
	if p.OversubExp > 0 && (p.WakeUs > 0 || p.SwitchUs > 0) {
		return fmt.Errorf("sim: profile sets oversub_exponent %v and wake_us %v / switch_us %v: they are two models of a crowded host, set one", p.OversubExp, p.WakeUs, p.SwitchUs)
	}
	if p.Cores < 0 {
		return fmt.Errorf("sim: profile cores is %d: want 0 (a core per rank) or more", p.Cores)
	}
	return nil
}

// Crowded reports whether a host of p has more ranks than cores.
func (p Profile) Crowded() bool { return p.Cores > 0 && p.RanksPerHost > p.Cores }

// Slowdown is the factor the slowdown model multiplies every cost of a
// rank by (1 in the shared-cores model, OversubExp 0).
func (p Profile) Slowdown() float64 {
	if p.OversubExp == 0 {
		return 1
	}
	return Slowdown(p.RanksPerHost, p.Cores, p.OversubExp)
}

// Slowdown is (ranks/cores)^exp when ranks outnumber cores, else 1.
func Slowdown(ranks, cores int, exp float64) float64 {
	if cores <= 0 || ranks <= cores {
		return 1
	}
	return math.Pow(float64(ranks)/float64(cores), exp)
}

// ParseProfile reads a profile in its JSON form and validates it. A field
// it does not know is an error (a misspelt cost would otherwise read as 0).
func ParseProfile(b []byte) (Profile, error) {
	var p Profile
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return Profile{}, fmt.Errorf("sim: profile does not parse: %v", err)
	}
	if dec.More() {
		return Profile{}, fmt.Errorf("sim: profile has data after its JSON object")
	}
	return p, p.Validate()
}
