package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	mlctx "github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
	"github.com/hcomm-dev/hcomm/contrib/gomlx/dp"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// TestMain makes the test binary a rank of dptrain when hcomm run starts it
// with DPTRAIN_AS_RANK set: "ok" trains briefly; "mismatch" gives rank 1
// another bucket size, which every rank must refuse.
func TestMain(m *testing.M) {
	mode := os.Getenv("DPTRAIN_AS_RANK")
	if mode == "" {
		os.Exit(m.Run())
	}
	o := defaults()
	o.Epochs, o.Samples, o.Baseline = 2, 512, false
	if mode == "mismatch" && os.Getenv("RANK") == "1" {
		o.Bucket = 1 << 10
	}
	if _, err := Run(o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "dptrain:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// hcommRun runs this test binary as n ranks under hcomm run (built from the
// parent module) in mode, and returns the exit code and everything printed.
func hcommRun(t *testing.T, n int, mode string) (int, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds hcomm and starts processes")
	}
	bin := filepath.Join(t.TempDir(), "hcomm")
	build := exec.Command("go", "build", "-o", bin, "github.com/hcomm-dev/hcomm/cmd/hcomm")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building hcomm: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, bin, "run", "-n", fmt.Sprint(n), "--", os.Args[0])
	c.Env = append(os.Environ(), "DPTRAIN_AS_RANK="+mode)
	out, err := c.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("hcomm run did not end:\n%s", out)
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return c.ProcessState.ExitCode(), string(out)
}

func TestProcessesUnderHcommRun(t *testing.T) {
	code, out := hcommRun(t, 2, "ok")
	if code != 0 || !strings.Contains(out, "[0] epoch  2") || !strings.Contains(out, "[0] variables identical on all 2 ranks") {
		t.Fatalf("exit %d\n%s", code, out)
	}
	t.Log("\n" + out)
}

func TestProcessesRefuseMismatchedModels(t *testing.T) {
	// hcomm run stops the other rank when the first fails: at least one
	// reports, naming both ranks, and the run ends instead of hanging.
	code, out := hcommRun(t, 2, "mismatch")
	if code == 0 || !strings.Contains(out, "the ranks have different models") ||
		!strings.Contains(out, "rank 0: model") || !strings.Contains(out, "rank 1: model") {
		t.Fatalf("exit %d\n%s", code, out)
	}
	t.Log("\n" + out)
}

func TestMLPLearnsOnTwoRanks(t *testing.T) {
	o := defaults()
	o.Ranks, o.Epochs, o.Samples, o.Baseline = 2, 3, 1024, false
	var out strings.Builder
	res, err := Run(o, &out)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	if res.Ranks != 2 || len(res.Losses) != 3 || !(res.Losses[2] < res.Losses[0]) || res.TestAcc[2] < 0.8 {
		t.Fatalf("losses %v, test accuracy %v", res.Losses, res.TestAcc)
	}
	if !strings.Contains(out.String(), "variables identical on all 2 ranks") {
		t.Fatal("no identity check in the report")
	}
}

func TestAttentionTrainsOnTwoRanksWithBaseline(t *testing.T) {
	o := defaults()
	o.Model, o.Ranks, o.Epochs, o.Samples, o.Batch = "attn", 2, 2, 256, 32
	var out strings.Builder
	res, err := Run(o, &out)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	if !(res.Losses[1] < res.Losses[0]) || res.Baseline <= 0 || res.Buckets < 2 {
		t.Fatalf("losses %v, baseline %v, %d buckets", res.Losses, res.Baseline, res.Buckets)
	}
}

func TestRefusesBadOptions(t *testing.T) {
	for _, o := range []Options{
		func() Options { o := defaults(); o.Model = "cnn"; return o }(),
		func() Options { o := defaults(); o.Ranks, o.Batch = 3, 64; return o }(),
		func() Options { o := defaults(); o.LR = -1; return o }(),
	} {
		if _, err := Run(o, io.Discard); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
}

// BenchmarkStep times one training step of each model on 1, 2 and 4 ranks
// in this process and reports the share of the step spent in hcomm:
//
//	cd contrib/gomlx && go test -run '^$' -bench Step -benchtime 50x ./examples/dptrain
//
// The global batch is the same whatever the number of ranks, so ms/step
// against ranks=1 is the speed-up. For ranks as processes, run the example
// under hcomm run (it prints ms/step and the hcomm share per epoch).
func BenchmarkStep(b *testing.B) {
	for _, model := range []string{"mlp", "attn"} {
		for _, n := range []int{1, 2, 4} {
			b.Run(fmt.Sprintf("%s/ranks=%d", model, n), func(b *testing.B) { benchStep(b, model, n) })
		}
	}
}

func benchStep(b *testing.B, model string, n int) {
	o := defaults()
	o.Model, o.Samples = model, 256
	d := makeData(o)
	backend, err := newBackend()
	if err != nil {
		b.Fatal(err)
	}
	comms, err := hcomm.InitAll(n, &hcomm.Config{Name: "bench", BufferSize: 8 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	per := o.Batch / n
	trs := make([]*dp.Trainer, n)
	ins := make([][]*tensors.Tensor, n)
	labs := make([][]*tensors.Tensor, n)
	for r, c := range comms {
		ctx := mlctx.New()
		ctx.SetParam(optimizers.ParamLearningRate, 0.003)
		trs[r], err = dp.NewTrainer(c, backend, ctx, modelFn(o, d.classes), losses.SparseCategoricalCrossEntropyLogits,
			optimizers.Adam().Done(), &dp.Config{BucketBytes: o.Bucket})
		if err != nil {
			b.Fatal(err)
		}
		defer trs[r].Close()
		e := d.sampleElements
		ins[r] = []*tensors.Tensor{tensors.FromFlatDataAndDimensions(append([]float32(nil), d.trainX[r*per*e:(r+1)*per*e]...), append([]int{per}, d.dims...)...)}
		labs[r] = []*tensors.Tensor{tensors.FromFlatDataAndDimensions(append([]int32(nil), d.trainY[r*per:(r+1)*per]...), per, 1)}
	}
	var comm, total time.Duration
	var mu sync.Mutex
	step := func() {
		var wg sync.WaitGroup
		for r := range n {
			wg.Go(func() {
				res, err := trs[r].TrainStep(context.Background(), nil, ins[r], labs[r])
				if err != nil {
					b.Error(err)
					return
				}
				if r == 0 {
					mu.Lock()
					comm += res.Timing.Comm
					total += res.Timing.Total
					mu.Unlock()
				}
			})
		}
		wg.Wait()
	}
	step() // compile the graphs, take rank 0's variables
	step() // and the optimizer's
	comm, total = 0, 0
	b.ResetTimer()
	for range b.N {
		step()
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Microseconds())/1e3/float64(b.N), "ms/step")
	b.ReportMetric(comm.Seconds()/total.Seconds(), "hcomm-share")
}
