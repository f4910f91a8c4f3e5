// Command dptrain trains a GoMLX model data-parallel on hcomm with package
// dp, on GoMLX's pure-Go backend: an MLP classifier on spirals, or a
// self-attention network (layers.MultiHeadAttention) reading token
// sequences, both generated in code. (GoMLX's convolution cannot be trained
// on the pure-Go backend of v0.26.0: its gradient needs the Reverse
// operation, which that backend lacks.) Every step, each rank trains on its share of the global batch and
// the ranks average their gradients; rank 0 prints the loss, accuracy and
// time of each epoch, checks at the end that every rank holds the same
// variables bit for bit, and compares the time per epoch with one rank
// training on the same global batches alone.
//
//	go run ./examples/dptrain                         # 2-4 ranks in this process, the MLP
//	go run ./examples/dptrain -model attn -ranks 4
//	go tool hcomm run -n 4 go run ./examples/dptrain  # one rank per process
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	mlctx "github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/gomlx/gomlx/pkg/ml/layers/activations"
	"github.com/gomlx/gomlx/pkg/ml/layers/fnn"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/metrics"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
	"github.com/hcomm-dev/hcomm/contrib/gomlx/dp"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// Options configure a run.
type Options struct {
	Model     string // "mlp" or "attn"
	Ranks     int    // ranks in this process (ignored under a launcher)
	Epochs    int
	Samples   int     // training samples in all
	Batch     int     // global batch: split evenly across the ranks
	LR        float64 // 0: 0.01 for the MLP, 0.003 for attention
	Optimizer string  // "adam" or "sgd"
	Bucket    int     // dp.Config.BucketBytes
	Seed      uint64
	Baseline  bool // also train on one rank and report the speed-up
}

func defaults() Options {
	return Options{Model: "mlp", Ranks: min(4, max(2, runtime.NumCPU())), Epochs: 6, Samples: 4096, Batch: 64,
		Optimizer: "adam", Bucket: 16 << 10, Seed: 1, Baseline: true}
}

// Result is what a run measured (rank 0's; the same on every rank but the times).
type Result struct {
	Losses    []float64 // mean training loss per epoch, over all ranks
	TrainAcc  []float64 // mean training accuracy per epoch, over all ranks
	TestAcc   []float64 // held-out accuracy after each epoch
	EpochTime []time.Duration
	CommShare []float64 // fraction of the steps' time spent in hcomm, per epoch
	StepTime  time.Duration
	MeanEpoch time.Duration // the first epoch left out when there are others
	Baseline  time.Duration // one rank's mean epoch on the same global batches (0: not run)
	Ranks     int
	Buckets   int
	Params    int64
}

func main() {
	o := defaults()
	flag.StringVar(&o.Model, "model", o.Model, "mlp (spirals) or attn (self-attention over token sequences)")
	flag.IntVar(&o.Ranks, "ranks", o.Ranks, "ranks in this process (under a launcher: one per process)")
	flag.IntVar(&o.Epochs, "epochs", o.Epochs, "epochs")
	flag.IntVar(&o.Samples, "samples", o.Samples, "training samples in all")
	flag.IntVar(&o.Batch, "batch", o.Batch, "global batch size (split across the ranks)")
	flag.Float64Var(&o.LR, "lr", o.LR, "learning rate (0: 0.01 for mlp, 0.003 for attn)")
	flag.StringVar(&o.Optimizer, "optimizer", o.Optimizer, "adam or sgd")
	flag.IntVar(&o.Bucket, "bucket", o.Bucket, "bytes of gradients per AllReduce")
	flag.BoolVar(&o.Baseline, "baseline", o.Baseline, "also train on one rank alone and report the speed-up")
	flag.Parse()
	if _, err := Run(o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "dptrain:", err)
		os.Exit(1)
	}
}

func (o Options) check() error {
	switch {
	case o.Model != "mlp" && o.Model != "attn":
		return fmt.Errorf("model %q: want mlp or attn", o.Model)
	case o.Optimizer != "adam" && o.Optimizer != "sgd":
		return fmt.Errorf("optimizer %q: want adam or sgd", o.Optimizer)
	case o.Ranks < 1 || o.Epochs < 1 || o.Batch < 1 || o.Samples < 1 || o.Bucket < 0:
		return fmt.Errorf("ranks, epochs, batch and samples must be >= 1 and bucket >= 0: %+v", o)
	case !(o.LR >= 0):
		return fmt.Errorf("learning rate %g must be > 0 (or 0: the model's default)", o.LR)
	}
	return nil
}

