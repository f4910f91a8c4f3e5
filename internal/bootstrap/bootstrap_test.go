package bootstrap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// logBuf is a concurrency-safe log sink.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func newServer(t *testing.T, secret Secret) (*Server, *logBuf) {
	t.Helper()
	lb := &logBuf{}
	s, err := Listen("127.0.0.1:0", secret, ServerOptions{Logger: slog.New(slog.NewTextHandler(lb, nil)), HandshakeTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, lb
}

// closedAddr returns a local TCP address that nothing listens on: a port
// just given back (a later listener may take it, rarely).
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// stores runs f over a MemStore and over TCP clients of one server.
func stores(t *testing.T, f func(t *testing.T, get func(rank int) Store)) {
	t.Run("mem", func(t *testing.T) {
		m := NewMemStore()
		defer m.Close()
		f(t, func(int) Store { return m })
	})
	t.Run("tcp", func(t *testing.T) {
		sec, _ := NewSecret()
		srv, _ := newServer(t, sec)
		var mu sync.Mutex
		clients := map[int]*Client{}
		defer func() {
			for _, c := range clients {
				c.Close()
			}
		}()
		f(t, func(rank int) Store {
			mu.Lock()
			defer mu.Unlock()
			if c, ok := clients[rank]; ok {
				return c
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c, err := Dial(ctx, srv.Addr().String(), sec, Claim{Rank: rank, NRanks: 16})
			if err != nil {
				t.Fatal(err)
			}
			clients[rank] = c
			return c
		})
	})
}

func TestSetGetAddDelete(t *testing.T) {
	stores(t, func(t *testing.T, get func(int) Store) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		a, b := get(0), get(1)
		got := make(chan []byte, 1)
		go func() {
			v, err := b.Get(ctx, "k")
			if err != nil {
				t.Error(err)
			}
			got <- v
		}()
		time.Sleep(20 * time.Millisecond) // let the Get wait first
		if err := a.Set(ctx, "k", []byte("hello")); err != nil {
			t.Fatal(err)
		}
		if v := <-got; string(v) != "hello" {
			t.Fatalf("Get = %q, want hello", v)
		}
		if err := a.Set(ctx, "empty", nil); err != nil {
			t.Fatal(err)
		}
		if v, err := b.Get(ctx, "empty"); err != nil || len(v) != 0 {
			t.Fatalf("Get(empty) = %q, %v", v, err)
		}
		for i, want := range []int64{5, 2, 3} {
			d := []int64{5, -3, 1}[i]
			v, err := get(i).Add(ctx, "ctr", d)
			if err != nil || v != want {
				t.Fatalf("Add #%d = %d, %v; want %d", i, v, err, want)
			}
		}
		if err := b.Delete(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		short, c2 := context.WithTimeout(ctx, 50*time.Millisecond)
		defer c2()
		if _, err := a.Get(short, "k"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Get of a deleted key = %v, want a deadline error", err)
		}
		if err := a.Set(ctx, "", nil); err == nil {
			t.Fatal("Set with an empty key succeeded")
		}
		if err := a.Set(ctx, "big", make([]byte, MaxValueLen+1)); err == nil {
			t.Fatal("Set of an oversized value succeeded")
		}
		// A cancelled Get does not disturb a later one on the same key.
		if err := a.Set(ctx, "k", []byte("again")); err != nil {
			t.Fatal(err)
		}
		if v, err := b.Get(ctx, "k"); err != nil || string(v) != "again" {
			t.Fatalf("Get after cancel = %q, %v", v, err)
		}
	})
}

func TestPrefixBarrierExchange(t *testing.T) {
	stores(t, func(t *testing.T, get func(int) Store) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p := Prefix(Prefix(get(0), "a"), "b")
		if err := p.Set(ctx, "k", []byte("v")); err != nil {
			t.Fatal(err)
		}
		if v, err := get(1).Get(ctx, "a/b/k"); err != nil || string(v) != "v" {
			t.Fatalf("prefixed key = %q, %v", v, err)
		}
		p.Close() // does not close the store
		if err := get(0).Set(ctx, "still", nil); err != nil {
			t.Fatalf("store unusable after closing a prefix view: %v", err)
		}
		const n = 4
		var wg sync.WaitGroup
		var passed sync.Map
		for r := 0; r < n; r++ {
			wg.Add(1)
			go func(r int) {
				defer wg.Done()
				s := get(r)
				if err := Barrier(ctx, s, "b1", n); err != nil {
					t.Error(err)
				}
				passed.Store(r, true)
				peer := r ^ 1
				v, err := Exchange(ctx, s, "x", fmt.Sprint(r), fmt.Sprint(peer), []byte{byte(r)})
				if err != nil || len(v) != 1 || int(v[0]) != peer {
					t.Errorf("rank %d: Exchange = %v, %v; want [%d]", r, v, err, peer)
				}
			}(r)
		}
		wg.Wait()
		// The exchange keys were consumed.
		short, c2 := context.WithTimeout(ctx, 30*time.Millisecond)
		defer c2()
		if _, err := get(0).Get(short, "x/1"); err == nil {
			t.Fatal("exchange key left in the store")
		}
		if err := Barrier(ctx, get(0), "b1", n); err == nil {
			t.Fatal("a fifth arrival at a barrier of 4 succeeded")
		}
	})
}

// A stranger with the wrong secret is refused and logged; the store keeps
// serving the ranks that know it.
func TestWrongSecretRefused(t *testing.T) {
	sec, _ := NewSecret()
	srv, logs := newServer(t, sec)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	good, err := Dial(ctx, srv.Addr().String(), sec, Claim{Rank: 0, NRanks: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	wrong := sec
	wrong[0] ^= 1
	if c, err := Dial(ctx, srv.Addr().String(), wrong, Claim{Rank: 7, NRanks: 16}); !errors.Is(err, ErrAuth) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("Dial with a wrong secret = %v, want ErrAuth", err)
	}
	// Garbage and silence are refused too.
	raw, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	io.ReadFull(raw, make([]byte, serverHello))
	raw.Write(bytes.Repeat([]byte("GET / HTTP/1.1\r\n"), 10))
	raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(raw); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("server did not close a garbage connection: %v", err)
	}
	raw.Close()
	deadline := time.Now().Add(5 * time.Second)
	for srv.Refused() < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if srv.Refused() != 2 {
		t.Fatalf("Refused = %d, want 2", srv.Refused())
	}
	if l := logs.String(); !strings.Contains(l, "wrong secret") || !strings.Contains(l, "claimed_rank=7") ||
		!strings.Contains(l, "not an hcomm bootstrap client") {
		t.Fatalf("refusals not logged:\n%s", l)
	}
	if err := good.Set(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if v, err := good.Get(ctx, "k"); err != nil || string(v) != "v" {
		t.Fatalf("good client after strangers: %q, %v", v, err)
	}
	// A server that does not know the secret cannot fool a client either.
	fake, _ := newServer(t, wrong)
	if c, err := Dial(ctx, fake.Addr().String(), sec, Claim{Rank: 1, NRanks: 16}); !errors.Is(err, ErrAuth) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("Dial to a server with another secret = %v, want ErrAuth", err)
	}
}

// Ranks may start before rank 0's store: Dial retries until it is up.
func TestDialRetriesUntilServerUp(t *testing.T) {
	addr := closedAddr(t)
	sec, _ := NewSecret()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type res struct {
		c   *Client
		err error
	}
	done := make(chan res, 1)
	go func() {
		c, err := Dial(ctx, addr, sec, Claim{Rank: 1, NRanks: 16})
		done <- res{c, err}
	}()
	time.Sleep(150 * time.Millisecond)
	srv, err := Listen(addr, sec, ServerOptions{})
	if err != nil {
		t.Skipf("port %s taken meanwhile: %v", addr, err)
	}
	defer srv.Close()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.c.Close()

	// With no server at all, Dial gives up at the deadline naming the address.
	short, c2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer c2()
	srv.Close()
	if _, err := Dial(short, addr, sec, Claim{Rank: 3, NRanks: 16}); err == nil || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), addr) {
		t.Fatalf("Dial with no server = %v", err)
	}
}

