package hcomm_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/internal/bootstrap"
	"github.com/hcomm-dev/hcomm/internal/elastic"
)

// membershipStore serves a membership store as `hcomm run --elastic` does
// and returns a function that connects slot to it.
func membershipStore(t *testing.T, slots int) (*bootstrap.Server, func(slot int, newcomer bool) *hcomm.Membership) {
	t.Helper()
	srv, err := bootstrap.Listen("127.0.0.1:0", elastic.Secret("job"), bootstrap.ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv, func(slot int, newcomer bool) *hcomm.Membership {
		t.Setenv("HCOMM_SECRET", "job")
		t.Setenv(elastic.EnvAddr, srv.Addr().String())
		t.Setenv(elastic.EnvSlot, strconv.Itoa(slot))
		t.Setenv(elastic.EnvSlots, strconv.Itoa(slots))
		join := ""
		if newcomer {
			join = "1"
		}
		t.Setenv(elastic.EnvJoin, join)
		m, err := hcomm.ElasticFromEnv(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		if m.Slot() != slot || m.Newcomer() != newcomer {
			t.Fatalf("slot %d: Slot() = %d, Newcomer() = %v", slot, m.Slot(), m.Newcomer())
		}
		return m
	}
}

// The membership protocol end to end: a newcomer registers, rank 0 sees it
// pending, makes a token and admits it, the members grow and the newcomer
// joins with the rank it was given; a newcomer that comes after End, or
// waits when the store closes, learns the job ended.
func TestMembership(t *testing.T) {
	t.Setenv(elastic.EnvAddr, "")
	if m, err := hcomm.ElasticFromEnv(context.Background()); m != nil || err != nil {
		t.Fatalf("outside --elastic: %v, %v; want nil, nil", m, err)
	}
	srv, connect := membershipStore(t, 5)
	m0 := connect(0, false)
	m3 := connect(3, true)
	root, err := hcomm.GetRootInfo(testCfg())
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	old := initRanks(t, 2, func(r int) (*hcomm.Comm, error) { return hcomm.InitRootInfo(2, root, r, testCfg()) })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type joined struct {
		c   *hcomm.Comm
		err error
	}
	newcomer := make(chan joined, 1)
	go func() {
		tok, rank, err := m3.AwaitToken(ctx)
		if err != nil {
			newcomer <- joined{nil, err}
			return
		}
		c, err := hcomm.JoinContext(ctx, tok, rank, testCfg())
		newcomer <- joined{c, err}
	}()
	var pending int
	for pending == 0 && ctx.Err() == nil {
		if pending, err = m0.Pending(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if pending != 1 {
		t.Fatalf("Pending = %d, want 1", pending)
	}
	tok, err := old[0].GrowToken(pending)
	if err != nil {
		t.Fatal(err)
	}
	if err := m0.Admit(ctx, tok); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := srv.Local().TryGet(ctx, elastic.MemberKey(3)); !ok {
		t.Error("Admit did not mark slot 3 as a member")
	}
	grown := make([]*hcomm.Comm, 3)
	gerrs := make(chan error, 2)
	for r := range 2 {
		go func() {
			var err error
			grown[r], err = old[r].Grow(ctx, tok, nil)
			gerrs <- err
		}()
	}
	j := <-newcomer
	for range 2 {
		if err := <-gerrs; err != nil {
			t.Fatal(err)
		}
	}
	if j.err != nil {
		t.Fatal(j.err)
	}
	grown[2] = j.c
	defer func() {
		for _, c := range grown {
			c.Destroy()
		}
	}()
	if j.c.Rank() != 2 || j.c.Size() != 3 {
		t.Fatalf("the newcomer is rank %d of %d, want 2 of 3", j.c.Rank(), j.c.Size())
	}
	work(t, grown, "", []int{7})
	if n, _ := m0.Pending(ctx); n != 0 {
		t.Errorf("Pending after Admit = %d", n)
	}
	if err := m0.Admit(ctx, tok); !isCode(err, hcomm.ErrPara) {
		t.Errorf("Admit with no newcomer waiting: %v, want ErrPara", err)
	}

	// A newcomer waiting at End, and one that comes after it.
	m4 := connect(4, true)
	waiting := make(chan error, 1)
	go func() { _, _, err := m4.AwaitToken(ctx); waiting <- err }()
	for n := 0; n == 0 && ctx.Err() == nil; time.Sleep(5 * time.Millisecond) {
		n, _ = m0.Pending(ctx)
	}
	if err := m0.End(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-waiting; !errors.Is(err, hcomm.ErrJobEnded) {
		t.Errorf("a newcomer waiting at End: %v, want ErrJobEnded", err)
	}
	m2 := connect(2, true)
	if _, _, err := m2.AwaitToken(ctx); !errors.Is(err, hcomm.ErrJobEnded) {
		t.Errorf("a newcomer after End: %v, want ErrJobEnded", err)
	}
}

// A newcomer waiting when the launcher closes its store learns the job ended.
func TestMembershipStoreClosed(t *testing.T) {
	srv, connect := membershipStore(t, 2)
	m := connect(1, true)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	go func() {
		time.Sleep(100 * time.Millisecond)
		srv.Close()
	}()
	if _, _, err := m.AwaitToken(ctx); !errors.Is(err, hcomm.ErrJobEnded) {
		t.Errorf("store closed: %v, want ErrJobEnded", err)
	}
}
