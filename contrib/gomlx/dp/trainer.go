// Package dp trains GoMLX models data-parallel on hcomm: every rank holds the
// whole model, computes the loss and gradients of its shard of the global
// batch, and the ranks average the gradients with AllReduce before each
// applies them with the same optimizer, so that all ranks hold the same
// variables after every step, bit for bit.
//
// A step runs two GoMLX graphs. The gradient graph computes the model, the
// loss (with any regularisation added by train.AddLoss), the metrics and the
// gradients of the trainable variables, and packs the gradients into a few
// flat buckets of at most Config.BucketBytes. Each bucket is copied into
// hcomm's memory and its AllReduce is enqueued on a stream at once, so that
// the ranks reduce bucket k while this rank copies bucket k+1 in and bucket
// k-1 out. The update graph slices the summed buckets back into gradients,
// scales them by 1/N and hands them to the optimizer's
// UpdateGraphWithGradients. GoMLX runs a graph as a whole, so the AllReduce
// cannot begin before the backward pass ends: the overlap is between the
// buckets, not with the backward pass.
//
// Before every step the ranks all-gather a descriptor of the step — the
// model's variables and the batch's shapes — and all refuse the step, with
// a MismatchError naming the ranks on each side, when any differs: a rank
// with another model or batch size never leaves its peers waiting in an
// AllReduce of another size. Variables that appear on a rank (the model's
// on the first step, an optimizer's on the second) are broadcast from rank 0
// before they are used, so every rank starts from rank 0's values.
package dp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	mlctx "github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// DefaultBucketBytes is Config.BucketBytes when it is 0.
const DefaultBucketBytes = 256 << 10

// testHookDescriptor, when set by a test, may change a rank's step
// descriptor before the ranks compare them.
var testHookDescriptor func(rank int, d []uint64)

// Config tunes a Trainer; the zero value is usable.
type Config struct {
	// BucketBytes is the most bytes of gradients averaged by one AllReduce;
	// 0 means DefaultBucketBytes. A variable larger than it gets a bucket of
	// its own. Every rank must use the same value.
	BucketBytes int
	// Metrics are computed on each rank's shard in the gradient graph and
	// averaged across ranks, like the loss.
	Metrics []Metric
}

// Metric is a value computed per step from a rank's shard, such as
// metrics.SparseCategoricalAccuracyGraph. Fn must return a scalar (or a
// tensor, reduced to its mean).
type Metric struct {
	Name string
	Fn   func(ctx *mlctx.Context, labels, predictions []*graph.Node) *graph.Node
}

// Result is one step's outcome, the same on every rank.
type Result struct {
	Step    int64     // 1 for the first step
	Loss    float64   // mean over the ranks of their shards' mean loss: the global batch's
	Metrics []float64 // likewise, in Config.Metrics' order
	Timing  Timing
}

// Timing splits one step's wall time on this rank.
type Timing struct {
	Compute time.Duration // gradient graph: model, loss, backward, packing
	Comm    time.Duration // in hcomm: descriptor, broadcasts, bucket AllReduces and their copies
	Update  time.Duration // update graph: the optimizer
	Total   time.Duration
}

// Trainer is one rank's data-parallel trainer. TrainStep is not safe for
// concurrent use (a mutex serializes it); one Trainer per rank, each with its
// own Context. The Trainer does not own the communicator: Destroy it after
// Close.
type Trainer struct {
	comm      *hcomm.Comm
	size      int
	backend   backends.Backend
	ctx       *mlctx.Context
	modelFn   train.ModelFn
	lossFn    train.LossFn
	opt       train.OptimizeWithGradients
	graphs    string // the optimizer and the metrics, as the layout hash sees them
	cfg       Config
	mu        sync.Mutex
	specs     map[any]*specGraphs
	synced    map[*mlctx.Variable]bool // variables already taken from rank 0
	step      int64
	stream    *device.Stream
	events    []*device.Event
	buf       device.Ptr // bucket staging: every bucket of a step, then the metrics
	bufN      int64
	closed    bool
	lastGraph *layout // the layout of the last step, for Buckets
}

