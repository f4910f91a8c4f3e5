package sim

import (
	"math"
	"testing"
)

// replayOf returns a world of p and a function that replays the charges
// recorded on it, failing the test on error.
func replayOf(t *testing.T, p Profile) (*World, func() []float64) {
	t.Helper()
	w, err := NewWorld(p)
	if err != nil {
		t.Fatal(err)
	}
	return w, func() []float64 {
		t.Helper()
		ends, err := w.Finish()
		if err != nil {
			t.Fatal(err)
		}
		return ends
	}
}

func nearly(a, b float64) bool { return math.Abs(a-b) <= 1e-12 }

// TestReplayTakesTurns: work that ranks of one host charge at once runs on
// its cores in turns, first come (in virtual time, then by rank) first
// served; with a core per rank, side by side.
func TestReplayTakesTurns(t *testing.T) {
	for _, c := range []struct {
		cores int
		want  []float64
	}{
		{0, []float64{10, 10, 10, 10}},
		{4, []float64{10, 10, 10, 10}},
		{2, []float64{10, 10, 20, 20}},
		{1, []float64{10, 20, 30, 40}},
	} {
		w, finish := replayOf(t, Profile{Hosts: 1, RanksPerHost: 4, Cores: c.cores})
		for r := 3; r >= 0; r-- { // recorded in reverse: the order must not matter
			w.tr.record(r, charge{kind: opWork, d: 10})
		}
		ends := finish()
		for r, e := range ends {
			if !nearly(e, c.want[r]) {
				t.Errorf("%d cores: rank %d ends at %v, want %v (all: %v)", c.cores, r, e, c.want[r], ends)
			}
		}
	}
}

// TestReplayWakesSleepers: on a crowded host a wait that blocks pays the
// switch in processor time and, when a processor had nothing to run (it
// halted), the wake-up before it; a wait whose record is already there
// pays neither, nor does a wait on a host with a core per rank.
func TestReplayWakesSleepers(t *testing.T) {
	const u = 1e-6 // the profile's costs are in µs, the charges in seconds
	const o, alpha = 2 * u, 1 * u
	for _, c := range []struct {
		name         string
		ranks, cores int
		work1        float64 // rank 1's work before it waits
		busy2        bool    // rank 2 holds the processor from 12 µs to 112
		want         float64 // rank 1's end, µs
	}{
		// Rank 0 works 10 µs then sends: the record arrives at 10 + o + α = 13.
		{"crowded, blocked, a processor halted", 2, 1, 0, false, 13 + 30 + 2 + 5},
		{"crowded, blocked, the processor busy", 3, 1, 0, true, 112 + 2 + 5},
		{"crowded, the record there already", 3, 2, 20, false, 20 + 2},
		{"a core per rank", 2, 0, 0, false, 13 + 2},
	} {
		w, finish := replayOf(t, Profile{Hosts: 1, RanksPerHost: c.ranks, Cores: c.cores, WakeUs: 30, SwitchUs: 5})
		m := w.tr.message()
		w.tr.record(0, charge{kind: opWork, d: 10 * u})
		w.tr.record(0, charge{kind: opSend, ev: m, prev: -1, d: o, lat: alpha})
		if c.work1 > 0 {
			w.tr.record(1, charge{kind: opWork, d: c.work1 * u})
		}
		w.tr.record(1, charge{kind: opWait, after: []int32{m}, d: o})
		if c.busy2 {
			w.tr.record(2, charge{kind: opWork, lat: 12 * u, d: 100 * u})
		}
		if got := finish()[1] / u; math.Abs(got-c.want) > 1e-9 {
			t.Errorf("%s: rank 1 ends at %v µs, want %v", c.name, got, c.want)
		}
	}
}

// TestReplayKeepsChannelOrder: a message never arrives before the one sent
// before it on its channel, and a reduction at the far end holds the far
// host's processor.
func TestReplayKeepsChannelOrder(t *testing.T) {
	w, finish := replayOf(t, Profile{Hosts: 2, RanksPerHost: 1, Cores: 1})
	a, b := w.tr.message(), w.tr.message()
	w.tr.record(0, charge{kind: opSend, ev: a, prev: -1, d: 1, lat: 50, far: 4, farHost: 1})
	w.tr.record(0, charge{kind: opSend, ev: b, prev: a, d: 1, lat: 1})
	w.tr.record(1, charge{kind: opWait, after: []int32{b}, d: 0})
	ends := finish()
	// a lands at 1 + 50 + 4 = 55 (its reduction on host 1's core), b at
	// 2 + 1 = 3 but not before a: 55.
	if !nearly(ends[1], 55) || !nearly(ends[0], 2) {
		t.Errorf("ends %v, want rank 0 at 2 and rank 1 at 55", ends)
	}
}

// TestReplayStallIsAnError: a wait on a message no one sent is reported,
// not hung on.
func TestReplayStallIsAnError(t *testing.T) {
	w, err := NewWorld(Profile{Hosts: 1, RanksPerHost: 2})
	if err != nil {
		t.Fatal(err)
	}
	m := w.tr.message()
	w.tr.record(1, charge{kind: opWait, after: []int32{m}})
	if _, err := w.Finish(); err == nil {
		t.Error("a wait on a message never sent replayed without error")
	}
}
