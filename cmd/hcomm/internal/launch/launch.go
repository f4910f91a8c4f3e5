// Package launch starts N local processes of one program with the variables
// torchrun sets (a small torchrun for one host): MASTER_ADDR, MASTER_PORT,
// RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE. Each output line is
// prefixed with the rank ("[2] ..."); SIGINT and SIGTERM are forwarded; when
// one rank fails, the others are stopped (SIGTERM, then SIGKILL after a grace
// period) and the first failing rank's exit status is returned. With
// Options.Bind (`hcomm run --bind-to`, auto by default on Linux) each rank
// is bound to its share of the launcher's processors (BindCore, BindAuto).
//
// # Elastic jobs
//
// With Options.Elastic (`hcomm run --elastic`, as torchrun's
// --nnodes=MIN:MAX and --max-restarts) a rank that fails does not fail the
// job while at least MinRanks processes still run; the launcher starts a
// replacement in its place, up to MaxRestarts times, and the program's
// ranks shrink around the loss and grow back when the replacement joins.
// The protocol between the launcher and the ranks:
//
//  1. The launcher serves a membership store (internal/bootstrap, on
//     127.0.0.1, its secret derived from HCOMM_SECRET) and gives every
//     process it starts a slot, unique over the job's life (0..N-1 for the
//     first N, then N, N+1, … for replacements; a process's output lines
//     are prefixed with its slot). Every process gets HCOMM_ELASTIC_ADDR,
//     HCOMM_ELASTIC_SLOT and HCOMM_ELASTIC_SLOTS (N + MaxRestarts); the
//     first N also get the torchrun variables, and start the job with
//     InitFromEnv as without --elastic.
//  2. When a rank dies, the survivors see their operations fail naming it
//     (hcomm's loss detection), Revoke the communicator and Shrink it. The
//     launcher sees the exit, and when the job may go on, starts a
//     replacement with HCOMM_ELASTIC_JOIN=1 and without RANK, WORLD_SIZE,
//     LOCAL_RANK: it registers in the store (hcomm.Membership.AwaitToken:
//     it takes the next newcomer number) and waits.
//  3. Between steps, the job's rank 0 reads how many newcomers wait
//     (Membership.Pending) and shares the count with the other ranks; when
//     it is positive, rank 0 makes a join token (Comm.GrowToken), hands it
//     to the newcomers through the store with their ranks
//     (Membership.Admit, which also marks their slots as members), and
//     every member calls Comm.Grow while every newcomer calls
//     hcomm.JoinContext.
//  4. At the end, rank 0 calls Membership.End: newcomers still waiting exit
//     (their AwaitToken reports hcomm.ErrJobEnded). Should no member be left
//     while a newcomer waits (every member exited), the launcher closes the
//     store, which tells them the same.
//
// The job's exit status is 0 when every process exited 0 but the failures
// it survived; a failure with fewer than MinRanks processes left, or a
// failed start, stops the job as without --elastic.
package launch

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hcomm-dev/hcomm/internal/bootstrap"
	"github.com/hcomm-dev/hcomm/internal/elastic"
	"github.com/hcomm-dev/hcomm/internal/procs"
)

// DefaultGrace is how long stopped ranks get between SIGTERM and SIGKILL.
const DefaultGrace = 5 * time.Second

// Options describe one launch. Prog and N are required.
type Options struct {
	N    int      // number of ranks (processes), 1..MaxRanks
	Prog string   // the program: a path, or a name looked up in PATH
	Args []string // its arguments
	// Env is the environment every rank starts from (os.Environ() when nil);
	// the launch variables are added to it, replacing any of the same name.
	Env []string
	// Stdout and Stderr receive the ranks' prefixed lines (os.Stdout and
	// os.Stderr when nil). Whole lines are written at once.
	Stdout, Stderr io.Writer
	// Grace is the time between SIGTERM and SIGKILL (DefaultGrace when 0).
	Grace time.Duration
	// Signals, when not nil, delivers signals to forward to every rank.
	Signals <-chan os.Signal
	// Port is MASTER_PORT; 0 picks a free port on 127.0.0.1 (FreePort).
	Port int
	// Elastic makes the job survive failed ranks (see the package doc).
	Elastic bool
	// MinRanks is how many processes must still run for the job to survive
	// a failure (Elastic; 1..N, 0 means 1).
	MinRanks int
	// MaxRestarts bounds the replacements an elastic job starts.
	MaxRestarts int
	// Bind is how the ranks are bound to the launcher's processors
	// (BindNone when empty; `hcomm run --bind-to` gives DefaultBind).
	Bind Bind
}

// Bind says how a launch binds its ranks to processors, as mpirun's
// --bind-to and srun's --cpu-bind do.
type Bind string