// Closing the server fails pending Gets of its clients; closing a client fails
// its own pending Gets; both are idempotent.
func TestCloseUnblocks(t *testing.T) {
	sec, _ := NewSecret()
	srv, _ := newServer(t, sec)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c1, err := Dial(ctx, srv.Addr().String(), sec, Claim{Rank: 1, NRanks: 16})
	if err != nil {
		t.Fatal(err)
	}
	c2, err := Dial(ctx, srv.Addr().String(), sec, Claim{Rank: 2, NRanks: 16})
	if err != nil {
		t.Fatal(err)
	}
	e1, e2 := make(chan error, 1), make(chan error, 1)
	go func() { _, err := c1.Get(ctx, "never"); e1 <- err }()
	go func() { _, err := c2.Get(ctx, "never"); e2 <- err }()
	time.Sleep(30 * time.Millisecond)
	c1.Close()
	c1.Close()
	if err := <-e1; !errors.Is(err, ErrClosed) {
		t.Fatalf("Get on a closed client = %v, want ErrClosed", err)
	}
	srv.Close()
	srv.Close()
	if err := <-e2; !errors.Is(err, ErrClosed) {
		t.Fatalf("Get when the server closed = %v, want ErrClosed", err)
	}
	<-c2.Done()
	if err := c2.Set(ctx, "k", nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Set after the server closed = %v", err)
	}
	c2.Close()
	m := NewMemStore()
	go func() { _, err := m.Get(ctx, "never"); e1 <- err }()
	time.Sleep(10 * time.Millisecond)
	m.Close()
	if err := <-e1; !errors.Is(err, ErrClosed) {
		t.Fatalf("MemStore Get after Close = %v", err)
	}
}

