package hcomm_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
	"github.com/hcomm-dev/hcomm/internal/bootstrap"
)

// syncBuf is a log sink safe for concurrent writers.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// initRanks is hcommtest.InitRanks: init(rank) for every rank concurrently,
// the communicators destroyed at the end of the test.
func initRanks(t *testing.T, n int, init func(rank int) (*hcomm.Comm, error)) []*hcomm.Comm {
	t.Helper()
	return hcommtest.InitRanks(t, n, init)
}

// work runs rankWork on every rank concurrently (hcommtest.Each).
func work(t *testing.T, comms []*hcomm.Comm, transport string, collSizes []int) {
	t.Helper()
	hcommtest.Each(t, comms, func(t testing.TB, c *hcomm.Comm) {
		if err := rankWork(c, transport, collSizes); err != nil {
			t.Fatal(err)
		}
	})
}

func testCfg() *hcomm.Config {
	return &hcomm.Config{Name: "boot", BufferSize: 256 << 10, ConnectTimeout: 20 * time.Second, ExecTimeout: 30 * time.Second}
}

// Ranks of one process joined through GetRootInfo/InitRootInfo talk inproc.
func TestInitRootInfoInProcess(t *testing.T) {
	root, err := hcomm.GetRootInfo(testCfg())
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	s := root.String()
	comms := initRanks(t, 3, func(r int) (*hcomm.Comm, error) {
		ri, err := hcomm.ParseRootInfo(s) // as another process would
		if err != nil {
			return nil, err
		}
		return hcomm.InitRootInfo(3, ri, r, testCfg())
	})
	work(t, comms, hcomm.TransportInproc, []int{0, 1, 7, 1023, 70000})
}

// Every transport of this build, forced inside one process, carries the same
// workload; and a ROCE channel is a tcp channel.
func TestInitAllForcedTransports(t *testing.T) {
	for _, tr := range hcommtest.Transports() {
		if tr.Processes {
			continue
		}
		t.Run(tr.String(), func(t *testing.T) {
			comms := hcommtest.Options{Config: testCfg()}.New(t, 3, tr)
			work(t, comms, tr.Name, []int{0, 1, 7, 1023, 70000})
		})
	}
	if !slices.Contains(hcomm.Transports(), hcomm.TransportTCP) {
		t.Skip("this build has no tcp transport")
	}

	comms2 := hcommtest.Options{Config: testCfg()}.New(t, 2, hcommtest.Auto)
	hcommtest.Each(t, comms2, func(t testing.TB, c *hcomm.Comm) {
		d := hcomm.ChannelDescInit(1)
		d[0].RemoteRank, d[0].Protocol, d[0].NotifyNum = 1-c.Rank(), hcomm.ProtocolROCE, 1
		out, err := c.ChannelAcquire(hcomm.EngineCPUTS, d)
		if err != nil {
			t.Fatalf("ROCE channel: %v", err)
		}
		if out[0].Transport() != hcomm.TransportTCP {
			t.Fatalf("ROCE channel on %v", out[0].Transport())
		}
	})
}

// A stranger with a wrong secret knocking at rank 0's store is refused and
// logged, and the communicator still forms.
func TestWrongSecretStrangerRefused(t *testing.T) {
	logs := &syncBuf{}
	cfg := testCfg()
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	root, err := hcomm.GetRootInfo(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	wrong := root.Secret
	wrong[15] ^= 0x80
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if c, err := bootstrap.Dial(ctx, root.Addr, bootstrap.Secret(wrong), bootstrap.Claim{Rank: 1, NRanks: 2}); !errors.Is(err, bootstrap.ErrAuth) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("stranger: %v, want ErrAuth", err)
	}
	// A stranger that speaks garbage is refused too.
	if raw, err := net.Dial("tcp", root.Addr); err == nil {
		raw.Write(bytes.Repeat([]byte{0xff}, 200))
		raw.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 512)
		for {
			if _, err := raw.Read(buf); err != nil {
				break
			}
		}
		raw.Close()
	}
	comms := initRanks(t, 2, func(r int) (*hcomm.Comm, error) { return hcomm.InitRootInfo(2, root, r, cfg) })
	work(t, comms, "", []int{1, 7})
	l := logs.String()
	if !strings.Contains(l, "refused connection") || !strings.Contains(l, "wrong secret") || !strings.Contains(l, "claimed_rank=1") {
		t.Fatalf("the stranger was not logged:\n%s", l)
	}
	// The stranger's claim of rank 1 had no effect: the real rank 1 joined.
	if comms[1].Rank() != 1 {
		t.Fatal("rank 1 missing")
	}
}

