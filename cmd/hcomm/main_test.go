package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/internal/leakcheck"
)

// TestMain removes the programs binaries built, once every test has run.
func TestMain(m *testing.M) {
	leakcheck.Main(m, func() {
		if binDir != "" {
			os.RemoveAll(binDir)
		}
	})
}

// rankProg is the program the launcher tests start: what each rank does is
// chosen by its first argument.
const rankProg = `package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	rank := os.Getenv("RANK")
	switch os.Args[1] {
	case "ok":
		fmt.Printf("rank %s of %s local %s/%s master %s:%s\n", rank, os.Getenv("WORLD_SIZE"),
			os.Getenv("LOCAL_RANK"), os.Getenv("LOCAL_WORLD_SIZE"), os.Getenv("MASTER_ADDR"), os.Getenv("MASTER_PORT"))
		fmt.Fprintf(os.Stderr, "to stderr from %s", rank) // no newline: the launcher ends the line
	case "fail", "stubborn":
		if rank == "2" {
			time.Sleep(200 * time.Millisecond)
			fmt.Println("failing")
			os.Exit(3)
		}
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
		fmt.Println("waiting")
		for {
			select {
			case s := <-c:
				if os.Args[1] == "stubborn" {
					fmt.Println("ignoring", s)
					continue
				}
				fmt.Println("stopped by", s)
				os.Exit(1)
			case <-time.After(60 * time.Second):
				fmt.Println("never stopped")
				os.Exit(0)
			}
		}
	case "killself":
		if rank == "1" {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		time.Sleep(60 * time.Second)
	case "wait":
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
		fmt.Println("waiting")
		select {
		case s := <-c:
			fmt.Println("got", s)
			os.Exit(7)
		case <-time.After(60 * time.Second):
			os.Exit(0)
		}
	}
}
`

var (
	buildOnce         sync.Once
	hcommBin, rankBin string
	binDir            string // where they are built; TestMain removes it
	buildErr          error
)

// binaries builds hcomm and the rank program once per test binary.
func binaries(t *testing.T) (string, string) {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "hcomm-run-test")
		if err != nil {
			buildErr = err
			return
		}
		binDir = dir
		hcommBin, rankBin = filepath.Join(dir, "hcomm"), filepath.Join(dir, "rank")
		if out, err := exec.Command("go", "build", "-o", hcommBin, ".").CombinedOutput(); err != nil {
			buildErr = &buildError{"hcomm", out, err}
			return
		}
		src := filepath.Join(dir, "rank.go")
		if err := os.WriteFile(src, []byte(rankProg), 0o644); err != nil {
			buildErr = err
			return
		}
		c := exec.Command("go", "build", "-o", rankBin, "rank.go")
		c.Dir = dir
		c.Env = append(os.Environ(), "GO111MODULE=off", "GOFLAGS=")
		if out, err := c.CombinedOutput(); err != nil {
			buildErr = &buildError{"the rank program", out, err}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return hcommBin, rankBin
}

// lockedBuffer is a bytes.Buffer that may be read while a command writes it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type buildError struct {
	what string
	out  []byte
	err  error
}

func (e *buildError) Error() string {
	return "building " + e.what + ": " + e.err.Error() + "\n" + string(e.out)
}

// hcommRun runs hcomm with args and returns its exit status, output and time.
func hcommRun(t *testing.T, args ...string) (int, string, string, time.Duration) {
	t.Helper()
	bin, _ := binaries(t)
	var out, errb bytes.Buffer
	c := exec.Command(bin, args...)
	c.Stdout, c.Stderr = &out, &errb
	start := time.Now()
	err := c.Start()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		c.Process.Kill()
		<-done
		t.Fatalf("hcomm %q did not end within 30 s\n%s%s", args, out.String(), errb.String())
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, out.String(), errb.String(), time.Since(start)
}

func TestRunSuccess(t *testing.T) {
	_, prog := binaries(t)
	code, out, errs, _ := hcommRun(t, "run", "-n", "4", "--", prog, "ok")
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	port := ""
	for r := 0; r < 4; r++ {
		re := regexp.MustCompile(`(?m)^\[` + string(rune('0'+r)) + `\] rank ` + string(rune('0'+r)) + ` of 4 local ` + string(rune('0'+r)) + `/4 master 127\.0\.0\.1:(\d+)$`)
		m := re.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no line for rank %d in\n%s", r, out)
		}
		if port != "" && m[1] != port {
			t.Errorf("ranks got different MASTER_PORTs: %s and %s", port, m[1])
		}
		port = m[1]
		if !strings.Contains(errs, "["+string(rune('0'+r))+"] to stderr from "+string(rune('0'+r))+"\n") {
			t.Errorf("rank %d's unterminated stderr line is missing:\n%s", r, errs)
		}
	}
}

