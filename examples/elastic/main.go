// Command elastic is data-parallel training that survives a lost rank: an
// MLP (examples/internal/mlp, as in examples/train) learns a generated
// dataset on every rank of an elastic job. When a rank dies mid-epoch the survivors shrink the
// communicator around it (hcomm's Shrink), undo the step it interrupted,
// share the epoch's remaining samples among themselves and go on; when
// `hcomm run --elastic` has started a replacement, rank 0 admits it between
// steps, the communicator grows back (Grow), and the newcomer receives the
// weights, the optimizer state (SGD with momentum) and the epoch's progress
// by broadcast. It prints every membership change, checks after each step
// that every rank holds bit-identical weights and optimizer state (a hash
// of them, all-gathered), and at each epoch's end that every sample of the
// epoch was trained on exactly once (a ledger summed with the gradients).
//
//	hcomm run --elastic -n 3 --min 2 --max-restarts 1 go run ./examples/elastic
//	hcomm run --elastic -n 3 --min 2 --max-restarts 1 go run ./examples/elastic -kill-rank 2 -kill-at-step 5
//
// With -kill-rank R -kill-at-step S the process started as rank R kills
// itself with SIGKILL in global step S, after its backward pass and before
// the gradients' AllReduce: the other ranks are then waiting for it there.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/examples/internal/mlp"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// Options configure a run.
type Options struct {
	Epochs   int     // passes over the training set
	Samples  int     // training samples in all
	Features int     // input dimension
	Classes  int     // output classes
	Hidden   int     // width of the two hidden layers
	Batch    int     // samples per rank per step
	LR       float64 // learning rate
	Momentum float64 // SGD momentum: the optimizer state
	Seed     uint64
	// KillRank and KillAtStep make the process started as rank KillRank
	// SIGKILL itself in global step KillAtStep (-1: never).
	KillRank, KillAtStep int
	// AwaitRegrow makes rank 0 wait, at an epoch's end, up to Timeout for a
	// replacement while the job has fewer ranks than it started with, so
	// that a short run grows back before it ends (for tests).
	AwaitRegrow bool
	Timeout     time.Duration // bounds every setup: init, shrink, grow
}

func defaults() Options {
	return Options{Epochs: 4, Samples: 1536, Features: 8, Classes: 4, Hidden: 16, Batch: 16, LR: 0.05, Momentum: 0.9, Seed: 1,
		KillRank: -1, KillAtStep: -1, Timeout: 60 * time.Second}
}

func main() {
	o := defaults()
	flag.IntVar(&o.Epochs, "epochs", o.Epochs, "epochs")
	flag.IntVar(&o.Samples, "samples", o.Samples, "training samples in all")
	flag.IntVar(&o.Hidden, "hidden", o.Hidden, "hidden layer width")
	flag.IntVar(&o.Batch, "batch", o.Batch, "samples per rank per step")
	flag.Float64Var(&o.LR, "lr", o.LR, "learning rate")
	flag.IntVar(&o.KillRank, "kill-rank", o.KillRank, "the rank (as started) that kills itself with SIGKILL")
	flag.IntVar(&o.KillAtStep, "kill-at-step", o.KillAtStep, "the global step in which -kill-rank kills itself")
	flag.BoolVar(&o.AwaitRegrow, "await-regrow", o.AwaitRegrow, "at an epoch's end, wait for a replacement while ranks are missing")
	flag.DurationVar(&o.Timeout, "timeout", o.Timeout, "bound of every setup (init, shrink, grow)")
	flag.Parse()
	if err := Run(o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "elastic:", err)
		os.Exit(1)
	}
}

// state is what every rank holds identically between steps, and what a
// newcomer receives.
type state struct {
	params, vel []float32 // weights and momentum, every layer's, flat
	ledger      []float32 // times each sample was trained on this epoch
	epoch       int
	cursor      int // samples of the epoch's order done
	step        int // global steps done
	world0      int // ranks the job started with
	lossSum     float64
	lossN       int
}

