package launch

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/internal/leakcheck"
	"github.com/hcomm-dev/hcomm/internal/procs"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

func TestPrefixWriterWholeLines(t *testing.T) {
	var mu sync.Mutex
	var out bytes.Buffer
	w := &prefixWriter{mu: &mu, w: &out, prefix: []byte("[3] ")}
	for _, s := range []string{"hel", "lo\nwor", "ld\n\nlast"} {
		if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
	if got, want := out.String(), "[3] hello\n[3] world\n[3] \n"; got != want {
		t.Errorf("before flush: %q, want %q", got, want)
	}
	w.flush()
	if got, want := out.String(), "[3] hello\n[3] world\n[3] \n[3] last\n"; got != want {
		t.Errorf("after flush: %q, want %q", got, want)
	}
	// An overlong line without a newline goes out in pieces, each prefixed.
	out.Reset()
	w.Write(bytes.Repeat([]byte("x"), 1<<16+10))
	if !strings.HasPrefix(out.String(), "[3] xxx") || !strings.HasSuffix(out.String(), "x\n") {
		t.Errorf("overlong line: %d bytes written", out.Len())
	}
}

func TestWithVarsReplaces(t *testing.T) {
	env := withVars([]string{"PATH=/bin", "RANK=9", "WORLD_SIZE=9", "X=1"}, map[string]string{"RANK": "0", "WORLD_SIZE": "2"})
	got := strings.Join(env, " ")
	if got != "PATH=/bin X=1 RANK=0 WORLD_SIZE=2" {
		t.Errorf("env = %q", got)
	}
}

func TestRunRejectsBadOptions(t *testing.T) {
	if _, err := Run(context.Background(), Options{N: 0, Prog: "true"}); err == nil {
		t.Error("N = 0 accepted")
	}
	if _, err := Run(context.Background(), Options{N: 1}); err == nil {
		t.Error("no program accepted")
	}
	if _, err := Run(context.Background(), Options{N: 1, Prog: "/no/such/prog"}); err == nil {
		t.Error("a missing program accepted")
	}
}

// Cancelling the context stops every rank.
func TestRunCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var out bytes.Buffer
	var mu sync.Mutex
	sw := &syncWriter{mu: &mu, w: &out}
	done := make(chan Result, 1)
	go func() {
		res, err := Run(ctx, Options{N: 2, Prog: "sh", Args: []string{"-c", "echo up; exec sleep 60"}, Stdout: sw, Stderr: sw, Grace: 200 * time.Millisecond})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		mu.Lock()
		up := strings.Count(out.String(), "up")
		mu.Unlock()
		if up == 2 {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatal("the ranks did not start")
		}
	}
	cancel()
	res := <-done
	if res.Code == 0 {
		t.Errorf("cancelled run exited %d", res.Code)
	}
}

type syncWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// Every rank of one launch gets the same fresh HCOMM_SECRET; two launches get
// different ones; a secret the caller set is kept.
func TestRunSetsASecretPerLaunch(t *testing.T) {
	secrets := func(env []string) []string {
		var out bytes.Buffer
		var mu sync.Mutex
		sw := &syncWriter{mu: &mu, w: &out}
		res, err := Run(context.Background(), Options{N: 2, Prog: "sh", Args: []string{"-c", `echo "s=$HCOMM_SECRET"`}, Env: env, Stdout: sw, Stderr: sw})
		if err != nil || res.Code != 0 {
			t.Fatalf("Run: %+v, %v", res, err)
		}
		var got []string
		for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			_, v, _ := strings.Cut(line, "s=")
			got = append(got, v)
		}
		return got
	}
	a, b := secrets([]string{"PATH=/usr/bin:/bin"}), secrets([]string{"PATH=/usr/bin:/bin"})
	if len(a) != 2 || a[0] != a[1] || len(a[0]) != 32 {
		t.Fatalf("ranks' secrets %q: want one 32-hex-digit secret", a)
	}
	if a[0] == b[0] {
		t.Errorf("two launches share the secret %q", a[0])
	}
	if c := secrets([]string{"PATH=/usr/bin:/bin", "HCOMM_SECRET=mine"}); c[0] != "mine" || c[1] != "mine" {
		t.Errorf("a preset secret was replaced: %q", c)
	}
}

