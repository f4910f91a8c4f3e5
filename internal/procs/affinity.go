package procs

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// A rank bound to some of the host's processors (hcomm run --bind-to core,
// mpirun --bind-to core, srun --cpu-bind) sees only those: runtime.NumCPU()
// follows the binding. How crowded the host is — how many processors its
// ranks share — is then not one rank's count but the union of the ranks'
// sets, which each rank publishes in the kernel's list form (Affinity,
// FormatList) and its communicator joins (Union).

// FormatList writes cpus in the kernel's list form ("0-3,8,10-11"), sorted
// and without repeats; "" for none.
func FormatList(cpus []int) string {
	s := slices.Clone(cpus)
	slices.Sort(s)
	s = slices.Compact(s)
	var b strings.Builder
	for i := 0; i < len(s); {
		j := i
		for j+1 < len(s) && s[j+1] == s[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(s[i]))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(s[j]))
		}
		i = j + 1
	}
	return b.String()
}

// ParseList reads a kernel CPU list ("0-3,8,10-11"); an empty list is none.
// A list that does not parse, a negative or reversed range, or one of more
// than 1<<16 processors is an error naming it.
func ParseList(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	var out []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		b := a
		if err == nil && isRange {
			b, err = strconv.Atoi(hi)
		}
		if err != nil || a < 0 || b < a || b-a >= 1<<16 || len(out)+b-a+1 > 1<<16 {
			return nil, fmt.Errorf("procs: CPU list %q: %q is not a processor or a range of them", s, part)
		}
		for c := a; c <= b; c++ {
			out = append(out, c)
		}
	}
	return out, nil
}

// Union returns how many processors the lists name together, and false
// when one of them is empty or does not parse (its rank did not say).
func Union(lists []string) (int, bool) {
	seen := map[int]bool{}
	for _, l := range lists {
		cpus, err := ParseList(l)
		if err != nil || len(cpus) == 0 {
			return 0, false
		}
		for _, c := range cpus {
			seen[c] = true
		}
	}
	return len(seen), len(lists) > 0
}

// Share divides cpus among n ranks as a launcher binds them: rank r gets
// its own run of len(cpus)/n processors (the rest left over), or, with
// more ranks than processors, the one processor r mod len(cpus). nil when
// there is nothing to divide.
func Share(cpus []int, n, r int) []int {
	if len(cpus) == 0 || n < 1 || r < 0 {
		return nil
	}
	k := len(cpus) / n
	if k < 1 {
		return []int{cpus[r%len(cpus)]}
	}
	r %= n
	return slices.Clone(cpus[r*k : (r+1)*k])
}
