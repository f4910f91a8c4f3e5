// Command train is data-parallel training in pure Go on hcomm: a small MLP
// classifier (examples/internal/mlp) learns a dataset generated in code;
// each rank trains on its shard, and the gradients are averaged with
// AllReduce while the backward pass goes on — each layer's gradient is enqueued on a stream as soon as it
// is ready (copy to the device, AllReduce, copy back, record an event), and
// the update waits only for those events. At the end every rank checks that
// all ranks hold bit-identical weights, and rank 0 compares the time per
// epoch with one rank training on the whole dataset alone.
//
//	go run ./examples/train                      # 2-4 ranks (one per core) in this process
//	go run ./examples/train -ranks 2 -epochs 20
//	hcomm run -n 4 go run ./examples/train       # one rank per process
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
	"unsafe"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/examples/internal/mlp"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// Options configure a training run.
type Options struct {
	Ranks    int     // ranks in this process (ignored under a launcher)
	Epochs   int     // passes over the training set
	Samples  int     // training samples in all (split across ranks)
	Features int     // input dimension
	Classes  int     // output classes
	Hidden   int     // width of the two hidden layers
	Batch    int     // samples per rank per step
	LR       float64 // learning rate of plain SGD
	Seed     uint64
	Overlap  bool // AllReduce each layer during the backward pass (else after it)
	Baseline bool // also train on one rank and report the speed-up
}

func defaults() Options {
	// As many ranks as cores (at least 2, at most 4): ranks in one process
	// compute in parallel only on cores of their own.
	return Options{Ranks: min(4, max(2, runtime.NumCPU())), Epochs: 8, Samples: 8192, Features: 32, Classes: 8, Hidden: 128, Batch: 32,
		LR: 0.05, Seed: 1, Overlap: true, Baseline: true}
}

// Result is what a run measured (on rank 0; the losses are averages over all ranks).
type Result struct {
	Losses     []float64 // mean training loss per epoch
	Accuracy   []float64 // test accuracy per epoch
	EpochTime  []time.Duration
	CommWait   []time.Duration // time the updates waited for AllReduce, per epoch
	Params     int
	Baseline   time.Duration // mean epoch time of one rank on the whole dataset (0: not run)
	MeanEpoch  time.Duration // mean epoch time, the first epoch left out when there are others
	Identical  bool
	WorldRanks int
}

func main() {
	o := defaults()
	flag.IntVar(&o.Ranks, "ranks", o.Ranks, "ranks in this process (under hcomm run: one per process)")
	flag.IntVar(&o.Epochs, "epochs", o.Epochs, "epochs")
	flag.IntVar(&o.Samples, "samples", o.Samples, "training samples in all")
	flag.IntVar(&o.Hidden, "hidden", o.Hidden, "hidden layer width")
	flag.IntVar(&o.Batch, "batch", o.Batch, "samples per rank per step")
	flag.Float64Var(&o.LR, "lr", o.LR, "learning rate")
	flag.BoolVar(&o.Overlap, "overlap", o.Overlap, "overlap each layer's AllReduce with the rest of the backward pass")
	flag.BoolVar(&o.Baseline, "baseline", o.Baseline, "also train on one rank alone and report the speed-up")
	flag.Parse()
	if _, err := Run(o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "train:", err)
		os.Exit(1)
	}
}

func (o Options) check() error {
	switch {
	case o.Ranks < 1 || o.Epochs < 1 || o.Batch < 1 || o.Hidden < 1 || o.Features < 1 || o.Classes < 2:
		return fmt.Errorf("ranks, epochs, batch, hidden, features must be >= 1 and classes >= 2: %+v", o)
	case o.LR <= 0 || math.IsNaN(o.LR):
		return fmt.Errorf("learning rate %g must be > 0", o.LR)
	}
	return nil
}

