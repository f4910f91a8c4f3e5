package hcomm

import "testing"

// A full timeline keeps the newest spans, oldest first, and counts the
// ones it let go.
func TestTracerKeepsNewest(t *testing.T) {
	tr := newTracer(4)
	for i := range 10 {
		tr.add(traceSpan{seq: uint64(i)})
	}
	got, dropped := tr.snapshot()
	if dropped != 6 || len(got) != 4 {
		t.Fatalf("kept %d, dropped %d; want 4 and 6", len(got), dropped)
	}
	for i, s := range got {
		if s.seq != uint64(6+i) {
			t.Errorf("span %d has seq %d, want %d", i, s.seq, 6+i)
		}
	}
}