func TestParseIfname(t *testing.T) {
	for _, tc := range []struct {
		spec string
		yes  []string
		no   []string
	}{
		{"eth", []string{"eth0", "eth12"}, []string{"ib0", "lo"}},
		{"eth,ib", []string{"eth0", "ib1"}, []string{"lo"}},
		{"^docker,lo", []string{"eth0"}, []string{"docker0", "lo"}},
		{"=eth0", []string{"eth0"}, []string{"eth01", "eth1"}},
		{"^=eth0", []string{"eth01", "lo"}, []string{"eth0"}},
	} {
		m, err := ParseIfname(tc.spec)
		if err != nil {
			t.Fatal(err)
		}
		for _, y := range tc.yes {
			if !m(y) {
				t.Errorf("%q does not match %q", tc.spec, y)
			}
		}
		for _, n := range tc.no {
			if m(n) {
				t.Errorf("%q matches %q", tc.spec, n)
			}
		}
	}
	if _, err := ParseIfname("^,"); err == nil {
		t.Fatal("empty list accepted")
	}
	ifc, err := PickIface("lo")
	if err != nil || !ifc.IP.IsLoopback() {
		t.Fatalf("PickIface(lo) = %v, %v", ifc, err)
	}
	if _, err := PickIface("=nosuchif0"); err == nil || !strings.Contains(err.Error(), "nosuchif0") {
		t.Fatalf("PickIface(nosuchif0) = %v", err)
	}
	if _, err := PickIface(""); err != nil {
		t.Fatal(err)
	}
}

func TestDeriveSecret(t *testing.T) {
	a, b := DeriveSecret("x"), DeriveSecret("y")
	if a == b || a != DeriveSecret("x") || len(a.String()) != 32 {
		t.Fatalf("DeriveSecret: %v %v", a, b)
	}
}

// FuzzFrame feeds the server's decoders arbitrary frames: they never panic,
// and a well-formed set body round-trips.
func FuzzFrame(f *testing.F) {
	f.Add(frame(opSet, 1, encodeSet("key", []byte("value"))))           // a set
	f.Add(frame(opAdd, 2, []byte{0, 0, 0, 0, 0, 0, 0, 1}, []byte("c"))) // an add
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1})                            // a huge length
	f.Add(frame(opSet, 3, []byte{0, 0, 0, 9}))                          // key length past the end
	f.Fuzz(func(t *testing.T, b []byte) {
		h, body, err := readFrame(bytes.NewReader(b))
		if err != nil {
			return
		}
		switch h.op() {
		case opSet:
			k, v, err := decodeSet(body)
			if err == nil && !bytes.Equal(encodeSet(k, v), body) {
				t.Fatalf("set body does not round-trip")
			}
		case opAdd:
			decodeAdd(body)
		}
	})
}

