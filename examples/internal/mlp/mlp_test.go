package mlp

import (
	"math"
	"testing"
)

// The same seed gives the same data and the same weights, bit for bit; a
// different seed gives others.
func TestDeterministic(t *testing.T) {
	a, b, c := MakeData(7, 64, 5, 3), MakeData(7, 64, 5, 3), MakeData(8, 64, 5, 3)
	if len(a.TrainY) != 64 || len(a.TestY) != 16 || len(a.TrainX) != 64*5 || len(a.TestX) != 16*5 {
		t.Fatalf("sizes: train %d/%d, test %d/%d", len(a.TrainX), len(a.TrainY), len(a.TestX), len(a.TestY))
	}
	if !equal(a.TrainX, b.TrainX) || !equal(a.TestX, b.TestX) || equal(a.TrainX, c.TrainX) {
		t.Error("MakeData is not a function of its seed")
	}
	for _, y := range a.TrainY {
		if y < 0 || y >= 3 {
			t.Fatalf("label %d out of 3 classes", y)
		}
	}
	la, lb := New(7, 5, 6, 3), New(7, 5, 6, 3)
	if len(la) != 3 || Params(la) != 6*5+6+6*6+6+3*6+3 {
		t.Fatalf("%d layers, %d parameters", len(la), Params(la))
	}
	for i := range la {
		if !equal(la[i].P, lb[i].P) {
			t.Errorf("layer %d: weights differ between two models of one seed", i)
		}
	}
}

// Backward's gradients are the derivatives of LossGrad's loss: each checked
// against a central difference of the loss in float64.
func TestBackwardMatchesFiniteDifferences(t *testing.T) {
	const n, features, hidden, classes = 4, 3, 5, 3
	d := MakeData(3, n, features, classes)
	ls := New(3, features, hidden, classes)
	for _, l := range ls { // non-zero biases, so that their gradients are checked too
		for k := range l.B() {
			l.B()[k] = 0.1 * float32(k%3-1)
		}
	}
	acts, grads := Buffers(ls, n)
	loss := func() float64 {
		Forward(ls, d.TrainX, n, acts)
		return LossGrad(acts[len(ls)], d.TrainY, classes, 1)
	}
	loss()
	grads[len(ls)] = acts[len(ls)]
	for i := len(ls) - 1; i >= 0; i-- {
		Backward(ls[i], acts[i], grads[i+1], grads, i, n)
	}
	const eps = 1e-2
	for i, l := range ls {
		for j := range l.P {
			p := l.P[j]
			l.P[j] = p + eps
			up := loss()
			l.P[j] = p - eps
			down := loss()
			l.P[j] = p
			want := (up - down) / (2 * eps)
			if got := float64(l.G[j]); math.Abs(got-want) > 1e-2*max(1, math.Abs(want)) {
				t.Errorf("layer %d parameter %d: gradient %g, finite difference %g", i, j, got, want)
			}
		}
	}
}

// Accuracy counts the samples whose largest logit is their label's.
func TestAccuracy(t *testing.T) {
	d := &Data{TestX: []float32{1, 0, 0, 1, 1, 0}, TestY: []int{0, 1, 1}}
	// One layer, the identity: the logits are the inputs.
	ls := []*Layer{{In: 2, Out: 2, P: []float32{1, 0, 0, 1, 0, 0}}}
	if got := Accuracy(ls, d); got != 2.0/3 {
		t.Errorf("accuracy %v, want 2/3", got)
	}
}

func equal(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}
