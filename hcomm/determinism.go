package hcomm

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Determinism says how reproducible a communicator's reductions (AllReduce,
// ReduceScatter, Reduce and their V forms) are: Config.Deterministic, or the
// environment variable HCCL_DETERMINISTIC.
type Determinism int

const (
	// DeterministicDefault, the zero value, takes HCCL_DETERMINISTIC, and is
	// DeterministicOff when the variable is unset. A resolved Config (Comm's
	// Config) never holds it.
	DeterministicDefault Determinism = iota
	// DeterministicOff is HCCL_DETERMINISTIC=false, HCCL's default. hcomm's
	// schedules are fixed, so its results are reproducible even so; only
	// DeterministicStrict changes what the collectives do.
	DeterministicOff
	// DeterministicOn is HCCL_DETERMINISTIC=true (hcclDeterministic 1): the
	// same inputs, rank count, sizes and configuration give the same bits
	// run after run, whatever the timing. Every hcomm schedule reduces in
	// an order fixed when it is issued, so this costs nothing (see the
	// collectives package's doc).
	DeterministicOn
	// DeterministicStrict is HCCL_DETERMINISTIC=strict, hcomm's addition:
	// every element of a reduction is combined in rank order,
	// ((x0 op x1) op x2) op … op x(n-1), so that the result is also the same
	// whatever the algorithm and transport. The selector then picks only
	// algorithms that honour that order (the collectives package's
	// AlgoOrdered and AlgoOneShot) and refuses a forced one that does not.
	DeterministicStrict
)

// String returns HCCL_DETERMINISTIC's value for d: "false", "true",
// "strict", or "default" for the zero value.
func (d Determinism) String() string {
	switch d {
	case DeterministicDefault:
		return "default"
	case DeterministicOff:
		return "false"
	case DeterministicOn:
		return "true"
	case DeterministicStrict:
		return "strict"
	}
	return "Determinism(" + strconv.Itoa(int(d)) + ")"
}

// envDeterministic reads HCCL_DETERMINISTIC: "true" or "false" as in HCCL
// (any case; also 1 and 0, hcclDeterministic's values), or "strict".
func envDeterministic() (Determinism, error) {
	v := os.Getenv("HCCL_DETERMINISTIC")
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "", "false", "0":
		return DeterministicOff, nil
	case "true", "1":
		return DeterministicOn, nil
	case "strict":
		return DeterministicStrict, nil
	}
	return 0, fmt.Errorf("environment variable HCCL_DETERMINISTIC=%q: want true, false or strict", v)
}