func (s *state) clone() *state {
	c := *s
	c.params = append([]float32(nil), s.params...)
	c.vel = append([]float32(nil), s.vel...)
	c.ledger = append([]float32(nil), s.ledger...)
	return &c
}

// hash is a hash of every bit of the state that must be the same on every rank.
func (s *state) hash() uint64 {
	h := fnv.New64a()
	h.Write(asBytes(s.params))
	h.Write(asBytes(s.vel))
	h.Write(asBytes(s.ledger))
	fmt.Fprint(h, s.epoch, s.cursor, s.step)
	return h.Sum64()
}

// job is one process's view of the run.
type job struct {
	o     Options
	out   io.Writer
	m     *hcomm.Membership // nil outside hcomm run --elastic
	c     *hcomm.Comm
	cfg   *hcomm.Config
	data  *mlp.Data
	ls    []*mlp.Layer
	grads []float32 // every layer's gradient, flat
	st    *state
	// started is the rank this process started as (-1: a newcomer).
	started int
}

// Run runs this process's part of the job.
func Run(o Options, out io.Writer) error {
	if o.Epochs < 1 || o.Batch < 1 || o.Hidden < 1 || o.Samples < 1 || o.LR <= 0 {
		return fmt.Errorf("epochs, batch, hidden, samples and lr must be positive: %+v", o)
	}
	ctx := context.Background()
	m, err := hcomm.ElasticFromEnv(ctx)
	if err != nil {
		return err
	}
	defer m.Close()
	j := &job{o: o, out: out, m: m, cfg: &hcomm.Config{Name: "elastic", BufferSize: 4 << 20, ConnectTimeout: o.Timeout}, started: -1}
	j.data = mlp.MakeData(o.Seed, o.Samples, o.Features, o.Classes)
	j.ls = mlp.New(o.Seed, o.Features, o.Hidden, o.Classes)
	j.st = &state{params: make([]float32, 0, mlp.Params(j.ls)), ledger: make([]float32, o.Samples)}
	for _, l := range j.ls {
		j.st.params = append(j.st.params, l.P...)
	}
	j.grads = make([]float32, len(j.st.params))
	j.st.vel = make([]float32, len(j.st.params))
	j.bind()
	if m != nil && m.Newcomer() {
		joined, err := j.join(ctx)
		if !joined || err != nil {
			return err
		}
	} else {
		if j.c, err = hcomm.InitFromEnvContext(ctx, j.cfg); err != nil {
			return err
		}
		j.started = j.c.Rank()
		j.st.world0 = j.c.Size()
		// Rank 0's initial state everywhere (equal already: the same seed;
		// the broadcast is what a real program does).
		if err := j.share(ctx); err != nil {
			return err
		}
		j.say("elastic: %d ranks, %d samples, MLP %d-%d-%d-%d (%d parameters), batch %d per rank, %d epochs",
			j.c.Size(), o.Samples, o.Features, o.Hidden, o.Hidden, o.Classes, len(j.st.params), o.Batch, o.Epochs)
	}
	defer func() { j.c.Destroy() }()
	return j.train(ctx)
}

// say prints on rank 0.
func (j *job) say(format string, args ...any) {
	if j.c != nil && j.c.Rank() == 0 {
		fmt.Fprintf(j.out, format+"\n", args...)
	}
}

// bind points the layers at the state's flat parameters and the job's flat
// gradient.
func (j *job) bind() {
	off := 0
	for _, l := range j.ls {
		n := len(l.P)
		l.P = j.st.params[off : off+n]
		l.G = j.grads[off : off+n]
		off += n
	}
}

