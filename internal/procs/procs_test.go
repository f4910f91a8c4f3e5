package procs

import (
	"runtime"
	"testing"
)

func TestPerRank(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	for _, tc := range []struct {
		set         string
		ranks, cpus int
		want        int
		wantOK      bool
	}{
		{"", 4, 16, 4, true},
		{"", 3, 8, 2, true},
		{"", 8, 2, 1, true}, // more ranks than processors: one each
		{"", 1, 8, 0, false},
		{"", 4, 1, 1, true},
		{"6", 4, 16, 0, false}, // GOMAXPROCS set: the user's choice
	} {
		n, ok := PerRank(env(map[string]string{"GOMAXPROCS": tc.set}), tc.ranks, tc.cpus)
		if n != tc.want || ok != tc.wantOK {
			t.Errorf("PerRank(GOMAXPROCS=%q, %d ranks, %d cpus) = %d, %v; want %d, %v", tc.set, tc.ranks, tc.cpus, n, ok, tc.want, tc.wantOK)
		}
	}
}

func TestCountList(t *testing.T) {
	for in, want := range map[string]int{"0": 1, "0-7": 8, "0-3,8,10-11": 7, "": 0, "x": 0, "3-1": 0, "0-": 0} {
		if got := countList(in); got != want {
			t.Errorf("countList(%q) = %d, want %d", in, got, want)
		}
	}
	if s := Shared(); s != 0 && s != runtime.NumCPU() {
		t.Errorf("Shared() = %d; want 0 or NumCPU %d", s, runtime.NumCPU())
	}
}
