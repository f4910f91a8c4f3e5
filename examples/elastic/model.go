package main

// The dataset and the model are examples/train's: Gaussian blobs, and an
// MLP Features -> Hidden -> Hidden -> Classes with ReLU and softmax.

import (
	"math"
	"math/rand/v2"
)

// --- data: Gaussian blobs, one per class, in Features dimensions.

type dataset struct {
	trainX, testX []float32 // row-major, Features per sample
	trainY, testY []int
}

func makeData(o Options) *dataset {
	rng := rand.New(rand.NewPCG(o.Seed, 0xda7a))
	centers := make([]float32, o.Classes*o.Features)
	for i := range centers {
		centers[i] = float32(rng.NormFloat64() * 1.2)
	}
	gen := func(n int) ([]float32, []int) {
		x := make([]float32, n*o.Features)
		y := make([]int, n)
		for i := range y {
			y[i] = rng.IntN(o.Classes)
			for f := 0; f < o.Features; f++ {
				x[i*o.Features+f] = centers[y[i]*o.Features+f] + float32(rng.NormFloat64()*1.5)
			}
		}
		return x, y
	}
	d := &dataset{}
	d.trainX, d.trainY = gen(o.Samples)
	d.testX, d.testY = gen(max(o.Samples/4, 1))
	return d
}

// --- the model: Features -> Hidden -> Hidden -> Classes, ReLU, softmax.

type layer struct {
	in, out int
	p       []float32 // out*in weights (row-major by output), then out biases
	g       []float32 // gradient, same layout
}

func (l *layer) w() []float32 { return l.p[:l.out*l.in] }
func (l *layer) b() []float32 { return l.p[l.out*l.in:] }

// newModel makes the layers with rank-independent initial weights, and the
// flat gradient buffer the layers' gradients are views of.
func newModel(o Options) ([]*layer, []float32) {
	sizes := []int{o.Features, o.Hidden, o.Hidden, o.Classes}
	rng := rand.New(rand.NewPCG(o.Seed, 0x5eed))
	var ls []*layer
	total := 0
	for i := 0; i+1 < len(sizes); i++ {
		l := &layer{in: sizes[i], out: sizes[i+1]}
		l.p = make([]float32, l.out*l.in+l.out)
		scale := math.Sqrt(2 / float64(l.in)) // He initialisation
		for j := range l.w() {
			l.w()[j] = float32(rng.NormFloat64() * scale)
		}
		total += len(l.p)
		ls = append(ls, l)
	}
	return ls, make([]float32, total)
}

// forward computes every layer's activations for a batch of n samples; acts[0]
// is the input, acts[len] the logits.
func forward(ls []*layer, x []float32, n int, acts [][]float32) {
	acts[0] = x
	for i, l := range ls {
		in, out := acts[i], acts[i+1][:n*l.out]
		w, b := l.w(), l.b()
		for s := 0; s < n; s++ {
			xs := in[s*l.in : (s+1)*l.in]
			for o := 0; o < l.out; o++ {
				sum := b[o]
				row := w[o*l.in : (o+1)*l.in]
				for k, v := range xs {
					sum += row[k] * v
				}
				if i < len(ls)-1 && sum < 0 {
					sum = 0 // ReLU
				}
				out[s*l.out+o] = sum
			}
		}
	}
}

// lossGrad turns logits into the softmax cross-entropy loss (summed over the
// batch) and writes d loss / d logits (scaled by 1/scale) over them.
func lossGrad(logits []float32, y []int, classes int, scale float32) float64 {
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

// backward computes layer l's gradient from dz (d loss / d its output,
// already through the ReLU) and in, and when l > 0, d loss / d its input
// through the previous ReLU into grads[i].
func backward(l *layer, in, dz []float32, grads [][]float32, i, n int) {
	gw, gb := l.g[:l.out*l.in], l.g[l.out*l.in:]
	clear(l.g)
	for s := 0; s < n; s++ {
		xs := in[s*l.in : (s+1)*l.in]
		for o := 0; o < l.out; o++ {
			g := dz[s*l.out+o]
			if g == 0 {
				continue
			}
			gb[o] += g
			row := gw[o*l.in : (o+1)*l.in]
			for k, v := range xs {
				row[k] += g * v
			}
		}
	}
	if i == 0 {
		return
	}
	dx := grads[i][:n*l.in]
	clear(dx)
	w := l.w()
	for s := 0; s < n; s++ {
		for o := 0; o < l.out; o++ {
			g := dz[s*l.out+o]
			if g == 0 {
				continue
			}
			row := w[o*l.in : (o+1)*l.in]
			d := dx[s*l.in : (s+1)*l.in]
			for k, v := range row {
				d[k] += g * v
			}
		}
	}
	for k, a := range in[:n*l.in] { // ReLU of the previous layer
		if a <= 0 {
			dx[k] = 0
		}
	}
}

func accuracy(ls []*layer, d *dataset, o Options) float64 {
	n := len(d.testY)
	acts := make([][]float32, len(ls)+1)
	for i, l := range ls {
		acts[i+1] = make([]float32, n*l.out)
	}
	forward(ls, d.testX, n, acts)
	logits := acts[len(ls)]
	right := 0
	for s, y := range d.testY {
		best := 0
		for k := 1; k < o.Classes; k++ {
			if logits[s*o.Classes+k] > logits[s*o.Classes+best] {
				best = k
			}
		}
		if best == y {
			right++
		}
	}
	return float64(right) / float64(n)
}