const (
	// BindNone leaves the ranks free to run on any of the launcher's
	// processors: the scheduler places and moves them.
	BindNone Bind = "none"
	// BindCore binds each rank to its share of the launcher's processors
	// (its CPU affinity): rank r gets its own run of P/N of the P
	// processors, or with more ranks than processors the one processor
	// r mod P — the share GOMAXPROCS is sized to. Ranks that outnumber the
	// processors then take turns on fixed ones instead of being moved
	// between them: 4 processes on 2 cores over tcp, 1 MiB broadcast 368 µs
	// bound against 552 free, all-gather 405 against 543, 16 B all-reduce
	// over shm 2.6 against 3.5 (BENCHMARKS.md, stop 31). A replacement of
	// an elastic job (slot s ≥ N) gets the share of rank s mod N. Two jobs
	// launched on one host at once each bind from processor 0 up and would
	// share processors while others idle: give such jobs --bind-to none, or
	// launch each under its own taskset.
	BindCore Bind = "core"
	// BindAuto binds as BindCore while the ranks are at most
	// AutoBindPerProcessor to a processor, and leaves them free above:
	// there a rank woken by its peer is best run on whichever processor is
	// idle, which a bound one cannot be (tcp, all-reduce, µs, free against
	// bound, stop 31: 8 processes on 2 cores 16 B 101 against 71, 64 KiB
	// 469 against 292; 16 processes 64 KiB 568 against 754, 1 MiB 5895
	// against 5116; 32 processes 16 B 487 against 606; 64 processes 16 B
	// 1110 against 1554, 64 KiB 5073 against 4515).
	BindAuto Bind = "auto"
)

// AutoBindPerProcessor is the most ranks a processor that BindAuto binds
// them at.
const AutoBindPerProcessor = 4

// ParseBind reads a --bind-to value.
func ParseBind(s string) (Bind, error) {
	switch b := Bind(s); b {
	case BindNone, BindCore, BindAuto:
		return b, nil
	}
	return "", fmt.Errorf("launch: --bind-to %q: want auto, core or none", s)
}

// MaxRanks bounds Options.N.
const MaxRanks = 1024

// Result says how the launch ended.
type Result struct {
	// Code is the exit status to exit with: 0 when every rank succeeded,
	// else the first failing rank's status (128+signal when it was killed by
	// a signal it did not get from the launcher's stop).
	Code int
	// FailedRank is the first rank that failed, -1 when none did. In an
	// elastic job it is a slot, and only a failure the job did not survive
	// sets it.
	FailedRank int
	// Survived counts the failures an elastic job survived, Restarts the
	// replacements it started.
	Survived, Restarts int
}

