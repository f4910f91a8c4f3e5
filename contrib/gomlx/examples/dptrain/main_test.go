package main

import (
	"context"
	"fmt"
	"io"
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
		func() Options { o := defaults(); o.LR = 0; return o }(),
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
		ctx.SetParam(optimizers.ParamLearningRate, o.LR)
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
