package hcomm_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// The scale harness: H network-namespace "hosts" on one bridge, P processes
// on each, one rank per process, started as torchrun starts them (MASTER_ADDR,
// RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) and joined through
// InitFromEnv at hcomm's default settings (HCCL_BUFFSIZE included) but for
// what the environment sets (it passes through). Every
// rank runs every collective, checked element by element (scaleWork), and
// reports what it holds: sockets (its /proc/self/fd links to sockets), RSS,
// shared memory, the bytes of its HCCL buffer committed so far, its
// collective channels, and its init time. CI runs 4 × 2; HCOMM_SCALE=16x4
// (scripts/scale-netns.sh 16 4) runs 64 ranks.

// scaleShape returns the hosts and processes per host to run: HCOMM_SCALE
// ("HxP"), else 4 × 2.
func scaleShape(t *testing.T) (hosts, procs int) {
	s := os.Getenv("HCOMM_SCALE")
	if s == "" {
		return 4, 2
	}
	h, p, ok := strings.Cut(s, "x")
	hosts, err1 := strconv.Atoi(h)
	procs, err2 := strconv.Atoi(p)
	if !ok || err1 != nil || err2 != nil || hosts < 1 || procs < 1 || hosts > 250 || hosts*procs > 1024 {
		t.Fatalf("HCOMM_SCALE=%q: want HOSTSxPROCS, e.g. 16x4 (at most 250 hosts and 1024 ranks)", s)
	}
	return hosts, procs
}

// scaleStats is what one rank reports (its SCALE line): what it holds at
// the end, and its sockets by kind after its first all-reduce (16 B) and
// after an all-reduce of 1 MiB, both at hcomm's choice of algorithm.
type scaleStats struct {
	rank                      int
	initMs, workMs            int64
	startUs, firstUs          int64 // wall clock (µs since the epoch): the process's start, its first collective done
	sockets, channels         int
	rssKB, shmKB, committedKB int64
	small, large              socketKinds // after the 16 B and the 1 MiB all-reduce
}

// socketKinds counts a process's sockets by what they are for.
type socketKinds struct {
	total    int
	data     int // tcp channels' streams (tcp sockets that are none of the below)
	mailbox  int // connections to or from a rank's bootstrap mailbox
	store    int // connections to or from rank 0's store
	standby  int // connections to or from a rank's standby store
	listen   int // listeners: the store, mailbox, standby, tcp transport
	other    int // unix-domain and the rest
	channels int // the collectives' channels
}

func (k socketKinds) fields(p string) string {
	return fmt.Sprintf("%s_sockets=%d %s_data=%d %s_mailbox=%d %s_store=%d %s_standby=%d %s_listen=%d %s_other=%d %s_channels=%d",
		p, k.total, p, k.data, p, k.mailbox, p, k.store, p, k.standby, p, k.listen, p, k.other, p, k.channels)
}

func (s scaleStats) line() string {
	return fmt.Sprintf("SCALE rank=%d init_ms=%d work_ms=%d start_us=%d first_us=%d sockets=%d channels=%d rss_kb=%d shm_kb=%d hccl_committed_kb=%d %s %s",
		s.rank, s.initMs, s.workMs, s.startUs, s.firstUs, s.sockets, s.channels, s.rssKB, s.shmKB, s.committedKB, s.small.fields("s16"), s.large.fields("s1m"))
}

