package hcomm

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/internal/procs"
)

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestParseLaunchEnv(t *testing.T) {
	for _, tc := range []struct {
		name            string
		env             map[string]string
		launcher        string
		rank, size, lr  int
		addr            string
		wantErrContains string
	}{
		{name: "torchrun", env: map[string]string{"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400"},
			launcher: "torchrun", rank: 3, size: 8, lr: 1, addr: "10.0.0.1:29400"},
		{name: "torchrun no local rank", env: map[string]string{"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
			launcher: "torchrun", rank: 0, size: 1, lr: -1, addr: "h:1"},
		{name: "torchrun ipv6", env: map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "fe80::1", "MASTER_PORT": "5"},
			launcher: "torchrun", rank: 0, size: 2, lr: -1, addr: "[fe80::1]:5"},
		{name: "torchrun no master", env: map[string]string{"RANK": "0", "WORLD_SIZE": "2"}, wantErrContains: "MASTER_ADDR"},
		{name: "torchrun rank too big", env: map[string]string{"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, wantErrContains: "outside"},
		{name: "torchrun bad size", env: map[string]string{"RANK": "0", "WORLD_SIZE": "x", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, wantErrContains: "WORLD_SIZE"},
		{name: "torchrun bad port", env: map[string]string{"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "h", "MASTER_PORT": "70000"}, wantErrContains: "port"},
		{name: "mpirun", env: map[string]string{"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "MASTER_ADDR": "node1"},
			launcher: "mpirun", rank: 1, size: 4, lr: 1, addr: "node1:29500"},
		{name: "mpirun hcomm addr", env: map[string]string{"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "HCOMM_MASTER_ADDR": "n:7"},
			launcher: "mpirun", rank: 1, size: 4, lr: -1, addr: "n:7"},
		{name: "mpirun no addr", env: map[string]string{"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4"}, wantErrContains: "MASTER_ADDR"},
		{name: "srun nodelist", env: map[string]string{"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_JOB_NODELIST": "gpu[03-06,9],cpu1", "HCOMM_ROOT_PORT": "4000"},
			launcher: "srun", rank: 5, size: 8, lr: 1, addr: "gpu03:4000"},
		{name: "srun step nodelist wins", env: map[string]string{"SLURM_PROCID": "0", "SLURM_NPROCS": "2", "SLURM_STEP_NODELIST": "a,b", "SLURM_JOB_NODELIST": "c"},
			launcher: "srun", rank: 0, size: 2, lr: -1, addr: "a:29500"},
		{name: "srun master", env: map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "MASTER_ADDR": "m", "MASTER_PORT": "9", "SLURM_NODELIST": "x"},
			launcher: "srun", rank: 0, size: 2, lr: -1, addr: "m:9"},
		{name: "srun complex", env: map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_NODELIST": "r[1-2]n[3-4]"}, wantErrContains: "too complex"},
		{name: "nothing", env: map[string]string{}, wantErrContains: "no launcher"},
		{name: "bad hcomm addr", env: map[string]string{"RANK": "0", "WORLD_SIZE": "1", "HCOMM_MASTER_ADDR": "nohost"}, wantErrContains: "HCOMM_MASTER_ADDR"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			le, err := parseLaunchEnv(envOf(tc.env))
			if tc.wantErrContains != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErrContains) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErrContains)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if le.launcher != tc.launcher || le.rank != tc.rank || le.size != tc.size || le.localRank != tc.lr || le.addr != tc.addr {
				t.Fatalf("got %+v", le)
			}
		})
	}
	// The secret: HCOMM_SECRET when set; otherwise derived, and different per job.
	base := map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
	a, _ := parseLaunchEnv(envOf(base))
	base["TORCHELASTIC_RUN_ID"] = "job2"
	b, _ := parseLaunchEnv(envOf(base))
	base["HCOMM_SECRET"] = "s3cret"
	c, _ := parseLaunchEnv(envOf(base))
	base["TORCHELASTIC_RUN_ID"] = "job3"
	d, _ := parseLaunchEnv(envOf(base))
	if a.secret == b.secret || b.secret == c.secret || c.secret != d.secret {
		t.Fatalf("secrets: %v %v %v %v", a.secret, b.secret, c.secret, d.secret)
	}
}

func TestFirstSlurmHost(t *testing.T) {
	for in, want := range map[string]string{"n1": "n1", "n1,n2": "n1", "n[001-010]": "n001", "n[7,3]-ib,x": "n7-ib", "a-[3-5]": "a-3"} {
		if got, err := firstSlurmHost(in); err != nil || got != want {
			t.Errorf("firstSlurmHost(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "[1-2]", "n[x-2]", "n]1", "n[1-2"} {
		if got, err := firstSlurmHost(in); err == nil {
			t.Errorf("firstSlurmHost(%q) = %q, want an error", in, got)
		}
	}
}

const goodTable = `{"status":"completed","version":"1.0","server_count":"2",
 "server_list":[
  {"server_id":"127.0.0.1","device":[{"device_id":"0","device_ip":"192.168.1.8","rank_id":"0"},{"device_id":"1","device_ip":"192.168.1.9","rank_id":"2"}]},
  {"server_id":"node_1","device":[{"device_id":"0","device_ip":"192.168.2.8","rank_id":"1"}]}]}`

func TestParseRankTable(t *testing.T) {
	tb, err := ParseRankTable([]byte(goodTable))
	if err != nil {
		t.Fatal(err)
	}
	e, _ := tb.ranks()
	if len(e) != 3 || e[2].server != 0 || e[2].deviceID != 1 || e[1].server != 1 {
		t.Fatalf("ranks = %+v", e)
	}
	addr, err := rankTableRoot(tb, e, envOf(map[string]string{"HCOMM_ROOT_PORT": "1234"}))
	if err != nil || addr != "127.0.0.1:1234" {
		t.Fatalf("root = %q, %v", addr, err)
	}
	if addr, _ := rankTableRoot(tb, e, envOf(nil)); addr != "127.0.0.1:29500" {
		t.Fatalf("default root = %q", addr)
	}
	for name, mut := range map[string][2]string{
		"version":        {`"version":"1.0"`, `"version":"1.2"`},
		"status":         {`"status":"completed"`, `"status":"initializing"`},
		"count":          {`"server_count":"2"`, `"server_count":"3"`},
		"dup rank":       {`"rank_id":"2"`, `"rank_id":"0"`},
		"gap":            {`"rank_id":"2"`, `"rank_id":"3"`},
		"bad rank":       {`"rank_id":"2"`, `"rank_id":"02"`},
		"bad device":     {`"device_id":"1"`, `"device_id":"-1"`},
		"dup server":     {`"server_id":"node_1"`, `"server_id":"127.0.0.1"`},
		"unknown field":  {`"status"`, `"bogus":1,"status"`},
		"number not str": {`"server_count":"2"`, `"server_count":2`},
		"trailing":       {`]}]}`, `]}]}{}`},
	} {
		bad := strings.Replace(goodTable, mut[0], mut[1], 1)
		if bad == goodTable {
			t.Fatalf("%s: mutation did not apply", name)
		}
		if _, err := ParseRankTable([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestPickTransport(t *testing.T) {
	mk := func(cfg Config, peers ...peerInfo) *Comm {
		return &Comm{rank: 0, cfg: cfg, boot: &bootState{peers: peers}}
	}
	me := peerInfo{Rank: 0, Host: "h1", ShmHost: "s1", Proc: "p1"}
	sameProc := peerInfo{Rank: 1, Host: "h1", ShmHost: "s1", Proc: "p1"}
	sameHost := peerInfo{Rank: 1, Host: "h1", ShmHost: "s1", Proc: "p2"}
	other := peerInfo{Rank: 1, Host: "h2", Proc: "p3"}
	noShm := peerInfo{Rank: 0, Host: "h1", Proc: "p1"} // a system without what shm needs
	type tc struct {
		cfg   Config
		me    peerInfo
		peer  peerInfo
		proto Protocol
		want  string // "" = error
	}
	cases := []tc{
		{Config{}, me, sameProc, ProtocolAuto, TransportInproc},
		{Config{}, me, sameProc, ProtocolHCCS, TransportInproc},
		{Config{}, me, other, ProtocolHCCS, ""},
		{Config{Transport: TransportInproc}, me, sameHost, ProtocolAuto, ""},
		{Config{}, me, other, ProtocolAuto, TransportTCP},
		{Config{}, me, sameProc, ProtocolROCE, TransportTCP},
		{Config{}, me, sameProc, ProtocolUBOE, TransportTCP},
		{Config{Transport: TransportTCP}, me, sameProc, ProtocolHCCS, TransportTCP},
		{Config{ShmDisable: true}, me, sameHost, ProtocolAuto, TransportTCP},
		{Config{ShmDisable: true}, me, sameHost, ProtocolHCCS, ""},
		{Config{}, me, sameHost, ProtocolAuto, TransportShm},
		{Config{}, me, sameHost, ProtocolHCCS, TransportShm},
		{Config{}, me, sameHost, ProtocolPCIE, TransportShm},
		{Config{}, me, sameProc, ProtocolPCIE, TransportShm},
		{Config{}, me, other, ProtocolPCIE, ""},
		{Config{ShmDisable: true}, me, sameProc, ProtocolPCIE, TransportInproc}, // PCIE where shm is off
		{Config{}, noShm, sameProc, ProtocolPCIE, TransportInproc},
		{Config{}, noShm, sameHost, ProtocolAuto, TransportTCP},
		{Config{Transport: TransportShm}, me, sameProc, ProtocolAuto, TransportShm},
		{Config{Transport: TransportShm}, me, other, ProtocolAuto, ""},
		{Config{}, me, sameProc, Protocol(42), ""},
	}
	for _, c := range cases {
		tr, err := mk(c.cfg, c.me, c.peer).pickTransport(1, c.proto)
		got := ""
		if tr != nil {
			got = tr.name
		}
		if got != c.want || (c.want == "") != (err != nil) {
			t.Errorf("cfg %+v peer %+v %v: got %q, %v; want %q", c.cfg, c.peer, c.proto, got, err, c.want)
		}
		if err != nil && !strings.Contains(err.Error(), "rank 1") && !strings.Contains(err.Error(), "HCOMM_TRANSPORT") && !strings.Contains(err.Error(), "protocol 42") {
			t.Errorf("error does not name the peer: %v", err)
		}
	}
}

func TestResolveNet(t *testing.T) {
	t.Setenv("HCOMM_TRANSPORT", "TCP")
	t.Setenv("HCOMM_SHM_DISABLE", "1")
	t.Setenv("HCOMM_SOCKET_IFNAME", "lo")
	c, err := Config{}.resolveNet()
	if err != nil || c.Transport != "tcp" || !c.ShmDisable || c.SocketIfname != "lo" {
		t.Fatalf("resolveNet = %+v, %v", c, err)
	}
	c, err = Config{Transport: "inproc", SocketIfname: "eth"}.resolveNet()
	if err != nil || c.Transport != "inproc" || c.SocketIfname != "eth" {
		t.Fatalf("code must win: %+v, %v", c, err)
	}
	t.Setenv("HCOMM_TRANSPORT", "rdma")
	if _, err := (Config{}).resolveNet(); err == nil {
		t.Fatal("HCOMM_TRANSPORT=rdma accepted")
	}
	t.Setenv("HCOMM_TRANSPORT", "shm")
	if _, err := (Config{}).resolveNet(); err == nil {
		t.Fatal("shm forced and disabled accepted")
	}
	t.Setenv("HCOMM_TRANSPORT", "")
	t.Setenv("HCOMM_SHM_DISABLE", "maybe")
	if _, err := (Config{}).resolveNet(); err == nil {
		t.Fatal("HCOMM_SHM_DISABLE=maybe accepted")
	}
	t.Setenv("HCOMM_SHM_DISABLE", "")
	t.Setenv("HCOMM_SHM_CMA_DISABLE", "1")
	if c, err := (Config{}).resolveNet(); err != nil || !c.ShmCMADisable {
		t.Fatalf("HCOMM_SHM_CMA_DISABLE=1: %+v, %v", c, err)
	}
	t.Setenv("HCOMM_SHM_CMA_DISABLE", "0")
	if c, err := (Config{ShmCMADisable: true}).resolveNet(); err != nil || !c.ShmCMADisable {
		t.Fatalf("code must win over HCOMM_SHM_CMA_DISABLE=0: %+v, %v", c, err)
	}
	t.Setenv("HCOMM_SHM_CMA_DISABLE", "perhaps")
	if _, err := (Config{}).resolveNet(); err == nil || !strings.Contains(err.Error(), "HCOMM_SHM_CMA_DISABLE") {
		t.Fatalf("HCOMM_SHM_CMA_DISABLE=perhaps: %v, want an error naming it", err)
	}
}

// Both ends must pick the same transport; a peer's malformed or misdirected
// setup message is an error naming it.
func TestSetupHandshake(t *testing.T) {
	ctx := context.Background()
	reply := func(b []byte) channel.Exchange {
		return func(context.Context, []byte) ([]byte, error) { return b, nil }
	}
	if err := handshake(ctx, reply([]byte(`{"transport":"tcp","rank":1}`)), 0, 1, "tcp"); err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]string{
		`{"transport":"shm","rank":1}`: "HCOMM_TRANSPORT",
		`{"transport":"tcp","rank":2}`: "says rank 2",
		`not json`:                     "malformed",
	} {
		if err := handshake(ctx, reply([]byte(in)), 0, 1, "tcp"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("peer message %s: %v, want an error with %q", in, err, want)
		}
	}
}

// Without HCOMM_TCP_STREAMS, a process on one processor opens one socket per
// tcp channel, others the tcp package's default.
func TestDefaultTCPStreams(t *testing.T) {
	if got := defaultStreams(1); got != 1 {
		t.Errorf("GOMAXPROCS=1: %d sockets, want 1", got)
	}
	for _, p := range []int{2, 16} {
		if got := defaultStreams(p); got != 0 {
			t.Errorf("GOMAXPROCS=%d: %d, want 0 (the tcp package's default)", p, got)
		}
	}
}

// A tcp poll yields to the host's other threads when the communicator's
// processes on the host are as many as its processors or more; with exactly
// as many, only after tcpTight.
func TestTCPYield(t *testing.T) {
	for _, c := range []struct {
		here, cpus int
		yield      bool
		tight      time.Duration
	}{
		{1, 2, false, 0},
		{2, 2, true, tcpTight},
		{4, 2, true, 0},
		{1, 1, true, tcpTight},
	} {
		yield, tight := tcpYield(c.here, c.cpus)
		if yield != c.yield || tight != c.tight {
			t.Errorf("%d processes on %d processors: yield %v after %v, want %v after %v", c.here, c.cpus, yield, tight, c.yield, c.tight)
		}
	}
}

// b is a rank bound to the processors of list (a kernel CPU list).
func b(host, proc, list string) peerInfo {
	cpus, _ := procs.ParseList(list)
	return peerInfo{Host: host, Proc: proc, CPUs: len(cpus), CPUSet: list}
}

// TestCrowded: a communicator is crowded when some host has more of its
// ranks' processes than cores (the fewest any of them reported), or one
// process with more ranks than cores; hosts that did not say how many cores
// they have count as uncrowded; and every rank, reading the same table,
// gets the same answer whichever host it is on.
func TestCrowded(t *testing.T) {
	p := func(host, proc string, cpus int) peerInfo { return peerInfo{Host: host, Proc: proc, CPUs: cpus} }
	for _, c := range []struct {
		name  string
		peers []peerInfo
		want  bool
	}{
		{"2 processes on 2 cores", []peerInfo{p("a", "1", 2), p("a", "2", 2)}, false},
		{"4 processes on 2 cores", []peerInfo{p("a", "1", 2), p("a", "2", 2), p("a", "3", 2), p("a", "4", 2)}, true},
		{"one host of two crowded", []peerInfo{p("a", "1", 8), p("a", "2", 8), p("b", "3", 1), p("b", "4", 1)}, true},
		{"a rank that saw fewer cores", []peerInfo{p("a", "1", 4), p("a", "2", 4), p("a", "3", 2)}, true},
		{"3 ranks in one process on 2 cores", []peerInfo{p("a", "1", 2), p("a", "1", 2), p("a", "1", 2)}, true},
		{"2 ranks in one process on 2 cores", []peerInfo{p("a", "1", 2), p("a", "1", 2)}, false},
		{"cores not told", []peerInfo{p("a", "1", 0), p("a", "2", 0), p("a", "3", 0)}, false},
		{"many hosts, one process each", []peerInfo{p("a", "1", 1), p("b", "2", 1), p("c", "3", 1)}, false},
		// A launcher that binds (hcomm run, mpirun --bind-to core): each
		// rank counts only its own share; the host's is their union.
		{"2 processes bound to a core each", []peerInfo{b("a", "1", "0"), b("a", "2", "1")}, false},
		{"2 processes bound to one core", []peerInfo{b("a", "1", "0"), b("a", "2", "0")}, true},
		{"4 processes bound round-robin to 2 cores", []peerInfo{b("a", "1", "0"), b("a", "2", "1"), b("a", "3", "0"), b("a", "4", "1")}, true},
		{"2 processes bound to 2 cores each", []peerInfo{b("a", "1", "0-1"), b("a", "2", "2-3")}, false},
		{"a bound rank beside one that did not say its set", []peerInfo{b("a", "1", "0"), p("a", "2", 2)}, true},
	} {
		if got := crowded(c.peers); got != c.want {
			t.Errorf("%s: crowded %v, want %v", c.name, got, c.want)
		}
	}
}

// TestHostCPUs: the processors a host's ranks share are the union of their
// affinity sets when every one published its set, else the fewest any of
// them counted.
func TestHostCPUs(t *testing.T) {
	for _, c := range []struct {
		name  string
		peers []peerInfo
		want  int
	}{
		{"bound a core each", []peerInfo{b("a", "1", "0"), b("a", "2", "1")}, 2},
		{"overlapping sets", []peerInfo{b("a", "1", "0-3"), b("a", "2", "2-5")}, 6},
		{"one did not say", []peerInfo{b("a", "1", "0-3"), {Host: "a", Proc: "2", CPUs: 3}}, 3},
		{"none said anything", []peerInfo{{Host: "a", Proc: "1"}}, 0},
	} {
		if got := hostCPUs(c.peers); got != c.want {
			t.Errorf("%s: %d processors, want %d", c.name, got, c.want)
		}
	}
}
