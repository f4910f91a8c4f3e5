package dp

import (
	"fmt"
	"hash/fnv"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	mlctx "github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// layout is what one gradient graph produces and its update graph consumes:
// the trainable variables whose gradients it computes, the state variables
// (non-trainable, floating point) it changes, and how both are packed into
// buckets, one AllReduce each. Every rank builds the same layout from the
// same model; its hash is what the ranks compare before they exchange
// buckets.
type layout struct {
	vars      []*mlctx.Variable // trainable, in the Context's order: the gradients
	state     []*mlctx.Variable // non-trainable floats the gradient graph changes: averaged
	buckets   []bucket
	lossDType dtypes.DType
	params    int64  // elements in all buckets
	hash      uint64 // of everything above but the values
	update    *mlctx.Exec
}

// bucket is one flat vector of one dtype: the gradients (or state values) of
// consecutive items, concatenated.
type bucket struct {
	dtype dtypes.DType
	items []item
	n     int // elements
}

// item is one variable's place in a bucket.
type item struct {
	index int  // into layout.vars, or layout.state when state
	state bool // a state variable's new value, not a gradient
	shape shapes.Shape
	off   int // first element in the bucket
}

// wireType is the hcomm type a bucket of dt travels as.
func wireType(dt dtypes.DType) (hcomm.DataType, error) {
	switch dt {
	case dtypes.Float32:
		return hcomm.Float32, nil
	case dtypes.Float64:
		return hcomm.Float64, nil
	case dtypes.Float16:
		return hcomm.Float16, nil
	case dtypes.BFloat16:
		return hcomm.BFloat16, nil
	}
	return 0, fmt.Errorf("dtype %s cannot be averaged (float32, float64, float16 and bfloat16 can)", dt)
}

// newLayout packs vars then state into buckets of at most bucketBytes each
// (a larger variable gets a bucket of its own); a bucket holds one dtype.
// Gradients come in the Context's order, so that the first bucket holds the
// first layers: the order the optimizer applies them in.
func newLayout(vars, state []*mlctx.Variable, bucketBytes int, lossDType dtypes.DType, graphs string) (*layout, error) {
	l := &layout{vars: vars, state: state, lossDType: lossDType}
	h := fnv.New64a()
	fmt.Fprintf(h, "%s; loss %s; bucket %d\n", graphs, lossDType, bucketBytes)
	open := map[dtypes.DType]int{} // dtype -> index of its bucket still filling
	add := func(v *mlctx.Variable, index int, state bool) error {
		dt := v.DType()
		if _, err := wireType(dt); err != nil {
			return fmt.Errorf("variable %q: %w", v.ScopeAndName(), err)
		}
		n := v.Shape().Size()
		fmt.Fprintf(h, "%v %s %s\n", state, v.ScopeAndName(), v.Shape())
		bi, ok := open[dt]
		if !ok || (l.buckets[bi].n+n)*dt.Size() > bucketBytes {
			l.buckets = append(l.buckets, bucket{dtype: dt})
			bi = len(l.buckets) - 1
			open[dt] = bi
		}
		b := &l.buckets[bi]
		b.items = append(b.items, item{index: index, state: state, shape: v.Shape(), off: b.n})
		b.n += n
		l.params += int64(n)
		return nil
	}
	for i, v := range vars {
		if err := add(v, i, false); err != nil {
			return nil, err
		}
	}
	for i, v := range state {
		if err := add(v, i, true); err != nil {
			return nil, err
		}
	}
	for _, b := range l.buckets {
		fmt.Fprintf(h, "bucket %s %d\n", b.dtype, b.n)
	}
	l.hash = h.Sum64()
	return l, nil
}
