package sim

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// A fit says what its inputs say, and no more: runs of 2 to 4 ranks on a
// noisy machine fix some costs well and others hardly at all. Bootstrap
// measures how well: it fits again to runs drawn with replacement from the
// runs given — per collective and rank count as many as there were — and
// reports where each fitted value falls over the refits. A value whose
// range is wide is not known from these runs, whatever the one fit said; a
// prediction far from the measured ranks that leans on it (the slowdown's
// exponent, raised to the ranks a core) is not either.

// Run is one run's measurements (one `hcomm bench -J` file): the unit
// Bootstrap draws.
type Run []Measured

// Spread is where one fitted value fell over a bootstrap's refits.
type Spread struct {
	Name          string // as in the profile's JSON
	P10, Mid, P90 float64
}

// Bootstrap refits runs drawn with replacement from runs, resamples times,
// and returns the 10th percentile, median and 90th percentile of each
// fitted cost (params' names) and, in the slowdown model (host's cores
// without a switch or wake-up: Fit), of the exponent. Draws come from
// seed, so a bootstrap can be repeated. Every collective and rank count
// needs two runs at least (one run resampled is itself), and resamples
// must be 2 to 1000.
func Bootstrap(runs []Run, host HostCosts, o Options, resamples int, seed uint64) ([]Spread, error) {
	if resamples < 2 || resamples > 1000 {
		return nil, fmt.Errorf("sim: %d resamples: want 2 to 1000", resamples)
	}
	type key struct {
		coll  string
		ranks int
	}
	var order []key
	groups := map[key][]Run{}
	for i, r := range runs {
		if len(r) == 0 {
			return nil, fmt.Errorf("sim: run %d has no measurements", i)
		}
		k := key{r[0].Collective, r[0].Ranks}
		for _, p := range r {
			if p.Collective != k.coll || p.Ranks != k.ranks {
				return nil, fmt.Errorf("sim: run %d mixes %s at %d ranks with %s at %d: a run is one collective at one rank count", i, k.coll, k.ranks, p.Collective, p.Ranks)
			}
		}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], r)
	}
	if len(order) == 0 {
		return nil, fmt.Errorf("sim: nothing to resample")
	}
	for _, k := range order {
		if len(groups[k]) < 2 {
			return nil, fmt.Errorf("sim: %s at %d ranks has one run: resampling needs two at least", k.coll, k.ranks)
		}
	}
	slowdown := host.Cores > 0 && host.WakeUs == 0 && host.SwitchUs == 0
	names := slices.Clone(params)
	if slowdown {
		names = append(names, "oversub_exponent")
	}
	vals := make([][]float64, len(names))
	rng := rand.New(rand.NewPCG(seed, 0x68636f6d6d)) // "hcomm"
	for i := range resamples {
		var pts []Measured
		for _, k := range order {
			g := groups[k]
			for range g {
				pts = append(pts, g[rng.IntN(len(g))]...)
			}
		}
		f, err := Fit(pts, host, o)
		if err != nil {
			return nil, fmt.Errorf("sim: resample %d of %d: %w", i+1, resamples, err)
		}
		p := f.Profile
		got := []float64{p.Intra.AlphaUs, p.Intra.OverheadUs, p.Intra.BetaNsPerByte, p.GammaNsPerByte, p.OversubExp}
		for k := range names {
			vals[k] = append(vals[k], got[k])
		}
	}
	out := make([]Spread, len(names))
	for i, v := range vals {
		slices.SortFunc(v, cmp.Compare)
		out[i] = Spread{Name: names[i], P10: rank(v, 0.1), Mid: rank(v, 0.5), P90: rank(v, 0.9)}
	}
	return out, nil
}

// rank is the q-quantile of sorted (nearest rank).
func rank(sorted []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
