package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSimCommand: a prediction from a profile file, with the selector's
// choice, a plot and the JSON; and a fit of a bench file.
func TestSimCommand(t *testing.T) {
	dir := t.TempDir()
	prof := filepath.Join(dir, "p.json")
	os.WriteFile(prof, []byte(`{"intra": {"alpha_us": 10, "beta_ns_per_byte": 1}, "hosts": 1, "ranks_per_host": 4}`), 0o644)
	plot, js := filepath.Join(dir, "p.svg"), filepath.Join(dir, "out.json")
	var out, errb bytes.Buffer
	code := Main([]string{"sim", "-profile", prof, "-n", "4,8", "-b", "1K", "-e", "64K", "-f", "64", "allreduce", "-plot", plot, "-J", js}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	// The simulated links are not mapped memory: a small all-reduce among 4
	// or 8 ranks goes rd there, as over tcp (select.go).
	for _, want := range []string{"auto:rd", " oneshot ", " ring ", " hd ", " best"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if b, err := os.ReadFile(plot); err != nil || !bytes.Contains(b, []byte("<svg")) || !bytes.Contains(b, []byte("8 ranks ring")) {
		t.Errorf("plot: %v, %.200s", err, b)
	}
	if b, err := os.ReadFile(js); err != nil || !bytes.Contains(b, []byte(`"ran": "rd"`)) {
		t.Errorf("JSON: %v, %.300s", err, b)
	}

	bench := filepath.Join(dir, "b.json")
	os.WriteFile(bench, []byte(`{"args": ["hcomm", "bench", "allreduce"], "config": {"devices": [{}, {}]},
		"results": [{"size": 16, "out_of_place": {"time": 30.0}}, {"size": 65536, "out_of_place": {"time": 100.0}},
		            {"size": 1048576, "out_of_place": {"time": 1100.0}}]}`), 0o644)
	fitted := filepath.Join(dir, "fit.json")
	out.Reset()
	if code := Main([]string{"sim", "fit", "-o", fitted, bench}, &out, &errb); code != 0 {
		t.Fatalf("fit: exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "rms relative error") {
		t.Errorf("fit output:\n%s", out.String())
	}
	out.Reset()
	if code := Main([]string{"sim", "-profile", fitted, "-n", "2", "-a", "auto", "-b", "16", "-e", "16", "-compare", bench, "allreduce"}, &out, &errb); code != 0 {
		t.Fatalf("predict with the fit: exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "30.0") {
		t.Errorf("the measured 30 µs is not beside the prediction:\n%s", out.String())
	}

	// Two runs of the same case, refitted to resamples of them.
	bench2 := filepath.Join(dir, "b2.json")
	os.WriteFile(bench2, []byte(`{"args": ["hcomm", "bench", "allreduce"], "config": {"devices": [{}, {}]},
		"results": [{"size": 16, "out_of_place": {"time": 40.0}}, {"size": 65536, "out_of_place": {"time": 90.0}},
		            {"size": 1048576, "out_of_place": {"time": 1300.0}}]}`), 0o644)
	out.Reset()
	if code := Main([]string{"sim", "fit", "-bootstrap", "3", bench, bench2}, &out, &errb); code != 0 {
		t.Fatalf("fit -bootstrap: exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"refitted to 3 resamples of the 2 files", "overhead_us", "beta_ns_per_byte"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("fit -bootstrap output lacks %q:\n%s", want, out.String())
		}
	}
}

// TestSimBadCommandLines: each mistake is named.
func TestSimBadCommandLines(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	os.WriteFile(good, []byte(`{"hosts": 1, "ranks_per_host": 2}`), 0o644)
	neg := filepath.Join(dir, "neg.json")
	os.WriteFile(neg, []byte(`{"intra": {"alpha_us": -5}, "hosts": 1, "ranks_per_host": 2}`), 0o644)
	broken := filepath.Join(dir, "broken.json")
	os.WriteFile(broken, []byte(`{"hosts": 1,`), 0o644)
	zero := filepath.Join(dir, "zero.json")
	os.WriteFile(zero, []byte(`{"hosts": 2, "ranks_per_host": 0}`), 0o644)
	host := filepath.Join(dir, "host.json")
	os.WriteFile(host, []byte(`{"cores": 2, "switch_us": 7, "wake_us": 17}`), 0o644)
	bench := filepath.Join(dir, "b.json")
	os.WriteFile(bench, []byte(`{"args": ["hcomm", "bench", "allreduce"], "config": {"devices": [{}, {}]}, "results": [{"size": 16, "out_of_place": {"time": 30.0}}]}`), 0o644)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"sim", "allreduce"}, "-profile is required"},
		{[]string{"sim", "-profile", neg, "allreduce"}, "intra.alpha_us is -5"},
		{[]string{"sim", "-profile", broken, "allreduce"}, "does not parse"},
		{[]string{"sim", "-profile", zero, "allreduce"}, "ranks_per_host is 0"},
		{[]string{"sim", "-profile", good, "allscatter"}, `no collective "allscatter"`},
		{[]string{"sim", "-profile", good, "-n", "0", "allreduce"}, "-n"},
		{[]string{"sim", "-profile", good, "-n", "6", "-ppn", "4", "allreduce"}, "6 ranks are not a whole number of hosts of 4"},
		{[]string{"sim", "-profile", good, "-a", "pairwise", "allreduce"}, `allreduce has no algorithm "pairwise"`},
		{[]string{"sim", "-profile", good, "-b", "1M", "-e", "1K", "allreduce"}, "want 0 < b <= e"},
		{[]string{"sim", "fit", filepath.Join(dir, "missing.json")}, "missing.json"},
		{[]string{"sim", "fit", broken}, "not an hcomm bench -J file"},
		{[]string{"sim", "fit", "-host", broken, bench}, "not a host's costs"},
		{[]string{"sim", "fit", "-host", host, "-cores", "4", bench}, "-cores 4 and " + host + "'s 2 cores disagree"},
		{[]string{"sim", "fit", "-bootstrap", "1", bench}, "-bootstrap 1: want 2 to 1000"},
		{[]string{"sim", "fit", "-bootstrap", "2", bench}, "allreduce at 2 ranks has one run"},
		{[]string{"sim", "probe", "now"}, "takes no arguments"},
		{[]string{"sim", "probe", "-n", "1"}, "want more processes than cores"},
		{[]string{"sim", "ring-member", "x"}, "want all|one"},
	} {
		var out, errb bytes.Buffer
		if code := Main(c.args, &out, &errb); code == 0 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%v: exit %d, stderr %q; want one containing %q", c.args, code, errb.String(), c.want)
		}
	}
}
