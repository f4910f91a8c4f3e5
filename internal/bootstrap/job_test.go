package bootstrap

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// TryGet answers at once, found or not, over memory and TCP and through a
// prefix.
func TestTryGet(t *testing.T) {
	stores(t, func(t *testing.T, get func(int) Store) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, s := range []Store{get(0), Prefix(get(1), "p")} {
			start := time.Now()
			if v, ok, err := s.TryGet(ctx, "missing"); ok || err != nil || v != nil {
				t.Fatalf("TryGet(missing) = %q, %v, %v", v, ok, err)
			}
			if d := time.Since(start); d > time.Second {
				t.Fatalf("TryGet of a missing key took %v", d)
			}
			if err := s.Set(ctx, "k", []byte("v")); err != nil {
				t.Fatal(err)
			}
			if v, ok, err := s.TryGet(ctx, "k"); !ok || err != nil || string(v) != "v" {
				t.Fatalf("TryGet(k) = %q, %v, %v", v, ok, err)
			}
			if err := s.Set(ctx, "empty", nil); err != nil {
				t.Fatal(err)
			}
			if v, ok, err := s.TryGet(ctx, "empty"); !ok || err != nil || len(v) != 0 {
				t.Fatalf("TryGet(empty) = %q, %v, %v", v, ok, err)
			}
		}
		if _, _, err := get(0).TryGet(ctx, ""); err == nil {
			t.Fatal("TryGet with an empty key succeeded")
		}
	})
}

// jobServer starts a store whose OnLost hook, when strict, must never run
// (a failed rendezvous is no lost rank).
func jobServer(t *testing.T, strict bool) (*Server, Secret) {
	t.Helper()
	sec, _ := NewSecret()
	opts := ServerOptions{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), HandshakeTimeout: 2 * time.Second}
	if strict {
		opts.OnLost = func(_ Store, rank int, reason string) { t.Errorf("OnLost(%d, %s)", rank, reason) }
	}
	srv, err := Listen("127.0.0.1:0", sec, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv, sec
}

// waiters dials the claims and starts on each client a Get that waits for
// a key nobody sets; the channel receives each Get's error.
func waiters(t *testing.T, srv *Server, sec Secret, claims ...Claim) (<-chan error, func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	errs := make(chan error, len(claims))
	var cls []*Client
	var wg sync.WaitGroup
	for _, cl := range claims {
		c, err := Dial(ctx, srv.Addr().String(), sec, cl)
		if err != nil {
			t.Fatalf("Dial(%v): %v", cl, err)
		}
		cls = append(cls, c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.Get(ctx, "never")
			errs <- err
		}()
	}
	return errs, func() {
		cancel()
		wg.Wait()
		for _, c := range cls {
			c.Close()
		}
	}
}

// expectJobFailure checks that the offender's Dial and every waiting
// client's Get fail promptly with ErrJobFailed and a message saying want.
func expectJobFailure(t *testing.T, srv *Server, sec Secret, errs <-chan error, n int, offender Claim, want ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	c, err := Dial(ctx, srv.Addr().String(), sec, offender)
	if err == nil {
		c.Close()
		t.Fatalf("Dial(%v) was admitted", offender)
	}
	check := func(who string, err error) {
		t.Helper()
		if !errors.Is(err, ErrJobFailed) {
			t.Errorf("%s: %v; want ErrJobFailed", who, err)
			return
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", who, err, w)
			}
		}
	}
	check("the offender", err)
	for i := 0; i < n; i++ {
		select {
		case err := <-errs:
			check("a waiting rank", err)
		case <-time.After(5 * time.Second):
			t.Fatalf("a waiting rank still waits %v after the job failed", time.Since(start))
		}
	}
	if srv.Failed() == "" {
		t.Error("Failed() is empty")
	}
	// Later claims are refused with the reason too.
	if c, err := Dial(ctx, srv.Addr().String(), sec, Claim{Rank: 0, NRanks: offender.NRanks}); !errors.Is(err, ErrJobFailed) {
		if c != nil {
			c.Close()
		}
		t.Errorf("a claim after the failure: %v; want ErrJobFailed", err)
	}
}

// A rank whose rank count differs from the job's fails the job: it is
// refused, and every rank waiting in the store fails at once with the reason.
func TestJobRankCountMismatch(t *testing.T) {
	srv, sec := jobServer(t, true)
	srv.Expect(4)
	errs, stop := waiters(t, srv, sec, Claim{Rank: 0, NRanks: 4}, Claim{Rank: 1, NRanks: 4}, Claim{Rank: 2, NRanks: 4})
	defer stop()
	expectJobFailure(t, srv, sec, errs, 3, Claim{Rank: 3, NRanks: 8, PID: 42, Host: "nodeB"},
		"rank 3 (pid 42 on nodeB) joined a job of 8 ranks; this job has 4")
}