// specGraphs is the gradient graph of one dataset spec and the layouts of
// the shapes it was built for.
type specGraphs struct {
	grad     *mlctx.Exec
	nInputs  int
	nLabels  int
	layouts  map[string]*layout // by shape key, each with its update graph
	building bool               // PreCompile is building the graph: record its layout in pending
	pending  *layout
	err      error // a refusal raised while building, returned by PreCompile
}

// NewTrainer returns rank comm.Rank()'s trainer of the model modelFn, with
// lossFn and optimizer as in train.NewTrainer. optimizer must implement
// UpdateGraphWithGradients (SGD, Adam and the others of package optimizers
// do). ctx holds this rank's variables; its values are replaced by rank 0's
// in the first step. Every rank must call NewTrainer and TrainStep alike.
func NewTrainer(comm *hcomm.Comm, backend backends.Backend, ctx *mlctx.Context, modelFn train.ModelFn,
	lossFn train.LossFn, optimizer optimizers.Interface, cfg *Config) (*Trainer, error) {
	switch {
	case comm == nil:
		return nil, errors.New("dp: NewTrainer: nil communicator")
	case backend == nil || ctx == nil || modelFn == nil:
		return nil, fmt.Errorf("dp: NewTrainer (rank %d): backend, ctx and modelFn are required", comm.Rank())
	}
	opt, ok := optimizer.(train.OptimizeWithGradients)
	if !ok {
		return nil, fmt.Errorf("dp: NewTrainer (rank %d): optimizer %T does not implement UpdateGraphWithGradients", comm.Rank(), optimizer)
	}
	t := &Trainer{comm: comm, size: comm.Size(), backend: backend, ctx: ctx, modelFn: modelFn, lossFn: lossFn,
		opt: opt, specs: map[any]*specGraphs{}, synced: map[*mlctx.Variable]bool{}}
	if cfg != nil {
		t.cfg = *cfg
	}
	names := make([]string, len(t.cfg.Metrics))
	for i, m := range t.cfg.Metrics {
		names[i] = m.Name
	}
	// What the ranks must share besides the variables: it enters the
	// layout's hash.
	t.graphs = fmt.Sprintf("optimizer %T; metrics %q", optimizer, names)
	if t.cfg.BucketBytes == 0 {
		t.cfg.BucketBytes = DefaultBucketBytes
	}
	if t.cfg.BucketBytes < 0 {
		return nil, fmt.Errorf("dp: NewTrainer (rank %d): BucketBytes %d is negative", comm.Rank(), t.cfg.BucketBytes)
	}
	for i, m := range t.cfg.Metrics {
		if m.Fn == nil {
			return nil, fmt.Errorf("dp: NewTrainer (rank %d): metric %d (%q) has no Fn", comm.Rank(), i, m.Name)
		}
	}
	// As train.NewTrainer: the learning rate is taken from the
	// hyperparameters each time a trainer starts.
	if err := ctx.DeleteVariable(ctx.In(optimizers.Scope).Scope(), optimizers.ParamLearningRate); err != nil {
		return nil, fmt.Errorf("dp: NewTrainer (rank %d): %w", comm.Rank(), err)
	}
	s, err := comm.Device().CreateStream()
	if err != nil {
		return nil, fmt.Errorf("dp: NewTrainer (rank %d): %w", comm.Rank(), err)
	}
	t.stream = s
	return t, nil
}

// Rank is the trainer's rank.
func (t *Trainer) Rank() int { return t.comm.Rank() }

// Size is the number of ranks.
func (t *Trainer) Size() int { return t.size }

// Buckets is the number of AllReduces per step and the elements in all of
// them, as of the last step (0, 0 before the first).
func (t *Trainer) Buckets() (buckets int, elements int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.lastGraph == nil {
		return 0, 0
	}
	return len(t.lastGraph.buckets), t.lastGraph.params
}

// Close releases the graphs, the stream and the staging memory. It is
// idempotent; the communicator is left alone.
func (t *Trainer) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	t.closed = true
	for _, sg := range t.specs {
		sg.grad.Finalize()
		for _, l := range sg.layouts {
			l.update.Finalize() // a layout is kept only with its update graph
		}
	}
	t.specs = nil
	var errs []error
	for _, e := range t.events {
		errs = append(errs, e.Destroy())
	}
	errs = append(errs, t.stream.Destroy())
	if t.buf != 0 {
		errs = append(errs, t.comm.Device().Free(t.buf))
	}
	return errors.Join(errs...)
}

