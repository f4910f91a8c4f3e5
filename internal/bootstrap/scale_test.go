package bootstrap

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"
)

// A call whose context ends before it writes (a starved process: its turn
// to write came after its deadline) fails alone: the connection stays up
// for the next call. (It used to close the connection — and a rank whose
// keep-alive ping missed its slot took the store for lost.)
func TestExpiredCallKeepsConnection(t *testing.T) {
	sec, _ := NewSecret()
	srv, _ := newServer(t, sec)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, srv.Addr().String(), sec, Claim{Rank: 0, NRanks: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dead, dcancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer dcancel()
	if err := c.Set(dead, "k", []byte("v")); err == nil {
		t.Fatal("a set with an expired deadline succeeded")
	}
	if err := c.Set(ctx, "k", []byte("w")); err != nil {
		t.Fatalf("the call after an expired one: %v", err)
	}
	if v, err := c.Get(ctx, "k"); err != nil || string(v) != "w" {
		t.Fatalf("get = %q, %v; want w", v, err)
	}
	select {
	case <-c.Done():
		t.Fatal("the connection ended")
	default:
	}
}

// Watched limits the idle timeout to the connections it accepts; a
// connection dropped for its silence gets a goodbye, so that its client
// does not take the store for lost.
func TestIdleWatchedAndGoodbye(t *testing.T) {
	sec, _ := NewSecret()
	lost := make(chan int, 4)
	srv, err := Listen("127.0.0.1:0", sec, ServerOptions{
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		IdleTimeout: 300 * time.Millisecond,
		Watched:     func(c Claim) bool { return c.Rank == 2 },
		OnLost:      func(_ Store, rank int, _ string) { lost <- rank },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	free, err := Dial(ctx, srv.Addr().String(), sec, Claim{Rank: 1, NRanks: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer free.Close()
	watched, err := Dial(ctx, srv.Addr().String(), sec, Claim{Rank: 2, NRanks: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer watched.Close()
	select {
	case r := <-lost:
		if r != 2 {
			t.Fatalf("lost rank %d, want the watched 2", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the watched quiet rank was not reported")
	}
	select {
	case <-watched.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the dropped client's connection did not end")
	}
	if watched.Lost() {
		t.Errorf("the client dropped for its silence takes the store for lost: %v", watched.Err())
	}
	time.Sleep(500 * time.Millisecond)
	if err := free.Set(ctx, "k", nil); err != nil {
		t.Fatalf("the unwatched quiet rank was dropped: %v", err)
	}
}

// DialUp does not retry: a store that is not listening is gone at once.
func TestDialUpGone(t *testing.T) {
	addr := closedAddr(t)
	sec, _ := NewSecret()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	_, err := DialUp(ctx, addr, sec, Claim{Rank: 1, NRanks: 2})
	if !errors.Is(err, ErrGone) {
		t.Fatalf("DialUp to nothing: %v, want ErrGone", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("DialUp took %v; want no retries", d)
	}
}

// Served counts the admitted handshakes and the frames they sent.
func TestServedCounts(t *testing.T) {
	sec, _ := NewSecret()
	srv, _ := newServer(t, sec)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, srv.Addr().String(), sec, Claim{Rank: 0, NRanks: 1})
	if err != nil {
		t.Fatal(err)
	}
	c.Set(ctx, "a", nil)
	c.Get(ctx, "a")
	c.Add(ctx, "n", 1)
	c.Close() // a goodbye
	if got, want := srv.Served(), int64(5); got != want {
		for i := 0; i < 100 && srv.Served() < want; i++ {
			time.Sleep(10 * time.Millisecond)
		}
		if got = srv.Served(); got != want {
			t.Errorf("served %d messages, want %d (a handshake, 3 requests, a goodbye)", got, want)
		}
	}
}

// An Open server (a rank's mailbox) admits several live connections of one
// rank — a rank dials it for each channel setup and hangs up after, and its
// next dial may come before the server has read the last goodbye — where a
// job's store takes the second for another process claiming the rank.
func TestOpenAdmitsRankTwice(t *testing.T) {
	sec, _ := NewSecret()
	srv, err := Listen("127.0.0.1:0", sec, ServerOptions{Logger: slog.New(slog.DiscardHandler), Open: true})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var clis []*Client
	for i := range 3 {
		c, err := DialUp(ctx, srv.Addr().String(), sec, Claim{Rank: 1, NRanks: 4, PID: 7, Host: "h"})
		if err != nil {
			t.Fatalf("connection %d of rank 1: %v", i, err)
		}
		defer c.Close()
		clis = append(clis, c)
	}
	for i, c := range clis {
		if err := c.Set(ctx, "k", []byte{byte(i)}); err != nil {
			t.Fatalf("connection %d of rank 1: %v", i, err)
		}
	}
	if n := srv.Conns(); n != 3 {
		t.Errorf("the server holds %d connections, want 3", n)
	}
	if f := srv.Failed(); f != "" {
		t.Errorf("the server failed its job: %s", f)
	}
}
