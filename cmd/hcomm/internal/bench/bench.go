// Package bench is hcomm bench: collective and point-to-point benchmarks with
// nccl-tests' flags, output layout and bandwidth conventions.
//
// For a row of size S bytes (per rank; the total for allgather), time t is the
// average over ranks of the wall time of -n back-to-back calls enqueued on a
// stream and synchronized, divided by -n; algbw = S / t in decimal GB/s;
// busbw = algbw × the collective's factor: allreduce 2(n-1)/n; allgather,
// reducescatter, alltoall, gather, scatter (n-1)/n; broadcast, reduce,
// sendrecv and p2p 1.
package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/internal/reduce"
)

// Hooks let tests reach inside a run.
type Hooks struct {
	// Corrupt, when set, is called with every rank's output of a checked
	// call before it is compared, and may change it: a test proves with it
	// that a wrong value is counted.
	Corrupt func(rank int, inPlace bool, out []byte)
	// Getenv replaces os.Getenv.
	Getenv func(string) string
	// Terminal says whether stderr is a terminal (the progress line); nil
	// asks os.Stderr.
	Terminal func() bool
	// Scrape, with --metrics-addr, is called with the /metrics URL once the
	// run is over, while the server still serves.
	Scrape func(url string)
	// Stall, when set, is called by every rank of a collective benchmark
	// before each row, with the run's context: a test makes a rank hang
	// with it to prove that -T ends the run.
	Stall func(ctx context.Context, rank int)
	// Environ replaces os.Environ for the JSON report's "env".
	Environ func() []string
	// Now replaces time.Now for the JSON report's start and end times.
	Now func() time.Time
}

// Options is one benchmark run, parsed from the flags.
type Options struct {
	Coll        string
	MinBytes    int64
	MaxBytes    int64
	StepFactor  float64
	StepBytes   int64
	Iters       int
	Warmup      int
	Check       bool
	DataTypes   []hcomm.DataType
	Ops         []hcomm.ReduceOp
	Root        int
	Ranks       int  // -g: ranks in this process
	RanksSet    bool // -g was given: run in this process even under a launcher
	JSON, CSV   bool
	Plot        string
	MetricsAddr string
	MinBW       float64        // HCOMM_TESTS_MIN_BW; 0 = no bound
	Bidir       bool           // p2p: both directions at once
	LL          bool           // -ll 1: p2p's small sizes as lines over inproc and shm
	Protocol    hcomm.Protocol // p2p: the channels' protocol (picks the transport)
	Register    bool           // -R 1: the buffers are symmetric windows (collectives.RegisterWindow)
	JSONFile    string         // -J: also write nccl-tests' JSON report to this file (json.go)
	PerIter     bool           // -I 1: time every iteration and report their statistics
	PerIterSkip int            // -K: leading iterations left out of -I's statistics
	Timeout     time.Duration  // -T: a wait longer than this aborts the run; 0 = none
	Memory      bool           // -M 1: report the device memory each rank uses
	Args        []string       // the command line, for the JSON report

	corrupt func(rank int, inPlace bool, out []byte) // Hooks.Corrupt
}

// ParseSize parses a byte count with an optional K, M or G suffix (binary,
// as hccl_test and nccl-tests: 1K = 1024).
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	if t != "" {
		switch t[len(t)-1] {
		case 'k', 'K':
			mult = 1 << 10
		case 'm', 'M':
			mult = 1 << 20
		case 'g', 'G':
			mult = 1 << 30
		}
		if mult != 1 {
			t = t[:len(t)-1]
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("size %q: want a non-negative integer with an optional K, M or G suffix", s)
	}
	return n * mult, nil
}

type sizeFlag struct{ v *int64 }

func (f sizeFlag) String() string {
	if f.v == nil {
		return "0"
	}
	return strconv.FormatInt(*f.v, 10)
}
func (f sizeFlag) Set(s string) error {
	n, err := ParseSize(s)
	if err != nil {
		return err
	}
	*f.v = n
	return nil
}

