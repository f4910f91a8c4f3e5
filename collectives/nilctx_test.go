package collectives_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// TestSliceNilContext: the slice calls refuse a nil context with ErrPara
// naming the call before they touch a channel — one rank calling alone
// proves nothing was sent or awaited.
func TestSliceNilContext(t *testing.T) {
	c := initAll(t, 2, nil)[0]
	var nilCtx context.Context
	v := make([]float32, 8)
	w := make([]float32, 16)
	for _, k := range []struct {
		op   string
		call func() error
	}{
		{"AllReduce", func() error { return collectives.AllReduceSlice(nilCtx, c, v, v, hcomm.Sum, nil) }},
		{"Broadcast", func() error { return collectives.BroadcastSlice(nilCtx, c, v, 0, nil) }},
		{"AllGather", func() error { return collectives.AllGatherSlice(nilCtx, c, v, w, nil) }},
		{"ReduceScatter", func() error { return collectives.ReduceScatterSlice(nilCtx, c, w, v, hcomm.Sum, nil) }},
		{"Reduce", func() error { return collectives.ReduceSlice(nilCtx, c, v, v, hcomm.Sum, 0, nil) }},
		{"AlltoAll", func() error { return collectives.AlltoAllSlice(nilCtx, c, w, w, nil) }},
		{"Barrier", func() error { return collectives.BarrierContext(nilCtx, c) }},
	} {
		err := k.call()
		var he *hcomm.Error
		if !errors.As(err, &he) || he.Op != k.op || he.Code != hcomm.ErrPara || !strings.Contains(err.Error(), "nil context") {
			t.Errorf("%s(nil context): %v, want an ErrPara *hcomm.Error of %s naming the nil context", k.op, err, k.op)
		}
	}
}
