// Package mlp is the model the training examples share: a dataset generated
// in code (Gaussian blobs, one per class) and a small multilayer perceptron,
// features -> hidden -> hidden -> classes with ReLU and a softmax
// cross-entropy loss, in pure Go. examples/train and examples/elastic
// train it; they own the communication (AllReduce of the gradients) and the
// update, this package only computes.
//
// Every call is deterministic: the same seed and sizes give the same bits
// on every rank and in every process. Forward and Accuracy only read the
// layers; Backward writes their gradients: it must not run concurrently
// with another call on the same layers, nor may the parameters change
// under a call. Distinct models may be used concurrently.
package mlp

import (
	"math"
	"math/rand/v2"
)

// Data is a generated dataset: samples drawn around one centre per class.
// The inputs are row-major, features values per sample.
type Data struct {
	TrainX, TestX []float32
	TrainY, TestY []int
}

// MakeData generates samples training samples (and a quarter as many test
// samples, at least one) of features dimensions in classes classes from
// seed.
func MakeData(seed uint64, samples, features, classes int) *Data {
	rng := rand.New(rand.NewPCG(seed, 0xda7a))
	centers := make([]float32, classes*features)
	for i := range centers {
		centers[i] = float32(rng.NormFloat64() * 1.2)
	}
	gen := func(n int) ([]float32, []int) {
		x := make([]float32, n*features)
		y := make([]int, n)
		for i := range y {
			y[i] = rng.IntN(classes)
			for f := 0; f < features; f++ {
				x[i*features+f] = centers[y[i]*features+f] + float32(rng.NormFloat64()*1.5)
			}
		}
		return x, y
	}
	d := &Data{}
	d.TrainX, d.TrainY = gen(samples)
	d.TestX, d.TestY = gen(max(samples/4, 1))
	return d
}

// Layer is one fully connected layer of In inputs and Out outputs. P holds
// its parameters, G their gradient in the same layout; callers may point
// both at views of larger buffers (of the same lengths) to move every
// layer's values at once.
type Layer struct {
	In, Out int
	P       []float32 // Out*In weights (row-major by output), then Out biases
	G       []float32 // gradient, same layout
}

// W returns the weights: P's first Out*In values.
func (l *Layer) W() []float32 { return l.P[:l.Out*l.In] }

// B returns the biases: P's last Out values.
func (l *Layer) B() []float32 { return l.P[l.Out*l.In:] }

// New makes the layers features -> hidden -> hidden -> classes with weights
// drawn from seed (He initialisation; zero biases), the same on every rank,
// each with a gradient buffer of its own.
func New(seed uint64, features, hidden, classes int) []*Layer {
	sizes := []int{features, hidden, hidden, classes}
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	var ls []*Layer
	for i := 0; i+1 < len(sizes); i++ {
		l := &Layer{In: sizes[i], Out: sizes[i+1]}
		l.P = make([]float32, l.Out*l.In+l.Out)
		l.G = make([]float32, len(l.P))
		scale := math.Sqrt(2 / float64(l.In)) // He initialisation
		for j := range l.W() {
			l.W()[j] = float32(rng.NormFloat64() * scale)
		}
		ls = append(ls, l)
	}
	return ls
}

// Params returns the number of parameters of the layers.
func Params(ls []*Layer) int {
	n := 0
	for _, l := range ls {
		n += len(l.P)
	}
	return n
}

// Buffers returns the activation and gradient buffers Forward and Backward
// use for batches of up to n samples: acts[i+1] and grads[i+1] hold n*Out
// values of layer i; acts[0] and grads[0] are left nil (Forward points
// acts[0] at its input; Backward needs no gradient of the input).
func Buffers(ls []*Layer, n int) (acts, grads [][]float32) {
	acts = make([][]float32, len(ls)+1)
	grads = make([][]float32, len(ls)+1)
	for i, l := range ls {
		acts[i+1] = make([]float32, n*l.Out)
		grads[i+1] = make([]float32, n*l.Out)
	}
	return acts, grads
}

