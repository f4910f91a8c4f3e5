package sim

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// ringEnv makes this test binary a process of Probe's ring (TestMain).
const ringEnv = "HCOMM_SIM_TEST_RING"

// TestProbe: the ring runs, its figures are positive, and the costs the
// simulator takes are what the figures say.
func TestProbe(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	t.Setenv(ringEnv, "1")
	procs := runtime.NumCPU() + 1
	if procs > 64 {
		t.Skipf("%d cores: the crowded ring would need %d processes", runtime.NumCPU(), procs)
	}
	h, err := Probe(context.Background(), ProbeOptions{Command: []string{os.Args[0], "--"}, Procs: procs, Messages: 50, Repeats: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", h)
	if h.Cores != runtime.NumCPU() || h.Procs != procs || h.BaseCPUUs <= 0 || h.CrowdedCPUUs <= 0 || h.HopUs <= 0 {
		t.Errorf("probe: %+v; want %d cores, %d processes and positive figures", h, runtime.NumCPU(), procs)
	}
	if h.SwitchUs != max(h.CrowdedCPUUs-h.BaseCPUUs, 0) || h.WakeUs != max(h.HopUs-h.CrowdedCPUUs, 0) {
		t.Errorf("probe: %+v; want switch = crowded − base and wake = hop − crowded, at least 0", h)
	}
}

// TestProbeErrors: a probe that cannot run says why.
func TestProbeErrors(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name string
		o    ProbeOptions
		want string
	}{
		{"no command", ProbeOptions{}, "no command"},
		{"not crowded", ProbeOptions{Command: []string{"x"}, Procs: runtime.NumCPU()}, "want more processes than cores"},
		{"few messages", ProbeOptions{Command: []string{"x"}, Procs: runtime.NumCPU() + 1, Messages: 3}, "at least 10"},
		{"a member fails", ProbeOptions{Command: []string{"false"}, Procs: runtime.NumCPU() + 1, Messages: 10}, "ring process"},
	} {
		if _, err := Probe(ctx, c.o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.name, err, c.want)
		}
	}
	if err := RingMember([]string{"some"}, nil); err == nil || !strings.Contains(err.Error(), "want all|one") {
		t.Errorf("a ring member's bad arguments: error %v", err)
	}
}

// TestReadHostCosts: a probe's file reads back; one that makes no sense is
// refused naming the file and the field.
func TestReadHostCosts(t *testing.T) {
	dir := t.TempDir()
	for name, c := range map[string]struct{ text, want string }{
		"good":     {`{"cores": 2, "procs": 8, "switch_us": 7.5, "wake_us": 17}`, ""},
		"broken":   {`{"cores": `, "not a host's costs"},
		"unknown":  {`{"cores": 2, "wake": 3}`, `unknown field "wake"`},
		"no cores": {`{"cores": 0, "wake_us": 3}`, "cores is 0"},
		"negative": {`{"cores": 2, "switch_us": -1}`, "switch_us is -1"},
	} {
		p := filepath.Join(dir, name+".json")
		os.WriteFile(p, []byte(c.text), 0o644)
		h, err := ReadHostCosts(p)
		switch {
		case c.want == "" && (err != nil || h.Cores != 2 || h.SwitchUs != 7.5 || h.WakeUs != 17):
			t.Errorf("%s: %+v, %v", name, h, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), p)):
			t.Errorf("%s: error %v, want one naming %s and containing %q", name, err, p, c.want)
		}
	}
}
