package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
)

// Level is the cost of a message on one level of the network: Alpha, the
// latency of a message of any size, in microseconds; Overhead, the time the
// sender is busy with a message of any size before its bytes go (LogP's o:
// system calls, wake-ups), in microseconds; and Beta, the time a byte holds
// the sender and its link, in nanoseconds (1/Beta is the bandwidth in GB/s).
type Level struct {
	AlphaUs       float64 `json:"alpha_us"`
	OverheadUs    float64 `json:"overhead_us,omitempty"`
	BetaNsPerByte float64 `json:"beta_ns_per_byte"`
}

// Profile is the simulator's link profile: the cost of a message between two
// ranks of one host (Intra) and of two hosts (Inter), the cost of a byte
// copied or reduced locally (GammaNsPerByte, nanoseconds), and the shape of
// the cluster — Hosts hosts of RanksPerHost ranks each, ranks numbered host
// by host. Cores is the number of cores of each host that the ranks share:
// when a host runs more ranks than it has cores, every cost of its ranks is
// multiplied by (RanksPerHost/Cores)^OversubExponent (the ranks take turns
// on the cores; an exponent above 1 says that taking turns costs more than
// the turns themselves — switches, caches — as a fit to measured runs may
// find; 0 means 1); Cores 0 means a core per rank.
//
// The JSON form is the one `hcomm sim fit` writes and `hcomm sim -profile`
// reads:
//
//	{"intra": {"alpha_us": 30, "overhead_us": 5, "beta_ns_per_byte": 0.4},
//	 "inter": {"alpha_us": 30, "overhead_us": 5, "beta_ns_per_byte": 0.4},
//	 "gamma_ns_per_byte": 0.1, "hosts": 1, "ranks_per_host": 16, "cores": 2}
type Profile struct {
	Intra          Level   `json:"intra"`
	Inter          Level   `json:"inter"`
	GammaNsPerByte float64 `json:"gamma_ns_per_byte"`
	Hosts          int     `json:"hosts"`
	RanksPerHost   int     `json:"ranks_per_host"`
	Cores          int     `json:"cores,omitempty"`
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
		{"gamma_ns_per_byte", p.GammaNsPerByte},
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
		return fmt.Errorf("sim: profile oversub_exponent is %v: want 0 (1) up to 4", p.OversubExp)
	}
	if p.Cores < 0 {
		return fmt.Errorf("sim: profile cores is %d: want 0 (a core per rank) or more", p.Cores)
	}
	return nil
}

// Slowdown is the factor every cost of a rank is multiplied by: its host's
// ranks over its cores, to the power OversubExponent, at least 1.
func (p Profile) Slowdown() float64 {
	return Slowdown(p.RanksPerHost, p.Cores, p.OversubExp)
}

// Slowdown is Profile.Slowdown of a host of ranks ranks and cores cores
// with exponent exp (0: 1).
func Slowdown(ranks, cores int, exp float64) float64 {
	if cores <= 0 || ranks <= cores {
		return 1
	}
	if exp == 0 {
		exp = 1
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
