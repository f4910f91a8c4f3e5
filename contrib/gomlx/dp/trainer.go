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
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	mlctx "github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
	"github.com/hcomm-dev/hcomm/collectives"
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

// prepare returns the layout of the gradient graph for these shapes,
// building and compiling it (and initializing any new variables) the first
// time they are seen.
func (t *Trainer) prepare(spec any, inputs, labels []*tensors.Tensor) (lay *layout, err error) {
	if len(inputs) == 0 {
		return nil, errors.New("no inputs: at least one is required")
	}
	if spec != nil && !reflect.TypeOf(spec).Comparable() {
		return nil, fmt.Errorf("spec of type %T cannot be a map key", spec)
	}
	for i, x := range append(append([]*tensors.Tensor(nil), inputs...), labels...) {
		if x == nil {
			return nil, fmt.Errorf("input or label %d is nil", i)
		}
	}
	sg := t.specs[spec]
	if sg == nil {
		sg = &specGraphs{nInputs: len(inputs), nLabels: len(labels), layouts: map[string]*layout{}}
		sg.grad, err = mlctx.NewExec(t.backend, t.ctx, t.gradGraph(sg, spec))
		if err != nil {
			return nil, err
		}
		t.specs[spec] = sg
	}
	if len(inputs) != sg.nInputs || len(labels) != sg.nLabels {
		return nil, fmt.Errorf("%d inputs and %d labels for spec %v, which had %d and %d", len(inputs), len(labels), spec, sg.nInputs, sg.nLabels)
	}
	key := shapeKey(inputs, labels)
	if lay := sg.layouts[key]; lay != nil {
		return lay, nil
	}
	args := make([]any, 0, len(inputs)+len(labels))
	for _, x := range inputs {
		args = append(args, x)
	}
	for _, x := range labels {
		args = append(args, x)
	}
	sg.building, sg.pending, sg.err = true, nil, nil
	err = sg.grad.PreCompile(args...)
	lay, sg.building, sg.pending = sg.pending, false, nil
	if sg.err != nil {
		return nil, sg.err
	}
	if err != nil {
		return nil, fmt.Errorf("building the gradient graph: %w", err)
	}
	if lay == nil {
		return nil, errors.New("the gradient graph was compiled without recording its layout")
	}
	if err := t.ctx.InitializeVariables(t.backend, nil); err != nil {
		return nil, err
	}
	lay.update, err = mlctx.NewExec(t.backend, t.ctx, t.updateGraph(lay))
	if err != nil {
		return nil, err
	}
	sg.layouts[key] = lay
	return lay, nil
}

// gradGraph is the gradient graph function of spec: outputs the loss and
// the metrics as one float64 vector, then the buckets. It records the
// layout for the shapes being built.
func (t *Trainer) gradGraph(sg *specGraphs, spec any) func(*mlctx.Context, []*graph.Node) []*graph.Node {
	return func(ctx *mlctx.Context, nodes []*graph.Node) []*graph.Node {
		g := nodes[0].Graph()
		ctx.SetTraining(g, true)
		inputs, labels := nodes[:sg.nInputs], nodes[sg.nInputs:]
		predictions := t.modelFn(ctx, spec, inputs)
		if t.lossFn != nil {
			loss := t.lossFn(labels, predictions)
			if !loss.Shape().IsScalar() {
				loss = graph.ReduceAllMean(loss)
			}
			train.SetLossNoRegularization(ctx, loss)
			train.AddLoss(ctx, loss)
		}
		loss := train.GetLosses(ctx, g)
		if loss == nil {
			panic(errors.New("dp: no loss: lossFn is nil and the model added none with train.AddLoss"))
		}
		stats := []*graph.Node{graph.ConvertDType(loss, dtypes.Float64)}
		for _, m := range t.cfg.Metrics {
			v := m.Fn(ctx, labels, predictions)
			if !v.Shape().IsScalar() {
				v = graph.ReduceAllMean(v)
			}
			stats = append(stats, graph.ConvertDType(v, dtypes.Float64))
		}
		var vars, state []*mlctx.Variable
		for v := range ctx.IterVariables() {
			if v.Trainable && v.InUseByGraph(g) {
				vars = append(vars, v)
			}
		}
		grads := ctx.BuildTrainableVariablesGradientsGraph(loss)
		if len(grads) != len(vars) {
			panic(fmt.Errorf("dp: %d gradients for %d trainable variables", len(grads), len(vars)))
		}
		for v := range ctx.IterVariables() {
			if !v.Trainable && v.ChangedInGraph(g) && v.DType().IsFloat() {
				state = append(state, v)
			}
		}
		lay, err := newLayout(vars, state, t.cfg.BucketBytes, loss.DType(), t.graphs)
		if err != nil {
			sg.err = err
			panic(err)
		}
		outs := []*graph.Node{graph.Stack(stats, 0)}
		for _, b := range lay.buckets {
			parts := make([]*graph.Node, len(b.items))
			for i, it := range b.items {
				x := grads[it.index]
				if it.state {
					x = state[it.index].ValueGraph(g)
				}
				parts[i] = graph.Reshape(x, -1)
			}
			if len(parts) == 1 {
				outs = append(outs, parts[0])
			} else {
				outs = append(outs, graph.Concatenate(parts, 0))
			}
		}
		if sg.building {
			sg.pending = lay
		}
		return outs
	}
}

