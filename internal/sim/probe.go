package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A crowded host — more ranks than cores — costs a message more than its
// link does, in two ways that runs of 2 to 4 ranks barely show: a rank that
// waits sleeps, and being put to sleep and switched back in takes processor
// time at both ends (Profile.SwitchUs); and a processor with nothing to run
// halts, so a message that wakes a rank on one waits for the processor to
// wake first (Profile.WakeUs; a virtual machine's halted processor takes
// tens of microseconds). Probe measures both on this host with no
// collective at all: a message sent and received over tcp loopback by one
// thread that never waits (the system calls alone); processes in a ring
// over tcp loopback, every one passing messages at once (the processor
// time of a crowded message, from the processes' own accounts); and one
// message going round the ring (the time of a hop, when the other
// processors are idle).

// HostCosts is what Probe measured: the JSON form `hcomm sim probe` writes
// and `hcomm sim fit -host` reads.
type HostCosts struct {
	Cores int `json:"cores"` // the host's processors
	Procs int `json:"procs"` // processes in the crowded ring
	// Processor time of a 16-byte message, both ends, µs: sent and
	// received by one thread that never waits (the system calls alone),
	// and among Procs processes (which sleep and are woken).
	BaseCPUUs    float64 `json:"base_cpu_us"`
	CrowdedCPUUs float64 `json:"crowded_cpu_us"`
	// HopUs is the time of a hop of the one message going round Procs.
	HopUs float64 `json:"hop_us"`
	// What the simulator charges (Profile.SwitchUs, Profile.WakeUs):
	// CrowdedCPUUs − BaseCPUUs, and HopUs − CrowdedCPUUs, at least 0.
	SwitchUs float64 `json:"switch_us"`
	WakeUs   float64 `json:"wake_us"`
}

// ProbeOptions configure Probe.
type ProbeOptions struct {
	// Command starts one process of the ring: it must call RingMember with
	// the arguments appended to it. Required.
	Command []string
	// Procs is the crowded ring's process count (default 4 × cores, at
	// least 4).
	Procs int
	// Messages is how many messages each process passes on (default 4000).
	Messages int
	// Timeout bounds each ring (default 1 minute).
	Timeout time.Duration
	// Repeats is how many times each figure is measured; Probe reports the
	// median (default 5: a machine shared with others is noisy).
	Repeats int
}

// Probe measures this host's HostCosts (see above).
func Probe(ctx context.Context, o ProbeOptions) (HostCosts, error) {
	cores := runtime.NumCPU()
	if len(o.Command) == 0 {
		return HostCosts{}, errors.New("sim: probe: no command to start the ring's processes")
	}
	if o.Procs == 0 {
		o.Procs = max(4*cores, 4)
	}
	if o.Procs <= cores || o.Procs > 1024 {
		return HostCosts{}, fmt.Errorf("sim: probe: %d processes on %d cores: want more processes than cores, at most 1024", o.Procs, cores)
	}
	if o.Messages == 0 {
		o.Messages = 4000
	}
	if o.Messages < 10 {
		return HostCosts{}, fmt.Errorf("sim: probe: %d messages a process: want at least 10", o.Messages)
	}
	if o.Timeout == 0 {
		o.Timeout = time.Minute
	}
	h := HostCosts{Cores: cores, Procs: o.Procs}
	if o.Repeats == 0 {
		o.Repeats = 5
	}
	var base, crowded, hop []float64
	for range max(o.Repeats, 1) {
		b, err := selfLoop(o.Messages)
		if err != nil {
			return h, err
		}
		c, _, err := ring(ctx, o, o.Procs, true)
		if err != nil {
			return h, err
		}
		_, p, err := ring(ctx, o, o.Procs, false)
		if err != nil {
			return h, err
		}
		base, crowded, hop = append(base, b), append(crowded, c), append(hop, p)
	}
	h.BaseCPUUs, h.CrowdedCPUUs, h.HopUs = median(base)*1e6, median(crowded)*1e6, median(hop)*1e6
	h.SwitchUs = max(h.CrowdedCPUUs-h.BaseCPUUs, 0)
	h.WakeUs = max(h.HopUs-h.CrowdedCPUUs, 0)
	return h, nil
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// selfLoop returns the time, in seconds, of a 16-byte message written to a
// tcp loopback connection and read back at its other end by the same
// thread: the data is there when the read comes, so no one waits.
func selfLoop(msgs int) (float64, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("sim: probe: %w", err)
	}
	defer l.Close()
	a, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		return 0, fmt.Errorf("sim: probe: %w", err)
	}
	defer a.Close()
	b, err := l.Accept()
	if err != nil {
		return 0, fmt.Errorf("sim: probe: %w", err)
	}
	defer b.Close()
	buf := make([]byte, 16)
	pass := func() error {
		if _, err := a.Write(buf); err != nil {
			return err
		}
		_, err := io.ReadFull(b, buf)
		return err
	}
	for range msgs / 10 {
		if err := pass(); err != nil {
			return 0, fmt.Errorf("sim: probe: %w", err)
		}
	}
	t0 := time.Now()
	for range msgs {
		if err := pass(); err != nil {
			return 0, fmt.Errorf("sim: probe: %w", err)
		}
	}
	return time.Since(t0).Seconds() / float64(msgs), nil
}

