package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/hcomm-dev/hcomm/examples/internal/mlp"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
	"github.com/hcomm-dev/hcomm/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

func small() Options {
	o := defaults()
	o.Ranks, o.Epochs, o.Samples, o.Features, o.Classes, o.Hidden, o.Batch, o.LR = 3, 4, 1536, 8, 4, 16, 16, 0.05
	return o
}

// Training learns (the loss falls, the test accuracy is well above chance),
// every rank ends with bit-identical weights, and the one-rank baseline runs.
func TestTrainLearns(t *testing.T) {
	var out bytes.Buffer
	res, err := Run(small(), &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !res.Identical || res.WorldRanks != 3 {
		t.Errorf("identical %v, ranks %d", res.Identical, res.WorldRanks)
	}
	if len(res.Losses) != 4 || !(res.Losses[3] < res.Losses[0]) {
		t.Errorf("losses %v do not fall", res.Losses)
	}
	if acc := res.Accuracy[len(res.Accuracy)-1]; acc < 0.6 {
		t.Errorf("final test accuracy %.2f; chance is 0.25", acc)
	}
	if res.Baseline <= 0 || res.MeanEpoch <= 0 {
		t.Errorf("baseline %v, mean epoch %v", res.Baseline, res.MeanEpoch)
	}
	for _, s := range []string{"train: 3 ranks, 1536 samples (512 per rank)", "epoch  4  loss", "weights identical on all 3 ranks", "speed-up"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("output lacks %q:\n%s", s, out.String())
		}
	}
}

// Overlapping the AllReduce with the backward pass changes when the
// gradients move, not what they are: both modes learn the same bits.
func TestOverlapChangesNothingButTime(t *testing.T) {
	o := small()
	o.Epochs, o.Baseline = 2, false
	a, err := Run(o, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	o.Overlap = false
	b, err := Run(o, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range a.Losses {
		if a.Losses[i] != b.Losses[i] || a.Accuracy[i] != b.Accuracy[i] {
			t.Errorf("epoch %d: overlap loss %v acc %v, without %v %v", i+1, a.Losses[i], a.Accuracy[i], b.Losses[i], b.Accuracy[i])
		}
	}
}

func TestBadOptions(t *testing.T) {
	o := small()
	o.LR = 0
	if _, err := Run(o, &bytes.Buffer{}); err == nil {
		t.Error("a zero learning rate was accepted")
	}
	o = small()
	o.Samples = 10
	if _, err := Run(o, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "too few") {
		t.Errorf("10 samples for 3 ranks of batch 16: err = %v", err)
	}
}

// Training runs the same over every transport, ranks as goroutines and as
// processes joined as under a launcher: every rank ends with bit-identical
// weights (train checks them against rank 0's) and the loss falls.
func TestTrainEveryTransport(t *testing.T) {
	o := small()
	o.Epochs, o.Baseline = 2, false
	for _, tr := range hcommtest.Transports() {
		t.Run(tr.String(), func(t *testing.T) {
			if tr.Processes && testing.Short() {
				t.Skip("-short: no processes")
			}
			hcommtest.Options{Config: &hcomm.Config{Name: "train", BufferSize: 8 << 20}}.Run(t, 3, tr, func(t testing.TB, c *hcomm.Comm) {
				res, err := train(context.Background(), c, o, mlp.MakeData(o.Seed, o.Samples, o.Features, o.Classes), &bytes.Buffer{})
				if err != nil {
					t.Fatal(err)
				}
				if !res.Identical || res.WorldRanks != 3 || len(res.Losses) != 2 || !(res.Losses[1] < res.Losses[0]) {
					t.Errorf("identical %v, ranks %d, losses %v", res.Identical, res.WorldRanks, res.Losses)
				}
			})
		})
	}
}