func parseScale(line string) (scaleStats, error) {
	var s scaleStats
	want := map[string]*int64{}
	ints := map[string]*int{"rank": &s.rank, "sockets": &s.sockets, "channels": &s.channels}
	for _, x := range []struct {
		p string
		k *socketKinds
	}{{"s16", &s.small}, {"s1m", &s.large}} {
		for n, f := range map[string]*int{"sockets": &x.k.total, "data": &x.k.data, "mailbox": &x.k.mailbox, "store": &x.k.store,
			"standby": &x.k.standby, "listen": &x.k.listen, "other": &x.k.other, "channels": &x.k.channels} {
			ints[x.p+"_"+n] = f
		}
	}
	for n, f := range map[string]*int64{"init_ms": &s.initMs, "work_ms": &s.workMs, "start_us": &s.startUs, "first_us": &s.firstUs,
		"rss_kb": &s.rssKB, "shm_kb": &s.shmKB, "hccl_committed_kb": &s.committedKB} {
		want[n] = f
	}
	rest, ok := strings.CutPrefix(line, "SCALE ")
	if !ok {
		return s, fmt.Errorf("not a SCALE line")
	}
	seen := 0
	for _, kv := range strings.Fields(rest) {
		k, v, _ := strings.Cut(kv, "=")
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return s, fmt.Errorf("%s: %v", kv, err)
		}
		switch {
		case want[k] != nil:
			*want[k] = n
		case ints[k] != nil:
			*ints[k] = int(n)
		default:
			return s, fmt.Errorf("unknown field %q", k)
		}
		seen++
	}
	if seen != len(want)+len(ints) {
		return s, fmt.Errorf("%d fields, want %d", seen, len(want)+len(ints))
	}
	return s, nil
}

// procSocketKinds sorts this process's sockets by what they are for: its
// tcp sockets by their addresses (from /proc/self/net/tcp{,6}, this network
// namespace's table) against rank 0's store (storePort, on either end)
// and the ranks' mailboxes and standby stores (BootAddrs).
func procSocketKinds(c *hcomm.Comm, storePort int) socketKinds {
	type ent struct {
		local, remote string
		listen        bool
	}
	tcp := map[string]ent{} // by inode
	for _, f := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(l)
			if len(fs) < 10 {
				continue
			}
			tcp[fs[9]] = ent{local: procNetAddr(fs[1]), remote: procNetAddr(fs[2]), listen: fs[3] == "0A"}
		}
	}
	mailboxes, standbys := hcomm.BootAddrs(c)
	in := func(a string, set []string) bool { return a != "" && slices.Contains(set, a) }
	var k socketKinds
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		l, err := os.Readlink("/proc/self/fd/" + e.Name())
		ino, ok := strings.CutPrefix(l, "socket:[")
		if err != nil || !ok {
			continue
		}
		k.total++
		t, ok := tcp[strings.TrimSuffix(ino, "]")]
		port := func(a string) int {
			_, p, _ := strings.Cut(a, ":")
			n, _ := strconv.Atoi(p)
			return n
		}
		switch {
		case !ok:
			k.other++
		case t.listen:
			k.listen++
		case port(t.local) == storePort || port(t.remote) == storePort:
			k.store++
		case in(t.local, mailboxes) || in(t.remote, mailboxes):
			k.mailbox++
		case in(t.local, standbys) || in(t.remote, standbys):
			k.standby++
		default:
			k.data++
		}
	}
	k.channels = collChannels(c)
	return k
}

// procNetAddr turns an address of /proc/net/tcp ("0100007F:1F90", the
// IPv4 address in host byte order) into "127.0.0.1:8080"; IPv6 addresses
// that map an IPv4 one likewise, others as they are.
func procNetAddr(s string) string {
	h, p, ok := strings.Cut(s, ":")
	port, err := strconv.ParseUint(p, 16, 16)
	if !ok || err != nil {
		return s
	}
	if len(h) == 32 && strings.HasPrefix(h, "0000000000000000FFFF0000") {
		h = h[24:]
	}
	if len(h) != 8 {
		return s
	}
	v, err := strconv.ParseUint(h, 16, 32)
	if err != nil {
		return s
	}
	return fmt.Sprintf("%d.%d.%d.%d:%d", byte(v), byte(v>>8), byte(v>>16), byte(v>>24), port)
}

// procSockets counts this process's open sockets.
func procSockets() int {
	ents, _ := os.ReadDir("/proc/self/fd")
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}

