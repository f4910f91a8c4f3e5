package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// keyPaths lists the key paths of a JSON value, in document order, with
// list indices as [] (the first element of a list stands for all).
func keyPaths(t *testing.T, b []byte) []string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	var out []string
	seen := map[string]bool{}
	var walk func(prefix string)
	walk = func(prefix string) {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("JSON: %v", err)
		}
		switch tok {
		case json.Delim('{'):
			for dec.More() {
				k, _ := dec.Token()
				p := prefix + "." + k.(string)
				if !seen[p] {
					seen[p] = true
					out = append(out, p)
				}
				walk(p)
			}
			dec.Token()
		case json.Delim('['):
			for dec.More() {
				walk(prefix + "[]")
			}
			dec.Token()
		}
	}
	walk("")
	return out
}

// TestNCCLJSON: -J writes nccl-tests 2.19's JSON (the key paths, in order,
// are golden), next to an existing file rather than over it, and its
// figures agree with the table printed at the same time.
func TestNCCLJSON(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "out.json")
	if err := os.WriteFile(path, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	h := Hooks{
		Environ: func() []string { return []string{"HCCL_BUFFSIZE=1", "HCOMM_SECRET=abc", "MY_API_KEY=k", "PLAIN=1"} },
		Now:     func() time.Time { return time.Date(2026, 11, 23, 1, 2, 3, 0, time.Local) },
	}
	code, out, errs := bench(t, h, "reducescatter", "-g", "3", "-b", "96", "-e", "6K", "-f", "8", "-n", "4", "-w", "1", "-I", "1", "-K", "1", "-J", path)
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	if b, _ := os.ReadFile(path); string(b) != "keep" {
		t.Fatalf("-J overwrote an existing file")
	}
	if !strings.HasPrefix(out, "# Writing JSON output to "+path+".0\n") {
		t.Fatalf("output does not say where the JSON goes:\n%s", out)
	}
	b, err := os.ReadFile(path + ".0")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "nccl_json.keys", strings.Join(keyPaths(t, b), "\n")+"\n")

	var doc struct {
		Version   int      `json:"version"`
		StartTime string   `json:"start_time"`
		Args      []string `json:"args"`
		Env       []string `json:"env"`
		Config    struct {
			NGPUs         int    `json:"ngpus"`
			StepFactor    int    `json:"step_factor"`
			Iterations    int    `json:"iterations"`
			PerIterTiming string `json:"per_iter_timing"`
			PerIterSkip   int    `json:"per_iter_skip"`
			Devices       []struct {
				Rank int `json:"rank"`
			} `json:"devices"`
		} `json:"config"`
		Results []struct {
			Size       int64          `json:"size"`
			Count      int64          `json:"count"`
			Type       string         `json:"type"`
			RedOp      string         `json:"redop"`
			Root       string         `json:"root"`
			OutOfPlace map[string]any `json:"out_of_place"`
			OOPIter    IterStats      `json:"out_of_place_per_iter"`
			InPlace    map[string]any `json:"in_place"`
			Actual     int            `json:"actual_iterations"`
		} `json:"results"`
		OutOfBounds struct {
			Count int    `json:"count"`
			Okay  string `json:"okay"`
		} `json:"out_of_bounds"`
		AvgBusBW struct {
			Bandwidth float64 `json:"bandwidth"`
			Okay      string  `json:"okay"`
		} `json:"average_bus_bandwidth"`
		Errors []string `json:"errors"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, b)
	}
	if doc.Version != 3 || doc.StartTime != "2026-11-23 01:02:03" || doc.Config.NGPUs != 3 || doc.Config.StepFactor != 8 ||
		doc.Config.Iterations != 4 || doc.Config.PerIterTiming != "true" || doc.Config.PerIterSkip != 1 || len(doc.Config.Devices) != 3 ||
		doc.OutOfBounds.Okay != "true" || doc.AvgBusBW.Okay != "unchecked" || len(doc.Errors) != 0 {
		t.Errorf("doc = %+v", doc)
	}
	if got := strings.Join(doc.Env, " "); got != "HCCL_BUFFSIZE=1 HCOMM_SECRET=*** MY_API_KEY=*** PLAIN=1" {
		t.Errorf("env = %q", got)
	}
	if got := strings.Join(doc.Args, " "); !strings.HasPrefix(got, "hcomm bench reducescatter -g 3") {
		t.Errorf("args = %q", got)
	}
	// The table's rows, field by field.
	rowRE := regexp.MustCompile(`^\s+(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(-?\d+)\s+(.*)$`)
	var rows [][]string
	for _, line := range strings.Split(out, "\n") {
		if m := rowRE.FindStringSubmatch(line); m != nil {
			rows = append(rows, m[1:])
		}
	}
	if len(rows) != len(doc.Results) || len(rows) != 3 {
		t.Fatalf("%d table rows, %d JSON results:\n%s", len(rows), len(doc.Results), out)
	}
	sum := 0.0
	for i, jr := range doc.Results {
		row := rows[i]
		f := strings.Fields(row[5]) // time algbw busbw #wrong i_min i_max i_p99 i_cv% (twice)
		if len(f) != 16 {
			t.Fatalf("row %d has %d figures, want 16 with -I 1: %q", i, len(f), row[5])
		}
		if strconv.FormatInt(jr.Size, 10) != row[0] || strconv.FormatInt(jr.Count, 10) != row[1] || jr.Type != row[2] ||
			jr.RedOp != row[3] || strings.TrimSpace(jr.Root) != row[4] || len(jr.Root) != 6 || jr.Actual != 4 {
			t.Errorf("result %d %+v against row %q", i, jr, row)
		}
		for k, p := range []map[string]any{jr.OutOfPlace, jr.InPlace} {
			g := f[k*8:]
			for j, key := range []string{"time", "alg_bw", "bus_bw", "nwrong"} {
				v, ok := p[key].(float64)
				if !ok {
					t.Fatalf("result %d: %s = %v", i, key, p[key])
				}
				// The JSON has 6 decimals (nccl-tests' %lf): the table's
				// figure is the value within half a millionth of it, rounded,
				// either way at a rounding boundary (69.2250004 is written
				// 69.225000 and printed 69.23).
				format := func(v float64) string {
					switch j {
					case 0:
						return strings.TrimSpace(timeStr(v))
					case 3:
						return strconv.Itoa(int(v))
					}
					return fmt.Sprintf("%.2f", v)
				}
				if g[j] != format(v) && g[j] != format(v-5e-7) && g[j] != format(v+5e-7) {
					t.Errorf("result %d placement %d %s: JSON %v, table %s", i, k, key, v, g[j])
				}
			}
			sum += p["bus_bw"].(float64)
		}
		it := jr.OOPIter
		if len(it.TimesUs) != 4 || it.Skipped != 1 || it.MinUs > it.P50Us || it.P50Us > it.MaxUs || it.AvgUs <= 0 {
			t.Errorf("result %d per-iteration stats %+v", i, it)
		}
		if want := iterStats(it.TimesUs, 1); math.Abs(want.CVPct-it.CVPct) > 1e-6 || want.P99Us != it.P99Us {
			t.Errorf("result %d: stats %+v disagree with its times (%+v)", i, it, want)
		}
		if strings.TrimSpace(floatStr(it.MinUs, 7)) != f[4] || strings.TrimSpace(floatStr(it.CVPct, 7)) != f[7] {
			t.Errorf("result %d: i_min/i_cv%% %v/%v against the table's %s/%s", i, it.MinUs, it.CVPct, f[4], f[7])
		}
	}
	if avg := sum / 6; math.Abs(avg-doc.AvgBusBW.Bandwidth) > 1e-5 {
		t.Errorf("average_bus_bandwidth %v, the results' mean %v", doc.AvgBusBW.Bandwidth, avg)
	}
}

// TestIterStats checks the statistics against nccl-tests' computeIterStats
// by hand: nearest-rank percentiles, population standard deviation.
func TestIterStats(t *testing.T) {
	times := []float64{100, 200, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9}
	st := iterStats(times, 2) // 1..10
	if st.MinUs != 1 || st.MaxUs != 10 || st.P50Us != 6 || st.P95Us != 10 || st.P99Us != 10 || st.AvgUs != 5.5 || st.Skipped != 2 || len(st.TimesUs) != 12 {
		t.Errorf("stats %+v", st)
	}
	if math.Abs(st.StdevUs-math.Sqrt(8.25)) > 1e-12 || math.Abs(st.CVPct-math.Sqrt(8.25)/5.5*100) > 1e-9 {
		t.Errorf("stdev %v cv %v", st.StdevUs, st.CVPct)
	}
	for v, want := range map[float64]string{1.234: "   1.23", 12345.6: "12345.6", 123456.7: " 123457", 12345678: "1.2e+07"} {
		if got := floatStr(v, 7); got != want {
			t.Errorf("floatStr(%v) = %q, want %q", v, got, want)
		}
	}
}

// TestTimeout: a rank that hangs makes the others' waits outlast -T; the
// run ends with a timeout error and exit status 1, and leaves no goroutine
// behind (TestMain checks).
func TestTimeout(t *testing.T) {
	h := Hooks{Stall: func(ctx context.Context, rank int) {
		if rank == 1 {
			<-ctx.Done() // until the run is aborted
		}
	}}
	start := time.Now()
	code, out, errs := bench(t, h, "allreduce", "-g", "2", "-b", "1K", "-e", "1K", "-n", "1", "-w", "1", "-T", "0.5")
	if code != 1 || !strings.Contains(errs, "test timeout (-T 500ms): rank 0 waited that long for its stream") {
		t.Fatalf("exit %d, stderr %q\n%s", code, errs, out)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("the timeout took %v", d)
	}
}

// TestMemoryReport: -M prints nccl-tests' "GPU memory usage" line with the
// HCCL buffer and the benchmark's buffers.
func TestMemoryReport(t *testing.T) {
	for _, coll := range []string{"allgather", "p2p"} {
		code, out, errs := bench(t, Hooks{}, coll, "-g", "2", "-b", "1K", "-e", "1M", "-f", "1024", "-n", "1", "-w", "0", "-M", "1")
		if code != 0 {
			t.Fatalf("exit %d\n%s%s", code, out, errs)
		}
		// allgather: a 1 MiB receive buffer and half of it to send; p2p: a
		// 1 MiB receive and a 1 MiB source buffer. The HCCL buffer is twice
		// HCCL_BUFFSIZE's 200 MB.
		want := map[string]string{
			"allgather": "# GPU memory usage     : Initialization 400 MB | User-Allocated 1.50 MB | Total  402 MB\n",
			"p2p":       "# GPU memory usage     : Initialization 400 MB | User-Allocated 2.00 MB | Total  402 MB\n",
		}[coll]
		if os.Getenv("HCCL_BUFFSIZE") == "" && !strings.Contains(out, want) {
			t.Errorf("%s: no %q in\n%s", coll, want, out)
		}
	}
	for n, want := range map[int64]string{0: "0.00 B", 1023: "1023 B", 1536: "1.50 KB", 50 << 20: "50.0 MB", 3 << 30: "3.00 GB"} {
		if got := memString(n); got != want {
			t.Errorf("memString(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestNewFlagsBadCommandLines(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"allreduce", "-I", "2"}, "-I 2: want 0 or 1"},
		{[]string{"allreduce", "-M", "3"}, "-M 3: want 0 or 1"},
		{[]string{"allreduce", "-T", "-1"}, "-T -1"},
		{[]string{"allreduce", "-K", "1"}, "-K 1 needs -I 1"},
		{[]string{"allreduce", "-I", "1", "-n", "2", "-K", "2"}, "-K 2: want a count in [0, -n 2)"},
		{[]string{"allreduce", "-J", "out.txt"}, "ending in .json"},
	} {
		code, _, errs := bench(t, Hooks{}, tc.args...)
		if code != 2 || !strings.Contains(errs, tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want 2 and %q", tc.args, code, errs, tc.want)
		}
	}
}
