package collectives

import (
	"math"
	"strings"
	"testing"
)

func TestParseCostModel(t *testing.T) {
	base := DefaultCostModel()
	m, err := ParseCostModel("network:alpha=35us,o=10us,beta=5GB/s;mapped:gamma=0.5ns", base)
	if err != nil {
		t.Fatal(err)
	}
	near := func(got, want float64) bool { return math.Abs(got-want) <= 1e-9*math.Abs(want) }
	if !near(m.Network.Alpha, 35e-6) || !near(m.Network.Overhead, 10e-6) || !near(m.Network.Beta, 0.2e-9) {
		t.Errorf("network = %+v, want alpha 35us, overhead 10us, beta 0.2ns", m.Network)
	}
	if !near(m.Mapped.Gamma, 0.5e-9) || m.Mapped.Alpha != base.Mapped.Alpha || m.Network.Gamma != base.Network.Gamma {
		t.Errorf("terms not named changed: %+v", m)
	}
	if m, err := ParseCostModel("  ", base); err != nil || m != base {
		t.Errorf("empty: %+v, %v; want the base", m, err)
	}
	for in, want := range map[string]string{
		"network:alpha=-1us":       "finite value",
		"network:beta=0GB/s":       "positive",
		"network:beta=3furlongs/s": "unit",
		"network:alpha=fast":       `alpha="fast"`,
		"network:delta=1":          `unknown term "delta"`,
		"disk:alpha=1us":           `unknown link class "disk"`,
		"alpha=1us":                "want class:term=value",
		"network:alpha":            "want term=value",
		"network:gamma=NaN":        "finite value",
		"network:alpha=+Inf":       "finite value",
	} {
		if _, err := ParseCostModel(in, base); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseCostModel(%q) = %v, want an error containing %q", in, err, want)
		}
	}
}