// Without Expect (rank 0 has not joined yet), ranks that disagree on the
// rank count fail the job all the same; Expect fails it for ranks admitted
// before it.
func TestJobRankCountDisagreement(t *testing.T) {
	srv, sec := jobServer(t, true)
	errs, stop := waiters(t, srv, sec, Claim{Rank: 1, NRanks: 4, PID: 7, Host: "a"})
	defer stop()
	expectJobFailure(t, srv, sec, errs, 1, Claim{Rank: 2, NRanks: 5, PID: 8, Host: "b"},
		"rank 1 (pid 7 on a) says 4 ranks, rank 2 (pid 8 on b) says 5")

	srv2, sec2 := jobServer(t, true)
	errs2, stop2 := waiters(t, srv2, sec2, Claim{Rank: 1, NRanks: 3, PID: 9, Host: "c"})
	defer stop2()
	srv2.Expect(2)
	select {
	case err := <-errs2:
		if !errors.Is(err, ErrJobFailed) || !strings.Contains(err.Error(), "rank 1 (pid 9 on c) joined a job of 3 ranks; this job has 2") {
			t.Errorf("rank admitted before Expect: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a rank admitted before Expect still waits")
	}
}

// Two processes claiming one rank fail the job, naming both.
func TestJobDuplicateRank(t *testing.T) {
	srv, sec := jobServer(t, true)
	srv.Expect(3)
	errs, stop := waiters(t, srv, sec, Claim{Rank: 0, NRanks: 3}, Claim{Rank: 1, NRanks: 3, PID: 11, Host: "hostA"})
	defer stop()
	expectJobFailure(t, srv, sec, errs, 2, Claim{Rank: 1, NRanks: 3, PID: 22, Host: "hostB"},
		"two processes claim rank 1 (pid 11 on hostA, pid 22 on hostB)")
}

// Host names of the longest kind make reasons that still fit the verdict
// and pass its MAC.
func TestJobLongHostNames(t *testing.T) {
	srv, sec := jobServer(t, true)
	long := func(c byte) string { return strings.Repeat(string(c), 300) } // cut to 255 on the wire
	errs, stop := waiters(t, srv, sec, Claim{Rank: 0, NRanks: 2, PID: 1, Host: long('a')})
	defer stop()
	expectJobFailure(t, srv, sec, errs, 1, Claim{Rank: 0, NRanks: 2, PID: 2, Host: long('b')},
		"two processes claim rank 0 (pid 1 on "+long('a')[:255]+", pid 2 on "+long('b')[:255]+")")
}

// A rank whose connection ended (a retried dial) may join again; once
// every rank has joined, a newcomer — another job on the same port — is
// refused alone and the job goes on.
func TestJobCompleteRefusesNewcomerAlone(t *testing.T) {
	srv, sec := jobServer(t, false)
	srv.Expect(2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first, err := Dial(ctx, srv.Addr().String(), sec, Claim{Rank: 1, NRanks: 2})
	if err != nil {
		t.Fatal(err)
	}
	first.Close()
	deadline := time.Now().Add(5 * time.Second)
	var r1 *Client
	for {
		if r1, err = Dial(ctx, srv.Addr().String(), sec, Claim{Rank: 1, NRanks: 2}); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond) // the server may not have seen the first end yet
	}
	if err != nil {
		t.Fatalf("rank 1 joining again after its connection ended: %v", err)
	}
	defer r1.Close()
	r0, err := Dial(ctx, srv.Addr().String(), sec, Claim{Rank: 0, NRanks: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer r0.Close()
	for _, cl := range []Claim{{Rank: 1, NRanks: 2}, {Rank: 0, NRanks: 4}, {Rank: 3, NRanks: 4}} {
		c, err := Dial(ctx, srv.Addr().String(), sec, cl)
		if err == nil {
			c.Close()
			t.Fatalf("newcomer %v admitted to a complete job", cl)
		}
		if !errors.Is(err, ErrJobFailed) || !strings.Contains(err.Error(), "all 2 ranks of this store's job have joined") ||
			!strings.Contains(err.Error(), "another job") {
			t.Errorf("newcomer %v: %v", cl, err)
		}
	}
	if f := srv.Failed(); f != "" {
		t.Fatalf("a newcomer failed the complete job: %s", f)
	}
	if err := r0.Set(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if v, err := r1.Get(ctx, "k"); err != nil || string(v) != "v" {
		t.Fatalf("the job after a newcomer: %q, %v", v, err)
	}
}

// FuzzClientHello sends the server arbitrary answers to its challenge: it
// never panics, never admits one (none can prove the secret), and keeps
// serving.
func FuzzClientHello(f *testing.F) {
	sec, _ := NewSecret()
	srv, err := Listen("127.0.0.1:0", sec, ServerOptions{HandshakeTimeout: 2 * time.Second})
	if err != nil {
		f.Fatal(err)
	}
	defer srv.Close()
	shaped := func(v byte, hostLen byte, host string) []byte {
		b := append(magicClient[:], v)
		b = append(b, claimBytes(Claim{Rank: 1, NRanks: 2, PID: 3, Host: host})[:12]...)
		b = append(b, hostLen)
		b = append(b, make([]byte, nonceLen+macLen)...) // a zero nonce and a MAC that does not prove
		return append(b, host...)
	}
	f.Add(shaped(version, 4, "node"))       // well formed, wrong MAC
	f.Add(shaped(version, 200, "short"))    // a host shorter than its length
	f.Add(shaped(1, 0, ""))                 // version 1
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n")) // not hcomm
	f.Add([]byte{})                         // silence, then EOF
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := net.Dial("tcp", srv.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(c, make([]byte, serverHello)); err != nil {
			t.Fatal(err)
		}
		c.Write(b)
		c.(*net.TCPConn).CloseWrite()
		reply, _ := io.ReadAll(c)
		if len(reply) > 0 && reply[0] == verdictAdmitted {
			t.Fatalf("admitted %x", b)
		}
		srv.mu.Lock()
		n := len(srv.members)
		srv.mu.Unlock()
		if n != 0 {
			t.Fatalf("%d members after %x", n, b)
		}
	})
}