func TestRootInfoString(t *testing.T) {
	r := hcomm.RootInfo{Addr: "10.1.2.3:4567"}
	for i := range r.Secret {
		r.Secret[i] = byte(i * 17)
	}
	s := r.String()
	if s != "hcomm1://00112233445566778899aabbccddeeff@10.1.2.3:4567" {
		t.Fatalf("String = %q", s)
	}
	back, err := hcomm.ParseRootInfo(s)
	if err != nil || back != r {
		t.Fatalf("ParseRootInfo = %+v, %v", back, err)
	}
	v6 := hcomm.RootInfo{Addr: "[fe80::1%eth0]:9"}
	if back, err := hcomm.ParseRootInfo(v6.String()); err != nil || back != v6 {
		t.Fatalf("IPv6: %+v, %v", back, err)
	}
	var u hcomm.RootInfo
	if err := u.UnmarshalText([]byte(s)); err != nil || u != r {
		t.Fatalf("UnmarshalText: %+v, %v", u, err)
	}
	for _, bad := range []string{
		"", "hcomm1://", "hcomm2://00112233445566778899aabbccddeeff@h:1",
		"hcomm1://00112233445566778899aabbccddeeff", "hcomm1://00112233445566778899AABBCCDDEEFF@h:1",
		"hcomm1://00112233445566778899aabbccddeef@h:1", "hcomm1://00112233445566778899aabbccddeeffa@h:1",
		"hcomm1://0011223344556677889zaabbccddeeff@h:1", "hcomm1://00112233445566778899aabbccddeeff@h",
		"hcomm1://00112233445566778899aabbccddeeff@:1", "hcomm1://00112233445566778899aabbccddeeff@h:0",
		"hcomm1://00112233445566778899aabbccddeeff@h:65536", "hcomm1://00112233445566778899aabbccddeeff@h:01",
		"hcomm1://00112233445566778899aabbccddeeff@h:1@x", " hcomm1://00112233445566778899aabbccddeeff@h:1",
	} {
		if _, err := hcomm.ParseRootInfo(bad); !errors.Is(err, hcomm.ErrPara) {
			t.Errorf("ParseRootInfo(%q) = %v, want ErrPara", bad, err)
		}
	}
}

// FuzzParseRootInfo: never panics; what parses prints back the same.
func FuzzParseRootInfo(f *testing.F) {
	f.Add("hcomm1://00112233445566778899aabbccddeeff@10.1.2.3:4567") // valid
	f.Add("hcomm1://00112233445566778899aabbccddeeff@[::1]:1")       // IPv6
	f.Add("hcomm1://@:")                                             // empty parts
	f.Fuzz(func(t *testing.T, s string) {
		r, err := hcomm.ParseRootInfo(s)
		if err != nil {
			return
		}
		if r.String() != s {
			t.Fatalf("%q parses to %+v, which prints as %q", s, r, r.String())
		}
	})
}