// typeNames are nccl-tests' names for the types it knows, hcomm's for the rest.
var typeNames = map[hcomm.DataType]string{
	hcomm.Int8: "int8", hcomm.Uint8: "uint8", hcomm.Int16: "int16", hcomm.Uint16: "uint16",
	hcomm.Int32: "int32", hcomm.Uint32: "uint32", hcomm.Int64: "int64", hcomm.Uint64: "uint64",
	hcomm.Float16: "half", hcomm.Float32: "float", hcomm.Float64: "double", hcomm.BFloat16: "bfloat16",
}

func parseTypes(s string) ([]hcomm.DataType, error) {
	if strings.EqualFold(s, "all") {
		return reduce.DataTypes(), nil
	}
	var out []hcomm.DataType
	for _, p := range strings.Split(s, ",") {
		dt, err := reduce.ParseDataType(strings.TrimSpace(p))
		if err != nil {
			return nil, fmt.Errorf("-d: %v (want one of int8, uint8, int16, uint16, int32, uint32, int64, uint64, half/fp16, float/fp32, double/fp64, bfloat16/bf16, or all)", err)
		}
		out = append(out, dt)
	}
	return out, nil
}

func parseOps(s string) ([]hcomm.ReduceOp, error) {
	if strings.EqualFold(s, "all") {
		return reduce.Ops(), nil
	}
	var out []hcomm.ReduceOp
	for _, p := range strings.Split(s, ",") {
		op, err := reduce.ParseOp(strings.TrimSpace(p))
		if err != nil {
			return nil, fmt.Errorf("-o: %v (want sum, prod, max, min or all)", err)
		}
		out = append(out, op)
	}
	return out, nil
}

func parseProtocol(s string) (hcomm.Protocol, error) {
	var names []string
	for p := hcomm.ProtocolAuto; p <= hcomm.ProtocolHCCSOnly; p++ {
		if strings.EqualFold(s, p.String()) {
			return p, nil
		}
		names = append(names, p.String())
	}
	return 0, fmt.Errorf("--protocol %q: want one of %s", s, strings.Join(names, ", "))
}

// errUsage is a command-line error: exit status 2.
type errUsage struct{ error }