// Run starts the ranks and waits for them. It returns an error only when the
// launch itself could not be made (bad options, a program that cannot start);
// a rank that fails is reported in Result. Cancelling ctx stops every rank as
// a failure would.
func Run(ctx context.Context, o Options) (Result, error) {
	res := Result{FailedRank: -1}
	if o.N < 1 || o.N > MaxRanks {
		return res, fmt.Errorf("launch: rank count %d is outside [1, %d]", o.N, MaxRanks)
	}
	if o.Elastic && (o.MinRanks < 0 || o.MinRanks > o.N || o.MaxRestarts < 0 || o.N+o.MaxRestarts > MaxRanks) {
		return res, fmt.Errorf("launch: --min %d must be in [1, %d] and --max-restarts %d in [0, %d]", o.MinRanks, o.N, o.MaxRestarts, MaxRanks-o.N)
	}
	if o.Prog == "" {
		return res, errors.New("launch: no program to run")
	}
	var cpus []int // the launcher's processors, shared out among the ranks
	switch o.Bind {
	case "", BindNone:
	case BindCore:
		if cpus = procs.Affinity(); len(cpus) == 0 {
			return res, errors.New("launch: --bind-to core: this system does not say which processors the launcher may use (use --bind-to none)")
		}
	case BindAuto:
		if cpus = procs.Affinity(); o.N > AutoBindPerProcessor*len(cpus) {
			cpus = nil // many ranks a processor: left to the scheduler
		}
	default:
		return res, fmt.Errorf("launch: binding %q: want auto, core or none", o.Bind)
	}
	prog, err := exec.LookPath(o.Prog)
	if err != nil {
		return res, fmt.Errorf("launch: %w", err)
	}
	if o.Env == nil {
		o.Env = os.Environ()
	}
	if o.Stdout == nil {
		o.Stdout = os.Stdout
	}
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
	if o.Grace <= 0 {
		o.Grace = DefaultGrace
	}
	port := o.Port
	if port == 0 {
		if port, err = FreePort(); err != nil {
			return res, fmt.Errorf("launch: finding a free port for MASTER_PORT: %w", err)
		}
	}
	// A fresh secret per launch, so that the ranks' bootstrap refuses anyone
	// else's processes (one the caller set is kept: ranks started elsewhere
	// may share it).
	secret := lookupVar(o.Env, "HCOMM_SECRET")
	if secret == "" {
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return res, fmt.Errorf("launch: making HCOMM_SECRET: %w", err)
		}
		secret = hex.EncodeToString(b[:])
	}
	var outMu sync.Mutex // one line at a time on both streams
	slots := o.N
	if o.Elastic {
		slots += o.MaxRestarts
	}
	var member *bootstrap.Server // the elastic job's membership store
	if o.Elastic {
		if member, err = bootstrap.Listen("127.0.0.1:0", elastic.Secret(secret), bootstrap.ServerOptions{}); err != nil {
			return res, fmt.Errorf("launch: starting the membership store: %w", err)
		}
		defer member.Close()
	}
	ranks := make([]*exec.Cmd, 0, slots)
	writers := make([]*prefixWriter, 0, 2*slots)
	type exit struct {
		slot int
		err  error
	}
	exits := make(chan exit, slots)
	stopAll := func(sig syscall.Signal) {
		for _, c := range ranks {
			signalGroup(c, sig)
		}
	}
	live := make(map[int]bool, o.N) // slot → running
	// start starts the process of slot: one of the first N (rank = slot), or
	// a replacement that joins the running job.
	start := func(slot int) error {
		c := exec.Command(prog, o.Args...)
		vars := map[string]string{
			"MASTER_ADDR":      "127.0.0.1",
			"MASTER_PORT":      strconv.Itoa(port),
			"RANK":             strconv.Itoa(slot),
			"WORLD_SIZE":       strconv.Itoa(o.N),
			"LOCAL_RANK":       strconv.Itoa(slot),
			"LOCAL_WORLD_SIZE": strconv.Itoa(o.N),
			"GROUP_RANK":       "0",
			"HCOMM_SECRET":     secret,
		}
		if g := gomaxprocs(o.Env, o.N); g != "" {
			vars["GOMAXPROCS"] = g
		}
		if o.Elastic {
			vars[elastic.EnvAddr] = member.Addr().String()
			vars[elastic.EnvSlot] = strconv.Itoa(slot)
			vars[elastic.EnvSlots] = strconv.Itoa(slots)
			if slot >= o.N { // a replacement has no rank until the job admits it
				vars["RANK"], vars["LOCAL_RANK"], vars["WORLD_SIZE"] = "", "", ""
				vars[elastic.EnvJoin] = "1"
			}
		}
		c.Env = withVars(o.Env, vars)
		stdout := &prefixWriter{mu: &outMu, w: o.Stdout, prefix: []byte("[" + strconv.Itoa(slot) + "] ")}
		stderr := &prefixWriter{mu: &outMu, w: o.Stderr, prefix: stdout.prefix}
		writers = append(writers, stdout, stderr)
		c.Stdout, c.Stderr = stdout, stderr
		setGroup(c)
		// A grandchild that keeps the output pipes open must not hold Wait
		// forever once the rank itself has exited.
		c.WaitDelay = o.Grace
		var err error
		if cpus != nil {
			err = startBound(c, procs.Share(cpus, o.N, slot%o.N))
		} else {
			err = c.Start()
		}
		if err != nil {
			return err
		}
		ranks = append(ranks, c)
		live[slot] = true
		go func() { exits <- exit{slot, c.Wait()} }()
		return nil
	}
	for r := 0; r < o.N; r++ {
		if err := start(r); err != nil {
			stopAll(syscall.SIGKILL)
			for range ranks {
				<-exits
			}
			return res, fmt.Errorf("launch: starting rank %d: %w", r, err)
		}
	}
	var (
		killTimer <-chan time.Time
		stopping  bool
		left      = o.N
		done      = ctx.Done()
	)
	stop := func() {
		if stopping {
			return
		}
		stopping = true
		stopAll(syscall.SIGTERM)
		killTimer = time.After(o.Grace)
	}
	// survive decides, in an elastic job, what a failure of slot does: the
	// job goes on while MinRanks processes run, with a replacement while
	// restarts remain.
	survive := func(slot int, err error) bool {
		if !o.Elastic || len(live) < max(o.MinRanks, 1) {
			return false
		}
		res.Survived++
		fmt.Fprintf(o.Stderr, "hcomm run: rank %d failed (%v); %d processes go on (--elastic, --min %d)\n", slot, err, len(live), max(o.MinRanks, 1))
		if res.Restarts >= o.MaxRestarts {
			return true
		}
		next := o.N + res.Restarts
		if err := start(next); err != nil {
			fmt.Fprintf(o.Stderr, "hcomm run: starting replacement %d: %v\n", next, err)
			return false
		}
		res.Restarts++
		left++
		fmt.Fprintf(o.Stderr, "hcomm run: started replacement %d (restart %d of %d)\n", next, res.Restarts, o.MaxRestarts)
		return true
	}
	// noMembers says whether every running process is a replacement the job
	// has not admitted: no member is left to admit them.
	noMembers := func() bool {
		for slot := range live {
			if slot < o.N {
				return false
			}
			if _, ok, _ := member.Local().TryGet(context.Background(), elastic.MemberKey(slot)); ok {
				return false
			}
		}
		return true
	}
	for left > 0 {
		select {
		case e := <-exits:
			left--
			delete(live, e.slot)
			if e.err != nil && res.FailedRank < 0 && !stopping && !survive(e.slot, e.err) {
				res.FailedRank, res.Code = e.slot, exitCode(e.err)
				fmt.Fprintf(o.Stderr, "hcomm run: rank %d failed (%v); stopping the other ranks\n", e.slot, e.err)
				stop()
			}
			if member != nil && len(live) > 0 && noMembers() {
				member.Close() // the waiting newcomers learn the job has ended
			}
		case s := <-o.Signals:
			if sig, ok := s.(syscall.Signal); ok {
				stopAll(sig)
			}
		case <-done:
			done = nil
			if res.FailedRank < 0 {
				res.Code = 130
			}
			stop()
		case <-killTimer:
			killTimer = nil
			stopAll(syscall.SIGKILL)
		}
	}
	for _, w := range writers {
		w.flush()
	}
	return res, nil
}