// A root info nobody claims stops its store by itself after ConnectTimeout;
// Close stops it at once.
func TestRootInfoUnclaimed(t *testing.T) {
	cfg := testCfg()
	cfg.ConnectTimeout = 300 * time.Millisecond
	r1, err := hcomm.GetRootInfo(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := hcomm.GetRootInfo(testCfg())
	if err != nil {
		t.Fatal(err)
	}
	r2.Close()
	r2.Close()
	if c, err := net.Dial("tcp", r2.Addr); err == nil {
		c.Close()
		t.Fatal("store still listening after RootInfo.Close")
	}
	time.Sleep(600 * time.Millisecond)
	if c, err := net.Dial("tcp", r1.Addr); err == nil {
		c.Close()
		t.Fatal("unclaimed store still listening after ConnectTimeout")
	}
	// Rank 0 can still start a store on the address itself.
	comms := initRanks(t, 1, func(r int) (*hcomm.Comm, error) { return hcomm.InitRootInfo(1, r1, r, testCfg()) })
	comms[0].Destroy()
}

func TestInitErrors(t *testing.T) {
	root, err := hcomm.GetRootInfo(testCfg())
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	for _, tc := range []struct{ n, rank int }{{0, 0}, {2, 2}, {2, -1}, {hcomm.MaxRanks + 1, 0}} {
		if _, err := hcomm.InitRootInfo(tc.n, root, tc.rank, testCfg()); !errors.Is(err, hcomm.ErrPara) {
			t.Errorf("InitRootInfo(%d, rank %d) = %v, want ErrPara", tc.n, tc.rank, err)
		}
	}
	// Ranks that disagree on the rank count fail, naming the odd one.
	cfg := testCfg()
	cfg.ConnectTimeout = 5 * time.Second
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r, n := range []int{2, 3} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := hcomm.InitRootInfo(n, root, r, cfg)
			if c != nil {
				c.Destroy()
			}
			errs[r] = err
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "rank 1") || !strings.Contains(err.Error(), "3 ranks") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	// A rank alone times out within ConnectTimeout, naming what it waited for.
	cfg.ConnectTimeout = 300 * time.Millisecond
	r2, _ := hcomm.GetRootInfo(cfg)
	start := time.Now()
	_, err = hcomm.InitRootInfo(2, r2, 0, cfg)
	if !errors.Is(err, hcomm.ErrTimeout) || !strings.Contains(err.Error(), "rank 1") || time.Since(start) > 3*time.Second {
		t.Fatalf("lonely rank 0: %v after %v", err, time.Since(start))
	}
	// Nobody at the address: a rank gives up at ConnectTimeout.
	_, err = hcomm.InitRootInfo(2, r2, 1, cfg)
	if !errors.Is(err, hcomm.ErrTimeout) {
		t.Fatalf("rank 1 with no store: %v", err)
	}
}

