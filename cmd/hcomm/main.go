// Command hcomm launches and measures hcomm programs.
//
//	hcomm run -n N [--] prog args...     N local ranks with torchrun's variables
//	hcomm run --elastic -n N --min M …   the same, surviving failed ranks (replacements join)
//	hcomm bench <collective|p2p> [flags] nccl-tests-style benchmark
//	hcomm sim -profile F <collective>    predicted time and busbw, by simulation
//	hcomm sim fit BENCH.json...          fit the simulator's link profile to runs
//	hcomm trace FILE.json...             summarise the timelines HCOMM_TRACE wrote
//
// Run "hcomm help <command>" for a command's flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/hcomm-dev/hcomm/cmd/hcomm/internal/bench"
	"github.com/hcomm-dev/hcomm/cmd/hcomm/internal/launch"
)

func main() {
	os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage:
  hcomm run -n N [--grace D] [--] prog [args...]
        start N local processes with MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE,
        LOCAL_RANK and LOCAL_WORLD_SIZE set; prefix their output with the rank
  hcomm run --elastic [--min M] [--max-restarts K] -n N [--] prog [args...]
        the same, but a failed rank does not end the job while M processes
        run: up to K replacements are started and join it (hcomm.Membership)
  hcomm bench <collective|p2p> [flags]
        benchmark a collective (nccl-tests layout); "hcomm bench -h" lists flags
  hcomm sim -profile FILE [flags] <collective>
        predict a collective's time and busbw at many ranks by running its
        schedules over a simulated network; "hcomm sim -h" lists flags
  hcomm sim fit [-cores N] [-o FILE] BENCH.json...
        fit the simulator's link profile to hcomm bench -J runs at a few ranks
  hcomm trace [-top K] FILE.json...
        summarise the timelines HCOMM_TRACE wrote: per rank and span name,
        count, total and percentiles
`

// Main runs the command line args and returns the exit status.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "run":
		return runCmd(args[1:], stdout, stderr)
	case "bench":
		return bench.Main(args[1:], stdout, stderr, bench.Hooks{})
	case "sim":
		return simCmd(args[1:], stdout, stderr)
	case "trace":
		return traceCmd(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		if len(args) > 1 {
			return Main([]string{args[1], "-h"}, stdout, stderr)
		}
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "hcomm: unknown command %q\n%s", args[0], usage)
	return 2
}

func runCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("hcomm run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	n := fs.Int("n", 1, "number of ranks (processes) to start")
	grace := fs.Duration("grace", launch.DefaultGrace, "time between SIGTERM and SIGKILL when stopping ranks")
	port := fs.Int("port", 0, "MASTER_PORT (0: a free port)")
	elasticJob := fs.Bool("elastic", false, "survive failed ranks: start replacements that join the running job (see --min, --max-restarts)")
	minRanks := fs.Int("min", 1, "with --elastic: a failure with fewer processes left than this fails the job (torchrun's --nnodes=MIN:MAX)")
	maxRestarts := fs.Int("max-restarts", 3, "with --elastic: replacements to start at most (torchrun's --max-restarts)")
	bindTo := fs.String("bind-to", string(launch.DefaultBind), "core: bind each rank to its share of the launcher's processors (its own P/N, or one of them in turn when ranks outnumber them), as mpirun --bind-to core; auto: core while ranks are at most 4 a processor, none above; none: let the scheduler place and move them")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: hcomm run -n N [--grace D] [--port P] [--bind-to auto|core|none] [--elastic [--min M] [--max-restarts K]] [--] prog [args...]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	bind, err := launch.ParseBind(*bindTo)
	if err != nil {
		fmt.Fprintf(stderr, "hcomm run: %v\n", err)
		return 2
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fmt.Fprintln(stderr, "hcomm run: no program given")
		fs.Usage()
		return 2
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	res, err := launch.Run(context.Background(), launch.Options{
		N: *n, Prog: rest[0], Args: rest[1:], Stdout: stdout, Stderr: stderr,
		Grace: *grace, Signals: sigs, Port: *port,
		Elastic: *elasticJob, MinRanks: *minRanks, MaxRestarts: *maxRestarts, Bind: bind,
	})
	if err != nil {
		fmt.Fprintf(stderr, "hcomm run: %v\n", err)
		return 127
	}
	return res.Code
}
