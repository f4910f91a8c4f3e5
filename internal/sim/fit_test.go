package sim

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	simch "github.com/hcomm-dev/hcomm/channel/sim"
	"github.com/hcomm-dev/hcomm/collectives"
)

// simulated returns the times of 16 B to 1 MiB all-reduces of 2, 3 and 4
// ranks simulated with p (its RanksPerHost set to each).
func simulated(t *testing.T, p simch.Profile) []Measured {
	t.Helper()
	var sizes []int64
	for b := int64(16); b <= 1<<20; b *= 4 {
		sizes = append(sizes, b)
	}
	var pts []Measured
	for _, r := range simulatedRuns(t, p, sizes) {
		pts = append(pts, r...)
	}
	return pts
}

// simulatedRuns returns a run per rank count (2, 3 and 4) of all-reduces
// of the sizes simulated with p.
func simulatedRuns(t *testing.T, p simch.Profile, sizes []int64) []Run {
	t.Helper()
	var runs []Run
	for _, n := range []int{2, 3, 4} {
		p.RanksPerHost = n
		cl, err := NewCluster(p, Options{})
		if err != nil {
			t.Fatal(err)
		}
		var r Run
		for _, b := range sizes {
			r = append(r, Measured{"allreduce", n, b, run(t, cl, Case{Collective: "allreduce", Bytes: b}).Time})
		}
		cl.Close()
		runs = append(runs, r)
	}
	return runs
}

// fitsBack fits pts with host and checks that the link costs come back
// within 5 % of truth's (and the exponent, when truth has one).
func fitsBack(t *testing.T, pts []Measured, host HostCosts, truth simch.Profile) simch.Profile {
	t.Helper()
	f, err := Fit(pts, host, Options{})
	if err != nil {
		t.Fatal(err)
	}
	got := f.Profile
	t.Logf("fitted %+v", got)
	for _, c := range []struct {
		name      string
		got, want float64
	}{{"alpha", got.Intra.AlphaUs, truth.Intra.AlphaUs}, {"overhead", got.Intra.OverheadUs, truth.Intra.OverheadUs},
		{"beta", got.Intra.BetaNsPerByte, truth.Intra.BetaNsPerByte}, {"gamma", got.GammaNsPerByte, truth.GammaNsPerByte},
		{"exponent", got.OversubExp, truth.OversubExp}} {
		if math.Abs(c.got-c.want) > 0.05*c.want {
			t.Errorf("%s: fitted %v, want %v", c.name, c.got, c.want)
		}
	}
	for i, p := range f.Points {
		if math.Abs(f.Pred[i]-p.Time) > 0.05*p.Time {
			t.Errorf("%d ranks, %d bytes: fitted profile predicts %v s, the truth %v s", p.Ranks, p.Bytes, f.Pred[i], p.Time)
		}
	}
	return got
}

// TestFitRecoversProfile: times simulated at 2–4 ranks with a known
// profile on a crowded host (2 cores, with a switch and a wake-up) fit
// back to its link costs when the fit is told the host's.
func TestFitRecoversProfile(t *testing.T) {
	truth := simch.Profile{Intra: simch.Level{AlphaUs: 20, OverheadUs: 4, BetaNsPerByte: 0.8}, GammaNsPerByte: 0.3, Hosts: 1,
		Cores: 2, SwitchUs: 6, WakeUs: 15}
	host := HostCosts{Cores: truth.Cores, SwitchUs: truth.SwitchUs, WakeUs: truth.WakeUs}
	got := fitsBack(t, simulated(t, truth), host, truth)
	if got.Cores != host.Cores || got.RanksPerHost != 4 || got.SwitchUs != host.SwitchUs || got.WakeUs != host.WakeUs {
		t.Errorf("fitted shape %d ranks, %d cores, switch %v, wake %v; want 4, and the host's %+v", got.RanksPerHost, got.Cores, got.SwitchUs, got.WakeUs, host)
	}
}

// TestFitFindsSlowdown: times of the slowdown model at 2–4 ranks on 2
// cores fit back to its costs and exponent when the fit is told only the
// cores.
func TestFitFindsSlowdown(t *testing.T) {
	truth := simch.Profile{Intra: simch.Level{AlphaUs: 20, OverheadUs: 4, BetaNsPerByte: 0.8}, GammaNsPerByte: 0.3, Hosts: 1,
		Cores: 2, OversubExp: 1.5}
	fitsBack(t, simulated(t, truth), HostCosts{Cores: truth.Cores}, truth)
}

func TestReadBench(t *testing.T) {
	dir := t.TempDir()
	good := `{"args": ["hcomm", "bench", "allreduce", "-b", "16"], "config": {"devices": [{}, {}, {}]},
		"results": [{"size": 16, "out_of_place": {"time": 100.0}, "in_place": {"time": 120.0}},
		            {"size": 64, "out_of_place": {"time": 150.0}, "in_place": null}]}`
	p := filepath.Join(dir, "good.json")
	os.WriteFile(p, []byte(good), 0o644)
	ms, err := ReadBench(p)
	if err != nil {
		t.Fatal(err)
	}
	want := []Measured{{"allreduce", 3, 16, 110e-6}, {"allreduce", 3, 64, 150e-6}}
	if len(ms) != 2 || ms[0].Ranks != 3 || math.Abs(ms[0].Time-want[0].Time) > 1e-12 || math.Abs(ms[1].Time-want[1].Time) > 1e-12 {
		t.Errorf("ReadBench: %+v, want %+v", ms, want)
	}
	for name, c := range map[string]struct{ text, want string }{
		"broken":  {`{"args": [`, "not an hcomm bench -J file"},
		"p2p":     {`{"args": ["hcomm", "bench", "p2p"], "config": {"devices": [{}]}}`, "names no collective"},
		"nodevs":  {`{"args": ["hcomm", "bench", "allreduce"], "config": {"devices": []}}`, "no devices"},
		"notimes": {`{"args": ["hcomm", "bench", "allreduce"], "config": {"devices": [{}]}, "results": [{"size": 16}]}`, "no measured times"},
	} {
		p := filepath.Join(dir, name+".json")
		os.WriteFile(p, []byte(c.text), 0o644)
		if _, err := ReadBench(p); err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: error %v, want one naming %s and containing %q", name, err, p, c.want)
		}
	}
}

// TestAlgoNamesHasEveryAlgorithm: hcomm sim -a knows every algorithm of
// every collective it simulates, by the name the package gives it (the
// double binary tree was missing from a list kept by hand).
func TestAlgoNamesHasEveryAlgorithm(t *testing.T) {
	names := AlgoNames()
	for _, c := range Collectives() {
		for _, a := range collectives.Algorithms(c) {
			if got, ok := names[a.String()]; !ok || got != a {
				t.Errorf("%s's %v: AlgoNames has %v, %v", c, a, got, ok)
			}
		}
	}
}

// TestMedians: repeated runs of a case merge into their median, in the
// order the cases first appear; other cases stay apart.
func TestMedians(t *testing.T) {
	in := []Measured{{"allreduce", 2, 16, 3}, {"allreduce", 4, 16, 7}, {"allreduce", 2, 16, 100}, {"allreduce", 2, 16, 4}, {"broadcast", 2, 16, 9}}
	want := []Measured{{"allreduce", 2, 16, 4}, {"allreduce", 4, 16, 7}, {"broadcast", 2, 16, 9}}
	if got := Medians(in); !slices.Equal(got, want) {
		t.Errorf("Medians: %v, want %v", got, want)
	}
}