// Ranks share the host's processors unless the caller chose GOMAXPROCS.
func TestGomaxprocsSharesTheProcessors(t *testing.T) {
	ncpu := runtime.NumCPU()
	if got, want := gomaxprocs(nil, 2), strconv.Itoa(max(1, ncpu/2)); got != want {
		t.Errorf("2 ranks on %d processors: GOMAXPROCS %q, want %q", ncpu, got, want)
	}
	if got := gomaxprocs(nil, 4*ncpu); got != "1" {
		t.Errorf("%d ranks on %d processors: GOMAXPROCS %q, want 1", 4*ncpu, ncpu, got)
	}
	if got := gomaxprocs([]string{"GOMAXPROCS=3"}, 4); got != "" {
		t.Errorf("the caller's GOMAXPROCS=3 was overridden with %q", got)
	}
	if got := gomaxprocs(nil, 1); got != "" {
		t.Errorf("one rank: GOMAXPROCS %q, want it left alone", got)
	}
}

// elasticRun runs script as n ranks of an elastic job and returns the result
// and the output.
func elasticRun(t *testing.T, n, minRanks, restarts int, script string) (Result, string) {
	t.Helper()
	var out bytes.Buffer
	var mu sync.Mutex
	sw := &syncWriter{mu: &mu, w: &out}
	res, err := Run(context.Background(), Options{N: n, Prog: "sh", Args: []string{"-c", script}, Env: []string{"PATH=/usr/bin:/bin"},
		Stdout: sw, Stderr: sw, Grace: 500 * time.Millisecond, Elastic: true, MinRanks: minRanks, MaxRestarts: restarts})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	return res, out.String()
}

