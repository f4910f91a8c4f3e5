package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/internal/leakcheck"
)

// TestMain runs this binary as one rank of an elastic job when
// ELASTIC_AS_RANK holds its arguments (hcommRun starts it so).
func TestMain(m *testing.M) {
	args := os.Getenv("ELASTIC_AS_RANK")
	if args == "" {
		leakcheck.Main(m)
		return
	}
	o := defaults()
	o.Epochs, o.Timeout, o.AwaitRegrow = 3, 30*time.Second, true
	fmt.Sscanf(args, "kill-rank=%d kill-at-step=%d", &o.KillRank, &o.KillAtStep)
	if err := Run(o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "elastic:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// hcommRun builds hcomm and runs this test binary as the ranks of
// `hcomm run --elastic -n n --min 2 --max-restarts 1`, bounded in time; it
// returns the exit status and everything printed.
func hcommRun(t *testing.T, n int, args string) (int, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds hcomm and starts processes")
	}
	bin := filepath.Join(t.TempDir(), "hcomm")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/hcomm-dev/hcomm/cmd/hcomm").CombinedOutput(); err != nil {
		t.Fatalf("building hcomm: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, bin, "run", "--elastic", "-n", fmt.Sprint(n), "--min", "2", "--max-restarts", "1", "--", os.Args[0])
	c.Env = append(os.Environ(), "ELASTIC_AS_RANK="+args)
	out, err := c.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("hcomm run --elastic did not end:\n%s", out)
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return c.ProcessState.ExitCode(), string(out)
}

// One rank of three is killed with SIGKILL mid-epoch: the survivors shrink
// and go on, the replacement the launcher starts joins by Grow and receives
// the state, every epoch accounts every sample once, the weights stay
// bit-identical, and the job ends with status 0.
func TestSurvivesAKilledRank(t *testing.T) {
	code, out := hcommRun(t, 3, "kill-rank=2 kill-at-step=5")
	t.Log("\n" + out)
	if code != 0 {
		t.Fatalf("hcomm run --elastic exited %d", code)
	}
	for _, want := range []string{
		"[2] elastic: rank 2 kills itself with SIGKILL in step 5",
		"hcomm run: rank 2 failed (signal: killed); 2 processes go on",
		"hcomm run: started replacement 3",
		"[0] membership: lost rank(s) [2] in step 5",
		"[0] membership: shrunk to 2 ranks (old ranks [0 1])",
		"[3] elastic: slot 3 joined as rank 2 of 3; received the weights, the optimizer state",
		"[0] membership: grew to 3 ranks",
		"[0] epoch 3  loss",
		"[0] done: 3 epochs",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if n := strings.Count(out, "ledger: each of the 1536 samples trained on exactly once"); n != 3 {
		t.Errorf("%d epochs passed the ledger check, want 3", n)
	}
}

// Without a failure the elastic job is a plain data-parallel run.
func TestNoFailure(t *testing.T) {
	code, out := hcommRun(t, 2, "kill-rank=-1 kill-at-step=-1")
	if code != 0 || strings.Contains(out, "membership:") || !strings.Contains(out, "[0] done: 3 epochs") {
		t.Fatalf("exit %d\n%s", code, out)
	}
}

func TestBadOptions(t *testing.T) {
	o := defaults()
	o.Batch = 0
	if err := Run(o, os.Stdout); err == nil || !strings.Contains(err.Error(), "must be positive") {
		t.Errorf("batch 0: %v", err)
	}
}