// join waits for rank 0 to admit this newcomer, joins the grown
// communicator and receives the state. It reports false when the job ended
// first.
func (j *job) join(ctx context.Context) (bool, error) {
	tok, rank, err := j.m.AwaitToken(ctx)
	if errors.Is(err, hcomm.ErrJobEnded) {
		fmt.Fprintf(j.out, "elastic: slot %d: the job ended before it admitted this replacement\n", j.m.Slot())
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if j.c, err = hcomm.JoinContext(ctx, tok, rank, j.cfg); err != nil {
		return false, err
	}
	if err := j.share(ctx); err != nil {
		return false, err
	}
	fmt.Fprintf(j.out, "elastic: slot %d joined as rank %d of %d; received the weights, the optimizer state and the progress (epoch %d, sample %d of %d, step %d)\n",
		j.m.Slot(), rank, j.c.Size(), j.st.epoch+1, j.st.cursor, j.o.Samples, j.st.step)
	return true, nil
}

// share broadcasts rank 0's state to every rank.
func (j *job) share(ctx context.Context) error {
	st := j.st
	hdr := []float64{float64(st.epoch), float64(st.cursor), float64(st.step), float64(st.world0), st.lossSum, float64(st.lossN)}
	for _, b := range [][]float32{st.params, st.vel, st.ledger} {
		if err := collectives.BroadcastSlice(ctx, j.c, b, 0, nil); err != nil {
			return err
		}
	}
	if err := collectives.BroadcastSlice(ctx, j.c, hdr, 0, nil); err != nil {
		return err
	}
	st.epoch, st.cursor, st.step, st.world0, st.lossSum, st.lossN = int(hdr[0]), int(hdr[1]), int(hdr[2]), int(hdr[3]), hdr[4], int(hdr[5])
	return nil
}

// order is epoch's order of the samples, the same on every rank.
func (j *job) order(epoch int) []int {
	p := make([]int, j.o.Samples)
	for i := range p {
		p[i] = i
	}
	rng := rand.New(rand.NewPCG(j.o.Seed, uint64(epoch)+0x0e90c4))
	rng.Shuffle(len(p), func(a, b int) { p[a], p[b] = p[b], p[a] })
	return p
}

func (j *job) train(ctx context.Context) error {
	o := j.o
	for j.st.epoch < o.Epochs {
		order := j.order(j.st.epoch)
		for j.st.cursor < len(order) {
			prev := j.st.clone()
			err := j.step(ctx, order)
			var pending int
			if err == nil {
				pending, err = j.check(ctx, false)
			}
			if err != nil {
				if err := j.shrink(ctx, err, prev); err != nil {
					return err
				}
				continue
			}
			if pending > 0 {
				if err := j.grow(ctx, pending); err != nil {
					return err
				}
			}
		}
		if o.AwaitRegrow && j.m != nil && j.c.Size() < j.st.world0 {
			pending, err := j.check(ctx, true)
			if err != nil {
				return fmt.Errorf("waiting for a replacement: %w", err)
			}
			if pending > 0 {
				if err := j.grow(ctx, pending); err != nil {
					return err
				}
			}
		}
		// Every sample of the epoch exactly once.
		for i, n := range j.st.ledger {
			if n != 1 {
				return fmt.Errorf("epoch %d: sample %d was trained on %g times, want once", j.st.epoch+1, i, n)
			}
		}
		j.say("epoch %d  loss %.4f  test acc %5.1f%%  ranks %d  ledger: each of the %d samples trained on exactly once",
			j.st.epoch+1, j.st.lossSum/float64(max(j.st.lossN, 1)), 100*mlp.Accuracy(j.ls, j.data), j.c.Size(), o.Samples)
		j.st.epoch++
		j.st.cursor, j.st.lossSum, j.st.lossN = 0, 0, 0
		clear(j.st.ledger)
	}
	if j.m != nil && j.c.Rank() == 0 {
		if err := j.m.End(ctx); err != nil {
			return err
		}
	}
	j.say("done: %d epochs, %d steps, %d ranks at the end; weights and optimizer state bit-identical on every rank after every step", o.Epochs, j.st.step, j.c.Size())
	return nil
}

// step trains one global step: the next Size()×Batch samples of the
// epoch's order (fewer at its end), shared out among the ranks, their
// gradients, loss and ledger entries summed with one AllReduce, and the
// update applied. On error the state may be half updated: the caller
// restores it.
func (j *job) step(ctx context.Context, order []int) error {
	o, st, c := j.o, j.st, j.c
	world, me := c.Size(), c.Rank()
	take := min(world*o.Batch, len(order)-st.cursor)
	lo, hi := st.cursor+me*take/world, st.cursor+(me+1)*take/world
	n := hi - lo
	P := len(st.params)
	vec := make([]float32, P+1+o.Samples) // gradients | loss | ledger
	if n > 0 {
		xb := make([]float32, n*o.Features)
		yb := make([]int, n)
		for k, i := range order[lo:hi] {
			copy(xb[k*o.Features:], j.data.TrainX[i*o.Features:(i+1)*o.Features])
			yb[k] = j.data.TrainY[i]
			vec[P+1+i] = 1
		}
		acts, grads := mlp.Buffers(j.ls, n)
		mlp.Forward(j.ls, xb, n, acts)
		logits := acts[len(j.ls)]
		vec[P] = float32(mlp.LossGrad(logits, yb, o.Classes, float32(take)))
		grads[len(j.ls)] = logits
		for i := len(j.ls) - 1; i >= 0; i-- {
			mlp.Backward(j.ls[i], acts[i], grads[i+1], grads, i, n)
		}
		copy(vec, j.grads)
	}
	if j.started >= 0 && j.started == o.KillRank && st.step == o.KillAtStep {
		fmt.Fprintf(j.out, "elastic: rank %d kills itself with SIGKILL in step %d (epoch %d, sample %d)\n", me, st.step, st.epoch+1, st.cursor)
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	if err := collectives.AllReduceSlice(ctx, c, vec, vec, hcomm.Sum, nil); err != nil {
		return err
	}
	mu, lr := float32(o.Momentum), float32(o.LR)
	for i := range st.params {
		st.vel[i] = mu*st.vel[i] + vec[i]
		st.params[i] -= lr * st.vel[i]
	}
	st.lossSum += float64(vec[P])
	st.lossN += take
	for i, v := range vec[P+1:] {
		st.ledger[i] += v
	}
	st.cursor += take
	st.step++
	return nil
}

// check all-gathers every rank's state hash and rank 0's count of waiting
// newcomers: it fails when the hashes differ, and returns the count. With
// wait, rank 0 first waits up to Timeout for a newcomer.
func (j *job) check(ctx context.Context, wait bool) (int, error) {
	world := j.c.Size()
	mine := []uint64{j.st.hash(), 0}
	if j.m != nil && j.c.Rank() == 0 {
		deadline := time.Now().Add(j.o.Timeout)
		for {
			n, err := j.m.Pending(ctx)
			if err != nil {
				return 0, err
			}
			mine[1] = uint64(n)
			if n > 0 || !wait || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	all := make([]uint64, 2*world)
	if err := collectives.AllGatherSlice(ctx, j.c, mine, all, nil); err != nil {
		return 0, err
	}
	for r := 1; r < world; r++ {
		if all[2*r] != all[0] {
			return 0, fmt.Errorf("step %d: rank %d's weights differ from rank 0's (state hash %016x, rank 0's %016x)", j.st.step, r, all[2*r], all[0])
		}
	}
	return int(all[1]), nil
}

// shrink handles a failed step: the communicator is revoked and shrunk to
// the ranks left, which then agree on the last step every one of them
// completed and go back to it (a rank may have completed the step whose
// check failed), so that the samples of an undone step are trained again
// by the survivors.
func (j *job) shrink(ctx context.Context, cause error, prev *state) error {
	old := j.c
	old.Revoke()
	sctx, cancel := context.WithTimeout(ctx, j.o.Timeout)
	defer cancel()
	nc, oldRanks, err := old.Shrink(sctx, nil, j.cfg)
	if err != nil {
		return fmt.Errorf("step %d failed (%v), and shrinking failed: %w", j.st.step, cause, err)
	}
	if nc == nil {
		return fmt.Errorf("step %d failed (%v) and this rank was left out of the shrunk communicator", j.st.step, cause)
	}
	var lost []int
	for r, k := 0, 0; r < old.Size(); r++ {
		if k < len(oldRanks) && oldRanks[k] == r {
			k++
			continue
		}
		lost = append(lost, r)
	}
	old.Destroy()
	j.c = nc
	steps := []float64{float64(j.st.step)}
	if err := collectives.AllReduceSlice(ctx, nc, steps, steps, hcomm.Min, nil); err != nil {
		return fmt.Errorf("agreeing on the last step after the shrink: %w", err)
	}
	undone := ""
	if int(steps[0]) < j.st.step {
		j.st = prev
		j.bind()
		undone = " (this rank undid the step: another had not completed it)"
	}
	if j.st.step != int(steps[0]) {
		return fmt.Errorf("after the shrink this rank is at step %d, the others at %d", j.st.step, int(steps[0]))
	}
	if undone != "" {
		fmt.Fprintf(j.out, "elastic: rank %d: back at step %d%s\n", nc.Rank(), j.st.step, undone)
	}
	j.say("membership: lost rank(s) %v in step %d (epoch %d, %d of %d samples done): %s", lost, j.st.step, j.st.epoch+1, j.st.cursor, j.o.Samples, clip(cause.Error(), 160))
	j.say("membership: shrunk to %d ranks (old ranks %v); the epoch's %d remaining samples are shared among them",
		nc.Size(), oldRanks, j.o.Samples-j.st.cursor)
	return nil
}

// grow admits n waiting newcomers: rank 0 makes a join token and sends it
// to the other ranks and the newcomers, every rank grows the communicator,
// and the newcomers receive the state. A grow that fails leaves the
// communicator as it was.
func (j *job) grow(ctx context.Context, n int) error {
	old := j.c
	var tokBuf [256]uint8
	var tok hcomm.JoinToken
	if old.Rank() == 0 {
		t, err := old.GrowToken(n)
		if err != nil {
			j.say("membership: cannot admit %d newcomers: %v", n, err)
		} else {
			tok = t
			copy(tokBuf[:], t.String())
		}
	}
	if err := collectives.BroadcastSlice(ctx, old, tokBuf[:], 0, nil); err != nil {
		return err
	}
	s := string(tokBuf[:])
	if i := strings.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	if s == "" {
		return nil
	}
	tok, err := hcomm.ParseJoinToken(s)
	if err != nil {
		return err
	}
	if old.Rank() == 0 {
		if err := j.m.Admit(ctx, tok); err != nil {
			return err
		}
	}
	gctx, cancel := context.WithTimeout(ctx, j.o.Timeout)
	defer cancel()
	gc, err := old.Grow(gctx, tok, nil)
	if err != nil {
		// Every member fails alike (the newcomers did not all come before
		// the token expired): go on as before.
		j.say("membership: growing by %d failed, going on with %d ranks: %s", n, old.Size(), clip(err.Error(), 160))
		return nil
	}
	old.Destroy()
	j.c = gc
	if err := j.share(ctx); err != nil {
		return err
	}
	first, k := tok.Newcomers()
	j.say("membership: grew to %d ranks (newcomers: ranks %d to %d) in step %d (epoch %d, %d of %d samples done); they received the weights and the optimizer state by broadcast",
		gc.Size(), first, first+k-1, j.st.step, j.st.epoch+1, j.st.cursor, j.o.Samples)
	return nil
}

func asBytes(f []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), len(f)*4)
}

// clip shortens s to n bytes for a one-line report.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
