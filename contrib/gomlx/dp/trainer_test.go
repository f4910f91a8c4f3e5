package dp_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	mlctx "github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/gomlx/gomlx/pkg/ml/layers/activations"
	"github.com/gomlx/gomlx/pkg/ml/layers/batchnorm"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/metrics"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
	"github.com/hcomm-dev/hcomm/contrib/gomlx/dp"
	"github.com/hcomm-dev/hcomm/hcomm"
)

const (
	features = 6
	classes  = 3
)

// backend is the pure-Go backend running a graph's operations one after
// another: its parallel mode (the default when one graph runs alone) races
// on its buffer bookkeeping (simplego/exec.go, v0.26.0; go test -race sees
// it), and results that vary from run to run would split the ranks.
var backend = sync.OnceValue(func() backends.Backend {
	b, err := simplego.New("ops_sequential")
	if err != nil {
		panic(err)
	}
	return b
})

// mlp is the test model: features -> hidden (tanh) -> classes.
func mlp(hidden int) func(ctx *mlctx.Context, _ any, in []*graph.Node) []*graph.Node {
	return func(ctx *mlctx.Context, _ any, in []*graph.Node) []*graph.Node {
		x := layers.DenseWithBias(ctx.In("hidden"), in[0], hidden)
		x = activations.Apply(activations.TypeTanh, x)
		return []*graph.Node{layers.DenseWithBias(ctx.In("out"), x, classes)}
	}
}

// mlpBatchNorm is mlp with batch normalization after the hidden layer: its
// running mean and variance are state the gradient graph changes from the
// rank's own shard, which the trainer averages across ranks.
func mlpBatchNorm(hidden int) func(ctx *mlctx.Context, _ any, in []*graph.Node) []*graph.Node {
	return func(ctx *mlctx.Context, _ any, in []*graph.Node) []*graph.Node {
		x := layers.DenseWithBias(ctx.In("hidden"), in[0], hidden)
		x = batchnorm.New(ctx.In("bn"), x, -1).UseBackendInference(false).Done() // SimpleGo lacks the fused op
		x = activations.Apply(activations.TypeTanh, x)
		return []*graph.Node{layers.DenseWithBias(ctx.In("out"), x, classes)}
	}
}

// blobs is a classification set: n samples, a Gaussian blob per class.
func blobs(n int, seed uint64) ([]float32, []int32) {
	rng := rand.New(rand.NewPCG(seed, 7))
	x := make([]float32, n*features)
	y := make([]int32, n)
	for i := range y {
		y[i] = int32(rng.IntN(classes))
		for f := range features {
			x[i*features+f] = float32(rng.NormFloat64()) + float32((int(y[i])+f)%classes)
		}
	}
	return x, y
}

// batch returns samples [from, from+n) as the model's inputs and labels.
func batch(x []float32, y []int32, from, n int) ([]*tensors.Tensor, []*tensors.Tensor) {
	xs := append([]float32(nil), x[from*features:(from+n)*features]...)
	ys := append([]int32(nil), y[from:from+n]...)
	return []*tensors.Tensor{tensors.FromFlatDataAndDimensions(xs, n, features)},
		[]*tensors.Tensor{tensors.FromFlatDataAndDimensions(ys, n, 1)}
}

// rank is one rank's trainer and Context.
type rank struct {
	tr  *dp.Trainer
	ctx *mlctx.Context
}