// Run trains with o and writes the report to out (rank 0's). It fails when
// the ranks' weights differ at the end.
func Run(o Options, out io.Writer) (*Result, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	var comms []*hcomm.Comm
	var err error
	if _, ok := hcomm.Launched(nil); ok {
		c, err := hcomm.InitFromEnv(&hcomm.Config{Name: "train"})
		if err != nil {
			return nil, err
		}
		comms = []*hcomm.Comm{c}
	} else if comms, err = hcomm.InitAll(o.Ranks, &hcomm.Config{Name: "train", BufferSize: 8 << 20}); err != nil {
		return nil, err
	}
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	world := comms[0].Size()
	data := mlp.MakeData(o.Seed, o.Samples, o.Features, o.Classes)
	if len(data.TrainY) < world*o.Batch {
		return nil, fmt.Errorf("%d samples are too few for %d ranks with batch %d", len(data.TrainY), world, o.Batch)
	}
	var res *Result
	err = forRanks(comms, func(ctx context.Context, c *hcomm.Comm) error {
		var w io.Writer = io.Discard
		if c.Rank() == 0 {
			w = out
		}
		r, err := train(ctx, c, o, data, w)
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
		one, err := hcomm.InitAll(1, &hcomm.Config{Name: "baseline", BufferSize: 8 << 20})
		if err != nil {
			return nil, err
		}
		bo := o
		bo.Batch = o.Batch * world // the same global batch: the same steps, on one rank
		r1, err := train(context.Background(), one[0], bo, data, io.Discard)
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
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[i] = fn(ctx, c); errs[i] != nil {
				once.Do(func() {
					cancel()
					for _, x := range comms {
						x.Abort()
					}
				})
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// --- training

// gradComm is one layer's AllReduce on the stream: device buffer and event.
type gradComm struct {
	dev device.Ptr
	ev  *device.Event
}

func asBytes(f []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), len(f)*4)
}

func train(ctx context.Context, c *hcomm.Comm, o Options, d *mlp.Data, out io.Writer) (*Result, error) {
	world, me := c.Size(), c.Rank()
	ls := mlp.New(o.Seed, o.Features, o.Hidden, o.Classes)
	params := mlp.Params(ls)
	// Rank 0's initial weights everywhere (they are equal already: the same
	// seed; the broadcast is what a real program does).
	for _, l := range ls {
		if err := collectives.BroadcastSlice(ctx, c, l.P, 0, nil); err != nil {
			return nil, err
		}
	}
	dev := c.Device()
	s, err := dev.CreateStream()
	if err != nil {
		return nil, err
	}
	defer s.Destroy()
	comms := make([]gradComm, len(ls))
	for i, l := range ls {
		p, err := dev.Malloc(int64(len(l.G) * 4))
		if err != nil {
			return nil, err
		}
		defer dev.Free(p)
		ev, err := dev.CreateEventWithFlags(device.EventDisableTiming)
		if err != nil {
			return nil, err
		}
		defer ev.Destroy()
		comms[i] = gradComm{dev: p, ev: ev}
	}
	// enqueue averages layer i's gradient across ranks, asynchronously.
	enqueue := func(i int) error {
		l, gc := ls[i], comms[i]
		if err := s.MemcpyHtoDAsync(gc.dev, asBytes(l.G)); err != nil {
			return err
		}
		if err := collectives.AllReduce(gc.dev, gc.dev, int64(len(l.G)), hcomm.Float32, hcomm.Sum, c, s, nil); err != nil {
			return err
		}
		if err := s.MemcpyDtoHAsync(asBytes(l.G), gc.dev); err != nil {
			return err
		}
		return gc.ev.Record(s)
	}
	// This rank's shard: every world-th sample, the same count on every rank.
	per := len(d.TrainY) / world
	idx := make([]int, per)
	for i := range idx {
		idx[i] = i*world + me
	}
	steps := per / o.Batch
	acts, grads := mlp.Buffers(ls, o.Batch)
	xb := make([]float32, o.Batch*o.Features)
	yb := make([]int, o.Batch)
	res := &Result{Params: params, WorldRanks: world}
	rng := rand.New(rand.NewPCG(o.Seed+uint64(me)+1, 0x5ca1e))
	fmt.Fprintf(out, "train: %d ranks, %d samples (%d per rank), MLP %d-%d-%d-%d (%d parameters), batch %d per rank, %d epochs, overlap %v\n",
		world, per*world, per, o.Features, o.Hidden, o.Hidden, o.Classes, params, o.Batch, o.Epochs, o.Overlap)
	var total time.Duration
	for ep := 0; ep < o.Epochs; ep++ {
		rng.Shuffle(len(idx), func(i, j int) { idx[i], idx[j] = idx[j], idx[i] })
		start := time.Now()
		var wait time.Duration
		var lossSum float64
		for st := 0; st < steps; st++ {
			for k := 0; k < o.Batch; k++ {
				i := idx[st*o.Batch+k]
				copy(xb[k*o.Features:(k+1)*o.Features], d.TrainX[i*o.Features:(i+1)*o.Features])
				yb[k] = d.TrainY[i]
			}
			mlp.Forward(ls, xb, o.Batch, acts)
			logits := acts[len(ls)]
			lossSum += mlp.LossGrad(logits, yb, o.Classes, float32(o.Batch*world))
			grads[len(ls)] = logits // d loss / d logits, in place
			for i := len(ls) - 1; i >= 0; i-- {
				mlp.Backward(ls[i], acts[i], grads[i+1], grads, i, o.Batch)
				if o.Overlap {
					if err := enqueue(i); err != nil { // overlaps with layer i-1's backward
						return nil, err
					}
				}
			}
			if !o.Overlap {
				for i := len(ls) - 1; i >= 0; i-- {
					if err := enqueue(i); err != nil {
						return nil, err
					}
				}
			}
			t0 := time.Now()
			for i, l := range ls {
				if err := comms[i].ev.Synchronize(ctx); err != nil {
					return nil, err
				}
				for j, g := range l.G { // the sum of the ranks' gradients of the global mean loss
					l.P[j] -= float32(o.LR) * g
				}
			}
			wait += time.Since(t0)
		}
		if err := s.Synchronize(ctx); err != nil {
			return nil, err
		}
		el := time.Since(start)
		total += el
		acc := mlp.Accuracy(ls, d)
		sum := []float64{lossSum, float64(steps * o.Batch)}
		if err := collectives.AllReduceSlice(ctx, c, sum, sum, hcomm.Sum, nil); err != nil {
			return nil, err
		}
		res.Losses = append(res.Losses, sum[0]/sum[1])
		res.Accuracy = append(res.Accuracy, acc)
		res.EpochTime = append(res.EpochTime, el)
		res.CommWait = append(res.CommWait, wait)
		fmt.Fprintf(out, "epoch %2d  loss %.4f  test acc %5.1f%%  time %.3f s  (waited %.3f s for AllReduce)\n",
			ep+1, sum[0]/sum[1], 100*acc, el.Seconds(), wait.Seconds())
	}
	// The first epoch pays for setting up channels and warming caches: the
	// mean leaves it out when there are others.
	res.MeanEpoch = total / time.Duration(o.Epochs)
	if o.Epochs > 1 {
		res.MeanEpoch = (total - res.EpochTime[0]) / time.Duration(o.Epochs-1)
	}
	// Every rank must hold the same bits: compare with rank 0's weights.
	var diff float64
	for _, l := range ls {
		ref := append([]float32(nil), l.P...)
		if err := collectives.BroadcastSlice(ctx, c, ref, 0, nil); err != nil {
			return nil, err
		}
		for j := range ref {
			if math.Float32bits(ref[j]) != math.Float32bits(l.P[j]) {
				diff++
			}
		}
	}
	tot := []float64{diff}
	if err := collectives.AllReduceSlice(ctx, c, tot, tot, hcomm.Sum, nil); err != nil {
		return nil, err
	}
	if tot[0] != 0 {
		return nil, fmt.Errorf("weights differ between ranks: %g parameters are not bit-identical to rank 0's", tot[0])
	}
	res.Identical = true
	fmt.Fprintf(out, "weights identical on all %d ranks (%d parameters, compared bit for bit with rank 0's)\n", world, params)
	return res, nil
}