// Parse parses hcomm bench's arguments (the collective first, then flags;
// flags may also come first).
func Parse(args []string, stderr io.Writer, getenv func(string) string) (Options, error) {
	o := Options{MinBytes: 8, MaxBytes: 32 << 20}
	args0 := args
	fs := flag.NewFlagSet("hcomm bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Var(sizeFlag{&o.MinBytes}, "b", "minimum size in bytes (K/M/G suffixes)")
	fs.Var(sizeFlag{&o.MaxBytes}, "e", "maximum size in bytes (K/M/G suffixes)")
	fs.Float64Var(&o.StepFactor, "f", 2, "multiplication factor between sizes")
	fs.Var(sizeFlag{&o.StepBytes}, "i", "increment between sizes in bytes, instead of -f")
	fs.IntVar(&o.Iters, "n", 20, "timed iterations per size")
	fs.IntVar(&o.Warmup, "w", 5, "warm-up iterations per size; for a collective, as many again at the largest and then the smallest size before the first is timed (as nccl-tests)")
	check := fs.Int("c", 1, "check results: 1 counts wrong elements, 0 does not check")
	register := fs.Int("R", 0, "1 registers the send and receive buffers as symmetric windows (collectives.RegisterWindow; nccl-tests' -R 2), so that peers read them in place; 0 does not")
	dts := fs.String("d", "float", "data type(s): a name, a comma list, or all")
	ops := fs.String("o", "sum", "reduction(s): sum, prod, max, min, a comma list, or all")
	fs.IntVar(&o.Root, "r", 0, "root rank of rooted collectives")
	fs.IntVar(&o.Ranks, "g", 2, "ranks in this process (hcomm.InitAll)")
	fs.BoolVar(&o.JSON, "json", false, "print JSON instead of the table")
	fs.BoolVar(&o.CSV, "csv", false, "print CSV instead of the table")
	fs.StringVar(&o.Plot, "plot", "", "write an SVG plot of busbw against size to this file")
	fs.StringVar(&o.MetricsAddr, "metrics-addr", "", "serve Prometheus /metrics on host:port during the run")
	fs.BoolVar(&o.Bidir, "bidir", false, "p2p: measure both directions of each pair at once")
	ll := fs.Int("ll", 1, "p2p: 1 sends sizes up to 56 bytes as one line (data and flag in one cache line) over channels that have them (inproc, shm: the LL protocol, PreparedLine), 0 as a write and a notify like the larger ones")
	fs.StringVar(&o.JSONFile, "J", "", "also write the report as nccl-tests 2.19's JSON to this file (a .json name; an existing file is kept and FILE.0, FILE.1, … written instead)")
	perIter := fs.Int("I", 0, "1 times every iteration of the collectives (device events) and adds, per placement, the slowest rank's min, max and p99 iteration time (i_min, i_max, i_p99, µs) and their coefficient of variation (i_cv%, stdev/mean); the JSON report gets every iteration's time")
	fs.IntVar(&o.PerIterSkip, "K", 0, "with -I 1: leading iterations left out of the per-iteration statistics")
	timeout := fs.Float64("T", 0, "timeout in seconds: a wait for the stream or the other ranks longer than this aborts the run with an error (0: none)")
	memory := fs.Int("M", 0, "1 reports the device memory per rank (HCCL buffer, benchmark buffers, total), as nccl-tests' \"GPU memory usage\"")
	proto := fs.String("protocol", "auto", "p2p: the channels' protocol: auto, HCCS, SIO, HCCS_ONLY, PCIE, ROCE, UBC_CTP, UBC_TP, UB_MEM, UBOE (picks the transport)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: hcomm bench <%s> [flags]\n", strings.ReplaceAll(collNames(), ", ", "|"))
		fs.PrintDefaults()
		fmt.Fprintln(stderr, "environment: HCOMM_TESTS_MIN_BW (GB/s: fail when the average busbw is lower), HCCL_BUFFSIZE, HCCL_EXEC_TIMEOUT, HCCL_CONNECT_TIMEOUT, HCOMM_DEBUG")
	}
	// The collective may come before or after the flags.
	var rest []string
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return o, err
			}
			return o, errUsage{err}
		}
		args = fs.Args()
		if len(args) > 0 {
			rest = append(rest, args[0])
			args = args[1:]
		}
	}
	switch len(rest) {
	case 0:
		fs.Usage()
		return o, errUsage{errors.New("no collective given")}
	case 1:
		o.Coll = strings.ToLower(rest[0])
	default:
		return o, errUsage{fmt.Errorf("one collective at a time, got %q", rest)}
	}
	if o.Coll != "p2p" {
		if _, err := lookupColl(o.Coll); err != nil {
			return o, errUsage{err}
		}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	o.RanksSet = set["g"]
	if set["i"] && !set["f"] {
		o.StepFactor = 0 // -i alone: additive steps; -f wins when both are given (hccl_test)
	}
	var err error
	if o.DataTypes, err = parseTypes(*dts); err != nil {
		return o, errUsage{err}
	}
	if o.Ops, err = parseOps(*ops); err != nil {
		return o, errUsage{err}
	}
	o.Check = *check != 0
	o.Register = *register == 1
	o.PerIter = *perIter == 1
	o.Memory = *memory == 1
	o.LL = *ll == 1
	o.Timeout = time.Duration(*timeout * float64(time.Second))
	o.Args = append([]string{"hcomm", "bench"}, args0...)
	if o.Protocol, err = parseProtocol(*proto); err != nil {
		return o, errUsage{err}
	}
	switch {
	case *check != 0 && *check != 1:
		err = fmt.Errorf("-c %d: want 0 or 1", *check)
	case *register != 0 && *register != 1:
		err = fmt.Errorf("-R %d: want 0 or 1", *register)
	case *perIter != 0 && *perIter != 1:
		err = fmt.Errorf("-I %d: want 0 or 1", *perIter)
	case *memory != 0 && *memory != 1:
		err = fmt.Errorf("-M %d: want 0 or 1", *memory)
	case *ll != 0 && *ll != 1:
		err = fmt.Errorf("-ll %d: want 0 or 1", *ll)
	case *timeout < 0 || *timeout > 1e9:
		err = fmt.Errorf("-T %g: want a number of seconds >= 0", *timeout)
	case o.PerIterSkip < 0 || (o.PerIterSkip > 0 && o.PerIterSkip >= o.Iters):
		err = fmt.Errorf("-K %d: want a count in [0, -n %d)", o.PerIterSkip, o.Iters)
	case o.PerIterSkip > 0 && !o.PerIter:
		err = fmt.Errorf("-K %d needs -I 1", o.PerIterSkip)
	case o.JSONFile != "" && !strings.EqualFold(filepath.Ext(o.JSONFile), ".json"):
		err = fmt.Errorf("-J %q: want a file name ending in .json (nccl-tests infers the format from it)", o.JSONFile)
	case o.MinBytes > o.MaxBytes:
		err = fmt.Errorf("-b %d is larger than -e %d", o.MinBytes, o.MaxBytes)
	case o.StepFactor != 0 && o.StepFactor <= 1:
		err = fmt.Errorf("-f %g: the step factor must be > 1", o.StepFactor)
	case o.StepFactor == 0 && o.StepBytes <= 0:
		err = errors.New("-i must be > 0")
	case o.Iters < 1:
		err = fmt.Errorf("-n %d: at least 1 iteration", o.Iters)
	case o.Warmup < 0:
		err = fmt.Errorf("-w %d is negative", o.Warmup)
	case o.Ranks < 1:
		err = fmt.Errorf("-g %d: at least 1 rank", o.Ranks)
	case o.JSON && o.CSV:
		err = errors.New("--json and --csv exclude each other")
	}
	if err != nil {
		return o, errUsage{err}
	}
	if v := getenv("HCOMM_TESTS_MIN_BW"); v != "" {
		if o.MinBW, err = strconv.ParseFloat(v, 64); err != nil || o.MinBW < 0 {
			return o, errUsage{fmt.Errorf("HCOMM_TESTS_MIN_BW=%q: want a non-negative number of GB/s", v)}
		}
	}
	return o, nil
}

