package hcomm_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/hcomm"
)

// growRanks grows members by n newcomers: rank 0 makes the token, every
// member calls Grow and every newcomer JoinContext with the token's string
// (as another process would). The grown communicators, by rank, are
// destroyed at the end of the test.
func growRanks(t *testing.T, members []*hcomm.Comm, n int, cfg *hcomm.Config) []*hcomm.Comm {
	t.Helper()
	tok, err := members[0].GrowToken(n)
	if err != nil {
		t.Fatal(err)
	}
	s := tok.String()
	m := len(members)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return initRanks(t, m+n, func(r int) (*hcomm.Comm, error) {
		tk, err := hcomm.ParseJoinToken(s)
		if err != nil {
			return nil, err
		}
		if r < m {
			return members[r].Grow(ctx, tk, cfg)
		}
		return hcomm.JoinContext(ctx, tk, r, cfg)
	})
}

// A communicator of 2 ranks grows by 2 newcomers on every transport: the
// members keep ranks 0 and 1, the newcomers take 2 and 3, the grown
// communicator carries the data plane and the collectives, and the old one
// still works.
func TestGrow(t *testing.T) {
	for _, tr := range hcomm.Transports() {
		t.Run(tr, func(t *testing.T) {
			cfg := testCfg()
			cfg.Transport = tr
			root, err := hcomm.GetRootInfo(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer root.Close()
			old := initRanks(t, 2, func(r int) (*hcomm.Comm, error) { return hcomm.InitRootInfo(2, root, r, cfg) })
			grown := growRanks(t, old, 2, cfg)
			work(t, grown, tr, []int{0, 1, 7, 70000})
			work(t, old, tr, []int{7})
		})
	}
}

func TestGrowErrors(t *testing.T) {
	root, err := hcomm.GetRootInfo(testCfg())
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	old := initRanks(t, 2, func(r int) (*hcomm.Comm, error) { return hcomm.InitRootInfo(2, root, r, testCfg()) })
	ctx := context.Background()

	if _, err := old[1].GrowToken(1); err == nil || !strings.Contains(err.Error(), "rank 1") {
		t.Errorf("GrowToken on rank 1: %v, want an error naming rank 1", err)
	}
	if _, err := old[0].GrowToken(0); err == nil || !strings.Contains(err.Error(), "newcomer count 0") {
		t.Errorf("GrowToken(0): %v, want an error naming the count", err)
	}
	tok, err := old[0].GrowToken(1)
	if err != nil {
		t.Fatal(err)
	}
	defer tok.Root.Close()
	if first, n := tok.Newcomers(); first != 2 || n != 1 {
		t.Errorf("Newcomers() = %d, %d; want 2, 1", first, n)
	}
	if _, err := hcomm.JoinContext(ctx, tok, 1, testCfg()); !isCode(err, hcomm.ErrPara) || !strings.Contains(err.Error(), "rank 1 is not a newcomer's") {
		t.Errorf("JoinContext as rank 1: %v, want ErrPara naming the rank", err)
	}
	other := tok
	other.Members, other.Size = 3, 4
	if _, err := old[1].Grow(ctx, other, nil); !isCode(err, hcomm.ErrPara) || !strings.Contains(err.Error(), "this one has 2") {
		t.Errorf("Grow with a token for 3 members: %v, want ErrPara naming the sizes", err)
	}
	expired := tok
	expired.Expires = time.Now().Add(-time.Second)
	if _, err := hcomm.JoinContext(ctx, expired, 2, testCfg()); !isCode(err, hcomm.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("JoinContext with an expired token: %v, want ErrTimeout matching DeadlineExceeded", err)
	}
	// A token whose store this process does not hold (a stranger's guess,
	// or one that expired and stopped) is refused on rank 0 at once.
	forged := tok
	forged.Root.Secret[0] ^= 1
	if _, err := old[0].Grow(ctx, forged, nil); !isCode(err, hcomm.ErrPara) || !strings.Contains(err.Error(), "no store for this token") {
		t.Errorf("rank 0 Grow with a forged token: %v, want ErrPara", err)
	}
	// A newcomer with a forged secret is refused by the store.
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := hcomm.JoinContext(cctx, forged, 2, testCfg()); err == nil {
		t.Error("JoinContext with a forged secret succeeded")
	} else {
		t.Logf("forged secret: %v", err)
	}
	if _, err := hcomm.ParseJoinToken(strings.Replace(tok.String(), "/2/3/", "/2/2/", 1)); !isCode(err, hcomm.ErrPara) {
		t.Errorf("a token that adds no rank parsed: %v", err)
	}
}

// A grow that a member's ctx cancels fails on every rank promptly rather
// than waiting out the connect timeout.
func TestGrowCanceled(t *testing.T) {
	root, err := hcomm.GetRootInfo(testCfg())
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	old := initRanks(t, 2, func(r int) (*hcomm.Comm, error) { return hcomm.InitRootInfo(2, root, r, testCfg()) })
	tok, err := old[0].GrowToken(1)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var gc *hcomm.Comm
			gc, errs[r] = old[r].Grow(ctx, tok, nil)
			if gc != nil {
				gc.Destroy()
			}
		}()
	}
	wg.Wait() // no newcomer: both end with ctx
	for r, err := range errs {
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("rank %d: %v, want DeadlineExceeded", r, err)
		}
	}
}

func TestJoinTokenString(t *testing.T) {
	tok := hcomm.JoinToken{Root: hcomm.RootInfo{Addr: "10.0.0.1:29500", Secret: [16]byte{1, 2, 3}}, Members: 3, Size: 5,
		Expires: time.UnixMilli(1_700_000_000_123)}
	s := tok.String()
	got, err := hcomm.ParseJoinToken(s)
	if err != nil {
		t.Fatal(err)
	}
	if got.Root != tok.Root || got.Members != 3 || got.Size != 5 || !got.Expires.Equal(tok.Expires) {
		t.Errorf("round trip of %s: %+v", s, got)
	}
	for _, bad := range []string{"", "hcomm1://x", strings.Replace(s, "/3/5/", "/0/5/", 1), strings.Replace(s, "/3/5/", "/3/+5/", 1),
		s + "/1", strings.Replace(s, "@10.0.0.1", "@", 1)} {
		if _, err := hcomm.ParseJoinToken(bad); !isCode(err, hcomm.ErrPara) {
			t.Errorf("ParseJoinToken(%q) = %v, want ErrPara", bad, err)
		}
	}
}

func FuzzParseJoinToken(f *testing.F) {
	f.Add("hcomm-join1://01020300000000000000000000000000@10.0.0.1:29500/3/5/1700000000123") // valid
	f.Add("hcomm-join1://01020300000000000000000000000000@[::1]:1/1/65536/-1")               // largest size
	f.Add("hcomm-join1://@:/0/0/0")                                                          // empty fields
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := hcomm.ParseJoinToken(s)
		if err != nil {
			return
		}
		back, err := hcomm.ParseJoinToken(tok.String())
		if err != nil || back != tok {
			t.Fatalf("%q: round trip gave %+v, %v", s, back, err)
		}
	})
}

// isCode says whether err is an *hcomm.Error with code.
func isCode(err error, code hcomm.Result) bool {
	var e *hcomm.Error
	return errors.As(err, &e) && e.Code == code
}
