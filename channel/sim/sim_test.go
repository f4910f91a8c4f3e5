package sim

import (
	"math"
	"strings"
	"testing"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/channel/channeltest"
	"github.com/hcomm-dev/hcomm/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// TestConformance runs the transport suite over a two-rank world: the sim
// transport moves bytes as inproc does (there is no connection to lose).
func TestConformance(t *testing.T) {
	channeltest.Run(t, channeltest.Config{
		Dialers: func(channeltest.TB) (channel.Dialer, channel.Dialer) {
			w, err := NewWorld(Profile{Hosts: 2, RanksPerHost: 1, Inter: Level{AlphaUs: 1, BetaNsPerByte: 1}})
			if err != nil {
				t.Fatal(err)
			}
			ds := w.Dialers()
			return ds[0], ds[1]
		},
		Closes:  true,
		Goodbye: true,
	})
}

// TestProfileErrors: a profile that makes no sense is refused with an error
// naming the field.
func TestProfileErrors(t *testing.T) {
	good := Profile{Intra: Level{AlphaUs: 1, BetaNsPerByte: 0.1}, Inter: Level{AlphaUs: 5, BetaNsPerByte: 1}, GammaNsPerByte: 0.1, Hosts: 2, RanksPerHost: 4}
	if err := good.Validate(); err != nil {
		t.Fatalf("good profile: %v", err)
	}
	for _, c := range []struct {
		name string
		edit func(*Profile)
		want string
	}{
		{"negative alpha", func(p *Profile) { p.Inter.AlphaUs = -1 }, "inter.alpha_us is -1"},
		{"negative beta", func(p *Profile) { p.Intra.BetaNsPerByte = -0.5 }, "intra.beta_ns_per_byte is -0.5"},
		{"negative gamma", func(p *Profile) { p.GammaNsPerByte = -2 }, "gamma_ns_per_byte is -2"},
		{"zero ranks per host", func(p *Profile) { p.RanksPerHost = 0 }, "ranks_per_host is 0"},
		{"zero hosts", func(p *Profile) { p.Hosts = 0 }, "hosts is 0"},
		{"overflow", func(p *Profile) { p.Hosts, p.RanksPerHost = 1<<40, 1<<40 }, "more than 65536 ranks"},
		{"negative cores", func(p *Profile) { p.Cores = -1 }, "cores is -1"},
		{"negative wake-up", func(p *Profile) { p.WakeUs = -3 }, "wake_us is -3"},
		{"switch not a number", func(p *Profile) { p.SwitchUs = math.NaN() }, "switch_us is NaN"},
		{"exponent", func(p *Profile) { p.OversubExp = 5 }, "oversub_exponent is 5"},
		{"two models", func(p *Profile) { p.OversubExp, p.WakeUs = 1, 20 }, "two models of a crowded host"},
	} {
		p := good
		c.edit(&p)
		err := p.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.name, err, c.want)
		}
		if _, err := NewWorld(p); err == nil {
			t.Errorf("%s: NewWorld accepted the profile", c.name)
		}
	}
	for _, c := range []struct{ text, want string }{
		{`{"hosts": 1, "ranks_per_host": `, "does not parse"},
		{`{"hosts": 1, "ranks_per_host": 2, "alpha": 3}`, `unknown field "alpha"`},
		{`{"hosts": 1, "ranks_per_host": 2} {}`, "data after"},
		{`{"hosts": 1, "ranks_per_host": 2, "intra": {"alpha_us": -3}}`, "intra.alpha_us is -3"},
	} {
		if _, err := ParseProfile([]byte(c.text)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseProfile(%s): error %v, want one containing %q", c.text, err, c.want)
		}
	}
	p, err := ParseProfile([]byte(`{"intra": {"alpha_us": 2, "beta_ns_per_byte": 0.5}, "hosts": 1, "ranks_per_host": 4, "cores": 2, "wake_us": 20, "switch_us": 5}`))
	if err != nil || p.Intra.AlphaUs != 2 || p.WakeUs != 20 || p.SwitchUs != 5 || !p.Crowded() {
		t.Errorf("ParseProfile: %+v, %v; want alpha 2 µs, wake-up 20, switch 5, crowded", p, err)
	}
	p, err = ParseProfile([]byte(`{"hosts": 1, "ranks_per_host": 4, "cores": 2, "oversub_exponent": 2}`))
	if err != nil || p.Slowdown() != 4 || Slowdown(2, 4, 2) != 1 {
		t.Errorf("slowdown of 4 ranks on 2 cores, exponent 2: %v (%v), want 4; of 2 ranks on 4 cores: %v, want 1", p.Slowdown(), err, Slowdown(2, 4, 2))
	}
}