// exitCode turns a Wait error into an exit status.
func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		if c := ee.ExitCode(); c > 0 {
			return c
		}
	}
	return 1
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago,
// drawn from outside the kernel's ephemeral range (bootstrap.FreePort) so
// that no connection takes it before rank 0's store binds it.
func FreePort() (int, error) { return bootstrap.FreePort("127.0.0.1") }

// gomaxprocs is the GOMAXPROCS a rank gets when the caller did not set one:
// the processors of this process shared out among the n ranks, at least one
// each (procs.PerRank, which InitFromEnv applies under mpirun and srun too).
// "" leaves the variable alone.
func gomaxprocs(env []string, n int) string {
	g, ok := procs.PerRank(func(k string) string { return lookupVar(env, k) }, n, runtime.NumCPU())
	if !ok {
		return ""
	}
	return strconv.Itoa(g)
}

// lookupVar returns name's value in env ("" when unset).
func lookupVar(env []string, name string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == name {
			return v
		}
	}
	return ""
}

// withVars returns env with vars set, replacing earlier definitions; a
// variable set to "" is removed.
func withVars(env []string, vars map[string]string) []string {
	out := make([]string, 0, len(env)+len(vars))
	for _, kv := range env {
		name, _, _ := bytes.Cut([]byte(kv), []byte("="))
		if _, ok := vars[string(name)]; !ok {
			out = append(out, kv)
		}
	}
	for _, k := range []string{"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "HCOMM_SECRET", "GOMAXPROCS",
		elastic.EnvAddr, elastic.EnvSlot, elastic.EnvSlots, elastic.EnvJoin} {
		if v, ok := vars[k]; ok && v != "" {
			out = append(out, k+"="+v)
		}
	}
	return out
}

// prefixWriter writes whole lines, each prefixed, to w under mu. A partial
// line waits for its newline (or flush).
type prefixWriter struct {
	mu     *sync.Mutex
	w      io.Writer
	prefix []byte
	buf    []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.buf = append(p.buf, b...)
	i := bytes.LastIndexByte(p.buf, '\n')
	if i < 0 {
		if len(p.buf) < 1<<16 {
			return len(b), nil
		}
		i = len(p.buf) - 1 // an overlong line goes out in pieces
		p.buf = append(p.buf, '\n')
		i++
	}
	p.emit(p.buf[:i+1])
	p.buf = append(p.buf[:0], p.buf[i+1:]...)
	return len(b), nil
}

func (p *prefixWriter) emit(lines []byte) {
	var out []byte
	for len(lines) > 0 {
		j := bytes.IndexByte(lines, '\n')
		out = append(out, p.prefix...)
		out = append(out, lines[:j+1]...)
		lines = lines[j+1:]
	}
	p.mu.Lock()
	p.w.Write(out)
	p.mu.Unlock()
}

// flush writes a last line that had no newline. Called after Wait returned,
// when no Write can run concurrently.
func (p *prefixWriter) flush() {
	if len(p.buf) > 0 {
		p.emit(append(p.buf, '\n'))
		p.buf = nil
	}
}