// updateGraph is the update graph of lay: it takes the summed buckets,
// scales them by 1/N, sets the state variables and applies the gradients
// with the optimizer.
func (t *Trainer) updateGraph(lay *layout) func(*mlctx.Context, []*graph.Node) {
	n := t.size
	return func(ctx *mlctx.Context, buckets []*graph.Node) {
		g := buckets[0].Graph()
		grads := make([]*graph.Node, len(lay.vars))
		for bi, b := range lay.buckets {
			x := buckets[bi]
			if n > 1 {
				x = graph.MulScalar(x, 1/float64(n))
			}
			for _, it := range b.items {
				size := it.shape.Size()
				part := x
				if len(b.items) > 1 {
					part = graph.Slice(x, graph.AxisRange(it.off, it.off+size))
				}
				part = graph.Reshape(part, it.shape.Dimensions...)
				if it.state {
					lay.state[it.index].SetValueGraph(part)
				} else {
					grads[it.index] = part
				}
			}
		}
		// The optimizer applies gradients to the trainable variables the
		// graph uses, in the Context's order: exactly lay.vars.
		for _, v := range lay.vars {
			v.ValueGraph(g)
		}
		t.opt.UpdateGraphWithGradients(ctx, grads, lay.lossDType)
	}
}

// allReduce sums the buckets (outs[1:]) and the metrics (outs[0]) across
// ranks: each bucket is copied into the staging memory and its AllReduce
// enqueued at once, so that the ranks reduce it while the next is copied;
// then each summed bucket is copied out as soon as its AllReduce is done.
func (t *Trainer) allReduce(ctx context.Context, lay *layout, outs []*tensors.Tensor) ([]*tensors.Tensor, []float64, error) {
	dev := t.comm.Device()
	nb := len(lay.buckets)
	offs := make([]int64, nb+1)
	for i, b := range lay.buckets {
		offs[i+1] = offs[i] + int64(b.n*b.dtype.Size())
		offs[i+1] = (offs[i+1] + 63) &^ 63
	}
	nStats := outs[0].Shape().Size()
	need := offs[nb] + int64(8*nStats)
	if need > t.bufN {
		if t.buf != 0 {
			if err := dev.Free(t.buf); err != nil {
				return nil, nil, err
			}
			t.buf, t.bufN = 0, 0
		}
		p, err := dev.Malloc(need)
		if err != nil {
			return nil, nil, err
		}
		t.buf, t.bufN = p, need
	}
	for len(t.events) < nb+1 {
		ev, err := dev.CreateEventWithFlags(device.EventDisableTiming)
		if err != nil {
			return nil, nil, err
		}
		t.events = append(t.events, ev)
	}
	summed := make([]*tensors.Tensor, 0, nb)
	fail := func(err error) ([]*tensors.Tensor, []float64, error) {
		// Nothing may be left running against the staging memory.
		_ = t.stream.Synchronize(ctx)
		for _, x := range summed {
			x.FinalizeAll()
		}
		return nil, nil, err
	}
	// enqueue copies x into the staging memory at off and enqueues its AllReduce.
	enqueue := func(i int, x *tensors.Tensor, off int64, count int, dt hcomm.DataType) error {
		var cerr error
		if err := x.ConstBytes(func(data []byte) { cerr = dev.MemcpyHtoD(t.buf.Add(off), data) }); err != nil {
			return err
		}
		if cerr != nil {
			return cerr
		}
		p := t.buf.Add(off)
		if err := collectives.AllReduce(p, p, int64(count), dt, hcomm.Sum, t.comm, t.stream, nil); err != nil {
			return err
		}
		return t.events[i].Record(t.stream)
	}
	if err := enqueue(nb, outs[0], offs[nb], nStats, hcomm.Float64); err != nil {
		return fail(err)
	}
	for i, b := range lay.buckets {
		dt, err := wireType(b.dtype)
		if err != nil {
			return fail(err)
		}
		if err := enqueue(i, outs[1+i], offs[i], b.n, dt); err != nil {
			return fail(err)
		}
	}
	if err := t.events[nb].Synchronize(ctx); err != nil {
		return fail(err)
	}
	raw := make([]byte, 8*nStats)
	if err := dev.MemcpyDtoH(raw, t.buf.Add(offs[nb])); err != nil {
		return fail(err)
	}
	stats := make([]float64, nStats)
	for i := range stats {
		stats[i] = math.Float64frombits(binary.NativeEndian.Uint64(raw[8*i:]))
	}
	for i, b := range lay.buckets {
		if err := t.events[i].Synchronize(ctx); err != nil {
			return fail(err)
		}
		x := tensors.FromShape(shapes.Make(b.dtype, b.n))
		var cerr error
		if err := x.MutableBytes(func(data []byte) { cerr = dev.MemcpyDtoH(data, t.buf.Add(offs[i])) }); err != nil {
			return fail(err)
		}
		summed = append(summed, x)
		if cerr != nil {
			return fail(cerr)
		}
	}
	// An event completes when its task has run, failed or not: a failed
	// AllReduce (a peer lost, a call its peers did not make alike) shows
	// only in the stream's error, and its bucket holds no sum.
	if err := t.stream.Synchronize(ctx); err != nil {
		return fail(err)
	}
	return summed, stats, nil
}

