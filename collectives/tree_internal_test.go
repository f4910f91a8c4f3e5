package collectives

import (
	"strings"
	"testing"
)

// TestTreeStepsPairUp: the tree's rounds, at every rank count from 2 to 70
// and a large one, pair up — each send of a rank to a peer is that peer's
// receive from it, in the same order on both sides (the hello parities
// count on it) — with 2(n-1) messages in all, one up from every rank but
// the root and one down to it, every rank's hello up after its children's,
// and the subtrees (what a hello up carries) the ranks below each child.
func TestTreeStepsPairUp(t *testing.T) {
	for _, n := range append(seq(2, 70), 1000) {
		steps := make([][]bfStep, n)
		msgs := 0
		for me := range n {
			steps[me] = treeSteps(me, n)
			if len(steps[me]) > bfInlineSteps && n <= 1<<11 {
				t.Fatalf("n=%d rank %d: %d rounds, more than a bfCall holds (%d)", n, me, len(steps[me]), bfInlineSteps)
			}
			for _, s := range steps[me] {
				if s.send {
					msgs++
				}
			}
		}
		if msgs != 2*(n-1) {
			t.Fatalf("n=%d: %d messages, want %d", n, msgs, 2*(n-1))
		}
		for me := range n {
			// Per peer, this rank's sends and receives in order against
			// the peer's receives and sends from this rank in order.
			for _, p := range peersOf(steps[me]) {
				mine, theirs := dirs(steps[me], p), dirs(steps[p], me)
				if len(mine) != len(theirs) {
					t.Fatalf("n=%d: rank %d has %q with %d, rank %d %q with %d", n, me, mine, p, p, theirs, me)
				}
				for i := range mine {
					if mine[i] == theirs[i] {
						t.Fatalf("n=%d: rank %d's step %d with %d is %q, so is %d's with %d", n, me, i, p, mine, p, me)
					}
				}
			}
			lo, hi := subtree(me, n)
			covered := 1
			up := -1
			for i, s := range steps[me] {
				switch {
				case s.recv && !s.final:
					if up >= 0 {
						t.Fatalf("n=%d rank %d: a child's hello in after its own went up", n, me)
					}
					clo, chi := subtree(s.peer, n)
					if clo != s.peer || clo < lo || chi > hi {
						t.Fatalf("n=%d rank %d: child %d's subtree [%d, %d) outside [%d, %d)", n, me, s.peer, clo, chi, lo, hi)
					}
					covered += chi - clo
				case s.send && s.peer < me:
					up = i
				}
			}
			if covered != hi-lo {
				t.Fatalf("n=%d rank %d: children cover %d ranks with it, its subtree %d", n, me, covered, hi-lo)
			}
			if (me == 0) != (up < 0) {
				t.Fatalf("n=%d rank %d: its hello up at step %d", n, me, up)
			}
		}
	}
}

func seq(lo, hi int) []int {
	var s []int
	for n := lo; n <= hi; n++ {
		s = append(s, n)
	}
	return s
}

func peersOf(steps []bfStep) []int {
	var ps []int
	seen := map[int]bool{}
	for _, s := range steps {
		if !seen[s.peer] {
			seen[s.peer] = true
			ps = append(ps, s.peer)
		}
	}
	return ps
}

// dirs is the string of a rank's steps with peer p: 's' a send, 'r' a
// receive.
func dirs(steps []bfStep, p int) string {
	var b strings.Builder
	for _, s := range steps {
		if s.peer != p {
			continue
		}
		if s.send {
			b.WriteByte('s')
		}
		if s.recv {
			b.WriteByte('r')
		}
	}
	return b.String()
}

// TestEnvTree: HCOMM_HANDSHAKE forces either form, unset leaves the
// communicator's choice, and anything else is refused by name.
func TestEnvTree(t *testing.T) {
	for _, c := range []struct {
		env        string
		auto, want bool
		err        string
	}{
		{"", true, true, ""}, {"", false, false, ""},
		{"tree", false, true, ""}, {"butterfly", true, false, ""},
		{"binomial", true, false, `HCOMM_HANDSHAKE="binomial"`},
	} {
		t.Setenv("HCOMM_HANDSHAKE", c.env)
		got, err := envTree(c.auto)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("HCOMM_HANDSHAKE=%q: %v, want an error naming %s", c.env, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("HCOMM_HANDSHAKE=%q auto=%v: %v, %v; want %v", c.env, c.auto, got, err, c.want)
		}
	}
}