// One rank failing makes hcomm run fail promptly with its status, and the
// others are stopped with SIGTERM.
func TestRunFailureStopsOthers(t *testing.T) {
	_, prog := binaries(t)
	code, out, errs, took := hcommRun(t, "run", "-n", "4", "--", prog, "fail")
	if code != 3 {
		t.Errorf("exit %d, want rank 2's 3\n%s%s", code, out, errs)
	}
	if took > 10*time.Second {
		t.Errorf("took %v: the other ranks were not stopped promptly", took)
	}
	for _, r := range []string{"0", "1", "3"} {
		if !strings.Contains(out, "["+r+"] stopped by terminated") {
			t.Errorf("rank %s was not stopped by SIGTERM:\n%s", r, out)
		}
	}
	if !strings.Contains(errs, "rank 2 failed") {
		t.Errorf("stderr does not name the failing rank: %q", errs)
	}
}

// A rank that ignores SIGTERM is killed after the grace period.
func TestRunKillsAfterGrace(t *testing.T) {
	_, prog := binaries(t)
	code, out, errs, took := hcommRun(t, "run", "-n", "3", "--grace", "300ms", "--", prog, "stubborn")
	if code != 3 {
		t.Errorf("exit %d, want 3\n%s%s", code, out, errs)
	}
	if took > 10*time.Second || !strings.Contains(out, "ignoring terminated") {
		t.Errorf("took %v\n%s", took, out)
	}
}

// SIGTERM to hcomm run reaches every rank.
func TestRunForwardsSignals(t *testing.T) {
	bin, prog := binaries(t)
	var out lockedBuffer
	c := exec.Command(bin, "run", "-n", "2", prog, "wait")
	c.Stdout, c.Stderr = &out, &out
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for strings.Count(out.String(), "waiting") < 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	c.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	select {
	case err := <-done:
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 7 {
			t.Errorf("exit %v, want the ranks' 7", err)
		}
	case <-time.After(20 * time.Second):
		c.Process.Kill()
		<-done
		t.Fatal("hcomm run did not end after SIGTERM")
	}
	if !strings.Contains(out.String(), "[0] got terminated") || !strings.Contains(out.String(), "[1] got terminated") {
		t.Errorf("the signal did not reach both ranks:\n%s", out.String())
	}
}

func TestRunBadCommandLines(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"run", "-n", "2"}, 2, "no program given"},
		{[]string{"run", "-n", "0", "true"}, 127, "rank count 0 is outside"},
		{[]string{"run", "-n", "2", "/no/such/program"}, 127, "/no/such/program"},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
	} {
		code, _, errs, _ := hcommRun(t, tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want %d and %q", tc.args, code, errs, tc.code, tc.want)
		}
	}
}

// hcomm bench under hcomm run: one rank per process through
// hcomm.InitFromEnv; rank 0 prints the table, the run passes its checks.
func TestBenchUnderRun(t *testing.T) {
	bin, _ := binaries(t)
	code, out, errs, _ := hcommRun(t, "run", "-n", "3", "--", bin, "bench", "allreduce", "-b", "8", "-e", "64K", "-f", "64", "-n", "2", "-w", "1")
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	for _, s := range []string{"[0] # hcomm bench allreduce: nRanks 3 ", "[0]  Rank  2 Group", "[0] # Out of bounds values : 0 OK\n"} {
		s = strings.Replace(s, "[0]  Rank", "[0] #  Rank", 1)
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q:\n%s", s, out)
		}
	}
	if strings.Contains(out, "[1]") || strings.Contains(out, "[2]") {
		t.Errorf("ranks other than 0 printed:\n%s", out)
	}
	rows := regexp.MustCompile(`(?m)^\[0\] +(8|512|32768) +\d+ +float +sum +-1 .* 0$`).FindAllString(out, -1)
	if len(rows) != 3 {
		t.Errorf("%d rows, want 3:\n%s", len(rows), out)
	}
}

// A rank killed by a signal makes hcomm run exit with 128+signal.
func TestRunSignalledRank(t *testing.T) {
	_, prog := binaries(t)
	code, out, errs, took := hcommRun(t, "run", "-n", "2", "--grace", "1s", "--", prog, "killself")
	if code != 128+9 || took > 10*time.Second {
		t.Errorf("exit %d after %v, want 137 promptly\n%s%s", code, took, out, errs)
	}
}
