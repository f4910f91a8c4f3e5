package bench

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"encoding/xml"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/hcomm-dev/hcomm/internal/leakcheck"
	"github.com/hcomm-dev/hcomm/internal/units"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

var update = flag.Bool("update", false, "rewrite the golden files")

// bench runs hcomm bench with args and returns its exit status and output.
func bench(t *testing.T, h Hooks, args ...string) (int, string, string) {
	t.Helper()
	if h.Getenv == nil {
		h.Getenv = func(string) string { return "" } // no launcher, no HCOMM_TESTS_MIN_BW
	}
	var out, errb bytes.Buffer
	code := Main(args, &out, &errb, h)
	return code, out.String(), errb.String()
}

var (
	floatRE = regexp.MustCompile(` +\d+\.\d+`)
	pidRE   = regexp.MustCompile(`Pid +\d+ on +\S+`)
	avgRE   = regexp.MustCompile(`(Avg bus bandwidth    : )\S+`)
)

// normalise replaces what changes between runs (times, bandwidths, pids,
// host names) by placeholders of the same width, so that the layout is
// still compared column by column.
func normalise(s string) string {
	s = pidRE.ReplaceAllString(s, "Pid PID on HOST")
	s = avgRE.ReplaceAllString(s, "${1}BW")
	return floatRE.ReplaceAllStringFunc(s, func(m string) string {
		return strings.Repeat(" ", len(m)-1) + "X"
	})
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("output differs from %s (go test -update rewrites it)\n got:\n%s\nwant:\n%s", path, got, want)
	}
}

func TestGoldenAllReduce(t *testing.T) {
	code, out, errs := bench(t, Hooks{}, "allreduce", "-g", "3", "-b", "8", "-e", "64K", "-f", "16", "-n", "2", "-w", "1")
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	golden(t, "allreduce.golden", normalise(out))
}

func TestGoldenBroadcast(t *testing.T) {
	code, out, errs := bench(t, Hooks{}, "broadcast", "-g", "2", "-r", "1", "-b", "1K", "-e", "1M", "-f", "32", "-n", "2", "-w", "1", "-d", "int32")
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	golden(t, "broadcast.golden", normalise(out))
}

// A deliberately corrupted element is counted in #wrong and in the footer,
// and fails the run.
func TestCorruptedResultFails(t *testing.T) {
	h := Hooks{Corrupt: func(rank int, inPlace bool, out []byte) {
		if rank == 1 && inPlace && len(out) > 0 {
			out[len(out)-1] ^= 0x40
		}
	}}
	code, out, _ := bench(t, h, "allreduce", "-g", "2", "-b", "256", "-e", "256", "-n", "1", "-w", "0")
	if code == 0 {
		t.Fatalf("exit 0 with a corrupted result:\n%s", out)
	}
	var row []string
	for _, l := range strings.Split(out, "\n") {
		if l != "" && l[0] != '#' {
			row = strings.Fields(l)
		}
	}
	// size count type redop root | time algbw busbw #wrong | time algbw busbw #wrong
	if len(row) != 13 || row[8] != "0" || row[12] != "1" {
		t.Errorf("row = %q, want 0 wrong out of place and 1 in place", row)
	}
	if !strings.Contains(out, "# Out of bounds values : 1 FAILED\n") {
		t.Errorf("footer does not report the wrong value:\n%s", out)
	}
}

