package dp

import (
	"context"
	"fmt"
	"strings"

	"github.com/hcomm-dev/hcomm/collectives"
)

// The words of a rank's step descriptor, exchanged with AllGather before the
// ranks exchange anything whose size depends on them.
const (
	wStatus    = iota // statusOK, or statusFailed when this rank cannot take the step
	wStep             // the trainer's step number
	wModel            // layout hash: variables, shapes, dtypes, buckets, optimizer
	wParams           // elements averaged per step
	wBatch            // hash of the input and label shapes and dtypes
	wBatchSize        // inputs[0]'s first dimension
	wNewVars          // hash of the variables rank 0 is about to broadcast
	wNewCount         // how many there are
	nWords
)

const (
	statusOK = iota
	statusFailed
)

// agree all-gathers this rank's descriptor d and returns nil when every rank
// sent the same; otherwise an error naming the ranks on each side of the
// first field that differs (or the ranks that failed). Every rank reaches
// the same verdict, so either all go on or none does.
func (t *Trainer) agree(ctx context.Context, d [nWords]uint64) error {
	all := make([]uint64, nWords*t.size)
	if err := collectives.AllGatherSlice(ctx, t.comm, d[:], all, nil); err != nil {
		return fmt.Errorf("dp: step %d: exchanging the step descriptors: %w", d[wStep], err)
	}
	word := func(r, w int) uint64 { return all[r*nWords+w] }
	var failed []int
	for r := range t.size {
		if word(r, wStatus) != statusOK {
			failed = append(failed, r)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("dp: step %d: %s could not build the step (see %s own error); no rank takes it",
			d[wStep], rankList(failed), map[bool]string{true: "its", false: "their"}[len(failed) == 1])
	}
	type field struct {
		w       int
		what    string
		explain func(r int) string
	}
	fields := []field{
		{wStep, "are at different steps", func(r int) string { return fmt.Sprintf("step %d", word(r, wStep)) }},
		{wModel, "have different models (trainable variables, their shapes and dtypes, the optimizer, the metrics or the bucket size)", func(r int) string {
			return fmt.Sprintf("model %016x with %d parameters", word(r, wModel), word(r, wParams))
		}},
		{wBatchSize, "have different batch sizes", func(r int) string { return fmt.Sprintf("batch size %d", int64(word(r, wBatchSize))) }},
		{wBatch, "have batches of different shapes or dtypes", func(r int) string { return fmt.Sprintf("batch shapes %016x", word(r, wBatch)) }},
		{wNewVars, "have different variables to take from rank 0", func(r int) string {
			return fmt.Sprintf("%d new variables (%016x)", word(r, wNewCount), word(r, wNewVars))
		}},
	}
	for _, f := range fields {
		groups := map[uint64][]int{}
		var order []uint64
		for r := range t.size {
			v := word(r, f.w)
			if _, ok := groups[v]; !ok {
				order = append(order, v)
			}
			groups[v] = append(groups[v], r)
		}
		if len(order) == 1 {
			continue
		}
		parts := make([]string, len(order))
		ranks := make([][]int, len(order))
		for i, v := range order {
			ranks[i] = groups[v]
			parts[i] = fmt.Sprintf("%s: %s", rankList(ranks[i]), f.explain(ranks[i][0]))
		}
		return &MismatchError{Step: int64(d[wStep]), What: f.what, Groups: ranks, Detail: strings.Join(parts, "; ")}
	}
	return nil
}

// MismatchError is TrainStep's refusal when the ranks do not agree on the
// model or the batch: every rank returns it, and no gradient is exchanged.
type MismatchError struct {
	Step   int64
	What   string  // "have different batch sizes", ...
	Groups [][]int // the ranks, grouped by what they hold, rank 0's group first
	Detail string  // each group and what it holds
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("dp: step %d: the ranks %s: %s", e.Step, e.What, e.Detail)
}

// rankList writes "rank 3" or "ranks 0, 1, 2".
func rankList(rs []int) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = fmt.Sprint(r)
	}
	if len(rs) == 1 {
		return "rank " + s[0]
	}
	return "ranks " + strings.Join(s, ", ")
}
