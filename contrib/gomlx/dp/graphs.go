package dp

import (
	"errors"
	"fmt"
	"reflect"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	mlctx "github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train"
)

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
