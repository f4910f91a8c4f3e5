package dp

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"strings"

	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	mlctx "github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

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
	if ctx == nil {
		return fmt.Errorf("dp: CheckIdentical (rank %d): nil context", t.Rank())
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