// procMemory returns this process's VmRSS and RssShmem in KiB.
func procMemory() (rss, shm int64) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return -1, -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			rss = n
		case "RssShmem":
			shm = n
		}
	}
	return rss, shm
}

// committedBytes returns the bytes of the device memory at p committed so
// far: the blocks of its memory file (fstat), reserved or touched.
func committedBytes(dev *device.Device, p device.Ptr) int64 {
	fd, _, err := dev.Share(p, 1)
	if err != nil {
		return -1
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return -1
	}
	return st.Blocks * 512
}

// collChannels counts the collectives' channels of c (their tag).
func collChannels(c *hcomm.Comm) int {
	n := 0
	for p := 0; p < c.Size(); p++ {
		if p == c.Rank() {
			continue
		}
		d := hcomm.ChannelDescInit(1)
		d[0].RemoteRank, d[0].Tag = p, "hcomm/collectives"
		if chs, err := c.ChannelQuery(hcomm.EngineCPUTS, d); err == nil && chs[0] != nil {
			n++
		}
	}
	return n
}

// scaleRank is one rank of the harness (HCOMM_TEST_ROLE=scale): init from
// the environment, every collective, its SCALE line, then Destroy.
func scaleRank(t *testing.T) {
	start := time.Now()
	c, err := hcomm.InitFromEnv(nil)
	if err != nil {
		t.Fatalf("init: %v", err)
	}
	defer c.Destroy()
	initDur := time.Since(start)
	st := scaleStats{rank: c.Rank(), initMs: initDur.Milliseconds(), startUs: procStart().UnixMicro()}
	storePort, _ := strconv.Atoi(os.Getenv("MASTER_PORT"))
	wstart := time.Now()
	if err := scaleWork(c, func(step int) {
		switch step {
		case 0:
			st.firstUs = time.Now().UnixMicro()
			st.small = procSocketKinds(c, storePort)
		case 1:
			st.large = procSocketKinds(c, storePort)
		}
	}); err != nil {
		t.Fatalf("rank %d: %v", c.Rank(), err)
	}
	st.workMs = time.Since(wstart).Milliseconds()
	st.sockets, st.channels = procSockets(), collChannels(c)
	st.rssKB, st.shmKB = procMemory()
	buf, _, _ := c.GetHcclBuffer()
	st.committedKB = committedBytes(c.Device(), buf) >> 10
	fmt.Println(st.line())
	// Every rank has measured before any leaves.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := collectives.BarrierContext(ctx, c); err != nil {
		t.Fatalf("rank %d: the closing barrier: %v", c.Rank(), err)
	}
}

// procStart returns when this process started (/proc/self/stat's start
// time, in clock ticks since boot, against /proc/uptime); the time of the
// call where that cannot be read.
func procStart() time.Time {
	now := time.Now()
	b, err1 := os.ReadFile("/proc/self/stat")
	u, err2 := os.ReadFile("/proc/uptime")
	if err1 != nil || err2 != nil {
		return now
	}
	_, after, _ := strings.Cut(string(b), ") ") // the command may hold spaces
	fs := strings.Fields(after)
	up, _, _ := strings.Cut(string(u), " ")
	upS, err1 := strconv.ParseFloat(up, 64)
	if len(fs) < 20 || err1 != nil {
		return now
	}
	ticks, err := strconv.ParseInt(fs[19], 10, 64) // field 22, starttime; fs[0] is field 3
	if err != nil {
		return now
	}
	const hz = 100 // USER_HZ on Linux
	return now.Add(-time.Duration(upS*float64(time.Second)) + time.Duration(ticks)*time.Second/hz)
}