// setup makes n ranks in this process, each with its own Context seeded
// seed+rank (so that only the broadcast can make them equal) and model.
func setup(t *testing.T, n int, seed int64, model func(r int) func(*mlctx.Context, any, []*graph.Node) []*graph.Node,
	opt func() optimizers.Interface, cfg *dp.Config) []rank {
	t.Helper()
	comms, err := hcomm.InitAll(n, &hcomm.Config{Name: "dp-test", BufferSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	rs := make([]rank, n)
	for r, c := range comms {
		ctx := mlctx.New()
		ctx.SetParam(optimizers.ParamLearningRate, 0.05)
		if err := ctx.SetRNGStateFromSeed(seed + int64(r)); err != nil {
			t.Fatal(err)
		}
		tr, err := dp.NewTrainer(c, backend(), ctx, model(r), losses.SparseCategoricalCrossEntropyLogits, opt(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		rs[r] = rank{tr: tr, ctx: ctx}
	}
	t.Cleanup(func() {
		for r, x := range rs {
			if err := x.tr.Close(); err != nil {
				t.Errorf("rank %d: Close: %v", r, err)
			}
			if err := x.tr.Close(); err != nil {
				t.Errorf("rank %d: second Close: %v", r, err)
			}
			comms[r].Destroy()
		}
	})
	return rs
}

// stepAll runs one step on every rank at once, rank r on shard(r), within a
// deadline: a hang fails the test instead of stalling it.
func stepAll(t *testing.T, rs []rank, shard func(r int) ([]*tensors.Tensor, []*tensors.Tensor)) ([]*dp.Result, []error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res := make([]*dp.Result, len(rs))
	errs := make([]error, len(rs))
	var wg sync.WaitGroup
	for r := range rs {
		wg.Go(func() {
			in, lab := shard(r)
			res[r], errs[r] = rs[r].tr.TrainStep(ctx, nil, in, lab)
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("a step hung: %v", errs)
	}
	return res, errs
}

// values is every variable of ctx as raw bytes, by name.
func values(t *testing.T, ctx *mlctx.Context) map[string][]byte {
	t.Helper()
	m := map[string][]byte{}
	for v := range ctx.IterVariables() {
		x, err := v.Value()
		if err != nil {
			t.Fatal(err)
		}
		if err := x.ConstBytes(func(b []byte) { m[v.ScopeAndName()] = append([]byte(nil), b...) }); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

// sameBits fails unless every rank's variables equal rank 0's bit for bit.
func sameBits(t *testing.T, rs []rank, step int) {
	t.Helper()
	ref := values(t, rs[0].ctx)
	for r := 1; r < len(rs); r++ {
		got := values(t, rs[r].ctx)
		if len(got) != len(ref) {
			t.Fatalf("step %d: rank %d has %d variables, rank 0 %d", step, r, len(got), len(ref))
		}
		for name, b := range ref {
			if string(got[name]) != string(b) {
				t.Fatalf("step %d: rank %d's variable %q differs from rank 0's", step, r, name)
			}
		}
	}
}

func TestVariablesBitIdenticalAfterEveryStep(t *testing.T) {
	const global = 32
	x, y := blobs(8*global, 1)
	for _, tc := range []struct {
		name  string
		model func(int) func(*mlctx.Context, any, []*graph.Node) []*graph.Node
		n     int
	}{{"mlp", mlp, 2}, {"mlp", mlp, 4}, {"batchnorm", mlpBatchNorm, 2}, {"batchnorm", mlpBatchNorm, 4}} {
		n := tc.n
		t.Run(fmt.Sprintf("%s/%dranks", tc.name, n), func(t *testing.T) {
			// Adam: its variables appear after the first step and must be
			// taken from rank 0 too; small buckets: several AllReduces.
			rs := setup(t, n, 10, func(int) func(*mlctx.Context, any, []*graph.Node) []*graph.Node { return tc.model(16) },
				func() optimizers.Interface { return optimizers.Adam().Done() },
				&dp.Config{BucketBytes: 256, Metrics: []dp.Metric{{Name: "accuracy", Fn: metrics.SparseCategoricalAccuracyGraph}}})
			per := global / n
			for step := range 8 {
				res, errs := stepAll(t, rs, func(r int) ([]*tensors.Tensor, []*tensors.Tensor) {
					return batch(x, y, step*global+r*per, per)
				})
				for r, err := range errs {
					if err != nil {
						t.Fatalf("step %d rank %d: %v", step, r, err)
					}
				}
				for r := 1; r < n; r++ {
					if res[r].Loss != res[0].Loss || res[r].Metrics[0] != res[0].Metrics[0] {
						t.Fatalf("step %d: rank %d reports loss %v accuracy %v, rank 0 %v %v",
							step, r, res[r].Loss, res[r].Metrics[0], res[0].Loss, res[0].Metrics[0])
					}
				}
				sameBits(t, rs, step)
			}
			checkAll(t, rs, "")
			// One rank's variable nudged by one ulp: every rank names it.
			v := rs[n-1].ctx.GetVariableByScopeAndName("/hidden/dense", "weights")
			if v == nil {
				t.Fatal("no variable /hidden/dense/weights")
			}
			x, err := v.Value()
			if err != nil {
				t.Fatal(err)
			}
			tensors.MustMutableFlatData(x, func(f []float32) { f[0] = math.Nextafter32(f[0], 2) })
			checkAll(t, rs, fmt.Sprintf("the variables of rank %d differ from rank 0's", n-1))
			if b, _ := rs[0].tr.Buckets(); b < 3 {
				t.Errorf("%d buckets with BucketBytes 256, want several", b)
			}
		})
	}
}

// checkAll runs CheckIdentical on every rank and wants want in every error
// ("": no error).
func checkAll(t *testing.T, rs []rank, want string) {
	t.Helper()
	errs := make([]error, len(rs))
	var wg sync.WaitGroup
	for r := range rs {
		wg.Go(func() { errs[r] = rs[r].tr.CheckIdentical(context.Background()) })
	}
	wg.Wait()
	for r, err := range errs {
		if (want == "" && err != nil) || (want != "" && (err == nil || !strings.Contains(err.Error(), want))) {
			t.Fatalf("rank %d: CheckIdentical: %v, want %q", r, err, want)
		}
	}
}

// lossTolerance is how far (relative) the loss of N ranks on B/N samples
// each may stray from one rank's on B: float32 gradients summed in another
// order (per shard, then across ranks) differ in the last bits, and eight
// steps of SGD carry that into the loss.
const lossTolerance = 1e-5

func TestLossMatchesOneRankOnTheGlobalBatch(t *testing.T) {
	const global, steps = 32, 8
	x, y := blobs(steps*global, 2)
	sgd := func() optimizers.Interface { return optimizers.StochasticGradientDescent().WithDecay(false) }
	model := func(int) func(*mlctx.Context, any, []*graph.Node) []*graph.Node { return mlp(16) }
	trajectory := func(n int) []float64 {
		rs := setup(t, n, 20, model, sgd, &dp.Config{BucketBytes: 512})
		per := global / n
		var losses []float64
		for step := range steps {
			res, errs := stepAll(t, rs, func(r int) ([]*tensors.Tensor, []*tensors.Tensor) {
				return batch(x, y, step*global+r*per, per)
			})
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			losses = append(losses, res[0].Loss)
		}
		return losses
	}
	one := trajectory(1)
	if !(one[steps-1] < one[0]) {
		t.Fatalf("one rank does not learn: losses %v", one)
	}
	for _, n := range []int{2, 4} {
		got := trajectory(n)
		for i := range one {
			if d := math.Abs(got[i] - one[i]); d > lossTolerance*math.Max(1, math.Abs(one[i])) {
				t.Errorf("%d ranks, step %d: loss %.9g, one rank %.9g (|diff| %.3g > %g)", n, i, got[i], one[i], d, lossTolerance)
			}
		}
		t.Logf("%d ranks: losses %.6f; one rank %.6f", n, got, one)
	}
}

// refusal steps all ranks with per-rank batch sizes and returns the errors,
// checking that every rank refused with the same MismatchError.
func refusal(t *testing.T, rs []rank, x []float32, y []int32, size func(r int) int) *dp.MismatchError {
	t.Helper()
	_, errs := stepAll(t, rs, func(r int) ([]*tensors.Tensor, []*tensors.Tensor) { return batch(x, y, 0, size(r)) })
	var first *dp.MismatchError
	for r, err := range errs {
		var me *dp.MismatchError
		if !errors.As(err, &me) {
			t.Fatalf("rank %d: %v, want a MismatchError", r, err)
		}
		if first == nil {
			first = me
		} else if me.Error() != first.Error() {
			t.Fatalf("rank %d: %v; rank 0: %v", r, me, first)
		}
	}
	return first
}

func TestRefusesMismatchedModels(t *testing.T) {
	x, y := blobs(64, 3)
	rs := setup(t, 4, 30, func(r int) func(*mlctx.Context, any, []*graph.Node) []*graph.Node {
		if r == 2 {
			return mlp(24)
		}
		return mlp(16)
	}, func() optimizers.Interface { return optimizers.StochasticGradientDescent() }, nil)
	me := refusal(t, rs, x, y, func(int) int { return 8 })
	if fmt.Sprint(me.Groups) != "[[0 1 3] [2]]" || !strings.Contains(me.Error(), "ranks 0, 1, 3: model") ||
		!strings.Contains(me.Error(), "rank 2: model") || !strings.Contains(me.What, "different models") {
		t.Fatalf("%v (groups %v)", me, me.Groups)
	}
	t.Log(me)
}

// metricsMismatch makes two ranks, rank 1 with one more metric than rank 0.
func metricsMismatch(t *testing.T) []rank {
	t.Helper()
	comms, err := hcomm.InitAll(2, &hcomm.Config{Name: "dp-test", BufferSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	rs := make([]rank, 2)
	for r, c := range comms {
		t.Cleanup(func() { c.Destroy() })
		cfg := &dp.Config{}
		if r == 1 {
			cfg.Metrics = []dp.Metric{{Name: "accuracy", Fn: metrics.SparseCategoricalAccuracyGraph}}
		}
		ctx := mlctx.New()
		tr, err := dp.NewTrainer(c, backend(), ctx, mlp(8), losses.SparseCategoricalCrossEntropyLogits,
			optimizers.StochasticGradientDescent(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		rs[r] = rank{tr: tr, ctx: ctx}
	}
	return rs
}

func TestRefusesMismatchedMetrics(t *testing.T) {
	// Rank 1 would all-reduce one more metric than rank 0.
	x, y := blobs(16, 7)
	rs := metricsMismatch(t)
	me := refusal(t, rs, x, y, func(int) int { return 4 })
	if fmt.Sprint(me.Groups) != "[[0] [1]]" || !strings.Contains(me.What, "different models") {
		t.Fatalf("%v (groups %v)", me, me.Groups)
	}
}

func TestFailedAllReduceFailsTheStep(t *testing.T) {
	// The ranks are made to agree on models that differ in their metrics:
	// the metrics' AllReduce then has another count on each rank, which
	// hcomm refuses on the stream. Every rank must return that error, not
	// apply what the buckets hold.
	x, y := blobs(16, 8)
	rs := metricsMismatch(t)
	dp.SetTestHookDescriptor(func(_ int, d []uint64) { d[dp.WordModel] = 1 })
	defer dp.SetTestHookDescriptor(nil)
	_, errs := stepAll(t, rs, func(int) ([]*tensors.Tensor, []*tensors.Tensor) { return batch(x, y, 0, 4) })
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "collective mismatch") {
			t.Fatalf("rank %d: %v, want hcomm's collective mismatch", r, err)
		}
	}
}

func TestRefusesMismatchedBatchSizes(t *testing.T) {
	x, y := blobs(64, 4)
	rs := setup(t, 2, 40, func(int) func(*mlctx.Context, any, []*graph.Node) []*graph.Node { return mlp(8) },
		func() optimizers.Interface { return optimizers.StochasticGradientDescent() }, nil)
	// Two good steps, then rank 1's batch shrinks: refused, and the
	// variables stay as they were.
	for range 2 {
		_, errs := stepAll(t, rs, func(int) ([]*tensors.Tensor, []*tensors.Tensor) { return batch(x, y, 0, 8) })
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
	}
	before := values(t, rs[0].ctx)
	me := refusal(t, rs, x, y, func(r int) int { return 8 - 4*r })
	if fmt.Sprint(me.Groups) != "[[0] [1]]" || me.Step != 3 ||
		!strings.Contains(me.Error(), "rank 0: batch size 8; rank 1: batch size 4") {
		t.Fatalf("%v (groups %v, step %d)", me, me.Groups, me.Step)
	}
	t.Log(me)
	after := values(t, rs[0].ctx)
	for name, b := range before {
		if string(after[name]) != string(b) {
			t.Fatalf("variable %q changed in a refused step", name)
		}
	}
	// The ranks agree again: the step goes on, numbered 3.
	res, errs := stepAll(t, rs, func(int) ([]*tensors.Tensor, []*tensors.Tensor) { return batch(x, y, 0, 8) })
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if res[0].Step != 3 {
		t.Fatalf("step %d after a refusal, want 3", res[0].Step)
	}
	sameBits(t, rs, 3)
}

func TestRankThatCannotBuildStopsAll(t *testing.T) {
	x, y := blobs(16, 5)
	rs := setup(t, 3, 50, func(r int) func(*mlctx.Context, any, []*graph.Node) []*graph.Node {
		if r == 1 {
			return func(*mlctx.Context, any, []*graph.Node) []*graph.Node { panic(errors.New("no model on this rank")) }
		}
		return mlp(8)
	}, func() optimizers.Interface { return optimizers.StochasticGradientDescent() }, nil)
	_, errs := stepAll(t, rs, func(int) ([]*tensors.Tensor, []*tensors.Tensor) { return batch(x, y, 0, 4) })
	if errs[1] == nil || !strings.Contains(errs[1].Error(), "dp: step 1 (rank 1)") || !strings.Contains(errs[1].Error(), "no model on this rank") {
		t.Fatalf("rank 1: %v", errs[1])
	}
	for _, r := range []int{0, 2} {
		if errs[r] == nil || !strings.Contains(errs[r].Error(), "rank 1 could not build the step") {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
	}
}

func TestRefusesSpecThatIsNoMapKey(t *testing.T) {
	x, y := blobs(16, 6)
	rs := setup(t, 2, 60, func(int) func(*mlctx.Context, any, []*graph.Node) []*graph.Node { return mlp(8) },
		func() optimizers.Interface { return optimizers.StochasticGradientDescent() }, nil)
	errs := make([]error, len(rs))
	var wg sync.WaitGroup
	for r := range rs {
		wg.Go(func() {
			in, lab := batch(x, y, 0, 4)
			_, errs[r] = rs[r].tr.TrainStep(context.Background(), []int{1}, in, lab)
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "spec of type []int cannot be a map key") {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

func TestFloat64Model(t *testing.T) {
	// float64 variables travel in float64 buckets: two ranks match one
	// rank on the global batch to float64 summation order.
	const global, steps = 16, 4
	x32, y := blobs(steps*global, 9)
	x := make([]float64, len(x32))
	for i, v := range x32 {
		x[i] = float64(v)
	}
	shard := func(from, n int) ([]*tensors.Tensor, []*tensors.Tensor) {
		return []*tensors.Tensor{tensors.FromFlatDataAndDimensions(append([]float64(nil), x[from*features:(from+n)*features]...), n, features)},
			[]*tensors.Tensor{tensors.FromFlatDataAndDimensions(append([]int32(nil), y[from:from+n]...), n, 1)}
	}
	sgd := func() optimizers.Interface { return optimizers.StochasticGradientDescent().WithDecay(false) }
	model := func(int) func(*mlctx.Context, any, []*graph.Node) []*graph.Node { return mlp(8) }
	trajectory := func(n int) []float64 {
		rs := setup(t, n, 70, model, sgd, nil)
		per := global / n
		var ls []float64
		for step := range steps {
			res, errs := stepAll(t, rs, func(r int) ([]*tensors.Tensor, []*tensors.Tensor) { return shard(step*global+r*per, per) })
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			sameBits(t, rs, step)
			ls = append(ls, res[0].Loss)
		}
		for v := range rs[0].ctx.IterVariables() {
			if v.Trainable && v.DType() != dtypes.Float64 {
				t.Fatalf("variable %q is %s, want Float64", v.ScopeAndName(), v.DType())
			}
		}
		return ls
	}
	one, two := trajectory(1), trajectory(2)
	for i := range one {
		if d := math.Abs(two[i] - one[i]); d > 1e-12*math.Max(1, math.Abs(one[i])) {
			t.Errorf("step %d: two ranks' loss %.17g, one rank's %.17g", i, two[i], one[i])
		}
	}
}

// TestRefusesNilContext: TrainStep and CheckIdentical refuse a nil context
// before they build or communicate — one rank calling alone would otherwise
// wait for its peer.
func TestRefusesNilContext(t *testing.T) {
	x, y := blobs(16, 6)
	rs := setup(t, 2, 61, func(int) func(*mlctx.Context, any, []*graph.Node) []*graph.Node { return mlp(8) },
		func() optimizers.Interface { return optimizers.StochasticGradientDescent() }, nil)
	var nilCtx context.Context
	in, lab := batch(x, y, 0, 4)
	if _, err := rs[0].tr.TrainStep(nilCtx, nil, in, lab); err == nil || !strings.Contains(err.Error(), "TrainStep (rank 0): nil context") {
		t.Errorf("TrainStep(nil context): %v", err)
	}
	if err := rs[0].tr.CheckIdentical(nilCtx); err == nil || !strings.Contains(err.Error(), "CheckIdentical (rank 0): nil context") {
		t.Errorf("CheckIdentical(nil context): %v", err)
	}
}