// newBackend is GoMLX's pure-Go backend, its operations run one after
// another within a graph (its parallel mode races in v0.26.0; the ranks
// are the parallelism here).
func newBackend() (backends.Backend, error) { return simplego.New("ops_sequential") }

// Run trains with o and writes rank 0's report to out. It fails when the
// ranks' variables differ at the end.
func Run(o Options, out io.Writer) (*Result, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	if o.LR == 0 {
		o.LR = map[string]float64{"mlp": 0.01, "attn": 0.003}[o.Model]
	}
	var comms []*hcomm.Comm
	if _, ok := hcomm.Launched(nil); ok {
		c, err := hcomm.InitFromEnv(&hcomm.Config{Name: "dptrain", BufferSize: 8 << 20})
		if err != nil {
			return nil, err
		}
		comms = []*hcomm.Comm{c}
	} else {
		var err error
		if comms, err = hcomm.InitAll(o.Ranks, &hcomm.Config{Name: "dptrain", BufferSize: 8 << 20}); err != nil {
			return nil, err
		}
	}
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	world := comms[0].Size()
	if o.Batch%world != 0 {
		return nil, fmt.Errorf("global batch %d does not split evenly across %d ranks", o.Batch, world)
	}
	data := makeData(o)
	if len(data.trainY) < o.Batch {
		return nil, fmt.Errorf("%d samples are fewer than one batch of %d", len(data.trainY), o.Batch)
	}
	backend, err := newBackend()
	if err != nil {
		return nil, err
	}
	var res *Result
	err = forRanks(comms, func(ctx context.Context, c *hcomm.Comm) error {
		var w io.Writer = io.Discard
		if c.Rank() == 0 {
			w = out
		}
		r, err := train(ctx, c, backend, o, data, w)
		if c.Rank() == 0 {
			res = r
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if res == nil { // not rank 0
		return &Result{}, nil
	}
	if o.Baseline && world > 1 {
		one, err := hcomm.InitAll(1, &hcomm.Config{Name: "baseline", BufferSize: 1 << 20})
		if err != nil {
			return nil, err
		}
		r1, err := train(context.Background(), one[0], backend, o, data, io.Discard)
		one[0].Destroy()
		if err != nil {
			return nil, err
		}
		res.Baseline = r1.MeanEpoch
		fmt.Fprintf(out, "one rank: %.3f s/epoch; %d ranks: %.3f s/epoch (epochs after the first); speed-up %.2fx\n",
			r1.MeanEpoch.Seconds(), world, res.MeanEpoch.Seconds(), r1.MeanEpoch.Seconds()/res.MeanEpoch.Seconds())
	}
	return res, nil
}

// forRanks runs fn for every communicator concurrently; a failing rank
// aborts the others so that none waits for it forever.
func forRanks(comms []*hcomm.Comm, fn func(ctx context.Context, c *hcomm.Comm) error) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	var once sync.Once
	for i, c := range comms {
		wg.Go(func() {
			if errs[i] = fn(ctx, c); errs[i] != nil {
				once.Do(func() {
					cancel()
					for _, x := range comms {
						x.Abort()
					}
				})
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// --- data

// dataset holds inputs row-major (dims per sample) and their classes.
type dataset struct {
	dims           []int // of one sample
	classes        int
	trainX, testX  []float32
	trainY, testY  []int32
	sampleElements int
}

func makeData(o Options) *dataset {
	rng := rand.New(rand.NewPCG(o.Seed, 0xda7a))
	d := &dataset{}
	var gen func() ([]float32, int32)
	switch o.Model {
	case "mlp":
		d.dims, d.classes, gen = []int{2}, 3, func() ([]float32, int32) { return spiral(rng, 3) }
	default:
		d.dims, d.classes, gen = []int{seqLen, seqFeatures}, vocab-1, func() ([]float32, int32) { return sequence(rng) }
	}
	d.sampleElements = 1
	for _, n := range d.dims {
		d.sampleElements *= n
	}
	fill := func(n int) ([]float32, []int32) {
		x := make([]float32, 0, n*d.sampleElements)
		y := make([]int32, n)
		for i := range y {
			var s []float32
			s, y[i] = gen()
			x = append(x, s...)
		}
		return x, y
	}
	d.trainX, d.trainY = fill(o.Samples)
	d.testX, d.testY = fill(max(o.Samples/4, 1))
	return d
}

// spiral is a point on one of k interleaved spiral arms; the arm is its class.
func spiral(rng *rand.Rand, k int) ([]float32, int32) {
	c := rng.IntN(k)
	r := rng.Float64()
	a := float64(c)*2*math.Pi/float64(k) + 3.5*r + rng.NormFloat64()*0.15
	return []float32{float32(r * math.Cos(a)), float32(r * math.Sin(a))}, int32(c)
}

// The attention model's sequences: seqLen tokens out of vocab, each given as
// its one-hot code followed by its position's.
const (
	seqLen      = 8
	vocab       = 6
	seqFeatures = vocab + seqLen
)

// sequence is seqLen random tokens with the marker (token 0) exactly once,
// not last; the class is the token after the marker (1..vocab-1, less one).
// Neither the tokens alone nor their positions alone tell it: the model must
// relate them.
func sequence(rng *rand.Rand) ([]float32, int32) {
	x := make([]float32, seqLen*seqFeatures)
	marker := rng.IntN(seqLen - 1)
	var class int32
	for p := range seqLen {
		tok := 1 + rng.IntN(vocab-1)
		if p == marker {
			tok = 0
		}
		if p == marker+1 {
			class = int32(tok - 1)
		}
		x[p*seqFeatures+tok] = 1
		x[p*seqFeatures+vocab+p] = 1
	}
	return x, class
}

// --- models

// modelFn is the model of o, a train.ModelFn.
func modelFn(o Options, classes int) func(ctx *mlctx.Context, _ any, in []*graph.Node) []*graph.Node {
	if o.Model == "mlp" {
		return func(ctx *mlctx.Context, _ any, in []*graph.Node) []*graph.Node {
			return []*graph.Node{fnn.New(ctx, in[0], classes).NumHiddenLayers(2, 64).Activation(activations.TypeTanh).Done()}
		}
	}
	return func(ctx *mlctx.Context, _ any, in []*graph.Node) []*graph.Node {
		x := layers.DenseWithBias(ctx.In("embed"), in[0], 32) // [batch, seqLen, 32]
		a := layers.MultiHeadAttention(ctx.In("attention"), x, x, x, 4, 8).Done()
		x = layers.LayerNormalization(ctx.In("norm"), graph.Add(x, a), -1).Done()
		x = graph.Reshape(x, x.Shape().Dimensions[0], -1)
		x = activations.Relu(layers.DenseWithBias(ctx.In("dense"), x, 64))
		return []*graph.Node{layers.DenseWithBias(ctx.In("logits"), x, classes)}
	}
}

// --- training

func train(ctx context.Context, c *hcomm.Comm, backend backends.Backend, o Options, d *dataset, out io.Writer) (*Result, error) {
	world, me := c.Size(), c.Rank()
	mctx := mlctx.New()
	mctx.SetParam(optimizers.ParamLearningRate, o.LR)
	// Each rank starts from its own random values: the trainer replaces
	// them by rank 0's in the first step.
	if err := mctx.SetRNGStateFromSeed(int64(o.Seed) + int64(me)); err != nil {
		return nil, err
	}
	var opt optimizers.Interface = optimizers.Adam().Done()
	if o.Optimizer == "sgd" {
		opt = optimizers.StochasticGradientDescent().WithDecay(false)
	}
	model := modelFn(o, d.classes)
	tr, err := dp.NewTrainer(c, backend, mctx, model, losses.SparseCategoricalCrossEntropyLogits, opt,
		&dp.Config{BucketBytes: o.Bucket, Metrics: []dp.Metric{{Name: "accuracy", Fn: metrics.SparseCategoricalAccuracyGraph}}})
	if err != nil {
		return nil, err
	}
	defer tr.Close()
	eval, err := newEval(backend, mctx, model, d)
	if err != nil {
		return nil, err
	}
	defer eval.Finalize()

	per := o.Batch / world
	steps := len(d.trainY) / o.Batch
	order := make([]int, len(d.trainY))
	for i := range order {
		order[i] = i
	}
	// Every rank shuffles alike (one seed), so that a step's global batch
	// is the same whatever the number of ranks; rank r takes its r-th share.
	rng := rand.New(rand.NewPCG(o.Seed, 0x5ca1e))
	xb := make([]float32, per*d.sampleElements)
	yb := make([]int32, per)
	res := &Result{Ranks: world}
	fmt.Fprintf(out, "dptrain: %s, %d ranks, %d samples, global batch %d (%d per rank), %d steps per epoch, %s, %d epochs\n",
		o.Model, world, len(d.trainY), o.Batch, per, steps, o.Optimizer, o.Epochs)
	var total, stepTotal time.Duration
	nSteps := 0
	for ep := range o.Epochs {
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		start := time.Now()
		var loss, acc float64
		var comm, busy time.Duration
		for st := range steps {
			for k := range per {
				i := order[st*o.Batch+me*per+k]
				copy(xb[k*d.sampleElements:], d.trainX[i*d.sampleElements:(i+1)*d.sampleElements])
				yb[k] = d.trainY[i]
			}
			in := tensors.FromFlatDataAndDimensions(append([]float32(nil), xb...), append([]int{per}, d.dims...)...)
			lab := tensors.FromFlatDataAndDimensions(append([]int32(nil), yb...), per, 1)
			r, err := tr.TrainStep(ctx, nil, []*tensors.Tensor{in}, []*tensors.Tensor{lab})
			in.FinalizeAll()
			lab.FinalizeAll()
			if err != nil {
				return nil, err
			}
			loss += r.Loss
			acc += r.Metrics[0]
			comm += r.Timing.Comm
			busy += r.Timing.Total
			if ep > 0 || o.Epochs == 1 {
				stepTotal += r.Timing.Total
				nSteps++
			}
		}
		el := time.Since(start)
		total += el
		testAcc, err := eval.accuracy()
		if err != nil {
			return nil, err
		}
		res.Losses = append(res.Losses, loss/float64(steps))
		res.TrainAcc = append(res.TrainAcc, acc/float64(steps))
		res.TestAcc = append(res.TestAcc, testAcc)
		res.EpochTime = append(res.EpochTime, el)
		res.CommShare = append(res.CommShare, comm.Seconds()/busy.Seconds())
		fmt.Fprintf(out, "epoch %2d  loss %.4f  train acc %5.1f%%  test acc %5.1f%%  time %.3f s  (%.2f ms/step, %.0f%% in hcomm)\n",
			ep+1, loss/float64(steps), 100*acc/float64(steps), 100*testAcc, el.Seconds(),
			1e3*busy.Seconds()/float64(steps), 100*comm.Seconds()/busy.Seconds())
	}
	res.MeanEpoch = total / time.Duration(o.Epochs)
	if o.Epochs > 1 {
		res.MeanEpoch = (total - res.EpochTime[0]) / time.Duration(o.Epochs-1)
	}
	if nSteps > 0 {
		res.StepTime = stepTotal / time.Duration(nSteps)
	}
	res.Buckets, res.Params = tr.Buckets()
	if err := tr.CheckIdentical(ctx); err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "variables identical on all %d ranks (%d parameters averaged in %d buckets per step; compared bit for bit with rank 0's)\n",
		world, res.Params, res.Buckets)
	return res, nil
}

// evaluator computes the accuracy on the held-out set.
type evaluator struct {
	exec *mlctx.Exec
	x    *tensors.Tensor
	y    []int32
	k    int
}

func newEval(backend backends.Backend, ctx *mlctx.Context, model func(*mlctx.Context, any, []*graph.Node) []*graph.Node, d *dataset) (*evaluator, error) {
	e, err := mlctx.NewExec(backend, ctx.Reuse(), func(ctx *mlctx.Context, x *graph.Node) *graph.Node {
		return graph.ArgMax(model(ctx, nil, []*graph.Node{x})[0], -1, dtypes.Int32)
	})
	if err != nil {
		return nil, err
	}
	x := tensors.FromFlatDataAndDimensions(d.testX, append([]int{len(d.testY)}, d.dims...)...)
	return &evaluator{exec: e, x: x, y: d.testY, k: d.classes}, nil
}

func (e *evaluator) accuracy() (float64, error) {
	outs, err := e.exec.Exec(e.x)
	if err != nil {
		return 0, err
	}
	defer outs[0].FinalizeAll()
	right := 0
	err = tensors.ConstFlatData(outs[0], func(pred []int32) {
		for i, p := range pred {
			if p == e.y[i] {
				right++
			}
		}
	})
	return float64(right) / float64(len(e.y)), err
}

// Finalize releases the graph and the held-out inputs.
func (e *evaluator) Finalize() {
	e.exec.Finalize()
	e.x.FinalizeAll()
}