// A rank whose connection ends without a goodbye is reported lost; one that
// closes its client is not; nor are the ranks of a server that closes.
func TestOnLost(t *testing.T) {
	sec, _ := NewSecret()
	lost := make(chan int, 4)
	srv, err := Listen("127.0.0.1:0", sec, ServerOptions{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnLost: func(local Store, rank int, reason string) {
			if err := local.Set(context.Background(), "lost", []byte(reason)); err != nil {
				t.Error(err)
			}
			lost <- rank
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dial := func(r int) *Client {
		c, err := Dial(ctx, srv.Addr().String(), sec, Claim{Rank: r, NRanks: 16})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	watcher := dial(0)
	defer watcher.Close()
	polite := dial(1)
	polite.Close()
	rude := dial(2)
	rude.conn.Close() // as if the process died
	rude.Close()
	select {
	case r := <-lost:
		if r != 2 {
			t.Fatalf("lost rank %d, want 2", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the lost rank was not reported")
	}
	v, err := watcher.Get(ctx, "lost")
	if err != nil || !strings.Contains(string(v), "without a goodbye") {
		t.Fatalf("lost key = %q, %v", v, err)
	}
	srv.Close()
	select {
	case r := <-lost:
		t.Fatalf("rank %d reported lost after a polite close or the server's close", r)
	case <-time.After(100 * time.Millisecond):
	}
}

// A rank that goes silent (no pings) past IdleTimeout is reported lost; one
// that keeps alive is not.
func TestIdleTimeout(t *testing.T) {
	sec, _ := NewSecret()
	lost := make(chan int, 4)
	srv, err := Listen("127.0.0.1:0", sec, ServerOptions{
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		IdleTimeout: 300 * time.Millisecond,
		OnLost:      func(_ Store, rank int, _ string) { lost <- rank },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	alive, err := Dial(ctx, srv.Addr().String(), sec, Claim{Rank: 1, NRanks: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer alive.Close()
	alive.KeepAlive(50 * time.Millisecond)
	quiet, err := Dial(ctx, srv.Addr().String(), sec, Claim{Rank: 2, NRanks: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer quiet.Close()
	select {
	case r := <-lost:
		if r != 2 {
			t.Fatalf("lost rank %d, want the quiet 2", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the quiet rank was not reported")
	}
	time.Sleep(500 * time.Millisecond)
	if err := alive.Set(ctx, "k", nil); err != nil {
		t.Fatalf("the rank that kept alive was dropped: %v", err)
	}
	select {
	case r := <-lost:
		t.Fatalf("rank %d reported lost", r)
	default:
	}
}

// A client tells the server's own Close (a goodbye) from the loss of the
// server (its connection cut without one).
func TestClientLost(t *testing.T) {
	sec, _ := NewSecret()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv, _ := newServer(t, sec)
	c, err := Dial(ctx, srv.Addr().String(), sec, Claim{Rank: 1, NRanks: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	srv.Close()
	<-c.Done()
	if c.Lost() {
		t.Fatal("the server's Close counted as a loss")
	}

	srv2, _ := newServer(t, sec)
	c2, err := Dial(ctx, srv2.Addr().String(), sec, Claim{Rank: 1, NRanks: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	srv2.mu.Lock()
	for conn := range srv2.conns { // as if rank 0's process died
		conn.Close()
	}
	srv2.mu.Unlock()
	<-c2.Done()
	if !c2.Lost() {
		t.Fatal("a cut connection did not count as a loss")
	}
	c3, err := Dial(ctx, srv2.Addr().String(), sec, Claim{Rank: 2, NRanks: 16})
	if err != nil {
		t.Fatal(err)
	}
	c3.Close()
	<-c3.Done()
	if c3.Lost() {
		t.Fatal("the client's own Close counted as a loss")
	}
}

// A rank that abandons a pending Get, says goodbye and closes its
// connection at once (a communicator destroyed right after its init) is not
// reported lost, though the server's answer to the abandoned Get finds the
// connection reset before the server has read the goodbye behind it.
func TestResetAfterByeNotLost(t *testing.T) {
	sec, _ := NewSecret()
	lost := make(chan string, 64)
	srv, err := Listen("127.0.0.1:0", sec, ServerOptions{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnLost: func(_ Store, rank int, reason string) { lost <- fmt.Sprintf("rank %d: %s", rank, reason) },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 40 {
		c, err := Dial(ctx, srv.Addr().String(), sec, Claim{Rank: i % 16, NRanks: 16})
		if err != nil {
			t.Fatal(err)
		}
		const gets = 64
		var req, bye []byte
		for id := uint64(1); id <= gets; id++ {
			req = append(req, frame(opGet, id, []byte("never"))...)
			bye = append(bye, frame(opCancel, id)...)
		}
		if err := c.send(time.Time{}, req); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond) // the Gets wait on the server
		c.send(time.Time{}, append(bye, frame(opBye, 0)...))
		c.conn.(*net.TCPConn).SetLinger(0) // close resets the connection
		c.Close()
	}
	select {
	case r := <-lost:
		t.Fatalf("a rank that said goodbye was reported lost: %s", r)
	case <-time.After(200 * time.Millisecond):
	}
}

// A call whose write finds the connection already closed — by another
// write's failure (a keep-alive ping meeting a dead store) before the
// reader has noticed — reports the connection's loss, not the write's
// "use of closed network connection" that names no cause.
func TestCallOnBrokenConnectionSaysLost(t *testing.T) {
	sec, _ := NewSecret()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv, _ := newServer(t, sec)
	for i := range 20 {
		c, err := Dial(ctx, srv.Addr().String(), sec, Claim{Rank: i % 16, NRanks: 16})
		if err != nil {
			t.Fatal(err)
		}
		c.conn.Close() // as a failed concurrent write does
		err = c.Set(ctx, "k", []byte("v"))
		if err == nil || !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "connection to the store") {
			t.Fatalf("try %d: a Set on a broken connection: %v, want the connection's loss", i, err)
		}
		if !c.Lost() {
			t.Fatalf("try %d: the broken connection did not count as lost", i)
		}
		c.Close()
	}
}