// scaleWork runs every collective once with hcomm's choice of algorithm,
// at an odd size, plus all-reduces of 16 B and 1 MiB, and the broadcast,
// all-gather, reduce-scatter and all-to-all again on their two-level and
// Bruck forms, each checked element by element; after the 16 B all-reduce
// (the first collective) it calls at(0), after the 1 MiB one at(1).
func scaleWork(c *hcomm.Comm, at func(step int)) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	me, n := c.Rank(), c.Size()
	val := func(r, i int) int32 { return int32(r*1000 + i%997) }
	fill := func(r, k int) []int32 {
		b := make([]int32, k)
		for i := range b {
			b[i] = val(r, i)
		}
		return b
	}
	check := func(what string, got []int32, want func(i int) int32) error {
		for i, v := range got {
			if w := want(i); v != w {
				return fmt.Errorf("%s: element %d = %d, want %d", what, i, v, w)
			}
		}
		return nil
	}
	sum := func(i int) int32 {
		var s int32
		for r := 0; r < n; r++ {
			s += val(r, i)
		}
		return s
	}
	for i, count := range []int{4, 1 << 18, 31, 1<<18 + 3} {
		recv := make([]int32, count)
		if err := collectives.AllReduceSlice(ctx, c, fill(me, count), recv, hcomm.Sum, nil); err != nil {
			return fmt.Errorf("AllReduce of %d: %w", count, err)
		}
		if err := check(fmt.Sprintf("AllReduce of %d", count), recv, sum); err != nil {
			return err
		}
		if i < 2 {
			at(i)
		}
	}
	const count = 1031
	// The broadcast, the all-gather and the reduce-scatter with hcomm's
	// choice, then forced onto their two-level forms (the broadcast's
	// root, the last rank, leads no host), the all-gather also onto
	// direct; the all-to-all with its choice and forced onto Bruck and
	// pairwise.
	forced := func(a collectives.Algorithm) []*collectives.Options {
		return []*collectives.Options{{}, {Algorithm: a}}
	}
	for _, o := range forced(collectives.AlgoHier) {
		buf := fill(me, count)
		if err := collectives.BroadcastSlice(ctx, c, buf, n-1, o); err != nil {
			return fmt.Errorf("Broadcast %v: %w", o.Algorithm, err)
		}
		if err := check(fmt.Sprintf("Broadcast %v", o.Algorithm), buf, func(i int) int32 { return val(n-1, i) }); err != nil {
			return err
		}
	}
	var red []int32
	if me == 1%n {
		red = make([]int32, count)
	}
	if err := collectives.ReduceSlice(ctx, c, fill(me, count), red, hcomm.Sum, 1%n, nil); err != nil {
		return fmt.Errorf("Reduce: %w", err)
	}
	if err := check("Reduce", red, sum); err != nil {
		return err
	}
	// Direct over a mix of shm and tcp pairs (several hosts of several
	// ranks): the tcp pairs write into lent receive buffers, the shm
	// pairs go through the pipes, in the same call (collectives/lent.go).
	for _, o := range append(forced(collectives.AlgoHier), &collectives.Options{Algorithm: collectives.AlgoDirect}) {
		all := make([]int32, n*count)
		if err := collectives.AllGatherSlice(ctx, c, fill(me, count), all, o); err != nil {
			return fmt.Errorf("AllGather %v: %w", o.Algorithm, err)
		}
		if err := check(fmt.Sprintf("AllGather %v", o.Algorithm), all, func(i int) int32 { return val(i/count, i%count) }); err != nil {
			return err
		}
	}
	for _, o := range forced(collectives.AlgoHier) {
		part := make([]int32, count)
		if err := collectives.ReduceScatterSlice(ctx, c, fill(me, n*count), part, hcomm.Sum, o); err != nil {
			return fmt.Errorf("ReduceScatter %v: %w", o.Algorithm, err)
		}
		if err := check(fmt.Sprintf("ReduceScatter %v", o.Algorithm), part, func(i int) int32 { return sum(me*count + i) }); err != nil {
			return err
		}
	}
	for _, o := range append(forced(collectives.AlgoBruck), &collectives.Options{Algorithm: collectives.AlgoPairwise}) {
		out := make([]int32, n*count)
		if err := collectives.AlltoAllSlice(ctx, c, fill(me, n*count), out, o); err != nil {
			return fmt.Errorf("AlltoAll %v: %w", o.Algorithm, err)
		}
		if err := check(fmt.Sprintf("AlltoAll %v", o.Algorithm), out, func(i int) int32 { return val(i/count, me*count+i%count) }); err != nil {
			return err
		}
	}
	if err := deviceWork(c, val, check); err != nil {
		return err
	}
	return collectives.BarrierContext(ctx, c)
}