// freePort is a loopback TCP port free at the time of the call, outside
// the kernel's ephemeral range (bootstrap.FreePort): a port that a
// connection of another test can take before the store binds it fails
// that test with "address in use".
func freePort(t *testing.T) int {
	t.Helper()
	p, err := bootstrap.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestInitClusterInfo(t *testing.T) {
	table := `{"status":"completed","version":"1.0","server_count":"2","server_list":[
 {"server_id":"127.0.0.1","device":[{"device_id":"0","device_ip":"192.168.1.8","rank_id":"0"},{"device_id":"1","device_ip":"192.168.1.9","rank_id":"1"}]},
 {"server_id":"node_1","device":[{"device_id":"0","device_ip":"192.168.2.8","rank_id":"2"}]}]}`
	path := filepath.Join(t.TempDir(), "rank_table.json")
	if err := os.WriteFile(path, []byte(table), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("HCOMM_ROOT_PORT", strconv.Itoa(freePort(t)))
	comms := initRanks(t, 3, func(r int) (*hcomm.Comm, error) { return hcomm.InitClusterInfo(path, r, testCfg()) })
	if comms[1].Device().ID() != 1 || comms[2].Device().ID() != 0 {
		t.Fatalf("device ids %d, %d; want the table's 1, 0", comms[1].Device().ID(), comms[2].Device().ID())
	}
	work(t, comms, "", []int{7, 1023})
	if _, err := hcomm.InitClusterInfo(path, 3, testCfg()); !errors.Is(err, hcomm.ErrPara) || !strings.Contains(err.Error(), "rank 3") {
		t.Fatalf("rank 3 of 3: %v", err)
	}
	if _, err := hcomm.InitClusterInfo(filepath.Join(t.TempDir(), "none.json"), 0, testCfg()); !errors.Is(err, hcomm.ErrOpenFile) {
		t.Fatalf("missing table: %v", err)
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	os.WriteFile(bad, []byte(strings.Replace(table, "completed", "initializing", 1)), 0o600)
	if _, err := hcomm.InitClusterInfo(bad, 0, testCfg()); !errors.Is(err, hcomm.ErrPara) || !strings.Contains(err.Error(), "initializing") {
		t.Fatalf("table not ready: %v", err)
	}
}

// Destroy leaves nothing behind: the whole life of a root-info communicator,
// many times over, keeps the goroutine count flat (leakcheck in TestMain
// checks the end state too).
func TestDestroyReleasesEverything(t *testing.T) {
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			return -1
		}
		return len(ents)
	}
	before := fds()
	defer func() {
		// Sockets close asynchronously in no case here: Destroy waits.
		if after := fds(); after != before {
			t.Errorf("%d file descriptors open before, %d after", before, after)
		}
	}()
	for i := range 3 {
		root, err := hcomm.GetRootInfo(testCfg())
		if err != nil {
			t.Fatal(err)
		}
		comms := make([]*hcomm.Comm, 2)
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for r := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				comms[r], errs[r] = hcomm.InitRootInfo(2, root, r, testCfg())
			}()
		}
		wg.Wait()
		for r, err := range errs {
			if err != nil {
				t.Fatalf("round %d rank %d: %v", i, r, err)
			}
		}
		work(t, comms, "", []int{7})
		cfg := testCfg() // a tcp channel too: its listener and sockets must go
		cfg.Transport = hcomm.TransportTCP
		if slices.Contains(hcomm.Transports(), hcomm.TransportTCP) {
			tcpComms, err := hcomm.InitAll(2, cfg)
			if err != nil {
				t.Fatal(err)
			}
			work(t, tcpComms, hcomm.TransportTCP, []int{7})
			comms = append(comms, tcpComms...)
		}
		for _, c := range comms {
			if err := c.Destroy(); err != nil {
				t.Fatal(err)
			}
			if err := c.Destroy(); err != nil {
				t.Fatal(fmt.Errorf("second Destroy: %w", err))
			}
		}
		if c, err := net.Dial("tcp", root.Addr); err == nil {
			c.Close()
			t.Fatal("rank 0's store outlived its communicator")
		}
	}
}

// BenchmarkInitRootInfo: GetRootInfo, 4 ranks joining over the TCP store,
// a channel from every rank to every other (the collectives' setup), Destroy.
func BenchmarkInitRootInfo(b *testing.B) {
	cfg := &hcomm.Config{BufferSize: 64 << 10, ConnectTimeout: 20 * time.Second}
	const n = 4
	for b.Loop() {
		root, err := hcomm.GetRootInfo(cfg)
		if err != nil {
			b.Fatal(err)
		}
		var wg, connected sync.WaitGroup
		errs := make([]error, n)
		connected.Add(n)
		for r := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := hcomm.InitRootInfo(n, root, r, cfg)
				if err != nil {
					errs[r] = err
					connected.Done()
					return
				}
				d := hcomm.ChannelDescInit(n - 1)
				for i, j := 0, 0; i < n; i++ {
					if i != r {
						d[j].RemoteRank, d[j].NotifyNum = i, 2
						j++
					}
				}
				_, errs[r] = c.ChannelAcquire(hcomm.EngineCPUTS, d)
				connected.Done()
				connected.Wait() // everyone connected before rank 0's store goes
				c.Destroy()
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
}

// Rank 0's init returns only once every rank has read the list of ranks
// from its store: rank 0 destroying its communicator (and so its store) the
// moment its init returns does not fail the ranks that read the list later.
func TestInitRootDestroysAtOnce(t *testing.T) {
	const n = 4
	hcomm.SetPeersHook(func(rank int) { time.Sleep(time.Duration(20*rank) * time.Millisecond) })
	defer hcomm.SetPeersHook(nil)
	root, err := hcomm.GetRootInfo(testCfg())
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := hcomm.InitRootInfo(n, root, r, testCfg())
			if err != nil {
				errs[r] = err
				return
			}
			errs[r] = c.Destroy()
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}
