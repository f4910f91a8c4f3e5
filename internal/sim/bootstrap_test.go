package sim

import (
	"strings"
	"testing"

	simch "github.com/hcomm-dev/hcomm/channel/sim"
)

// bootSizes are the bootstrap tests' sizes: few, so that the refits stay
// quick.
var bootSizes = []int64{16, 4 << 10, 1 << 20}

// TestBootstrapSpread: runs that agree give no spread, at the fitted
// values; runs of two hosts that crowd differently (exponents 1.1 and 1.5)
// give an exponent that moves over the resamples across both — and past
// them, where a resample takes one rank count's runs from one host and
// another's from the other.
func TestBootstrapSpread(t *testing.T) {
	if raceEnabled {
		t.Skip("six fits of simulated runs take a minute under the race detector; make test runs this without it")
	}
	truth := simch.Profile{Intra: simch.Level{AlphaUs: 20, OverheadUs: 4, BetaNsPerByte: 0.8}, GammaNsPerByte: 0.3, Hosts: 1,
		Cores: 2, OversubExp: 1.5}
	host := HostCosts{Cores: 2}
	a := simulatedRuns(t, truth, bootSizes)
	exp := func(sp []Spread) Spread {
		t.Helper()
		for _, s := range sp {
			if s.Name == "oversub_exponent" {
				return s
			}
		}
		t.Fatalf("no exponent among %+v", sp)
		return Spread{}
	}

	same, err := Bootstrap(append(append([]Run(nil), a...), a...), host, Options{}, 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(same) != 5 {
		t.Fatalf("%d values spread, want α, o, β, γ and the exponent: %+v", len(same), same)
	}
	for _, s := range same {
		if s.P10 != s.Mid || s.Mid != s.P90 {
			t.Errorf("%s: identical runs spread %v–%v", s.Name, s.P10, s.P90)
		}
	}
	if e := exp(same); e.Mid < 1.45 || e.Mid > 1.55 {
		t.Errorf("identical runs: exponent %v, want the truth's 1.5", e.Mid)
	}

	truth.OversubExp = 1.1
	b := simulatedRuns(t, truth, bootSizes)
	mixed, err := Bootstrap(append(a, b...), host, Options{}, 4, 1)
	if err != nil {
		t.Fatal(err)
	}
	e := exp(mixed)
	t.Logf("two hosts' runs: exponent %v / %v / %v", e.P10, e.Mid, e.P90)
	if e.P10 > 1.15 || e.P90 < 1.45 {
		t.Errorf("runs of exponents 1.1 and 1.5: the refits' exponent %v–%v, want a range from 1.15 or below to 1.45 or above", e.P10, e.P90)
	}
}

func TestBootstrapErrors(t *testing.T) {
	r := func(n int) Run { return Run{{"allreduce", n, 16, 1e-5}, {"allreduce", n, 4096, 2e-5}} }
	host := HostCosts{Cores: 2}
	for _, c := range []struct {
		name      string
		runs      []Run
		resamples int
		want      string
	}{
		{"one resample", []Run{r(2), r(2)}, 1, "1 resamples: want 2 to 1000"},
		{"too many", []Run{r(2), r(2)}, 1001, "want 2 to 1000"},
		{"nothing", nil, 2, "nothing to resample"},
		{"empty run", []Run{r(2), {}}, 2, "run 1 has no measurements"},
		{"one run", []Run{r(2), r(2), r(3)}, 2, "allreduce at 3 ranks has one run"},
		{"mixed", []Run{r(2), append(r(2), Measured{"allreduce", 3, 16, 1e-5})}, 2, "run 1 mixes allreduce at 2 ranks with allreduce at 3"},
	} {
		if _, err := Bootstrap(c.runs, host, Options{}, c.resamples, 1); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
}