// unsynced returns the variables rank 0 has not yet given this rank, in the
// Context's order.
func (t *Trainer) unsynced() []*mlctx.Variable {
	var vs []*mlctx.Variable
	for v := range t.ctx.IterVariables() {
		if !t.synced[v] {
			vs = append(vs, v)
		}
	}
	return vs
}

// pack returns room for vs's values, filled with this rank's on rank 0 (the
// values it will broadcast): it fails before the ranks agree, never during
// the broadcast.
func (t *Trainer) pack(vs []*mlctx.Variable) ([]byte, error) {
	total := 0
	for _, v := range vs {
		total += int(v.Shape().Memory())
	}
	buf := make([]byte, total)
	if t.Rank() != 0 {
		return buf, nil
	}
	off := 0
	for _, v := range vs {
		x, err := v.Value()
		if err != nil {
			return nil, fmt.Errorf("variable %q: %w", v.ScopeAndName(), err)
		}
		if err := x.ConstBytes(func(data []byte) { off += copy(buf[off:], data) }); err != nil {
			return nil, fmt.Errorf("variable %q: %w", v.ScopeAndName(), err)
		}
	}
	if off != total {
		return nil, fmt.Errorf("the values of %d variables hold %d bytes, their shapes %d", len(vs), off, total)
	}
	return buf, nil
}