// ring runs n processes in a ring, every one passing messages (all) or one
// message going round, and returns the processor time a message took (the
// processes' user and system time over the messages) and the time of a
// hop, in seconds.
func ring(ctx context.Context, o ProbeOptions, n int, all bool) (cpu, hop float64, err error) {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	// Each process's listener is made here and handed down, so the ring
	// needs no free ports agreed on.
	var files []*os.File
	var addrs []string
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, 0, fmt.Errorf("sim: probe: %w", err)
		}
		f, err := l.(*net.TCPListener).File()
		l.Close()
		if err != nil {
			return 0, 0, fmt.Errorf("sim: probe: %w", err)
		}
		files = append(files, f)
		addrs = append(addrs, l.Addr().String())
	}
	mode := "one"
	if all {
		mode = "all"
	}
	laps := o.Messages
	if !all {
		laps = max(o.Messages/n, 10)
	}
	type report struct {
		cpu, elapsed float64
		err          error
	}
	reports := make(chan report, n)
	var cmds []*exec.Cmd
	for r := range n {
		args := append(append([]string(nil), o.Command[1:]...), mode, strconv.Itoa(r), strconv.Itoa(laps), addrs[(r+1)%n])
		c := exec.CommandContext(ctx, o.Command[0], args...)
		c.Env = append(os.Environ(), "GOMAXPROCS=1")
		c.ExtraFiles = []*os.File{files[r]}
		out, err := c.StdoutPipe()
		if err != nil {
			return 0, 0, fmt.Errorf("sim: probe: %w", err)
		}
		var stderr strings.Builder
		c.Stderr = &stderr
		if err := c.Start(); err != nil {
			return 0, 0, fmt.Errorf("sim: probe: starting %s: %w", o.Command[0], err)
		}
		cmds = append(cmds, c)
		go func() {
			line, _ := bufio.NewReader(out).ReadString('\n')
			io.Copy(io.Discard, out)
			werr := c.Wait()
			var rp report
			if _, err := fmt.Sscanf(line, "%g %g", &rp.cpu, &rp.elapsed); err != nil || werr != nil {
				rp.err = fmt.Errorf("sim: probe: ring process %d of %d: %v %v: %s", r, n, werr, err, strings.TrimSpace(stderr.String()))
			}
			reports <- rp
		}()
	}
	var total float64
	for range cmds {
		rp := <-reports
		if rp.err != nil && err == nil {
			err = rp.err
			cancel() // stop the others
		}
		total += rp.cpu
		hop = max(hop, rp.elapsed)
	}
	if err != nil {
		return 0, 0, err
	}
	if all {
		return total / float64(n*laps), 0, nil
	}
	return total / float64(n*laps), hop / float64(n*laps), nil
}

// RingMember is one process of Probe's ring: args are the mode ("all" or
// "one"), its place, the laps and the next process's address; its
// listener is file descriptor 3. It prints its processor time and the
// time its laps took, in seconds.
func RingMember(args []string, stdout io.Writer) error {
	if len(args) != 4 || args[0] != "all" && args[0] != "one" {
		return fmt.Errorf("sim: ring member: want all|one, place, laps and the next address; have %q", args)
	}
	r, err1 := strconv.Atoi(args[1])
	laps, err2 := strconv.Atoi(args[2])
	if err := errors.Join(err1, err2); err != nil || r < 0 || laps < 1 {
		return fmt.Errorf("sim: ring member: place %q and laps %q: %v", args[1], args[2], err)
	}
	f := os.NewFile(3, "listener")
	l, err := net.FileListener(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("sim: ring member %d: its listener: %w", r, err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			c = nil
		}
		accepted <- c
	}()
	var out net.Conn
	for deadline := time.Now().Add(10 * time.Second); ; {
		out, err = net.Dial("tcp", args[3])
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sim: ring member %d: dialing %s: %w", r, args[3], err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	defer out.Close()
	var in net.Conn
	select {
	case in = <-accepted:
	case <-time.After(10 * time.Second):
	}
	if in == nil {
		return fmt.Errorf("sim: ring member %d: no process connected to it", r)
	}
	defer in.Close()
	b := make([]byte, 16)
	pass := func(first bool) error {
		if first {
			if _, err := out.Write(b); err != nil {
				return err
			}
		}
		if _, err := io.ReadFull(in, b); err != nil {
			return err
		}
		if !first {
			_, err := out.Write(b)
			return err
		}
		return nil
	}
	// Everyone sends, then receives (all); or the first process sends and
	// receives each lap while the others pass the message on (one).
	starts := args[0] == "all" || r == 0
	// A lap to warm up, not counted.
	if err := pass(starts); err != nil {
		return fmt.Errorf("sim: ring member %d: %w", r, err)
	}
	var ru0, ru1 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	t0 := time.Now()
	for range laps {
		if err := pass(starts); err != nil {
			return fmt.Errorf("sim: ring member %d: %w", r, err)
		}
	}
	elapsed := time.Since(t0)
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	cpu := tv(ru1.Utime) + tv(ru1.Stime) - tv(ru0.Utime) - tv(ru0.Stime)
	_, err = fmt.Fprintf(stdout, "%g %g\n", cpu, elapsed.Seconds())
	return err
}

func tv(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)*1e-6 }

// ReadHostCosts reads a file `hcomm sim probe -o` wrote. A field it does
// not know, a negative cost, or no cores is an error naming the file.
func ReadHostCosts(path string) (HostCosts, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return HostCosts{}, err
	}
	var h HostCosts
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&h); err != nil {
		return HostCosts{}, fmt.Errorf("%s: not a host's costs (hcomm sim probe -o): %v", path, err)
	}
	if h.Cores < 1 {
		return HostCosts{}, fmt.Errorf("%s: cores is %d: want at least 1", path, h.Cores)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"switch_us", h.SwitchUs}, {"wake_us", h.WakeUs}} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) || f.v < 0 {
			return HostCosts{}, fmt.Errorf("%s: %s is %v: want a finite cost >= 0", path, f.name, f.v)
		}
	}
	return h, nil
}