// sizes lists the row sizes: min, then ×factor (or +step) up to max.
func (o Options) sizes() []int64 {
	var out []int64
	for s := o.MinBytes; s <= o.MaxBytes; {
		out = append(out, s)
		next := s + o.StepBytes
		if o.StepFactor > 1 {
			next = int64(float64(s) * o.StepFactor)
			if s == 0 {
				next = 1
			}
		}
		if next <= s {
			next = s + 1
		}
		s = next
	}
	return out
}

// Main runs hcomm bench with args and returns the exit status: 0 when every
// value checked was right and the average busbw reached HCOMM_TESTS_MIN_BW,
// 1 otherwise or on an error, 2 for a bad command line.
func Main(args []string, stdout, stderr io.Writer, h Hooks) int {
	if h.Getenv == nil {
		h.Getenv = os.Getenv
	}
	if h.Terminal == nil {
		h.Terminal = stderrIsTerminal
	}
	o, err := Parse(args, stderr, h.Getenv)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "hcomm bench: %v\n", err)
		return 2
	}
	ok, err := Run(o, stdout, stderr, h)
	if err != nil {
		fmt.Fprintf(stderr, "hcomm bench: %v\n", err)
		return 1
	}
	if !ok {
		return 1
	}
	return 0
}

func stderrIsTerminal() bool {
	fi, err := os.Stderr.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