// TrainStep trains one step on this rank's shard: inputs and labels as
// train.Trainer.TrainStep takes them (spec, often nil, selects the graph;
// it must be usable as a map key). Every rank must pass a shard of the same
// shapes. It returns the averaged loss and metrics, the same on every rank.
//
// When the ranks disagree on the model or the batch, every rank returns a
// *MismatchError and the variables are untouched. An error after the ranks
// agreed (an AllReduce failed, ctx ended) leaves the communicator out of
// step with its peers: Abort it.
func (t *Trainer) TrainStep(ctx context.Context, spec any, inputs, labels []*tensors.Tensor) (*Result, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, fmt.Errorf("dp: TrainStep (rank %d): trainer closed", t.Rank())
	}
	if ctx == nil {
		return nil, fmt.Errorf("dp: TrainStep (rank %d): nil context", t.Rank())
	}
	start := time.Now()
	t.step++
	res := &Result{Step: t.step}
	fail := func(err error) (*Result, error) {
		return nil, fmt.Errorf("dp: step %d (rank %d): %w", res.Step, t.Rank(), err)
	}

	// Build (or find) the graph for these shapes; a rank that cannot still
	// takes part in the agreement, so that its peers learn it and stop.
	var d [nWords]uint64
	d[wStep] = uint64(t.step)
	lay, buildErr := t.prepare(spec, inputs, labels)
	var newVars []*mlctx.Variable
	var packed []byte // the new variables' values: rank 0's to send, the others' to receive
	if buildErr == nil {
		d[wModel], d[wParams] = lay.hash, uint64(lay.params)
		d[wBatch], d[wBatchSize] = batchHash(spec, inputs, labels)
		newVars = t.unsynced()
		d[wNewVars], d[wNewCount] = varsHash(newVars), uint64(len(newVars))
		packed, buildErr = t.pack(newVars)
	}
	if buildErr != nil {
		d[wStatus] = statusFailed
	}
	if testHookDescriptor != nil {
		testHookDescriptor(t.Rank(), d[:])
	}
	tc := time.Now()
	if err := t.agree(ctx, d); err != nil {
		t.step--
		if buildErr != nil {
			return fail(buildErr)
		}
		return nil, err
	}
	if err := t.broadcast(ctx, newVars, packed); err != nil {
		return fail(err)
	}
	res.Timing.Comm += time.Since(tc)

	// The gradient graph.
	tg := time.Now()
	args := make([]any, 0, len(inputs)+len(labels))
	for _, x := range inputs {
		args = append(args, x)
	}
	for _, x := range labels {
		args = append(args, x)
	}
	outs, err := t.specs[spec].grad.Exec(args...)
	if err != nil {
		return fail(err)
	}
	res.Timing.Compute = time.Since(tg)
	defer func() {
		for _, o := range outs {
			o.FinalizeAll()
		}
	}()
	if len(outs) != 1+len(lay.buckets) {
		return fail(fmt.Errorf("the gradient graph returned %d outputs, want %d", len(outs), 1+len(lay.buckets)))
	}

	// Average the buckets and the metrics.
	tc = time.Now()
	summed, stats, err := t.allReduce(ctx, lay, outs)
	res.Timing.Comm += time.Since(tc)
	if err != nil {
		return fail(err)
	}
	defer func() {
		for _, b := range summed {
			b.FinalizeAll()
		}
	}()
	res.Loss = stats[0] / float64(t.size)
	for _, m := range stats[1:] {
		res.Metrics = append(res.Metrics, m/float64(t.size))
	}

	// The update graph.
	tu := time.Now()
	uargs := make([]any, len(summed))
	for i, b := range summed {
		uargs[i] = b
	}
	if _, err := lay.update.Exec(uargs...); err != nil {
		return fail(err)
	}
	res.Timing.Update = time.Since(tu)
	res.Timing.Total = time.Since(start)
	t.lastGraph = lay
	return res, nil
}