func TestMinBandwidth(t *testing.T) {
	env := func(k string) string {
		if k == "HCOMM_TESTS_MIN_BW" {
			return "1e6"
		}
		return ""
	}
	code, out, _ := bench(t, Hooks{Getenv: env}, "allreduce", "-g", "2", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0")
	if code == 0 || !regexp.MustCompile(`# Avg bus bandwidth    : \S+ FAILED\n`).MatchString(out) {
		t.Errorf("exit %d; a 1e6 GB/s floor must fail:\n%s", code, out)
	}
	env2 := func(k string) string {
		if k == "HCOMM_TESTS_MIN_BW" {
			return "0.0000001"
		}
		return ""
	}
	code, out, _ = bench(t, Hooks{Getenv: env2}, "allreduce", "-g", "2", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0")
	if code != 0 || !strings.Contains(out, " OK\n#\n") {
		t.Errorf("exit %d; a tiny floor must pass:\n%s", code, out)
	}
}

// Every data type and op, on a rank count that is not a power of two, sizes
// that do not divide evenly: every value checked right.
func TestAllTypesAllOps(t *testing.T) {
	code, out, errs := bench(t, Hooks{}, "allreduce", "-g", "3", "-b", "7", "-e", "4K", "-f", "24", "-n", "1", "-w", "0", "-d", "all", "-o", "all")
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	rows := 0
	for _, l := range strings.Split(out, "\n") {
		if l != "" && l[0] != '#' {
			rows++
			f := strings.Fields(l)
			if f[8] != "0" || f[12] != "0" {
				t.Errorf("wrong values: %s", l)
			}
		}
	}
	if want := 12 * 4 * 3; rows != want {
		t.Errorf("%d rows, want %d (12 types x 4 ops x 3 sizes)", rows, want)
	}
}

func TestJSONAndCSV(t *testing.T) {
	code, out, errs := bench(t, Hooks{}, "allreduce", "--json", "-g", "2", "-b", "1K", "-e", "4K", "-f", "4", "-n", "1", "-w", "0")
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	var doc struct {
		Coll   string `json:"collective"`
		NRanks int    `json:"nranks"`
		Rows   []Row  `json:"rows"`
		OK     bool   `json:"ok"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if doc.Coll != "allreduce" || doc.NRanks != 2 || len(doc.Rows) != 2 || !doc.OK {
		t.Errorf("doc = %+v", doc)
	}
	for _, r := range doc.Rows {
		if r.Out == nil || r.In == nil || r.Out.TimeUs <= 0 || r.In.BusBW <= 0 || r.Out.Wrong != 0 {
			t.Errorf("row %+v", r)
		}
	}
	code, out, errs = bench(t, Hooks{}, "allreduce", "--csv", "-g", "2", "-b", "1K", "-e", "4K", "-f", "4", "-n", "1", "-w", "0")
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1+4 || recs[0][0] != "collective" || recs[1][7] != "out-of-place" || recs[2][7] != "in-place" || recs[4][2] != "4096" {
		t.Errorf("csv = %q", recs)
	}
}

func TestPlot(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bw.svg")
	code, out, errs := bench(t, Hooks{}, "allreduce", "-g", "2", "-b", "8", "-e", "64K", "-f", "8", "-n", "1", "-w", "0", "-d", "float,int8", "--plot", path)
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(bytes.NewReader(b))
	lines := 0
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed SVG: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
			lines++
		}
	}
	if lines != 4 { // 2 types x (out-of-place, in-place)
		t.Errorf("%d polylines, want 4", lines)
	}
	for _, s := range []string{"allreduce float sum", "allreduce int8 sum", "busbw (GB/s)", ">32K<"} {
		if !bytes.Contains(b, []byte(s)) {
			t.Errorf("plot lacks %q", s)
		}
	}
}

func TestP2P(t *testing.T) {
	for _, bidir := range []bool{false, true} {
		args := []string{"p2p", "-g", "3", "-b", "8", "-e", "256K", "-f", "64", "-n", "3", "-w", "1"}
		if bidir {
			args = append(args, "--bidir")
		}
		code, out, errs := bench(t, Hooks{}, args...)
		if code != 0 {
			t.Fatalf("bidir=%v: exit %d\n%s%s", bidir, code, out, errs)
		}
		for _, s := range []string{"round trip of a 8-byte write", "bandwidth of 32768-byte writes", "# Out of bounds values : 0 OK"} {
			if !strings.Contains(out, s) {
				t.Errorf("bidir=%v: output lacks %q:\n%s", bidir, s, out)
			}
		}
	}
	// Around the line's bound (-ll 1, the default: up to 56 bytes; 57 and
	// more go as write + notify), one way and both, and with -ll 0: every
	// byte checked, a corrupted line's byte counted.
	for _, extra := range [][]string{nil, {"--bidir"}, {"-ll", "0"}} {
		args := append([]string{"p2p", "-g", "2", "-b", "1", "-e", "60", "-i", "1", "-n", "50", "-w", "5"}, extra...)
		code, out, errs := bench(t, Hooks{}, args...)
		if code != 0 || !strings.Contains(out, "# Out of bounds values : 0 OK") {
			t.Fatalf("%v: exit %d\n%s%s", extra, code, out, errs)
		}
		if ll := strings.Contains(out, "travel as one line"); ll != (len(extra) == 0 || extra[0] != "-ll") {
			t.Errorf("%v: the report says lines: %v", extra, ll)
		}
	}
	lh := Hooks{Corrupt: func(rank int, _ bool, out []byte) {
		if rank == 1 && len(out) > 20 {
			out[20]++
		}
	}}
	if code, out, _ := bench(t, lh, "p2p", "-g", "2", "-b", "32", "-e", "32", "-n", "1", "-w", "0"); code == 0 || !strings.Contains(out, "# Out of bounds values : 1 FAILED") {
		t.Errorf("exit %d; a corrupted line must fail:\n%s", code, out)
	}
	if code, _, errs := bench(t, Hooks{}, "p2p", "-ll", "2"); code != 2 || !strings.Contains(errs, "-ll 2: want 0 or 1") {
		t.Errorf("-ll 2: exit %d, %s", code, errs)
	}
	h := Hooks{Corrupt: func(rank int, _ bool, out []byte) {
		if rank == 2 && len(out) > 100 {
			out[100]++
		}
	}}
	code, out, _ := bench(t, h, "p2p", "-g", "3", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0")
	// rank 2 receives from ranks 0 and 1: two corrupted bytes.
	if code == 0 || !strings.Contains(out, "# Out of bounds values : 2 FAILED") {
		t.Errorf("exit %d; corrupted p2p data must fail:\n%s", code, out)
	}
}

func TestBadCommandLines(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{}, "no collective"},
		{[]string{"allgatherz"}, `unknown collective "allgatherz"; available: allgather, allreduce, alltoall, broadcast, gather, reduce, reducescatter, scatter, sendrecv, p2p`},
		{[]string{"allreduce", "-d", "float33"}, "unknown data type"},
		{[]string{"allreduce", "-o", "avg"}, "unknown reduce op"},
		{[]string{"allreduce", "-b", "2M", "-e", "1M"}, "larger than -e"},
		{[]string{"allreduce", "-f", "1"}, "step factor must be > 1"},
		{[]string{"allreduce", "-b", "12Q"}, "K, M or G suffix"},
		{[]string{"allreduce", "-n", "0"}, "at least 1 iteration"},
		{[]string{"allreduce", "-c", "2"}, "want 0 or 1"},
		{[]string{"allreduce", "--json", "--csv"}, "exclude each other"},
		{[]string{"allreduce", "broadcast"}, "one collective at a time"},
	} {
		code, _, errs := bench(t, Hooks{}, tc.args...)
		if code != 2 || !strings.Contains(errs, tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want 2 and %q", tc.args, code, errs, tc.want)
		}
	}
	code, _, errs := bench(t, Hooks{}, "broadcast", "-g", "2", "-r", "2", "-b", "8", "-e", "8")
	if code != 1 || !strings.Contains(errs, "-r 2: the root must be a rank in [0, 2)") {
		t.Errorf("bad root: exit %d, %q", code, errs)
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "8": 8, "1K": 1024, "64m": 64 << 20, "2G": 2 << 30} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "K", "-1", "1.5M", "1T", "99999999999G"} {
		if _, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) succeeded", in)
		}
	}
	// ParseSize reads back what the plot's size axis writes (units.Size).
	for _, n := range []int64{0, 8, 1000, 1536, 4 << 10, 1<<20 + 1<<10, 64 << 20, 2 << 30, 1<<30 + 1} {
		if got, err := ParseSize(units.Size(n)); err != nil || got != n {
			t.Errorf("ParseSize(units.Size(%d) = %q) = %d, %v", n, units.Size(n), got, err)
		}
	}
}

func TestSizes(t *testing.T) {
	o := Options{MinBytes: 8, MaxBytes: 100, StepFactor: 2}
	if got := o.sizes(); len(got) != 4 || got[3] != 64 {
		t.Errorf("factor sizes = %v", got)
	}
	o = Options{MinBytes: 10, MaxBytes: 40, StepBytes: 15}
	if got := o.sizes(); len(got) != 3 || got[2] != 40 {
		t.Errorf("step sizes = %v", got)
	}
}

// Every collective, checked on 3 ranks with sizes that do not divide evenly,
// every type (and op where it reduces): no wrong value, both placements
// where the collective has them, and busbw = algbw x the nccl-tests factor.
func TestEveryCollective(t *testing.T) {
	factors := map[string]float64{"allreduce": 4.0 / 3, "allgather": 2.0 / 3, "reducescatter": 2.0 / 3, "alltoall": 2.0 / 3,
		"scatter": 2.0 / 3, "gather": 2.0 / 3, "broadcast": 1, "reduce": 1, "sendrecv": 1}
	for name, f := range factors {
		t.Run(name, func(t *testing.T) {
			code, out, errs := bench(t, Hooks{}, name, "--json", "-g", "3", "-r", "2", "-b", "5", "-e", "41K", "-f", "91", "-n", "1", "-w", "1", "-d", "int8,uint16,bfloat16,float,uint64", "-o", "all")
			if code != 0 {
				t.Fatalf("exit %d\n%s%s", code, out, errs)
			}
			var doc struct{ Rows []Row }
			if err := json.Unmarshal([]byte(out), &doc); err != nil {
				t.Fatal(err)
			}
			want := 5 * 3 // types x sizes
			if colls[name].reduces {
				want *= 4
			}
			if len(doc.Rows) != want {
				t.Errorf("%d rows, want %d", len(doc.Rows), want)
			}
			for _, r := range doc.Rows {
				for _, res := range []*Result{r.Out, r.In} {
					if res.NA {
						continue
					}
					if res.Wrong != 0 {
						t.Errorf("%+v: %d wrong", r, res.Wrong)
					}
					if res.AlgBW > 0 && math.Abs(res.BusBW/res.AlgBW-f) > 1e-9 {
						t.Errorf("busbw/algbw = %g, want %g", res.BusBW/res.AlgBW, f)
					}
				}
				if (r.Out.NA && r.In.NA) || (r.Out.NA != colls[name].inPlaceOnly) || (r.In.NA != colls[name].outOfPlaceOnly) {
					t.Errorf("placements of %+v", r)
				}
			}
		})
	}
}

// --metrics-addr serves the run's hcomm metrics in the Prometheus format.
func TestMetricsAddr(t *testing.T) {
	var body string
	h := scraper(t, &body)
	// 1 MiB: a schedule whose pipes wait on notifies (a small call's
	// hello between ranks of one process is a line, without a notify).
	code, out, errs := bench(t, h, "allreduce", "-g", "2", "-b", "1M", "-e", "1M", "-n", "3", "-w", "1", "--metrics-addr", "127.0.0.1:0")
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	if !strings.Contains(errs, "serving metrics on http://127.0.0.1:") {
		t.Errorf("stderr does not say where: %q", errs)
	}
	for _, s := range []string{`hcomm_collective_duration_seconds_count{algorithm="`, `op="allreduce",rank="1"}`,
		`hcomm_transport_bytes_total{direction="write",rank="0",transport="inproc"}`, `hcomm_errors_total{code="timeout",rank="1"} 0`,
		"hcomm_notify_wait_seconds_bucket", "go_goroutines"} {
		if !strings.Contains(body, s) {
			t.Errorf("scrape lacks %q:\n%s", s, body)
		}
	}
	if code, _, errs := bench(t, Hooks{}, "allreduce", "--metrics-addr", "256.1.1.1:99999"); code != 1 || !strings.Contains(errs, "--metrics-addr") {
		t.Errorf("bad address: exit %d, %q", code, errs)
	}
}

// Under a launcher (WORLD_SIZE set) without -g, bench joins the other
// processes; when that fails, the error says what was tried and how to run
// in one process instead.
func TestLauncherWithoutPeers(t *testing.T) {
	if os.Getenv("WORLD_SIZE") != "" || os.Getenv("OMPI_COMM_WORLD_SIZE") != "" || os.Getenv("SLURM_NTASKS") != "" {
		t.Skip("the test runs under a launcher")
	}
	env := func(k string) string {
		if k == "WORLD_SIZE" {
			return "2"
		}
		return ""
	}
	code, _, errs := bench(t, Hooks{Getenv: env}, "allreduce", "-b", "8", "-e", "8")
	if code != 1 || !strings.Contains(errs, "WORLD_SIZE is set but RANK is not") || !strings.Contains(errs, "-g N") ||
		strings.Contains(errs, "rank -1") {
		t.Errorf("exit %d, stderr %q", code, errs)
	}
	// -g wins over the launcher's variables.
	code, out, errs := bench(t, Hooks{Getenv: env}, "allreduce", "-g", "2", "-b", "8", "-e", "8", "-n", "1")
	if code != 0 {
		t.Errorf("-g 2 under WORLD_SIZE: exit %d\n%s%s", code, out, errs)
	}
}

// --protocol picks the channels' transport, and the header says which.
func TestP2PProtocol(t *testing.T) {
	for proto, tr := range map[string]string{"HCCS": "inproc", "ROCE": "tcp"} {
		code, out, errs := bench(t, Hooks{}, "p2p", "-g", "2", "-b", "8", "-e", "64K", "-f", "8192", "-n", "2", "-w", "1", "--protocol", proto)
		if code != 0 {
			t.Fatalf("%s: exit %d\n%s%s", proto, code, out, errs)
		}
		if want := "# p2p channels: protocol " + proto + ", transport " + tr + "\n"; !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if code, _, errs := bench(t, Hooks{}, "p2p", "--protocol", "carrier-pigeon"); code != 2 || !strings.Contains(errs, "want one of AUTO, HCCS, ROCE") {
		t.Errorf("bad protocol: exit %d, %q", code, errs)
	}
}

func TestMetricsAddrPerLocalRank(t *testing.T) {
	env := map[string]string{"WORLD_SIZE": "4", "LOCAL_RANK": "3"}
	get := func(k string) string { return env[k] }
	for _, tc := range []struct {
		in, want string
		ranksSet bool
	}{
		{"127.0.0.1:9464", "127.0.0.1:9467", false},
		{"127.0.0.1:9464", "127.0.0.1:9464", true}, // -g: one process, no shift
		{":0", ":0", false},
	} {
		got, err := metricsAddr(Options{MetricsAddr: tc.in, RanksSet: tc.ranksSet}, get)
		if err != nil || got != tc.want {
			t.Errorf("metricsAddr(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

// The progress line goes to stderr only when it is a terminal, and is
// cleared at the end.
func TestProgressLine(t *testing.T) {
	args := []string{"allreduce", "-g", "2", "-b", "8", "-e", "64", "-f", "8", "-n", "1", "-w", "0"}
	_, out, errs := bench(t, Hooks{Terminal: func() bool { return true }}, args...)
	if !strings.Contains(errs, "\rallreduce float sum 64 B: row 2/2") || !strings.HasSuffix(errs, "\r\x1b[K") || strings.Contains(out, "row 2/2") {
		t.Errorf("terminal: stderr %q", errs)
	}
	if _, _, errs = bench(t, Hooks{Terminal: func() bool { return false }}, args...); errs != "" {
		t.Errorf("not a terminal: stderr %q", errs)
	}
}

// -R 1 runs the collectives on symmetric windows (peers read the buffers in
// place); the results are checked as without it.
func TestRegisteredWindows(t *testing.T) {
	for _, name := range []string{"broadcast", "allgather", "alltoall", "allreduce"} {
		t.Run(name, func(t *testing.T) {
			code, out, errs := bench(t, Hooks{}, name, "--json", "-R", "1", "-g", "4", "-r", "1", "-b", "7", "-e", "1M", "-f", "97", "-n", "2", "-w", "1", "-d", "int8,float")
			if code != 0 {
				t.Fatalf("exit %d\n%s%s", code, out, errs)
			}
			var doc struct{ Rows []Row }
			if err := json.Unmarshal([]byte(out), &doc); err != nil {
				t.Fatal(err)
			}
			if len(doc.Rows) != 2*3 {
				t.Errorf("%d rows, want 6", len(doc.Rows))
			}
			for _, r := range doc.Rows {
				for _, res := range []*Result{r.Out, r.In} {
					if !res.NA && res.Wrong != 0 {
						t.Errorf("%+v: %d wrong", r, res.Wrong)
					}
				}
			}
		})
	}
	if code, _, errs := bench(t, Hooks{}, "allgather", "-R", "2", "-g", "2"); code != 2 || !strings.Contains(errs, "-R 2") {
		t.Errorf("-R 2: exit %d, %q", code, errs)
	}
}

// TestLaunchWarmup: before the first size is timed, a run makes -w calls
// at its largest size and -w at its smallest, as nccl-tests' TimeTest does,
// besides each size's own -w: the all-reduces a run counts (its metrics)
// grow by 2·w for the launch plus w per size and placement.
func TestLaunchWarmup(t *testing.T) {
	calls := func(w string) int {
		var body string
		code, out, errs := bench(t, scraper(t, &body), "allreduce", "-g", "2", "-b", "1K", "-e", "4K", "-n", "3", "-w", w, "-c", "0", "--metrics-addr", "127.0.0.1:0")
		if code != 0 {
			t.Fatalf("-w %s: exit %d\n%s%s", w, code, out, errs)
		}
		total := 0
		for _, line := range strings.Split(body, "\n") {
			if strings.HasPrefix(line, "hcomm_collective_duration_seconds_count{") && strings.Contains(line, `op="allreduce",rank="0"}`) {
				var n int
				if _, err := fmt.Sscan(line[strings.LastIndex(line, " ")+1:], &n); err == nil {
					total += n
				}
			}
		}
		return total
	}
	without, with := calls("0"), calls("2")
	// Three sizes (1, 2 and 4 KiB), out of place and in place: 12 calls of
	// the sizes' own warm-up, and 4 of the launch's.
	if got, want := with-without, 2*2+3*2*2; got != want {
		t.Errorf("-w 2 made %d all-reduces more than -w 0 (%d against %d), want %d: the sizes' 12 and the launch's 4", got, with, without, want)
	}
}

// scraper returns hooks whose Scrape keeps the run's /metrics page in
// *body (--metrics-addr).
func scraper(t *testing.T, body *string) Hooks {
	return Hooks{Scrape: func(url string) {
		resp, err := http.Get(url)
		if err != nil {
			t.Error(err)
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		*body = string(b)
	}}
}