// deviceWork runs the collectives that have no host-slice form — Scatter,
// Gather, AlltoAllV and a ring of BatchSendRecv — on a stream of c's device.
func deviceWork(c *hcomm.Comm, val func(r, i int) int32, check func(string, []int32, func(int) int32) error) error {
	me, n := c.Rank(), c.Size()
	const count = 257
	dev := c.Device()
	s, err := dev.CreateStream()
	if err != nil {
		return err
	}
	defer s.Destroy()
	size := int64(4 * 2 * n * count)
	p, err := dev.Malloc(size)
	if err != nil {
		return err
	}
	defer dev.Free(p)
	in, out := p, p.Add(size/2)
	put := func(at device.Ptr, k int, v func(i int) int32) error {
		b := make([]byte, 4*k)
		for i := 0; i < k; i++ {
			binary.LittleEndian.PutUint32(b[4*i:], uint32(v(i)))
		}
		return dev.MemcpyHtoD(at, b)
	}
	get := func(what string, at device.Ptr, k int) ([]int32, error) {
		if err := s.SynchronizeWithTimeout(2 * time.Minute); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		b := make([]byte, 4*k)
		if err := dev.MemcpyDtoH(b, at); err != nil {
			return nil, err
		}
		v := make([]int32, k)
		for i := range v {
			v[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
		}
		return v, nil
	}
	root := n / 2
	if err := put(in, n*count, func(i int) int32 { return val(me, i) }); err != nil {
		return err
	}
	if err := collectives.Scatter(in, out, count, hcomm.Int32, root, c, s, nil); err != nil {
		return fmt.Errorf("Scatter: %w", err)
	}
	got, err := get("Scatter", out, count)
	if err != nil {
		return err
	}
	if err := check("Scatter", got, func(i int) int32 { return val(root, me*count+i) }); err != nil {
		return err
	}
	if err := collectives.Gather(in, out, count, hcomm.Int32, root, c, s, nil); err != nil {
		return fmt.Errorf("Gather: %w", err)
	}
	if me == root {
		if got, err = get("Gather", out, n*count); err != nil {
			return err
		}
		if err := check("Gather", got, func(i int) int32 { return val(i/count, i%count) }); err != nil {
			return err
		}
	}
	// AlltoAllV: rank r sends 1 + (r+p)%3 elements to rank p.
	k := func(from, to int) int64 { return int64(1 + (from+to)%3) }
	sc, sd, rc, rd := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	var soff, roff int64
	for q := 0; q < n; q++ {
		sc[q], sd[q], rc[q], rd[q] = k(me, q), soff, k(q, me), roff
		soff += sc[q]
		roff += rc[q]
	}
	if err := collectives.AlltoAllV(in, sc, sd, hcomm.Int32, out, rc, rd, hcomm.Int32, c, s, nil); err != nil {
		return fmt.Errorf("AlltoAllV: %w", err)
	}
	if got, err = get("AlltoAllV", out, int(roff)); err != nil {
		return err
	}
	for q := 0; q < n; q++ {
		if err := check(fmt.Sprintf("AlltoAllV from rank %d", q), got[rd[q]:rd[q]+rc[q]], func(i int) int32 { return val(q, int(sd0(q, me, k))+i) }); err != nil {
			return err
		}
	}
	// A ring of BatchSendRecv: each rank sends to its right, receives from its left.
	if n > 1 {
		right, left := (me+1)%n, (me+n-1)%n
		items := []collectives.SendRecvItem{
			{Type: collectives.SendItem, Buf: in, Count: count, DataType: hcomm.Int32, RemoteRank: right},
			{Type: collectives.RecvItem, Buf: out, Count: count, DataType: hcomm.Int32, RemoteRank: left},
		}
		if err := collectives.BatchSendRecv(items, c, s); err != nil {
			return fmt.Errorf("BatchSendRecv: %w", err)
		}
		if got, err = get("BatchSendRecv", out, count); err != nil {
			return err
		}
		if err := check("BatchSendRecv", got, func(i int) int32 { return val(left, i) }); err != nil {
			return err
		}
	}
	return nil
}

// sd0 is where rank from's block for rank to starts in from's AlltoAllV send
// buffer (the displacements of deviceWork).
func sd0(from, to int, k func(from, to int) int64) int64 {
	var off int64
	for q := 0; q < to; q++ {
		off += k(from, q)
	}
	return off
}

// TestScaleNetns is the scale harness (see the top of this file); it needs
// root for the namespaces and is bounded by a deadline, after which, as on
// any failure, every process, namespace and link it made is removed.
func TestScaleNetns(t *testing.T) {
	hosts, procs := scaleShape(t)
	n := hosts * procs
	h := makeNetnsHosts(t, hosts) // skips without root; cleans up after itself
	limit := 90 * time.Second
	if n > 8 {
		limit = 15 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	secret := make([]byte, 16)
	rand.Read(secret)
	ps := make([]*rankProc, n)
	t.Cleanup(func() { // before the namespaces' cleanup (registered earlier)
		for _, p := range ps {
			if p != nil {
				p.cmd.Process.Kill()
				<-p.done
			}
		}
	})
	launched := time.Now()
	for r := 0; r < n; r++ {
		args := []string{"ip", "netns", "exec", h.ns(r / procs), bin, "-test.run=^TestHelperRank$", "-test.v",
			"-test.timeout=" + limit.String()}
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		cmd.Env = append(os.Environ(), roleEnv+"=scale",
			"MASTER_ADDR="+h.addr(0), "MASTER_PORT=29533", "HCOMM_SECRET="+hex.EncodeToString(secret),
			"RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(n),
			"LOCAL_RANK="+strconv.Itoa(r%procs), "LOCAL_WORLD_SIZE="+strconv.Itoa(procs),
			"HCOMM_SOCKET_IFNAME=="+h.nsEnd(r/procs),
			"HCCL_CONNECT_TIMEOUT="+strconv.Itoa(int(limit/time.Second)))
		p := &rankProc{rank: r, cmd: cmd, log: newLineLog(), done: make(chan error, 1)}
		cmd.Stdout, cmd.Stderr = p.log, p.log
		cmd.WaitDelay = 5 * time.Second
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting rank %d: %v", r, err)
		}
		go func() { p.done <- cmd.Wait() }()
		ps[r] = p
	}
	launchDur := time.Since(launched)
	var stats []scaleStats
	for _, p := range ps {
		err := <-p.done
		p.done <- err // for the cleanup
		var got *scaleStats
		for _, l := range strings.Split(p.log.String(), "\n") {
			if strings.HasPrefix(l, "SCALE ") {
				s, perr := parseScale(l)
				if perr != nil {
					t.Errorf("rank %d: %q: %v", p.rank, l, perr)
				}
				got = &s
			}
		}
		if err != nil || got == nil {
			out := p.log.String()
			if len(out) > 4000 {
				out = out[len(out)-4000:]
			}
			t.Errorf("rank %d: %v (exit), no SCALE line: %v\n%s", p.rank, err, got == nil, out)
			continue
		}
		stats = append(stats, *got)
	}
	if ctx.Err() != nil {
		t.Fatalf("%d ranks did not finish within %v", n, limit)
	}
	if len(stats) == 0 {
		return
	}
	t.Logf("%d ranks = %d hosts x %d processes, launched in %v, all done in %v", n, hosts, procs, launchDur.Round(time.Millisecond), time.Since(launched).Round(time.Millisecond))
	t.Log("rank  init_ms  work_ms  sockets  channels  rss_MiB  shm_MiB  hccl_committed_MiB")
	for _, s := range stats {
		t.Logf("%4d  %7d  %7d  %7d  %8d  %7.1f  %7.1f  %18.1f", s.rank, s.initMs, s.workMs, s.sockets, s.channels,
			float64(s.rssKB)/1024, float64(s.shmKB)/1024, float64(s.committedKB)/1024)
	}
	for _, x := range []struct {
		what string
		k    func(scaleStats) socketKinds
	}{{"16 B", func(s scaleStats) socketKinds { return s.small }}, {"1 MiB", func(s scaleStats) socketKinds { return s.large }}} {
		t.Logf("sockets after the all-reduce of %s, by rank: total = data + mailbox + store + standby + listen + other (channels)", x.what)
		for _, s := range stats {
			k := x.k(s)
			t.Logf("%4d  %3d = %3d + %3d + %3d + %3d + %3d + %3d (%d)", s.rank, k.total, k.data, k.mailbox, k.store, k.standby, k.listen, k.other, k.channels)
		}
	}
	col := func(f func(scaleStats) int64) string {
		v := make([]int64, len(stats))
		for i, s := range stats {
			v[i] = f(s)
		}
		sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
		return fmt.Sprintf("min %d median %d max %d", v[0], v[len(v)/2], v[len(v)-1])
	}
	t.Logf("init_ms: %s", col(func(s scaleStats) int64 { return s.initMs }))
	t.Logf("start to first collective done, ms: %s", col(func(s scaleStats) int64 { return (s.firstUs - s.startUs) / 1000 }))
	var lastStart, lastFirst int64
	for _, s := range stats {
		lastStart, lastFirst = max(lastStart, s.startUs), max(lastFirst, s.firstUs)
	}
	t.Logf("init: last process start to every rank's first collective done: %d ms", (lastFirst-lastStart)/1000)
	t.Logf("sockets: %s", col(func(s scaleStats) int64 { return int64(s.sockets) }))
	t.Logf("channels: %s", col(func(s scaleStats) int64 { return int64(s.channels) }))
	for _, x := range []struct {
		what string
		k    func(scaleStats) socketKinds
	}{{"16 B", func(s scaleStats) socketKinds { return s.small }}, {"1 MiB", func(s scaleStats) socketKinds { return s.large }}} {
		k := func(f func(socketKinds) int) string { return col(func(s scaleStats) int64 { return int64(f(x.k(s))) }) }
		t.Logf("after the %s all-reduce: sockets %s; data %s; mailbox %s; store %s; standby %s; listen %s; other %s; channels %s", x.what,
			k(func(k socketKinds) int { return k.total }), k(func(k socketKinds) int { return k.data }),
			k(func(k socketKinds) int { return k.mailbox }), k(func(k socketKinds) int { return k.store }),
			k(func(k socketKinds) int { return k.standby }), k(func(k socketKinds) int { return k.listen }),
			k(func(k socketKinds) int { return k.other }), k(func(k socketKinds) int { return k.channels }))
	}
	t.Logf("rss_kb: %s", col(func(s scaleStats) int64 { return s.rssKB }))
	t.Logf("shm_kb: %s", col(func(s scaleStats) int64 { return s.shmKB }))
	t.Logf("hccl_committed_kb: %s", col(func(s scaleStats) int64 { return s.committedKB }))
	// The HCCL buffer is 400 MB at the default HCCL_BUFFSIZE: what a rank
	// committed of it is what its collectives touched, a small part.
	if i := slices.IndexFunc(stats, func(s scaleStats) bool { return s.committedKB > 128<<10 }); i >= 0 {
		t.Errorf("rank %d committed %d KiB of its HCCL buffer; want it committed as touched (under 128 MiB)", stats[i].rank, stats[i].committedKB)
	}
}