// An elastic job survives a failed rank while --min processes run, starts a
// replacement with HCOMM_ELASTIC_JOIN=1 and no RANK, and ends with status 0.
func TestRunElasticSurvives(t *testing.T) {
	const script = `if [ -n "$HCOMM_ELASTIC_JOIN" ]; then echo "newcomer slot=$HCOMM_ELASTIC_SLOT of $HCOMM_ELASTIC_SLOTS rank=[$RANK] store=${HCOMM_ELASTIC_ADDR%:*}"; exit 0; fi
if [ "$RANK" = 1 ]; then exit 3; fi
sleep 1; echo "member $RANK slot=$HCOMM_ELASTIC_SLOT done"`
	res, out := elasticRun(t, 3, 2, 1, script)
	if res.Code != 0 || res.FailedRank != -1 || res.Survived != 1 || res.Restarts != 1 {
		t.Fatalf("result %+v, want status 0, one failure survived, one restart; output:\n%s", res, out)
	}
	for _, want := range []string{"[3] newcomer slot=3 of 4 rank=[] store=127.0.0.1", "[0] member 0 slot=0 done", "[2] member 2 slot=2 done",
		"rank 1 failed (exit status 3); 2 processes go on", "started replacement 3 (restart 1 of 1)"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// Restarts spent: the next failure is survived without a replacement.
	res, out = elasticRun(t, 3, 1, 0, `if [ "$RANK" = 2 ]; then exit 4; fi; sleep 0.3`)
	if res.Code != 0 || res.Survived != 1 || res.Restarts != 0 || strings.Contains(out, "replacement") {
		t.Errorf("no restarts left: %+v\n%s", res, out)
	}
}

// A failure that leaves fewer than --min processes fails the elastic job as
// without --elastic; bad elastic options are refused.
func TestRunElasticBelowMin(t *testing.T) {
	res, out := elasticRun(t, 2, 2, 3, `if [ "$RANK" = 1 ]; then exit 5; fi; exec sleep 60`)
	if res.Code != 5 || res.FailedRank != 1 || res.Restarts != 0 {
		t.Errorf("result %+v, want status 5 from rank 1 and no restart; output:\n%s", res, out)
	}
	for _, o := range []Options{{N: 2, Prog: "true", Elastic: true, MinRanks: 3}, {N: 2, Prog: "true", Elastic: true, MaxRestarts: -1}} {
		if _, err := Run(context.Background(), o); err == nil || !strings.Contains(err.Error(), "--min") {
			t.Errorf("Run(%+v) = %v, want an error naming --min and --max-restarts", o, err)
		}
	}
}

// TestBindCore: --bind-to core binds each rank to its share of the
// launcher's processors (procs.Share) — with more ranks than processors one
// each in turn — and leaves the launcher's own threads as they were;
// --bind-to none leaves every rank the launcher's processors, and auto
// binds as core up to AutoBindPerProcessor ranks a processor, not above.
func TestBindCore(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("binding is implemented on Linux only")
	}
	mine := procs.Affinity()
	if len(mine) == 0 {
		t.Skip("this system does not say which processors the test may use")
	}
	allowed := func(bind Bind, n int) map[int]string {
		var out bytes.Buffer
		var mu sync.Mutex
		sw := &syncWriter{mu: &mu, w: &out}
		res, err := Run(context.Background(), Options{N: n, Prog: "sh", Bind: bind, Stdout: sw, Stderr: sw,
			Args: []string{"-c", `sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status`}})
		if err != nil || res.Code != 0 {
			t.Fatalf("bind %s, %d ranks: %v, exit %d: %s", bind, n, err, res.Code, out.String())
		}
		got := map[int]string{}
		for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			var r int
			var list string
			if _, err := fmt.Sscanf(line, "[%d] %s", &r, &list); err != nil {
				t.Fatalf("line %q: %v", line, err)
			}
			got[r] = list
		}
		return got
	}
	for _, n := range []int{1, 2, len(mine) + 1, 2*len(mine) + 1} {
		got := allowed(BindCore, n)
		for r := range n {
			want := procs.FormatList(procs.Share(mine, n, r))
			if got[r] != want {
				t.Errorf("--bind-to core, %d ranks on processors %s: rank %d runs on %q, want %q", n, procs.FormatList(mine), r, got[r], want)
			}
		}
	}
	for r, list := range allowed(BindNone, 3) {
		if list != procs.FormatList(mine) {
			t.Errorf("--bind-to none: rank %d runs on %q, want the launcher's %q", r, list, procs.FormatList(mine))
		}
	}
	// auto: bound up to AutoBindPerProcessor ranks a processor, free above.
	most := AutoBindPerProcessor * len(mine)
	got := allowed(BindAuto, most)
	for r := range most {
		if want := procs.FormatList(procs.Share(mine, most, r)); got[r] != want {
			t.Errorf("--bind-to auto, %d ranks on %d processors: rank %d runs on %q, want %q", most, len(mine), r, got[r], want)
		}
	}
	for r, list := range allowed(BindAuto, most+1) {
		if list != procs.FormatList(mine) {
			t.Errorf("--bind-to auto, %d ranks on %d processors: rank %d runs on %q, want the launcher's %q", most+1, len(mine), r, list, procs.FormatList(mine))
		}
	}
	if after := procs.Affinity(); !slices.Equal(after, mine) {
		t.Errorf("the launcher's processors were %v before binding ranks, %v after", mine, after)
	}
	if _, err := ParseBind("socket"); err == nil || !strings.Contains(err.Error(), "socket") {
		t.Errorf("ParseBind(socket): %v, want an error naming it", err)
	}
	if _, err := Run(context.Background(), Options{N: 1, Prog: "true", Bind: "numa"}); err == nil {
		t.Errorf("Run accepted binding %q", "numa")
	}
}