// Forward computes every layer's activations for a batch of n samples x
// into acts (from Buffers): acts[0] is set to x, acts[len(ls)] holds the
// logits.
func Forward(ls []*Layer, x []float32, n int, acts [][]float32) {
	acts[0] = x
	for i, l := range ls {
		in, out := acts[i], acts[i+1][:n*l.Out]
		w, b := l.W(), l.B()
		for s := 0; s < n; s++ {
			xs := in[s*l.In : (s+1)*l.In]
			for o := 0; o < l.Out; o++ {
				sum := b[o]
				row := w[o*l.In : (o+1)*l.In]
				for k, v := range xs {
					sum += row[k] * v
				}
				if i < len(ls)-1 && sum < 0 {
					sum = 0 // ReLU
				}
				out[s*l.Out+o] = sum
			}
		}
	}
}

// LossGrad turns the logits of the len(y) samples labelled y into the
// softmax cross-entropy loss (summed over the batch) and writes
// d loss / d logits (scaled by 1/scale) over them.
func LossGrad(logits []float32, y []int, classes int, scale float32) float64 {
	var loss float64
	for s, label := range y {
		z := logits[s*classes : (s+1)*classes]
		m := z[0]
		for _, v := range z {
			m = max(m, v)
		}
		var sum float64
		for _, v := range z {
			sum += math.Exp(float64(v - m))
		}
		loss += math.Log(sum) - float64(z[label]-m)
		for k, v := range z {
			p := float32(math.Exp(float64(v-m)) / sum)
			if k == label {
				p--
			}
			z[k] = p / scale
		}
	}
	return loss
}

// Backward computes layer l's gradient into l.G (overwriting it) from in,
// its input, and dz, d loss / d its output (already through its ReLU), for
// a batch of n samples. When i, the layer's index, is above 0 it also writes
// d loss / d its input, through the previous layer's ReLU, into grads[i]:
// the dz of layer i-1. Layer i's gradient is final when Backward returns,
// so that it may be sent while the layers before it are computed.
func Backward(l *Layer, in, dz []float32, grads [][]float32, i, n int) {
	gw, gb := l.G[:l.Out*l.In], l.G[l.Out*l.In:]
	clear(l.G)
	for s := 0; s < n; s++ {
		xs := in[s*l.In : (s+1)*l.In]
		for o := 0; o < l.Out; o++ {
			g := dz[s*l.Out+o]
			if g == 0 {
				continue
			}
			gb[o] += g
			row := gw[o*l.In : (o+1)*l.In]
			for k, v := range xs {
				row[k] += g * v
			}
		}
	}
	if i == 0 {
		return
	}
	dx := grads[i][:n*l.In]
	clear(dx)
	w := l.W()
	for s := 0; s < n; s++ {
		for o := 0; o < l.Out; o++ {
			g := dz[s*l.Out+o]
			if g == 0 {
				continue
			}
			row := w[o*l.In : (o+1)*l.In]
			d := dx[s*l.In : (s+1)*l.In]
			for k, v := range row {
				d[k] += g * v
			}
		}
	}
	for k, a := range in[:n*l.In] { // ReLU of the previous layer
		if a <= 0 {
			dx[k] = 0
		}
	}
}

// Accuracy returns the fraction of d's test samples whose largest logit is
// their label's.
func Accuracy(ls []*Layer, d *Data) float64 {
	n := len(d.TestY)
	acts := make([][]float32, len(ls)+1)
	for i, l := range ls {
		acts[i+1] = make([]float32, n*l.Out)
	}
	Forward(ls, d.TestX, n, acts)
	logits := acts[len(ls)]
	classes := ls[len(ls)-1].Out
	right := 0
	for s, y := range d.TestY {
		best := 0
		for k := 1; k < classes; k++ {
			if logits[s*classes+k] > logits[s*classes+best] {
				best = k
			}
		}
		if best == y {
			right++
		}
	}
	return float64(right) / float64(n)
}
