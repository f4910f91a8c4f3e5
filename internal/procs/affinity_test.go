package procs

import (
	"runtime"
	"slices"
	"strings"
	"testing"
)

func TestListRoundTrip(t *testing.T) {
	for _, c := range []struct {
		in   []int
		want string
	}{
		{nil, ""}, {[]int{3}, "3"}, {[]int{0, 1, 2, 3}, "0-3"}, {[]int{11, 0, 8, 10, 1, 2, 3, 3}, "0-3,8,10-11"}, {[]int{1, 3, 5}, "1,3,5"},
	} {
		got := FormatList(c.in)
		if got != c.want {
			t.Errorf("FormatList(%v) = %q, want %q", c.in, got, c.want)
		}
		back, err := ParseList(got)
		want := slices.Compact(slices.Sorted(slices.Values(c.in)))
		if err != nil || !slices.Equal(back, want) {
			t.Errorf("ParseList(%q) = %v, %v; want %v", got, back, err, want)
		}
	}
	for _, bad := range []string{"x", "3-1", "0-", "-1", "1,,2", "0-70000"} {
		if _, err := ParseList(bad); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("ParseList(%q): error %v, want one naming the list", bad, err)
		}
	}
}

func TestUnion(t *testing.T) {
	for _, c := range []struct {
		lists []string
		n     int
		ok    bool
	}{
		{[]string{"0", "1"}, 2, true}, // two ranks bound to a core each
		{[]string{"0", "0"}, 1, true}, // two ranks on one core
		{[]string{"0", "1", "0", "1"}, 2, true},
		{[]string{"0-3", "2-5"}, 6, true},
		{[]string{"0", ""}, 0, false}, // a rank that did not say
		{[]string{"0", "z"}, 0, false},
		{nil, 0, false},
	} {
		n, ok := Union(c.lists)
		if n != c.n || ok != c.ok {
			t.Errorf("Union(%q) = %d, %v; want %d, %v", c.lists, n, ok, c.n, c.ok)
		}
	}
}

func TestShare(t *testing.T) {
	cpus := []int{0, 1, 2, 3, 4, 5, 6, 7}
	for _, c := range []struct {
		cpus []int
		n, r int
		want []int
	}{
		{cpus, 2, 0, []int{0, 1, 2, 3}}, {cpus, 2, 1, []int{4, 5, 6, 7}},
		{cpus, 3, 2, []int{4, 5}}, // 8/3 = 2 each, 6 and 7 left over
		{[]int{0, 1}, 4, 0, []int{0}}, {[]int{0, 1}, 4, 1, []int{1}}, {[]int{0, 1}, 4, 2, []int{0}}, {[]int{0, 1}, 4, 3, []int{1}},
		{[]int{2, 5}, 2, 1, []int{5}},
		{nil, 2, 0, nil}, {cpus, 0, 0, nil},
	} {
		if got := Share(c.cpus, c.n, c.r); !slices.Equal(got, c.want) {
			t.Errorf("Share(%v, %d ranks, rank %d) = %v, want %v", c.cpus, c.n, c.r, got, c.want)
		}
	}
}

func TestAffinity(t *testing.T) {
	a := Affinity()
	if runtime.GOOS != "linux" {
		t.Skipf("affinity is read on Linux only")
	}
	if len(a) != runtime.NumCPU() {
		t.Errorf("Affinity() = %v: %d processors, runtime.NumCPU() %d", a, len(a), runtime.NumCPU())
	}
}