// broadcast replaces vs's values by rank 0's, packed in buf, in one
// Broadcast.
func (t *Trainer) broadcast(ctx context.Context, vs []*mlctx.Variable, buf []byte) error {
	if len(vs) == 0 {
		return nil
	}
	if t.size > 1 && len(buf) > 0 {
		if err := collectives.BroadcastSlice(ctx, t.comm, buf, 0, nil); err != nil {
			return fmt.Errorf("broadcasting %d variables from rank 0: %w", len(vs), err)
		}
	}
	off := 0
	for _, v := range vs {
		n := int(v.Shape().Memory())
		if t.Rank() != 0 {
			x := tensors.FromShape(v.Shape())
			if n > 0 {
				if err := x.MutableBytes(func(data []byte) { copy(data, buf[off:off+n]) }); err != nil {
					return err
				}
			}
			if err := v.SetValue(x); err != nil {
				return fmt.Errorf("variable %q: %w", v.ScopeAndName(), err)
			}
		}
		off += n
		t.synced[v] = true
	}
	return nil
}

// shapeKey names the shapes and dtypes of a step's inputs and labels.
func shapeKey(inputs, labels []*tensors.Tensor) string {
	var b strings.Builder
	for _, x := range inputs {
		b.WriteString(x.Shape().String())
		b.WriteByte(';')
	}
	b.WriteByte('|')
	for _, x := range labels {
		b.WriteString(x.Shape().String())
		b.WriteByte(';')
	}
	return b.String()
}

// batchHash hashes the spec and shapes of a step's batch and returns it
// with the batch size (inputs[0]'s first dimension, 1 for a scalar).
func batchHash(spec any, inputs, labels []*tensors.Tensor) (uint64, uint64) {
	h := fnv.New64a()
	fmt.Fprintf(h, "%v|%s", spec, shapeKey(inputs, labels))
	size := 1
	if s := inputs[0].Shape(); s.Rank() > 0 {
		size = s.Dimensions[0]
	}
	return h.Sum64(), uint64(size)
}

// varsHash hashes the names, shapes and dtypes of vs, in order: the order
// the broadcast packs them in.
func varsHash(vs []*mlctx.Variable) uint64 {
	h := fnv.New64a()
	for _, v := range vs {
		fmt.Fprintln(h, v.ScopeAndName(), v.Shape())
	}
	return h.Sum64()
}

// CheckIdentical returns nil when every rank's variables hash the same as
// rank 0's (names, shapes and values, bit for bit), else an error naming the
// ranks that differ. Every rank must call it; all reach the same verdict.
func (t *Trainer) CheckIdentical(ctx context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return fmt.Errorf("dp: CheckIdentical (rank %d): trainer closed", t.Rank())
	}
	h := fnv.New64a()
	n := uint64(0)
	for v := range t.ctx.IterVariables() {
		x, err := v.Value()
		if err != nil {
			return fmt.Errorf("dp: CheckIdentical (rank %d): variable %q: %w", t.Rank(), v.ScopeAndName(), err)
		}
		fmt.Fprintln(h, v.ScopeAndName(), v.Shape())
		if err := x.ConstBytes(func(b []byte) { h.Write(b) }); err != nil {
			return fmt.Errorf("dp: CheckIdentical (rank %d): variable %q: %w", t.Rank(), v.ScopeAndName(), err)
		}
		n++
	}
	all := make([]uint64, 2*t.size)
	if err := collectives.AllGatherSlice(ctx, t.comm, []uint64{h.Sum64(), n}, all, nil); err != nil {
		return fmt.Errorf("dp: CheckIdentical (rank %d): %w", t.Rank(), err)
	}
	var differ []int
	for r := 1; r < t.size; r++ {
		if all[2*r] != all[0] || all[2*r+1] != all[1] {
			differ = append(differ, r)
		}
	}
	if len(differ) > 0 {
		return fmt.Errorf("dp: the variables of %s differ from rank 0's", rankList(differ))
	}
	return nil
}
