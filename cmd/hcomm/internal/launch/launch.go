// Package launch starts N local processes of one program with the variables
// torchrun sets (a small torchrun for one host): MASTER_ADDR, MASTER_PORT,
// RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE. Each output line is
// prefixed with the rank ("[2] ..."); SIGINT and SIGTERM are forwarded; when
// one rank fails, the others are stopped (SIGTERM, then SIGKILL after a grace
// period) and the first failing rank's exit status is returned.
package launch

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

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
	// Port is MASTER_PORT; 0 picks a free port on 127.0.0.1.
	Port int
}

// MaxRanks bounds Options.N.
const MaxRanks = 1024

// Result says how the launch ended.
type Result struct {
	// Code is the exit status to exit with: 0 when every rank succeeded,
	// else the first failing rank's status (128+signal when it was killed by
	// a signal it did not get from the launcher's stop).
	Code int
	// FailedRank is the first rank that failed, -1 when none did.
	FailedRank int
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
	if o.Prog == "" {
		return res, errors.New("launch: no program to run")
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
	procs := make([]*exec.Cmd, 0, o.N)
	writers := make([]*prefixWriter, 0, 2*o.N)
	type exit struct {
		rank int
		err  error
	}
	exits := make(chan exit, o.N)
	stopAll := func(sig syscall.Signal) {
		for _, c := range procs {
			signalGroup(c, sig)
		}
	}
	for r := 0; r < o.N; r++ {
		c := exec.Command(prog, o.Args...)
		vars := map[string]string{
			"MASTER_ADDR":      "127.0.0.1",
			"MASTER_PORT":      strconv.Itoa(port),
			"RANK":             strconv.Itoa(r),
			"WORLD_SIZE":       strconv.Itoa(o.N),
			"LOCAL_RANK":       strconv.Itoa(r),
			"LOCAL_WORLD_SIZE": strconv.Itoa(o.N),
			"GROUP_RANK":       "0",
			"HCOMM_SECRET":     secret,
		}
		if g := gomaxprocs(o.Env, o.N); g != "" {
			vars["GOMAXPROCS"] = g
		}
		c.Env = withVars(o.Env, vars)
		stdout := &prefixWriter{mu: &outMu, w: o.Stdout, prefix: []byte("[" + strconv.Itoa(r) + "] ")}
		stderr := &prefixWriter{mu: &outMu, w: o.Stderr, prefix: stdout.prefix}
		writers = append(writers, stdout, stderr)
		c.Stdout, c.Stderr = stdout, stderr
		setGroup(c)
		// A grandchild that keeps the output pipes open must not hold Wait
		// forever once the rank itself has exited.
		c.WaitDelay = o.Grace
		if err := c.Start(); err != nil {
			stopAll(syscall.SIGKILL)
			for range procs {
				<-exits
			}
			return res, fmt.Errorf("launch: starting rank %d: %w", r, err)
		}
		procs = append(procs, c)
		go func(r int, c *exec.Cmd) { exits <- exit{r, c.Wait()} }(r, c)
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
	for left > 0 {
		select {
		case e := <-exits:
			left--
			if e.err != nil && res.FailedRank < 0 && !stopping {
				res.FailedRank, res.Code = e.rank, exitCode(e.err)
				fmt.Fprintf(o.Stderr, "hcomm run: rank %d failed (%v); stopping the other ranks\n", e.rank, e.err)
				stop()
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

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

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

// withVars returns env with vars set, replacing earlier definitions.
func withVars(env []string, vars map[string]string) []string {
	out := make([]string, 0, len(env)+len(vars))
	for _, kv := range env {
		name, _, _ := bytes.Cut([]byte(kv), []byte("="))
		if _, ok := vars[string(name)]; !ok {
			out = append(out, kv)
		}
	}
	for _, k := range []string{"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "HCOMM_SECRET", "GOMAXPROCS"} {
		if v, ok := vars[k]; ok {
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
