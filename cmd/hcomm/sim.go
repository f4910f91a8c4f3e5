package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"

	simch "github.com/hcomm-dev/hcomm/channel/sim"
	"github.com/hcomm-dev/hcomm/cmd/hcomm/internal/bench"
	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/internal/sim"
)

const simUsage = `usage:
  hcomm sim -profile FILE [flags] <collective>
        predict a collective's time and busbw per rank count, size and
        algorithm by running its schedules over a simulated network
  hcomm sim fit [-cores N | -host FILE] [-bootstrap K] [-o FILE] BENCH.json...
        fit a profile (α, o, β, γ) to hcomm bench -J files measured at a few ranks
  hcomm sim probe [-n PROCS] [-m MESSAGES] [-o FILE]
        measure what a crowded host costs a message (processes in a ring over
        tcp loopback, no collective): the switch and wake-up of the profile
`

// simCmd is `hcomm sim`.
func simCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "fit":
			return simFitCmd(args[1:], stdout, stderr)
		case "probe":
			return simProbeCmd(args[1:], stdout, stderr)
		case ringMember: // a process of the probe's ring
			if err := sim.RingMember(args[1:], stdout); err != nil {
				fmt.Fprintf(stderr, "hcomm sim: %v\n", err)
				return 1
			}
			return 0
		}
	}
	fs := flag.NewFlagSet("hcomm sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	profile := fs.String("profile", "", "link profile (JSON, as hcomm sim fit writes it); required")
	ranks := fs.String("n", "8,16,64,256", "rank counts, comma-separated")
	ppn := fs.Int("ppn", 0, "ranks per host (0: all on one host for a one-host profile, as hcomm sim fit writes; else the profile's ranks_per_host); each rank count must be a multiple")
	minB := fs.String("b", "16", "smallest size (bytes; K, M, G suffixes)")
	maxB := fs.String("e", "1M", "largest size")
	factor := fs.Int("f", 4, "size factor between rows")
	algos := fs.String("a", "", "algorithms, comma-separated (auto = the selector's; default: auto and every algorithm the collective has)")
	compare := fs.String("compare", "", "hcomm bench -J files (comma-separated) measured on one host: printed beside the predictions of their rank count (the median of files of one rank count)")
	plot := fs.String("plot", "", "write busbw against size as SVG to this file")
	jsonOut := fs.String("J", "", "write the predictions as JSON to this file")
	buffMB := fs.Int64("buffsize", 16, "each rank's HCCL_BUFFSIZE in MB, as the measured runs'")
	memGB := fs.Int64("mem", 8, "memory the simulation may use over all ranks, GB: the send and receive buffers, and apart the heap while a case runs (a case over it is aborted)")
	fs.Usage = func() {
		fmt.Fprint(stderr, simUsage)
		fs.PrintDefaults()
	}
	// The collective may come before, between or after the flags.
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			return 2
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "hcomm sim: %v\n", err)
		return 1
	}
	if len(pos) != 1 {
		fmt.Fprintln(stderr, "hcomm sim: name one collective:", strings.Join(sim.Collectives(), ", "))
		return 2
	}
	coll := pos[0]
	if !slices.Contains(sim.Collectives(), coll) {
		return fail(fmt.Errorf("no collective %q (have %s)", coll, strings.Join(sim.Collectives(), ", ")))
	}
	if *profile == "" {
		return fail(fmt.Errorf("-profile is required (hcomm sim fit writes one)"))
	}
	b, err := os.ReadFile(*profile)
	if err != nil {
		return fail(err)
	}
	prof, err := simch.ParseProfile(b)
	if err != nil {
		return fail(fmt.Errorf("%s: %w", *profile, err))
	}
	ns, err := parseInts(*ranks, "-n")
	if err != nil {
		return fail(err)
	}
	lo, err := bench.ParseSize(*minB)
	if err != nil {
		return fail(fmt.Errorf("-b: %w", err))
	}
	hi, err := bench.ParseSize(*maxB)
	if err != nil {
		return fail(fmt.Errorf("-e: %w", err))
	}
	if lo <= 0 || hi < lo || *factor < 2 {
		return fail(fmt.Errorf("sizes -b %d -e %d -f %d: want 0 < b <= e and a factor of at least 2", lo, hi, *factor))
	}
	if *buffMB <= 0 || *memGB <= 0 {
		return fail(fmt.Errorf("-buffsize %d MB and -mem %d GB must be positive", *buffMB, *memGB))
	}
	as, err := simAlgos(coll, *algos)
	if err != nil {
		return fail(err)
	}
	measured := map[int]map[int64]float64{}
	var points []sim.Measured
	if *compare != "" {
		for _, f := range strings.Split(*compare, ",") {
			ms, err := sim.ReadBench(f)
			if err != nil {
				return fail(err)
			}
			for _, m := range ms {
				if m.Collective != coll {
					return fail(fmt.Errorf("%s measures %s, not %s", f, m.Collective, coll))
				}
				points = append(points, m)
			}
		}
		// Files of one rank count are repeated runs: their median.
		points = sim.Medians(points)
		for _, m := range points {
			if measured[m.Ranks] == nil {
				measured[m.Ranks] = map[int64]float64{}
			}
			measured[m.Ranks][m.Bytes] = m.Time
		}
	}
	opts := sim.Options{BufferSize: *buffMB << 20, MemLimit: *memGB << 30}
	var all []sim.Result
	fmt.Fprintf(stdout, "# hcomm sim %s: profile %s\n", coll, *profile)
	crowding := "" // how a crowded host is modelled
	switch {
	case prof.Cores == 0:
	case prof.OversubExp > 0:
		crowding = fmt.Sprintf(" (slowdown, exponent %.3g)", prof.OversubExp)
	default:
		crowding = fmt.Sprintf(" (shared; switch %.3g µs, wake-up %.3g µs)", prof.SwitchUs, prof.WakeUs)
	}
	fmt.Fprintf(stdout, "#   intra α %.3g µs o %.3g µs β %.4g ns/B; inter α %.3g µs o %.3g µs β %.4g ns/B; γ %.4g ns/B; cores per host %d%s\n",
		prof.Intra.AlphaUs, prof.Intra.OverheadUs, prof.Intra.BetaNsPerByte, prof.Inter.AlphaUs, prof.Inter.OverheadUs, prof.Inter.BetaNsPerByte, prof.GammaNsPerByte, prof.Cores, crowding)
	fmt.Fprintf(stdout, "# %6s %6s %10s %-9s %12s %8s %8s %12s %7s\n", "ranks", "hosts", "size", "algo", "time(us)", "algbw", "busbw", "measured", "error")
	for _, n := range ns {
		p := prof
		per := *ppn
		if per == 0 {
			per = min(prof.RanksPerHost, n)
			if prof.Hosts == 1 {
				per = n // a one-host profile (a fit's) predicts one host
			}
		}
		if per <= 0 || n%per != 0 {
			return fail(fmt.Errorf("%d ranks are not a whole number of hosts of %d ranks (-ppn)", n, per))
		}
		p.Hosts, p.RanksPerHost = n/per, per
		cl, err := sim.NewCluster(p, opts)
		if err != nil {
			return fail(err)
		}
		for size := lo; size <= hi; size *= int64(*factor) {
			var row []sim.Result
			for _, a := range as {
				r, err := cl.Run(sim.Case{Collective: coll, Algorithm: a, Bytes: size})
				if err != nil {
					fmt.Fprintf(stderr, "hcomm sim: %d ranks, %d bytes, %s: %v\n", n, size, a, err)
					continue
				}
				row = append(row, r)
			}
			best := -1
			for i, r := range row {
				if r.Algorithm != collectives.AlgoAuto && (best < 0 || r.Time < row[best].Time) {
					best = i
				}
			}
			for i, r := range row {
				name := r.Algorithm.String()
				if r.Algorithm == collectives.AlgoAuto {
					name = "auto:" + r.Algo
				}
				mark := ""
				if i == best {
					mark = " best"
				}
				meas, errPct := "", ""
				if t, ok := measured[n][size]; ok && (r.Algorithm == collectives.AlgoAuto || len(as) == 1) {
					meas = fmt.Sprintf("%.1f", t*1e6)
					errPct = fmt.Sprintf("%+.0f%%", 100*(r.Time-t)/t)
				}
				fmt.Fprintf(stdout, "  %6d %6d %10d %-9s %12.1f %8.3f %8.3f %12s %7s%s\n", n, p.Hosts, size, name, r.Time*1e6, r.AlgBW, r.BusBW, meas, errPct, mark)
			}
			all = append(all, row...)
		}
		if err := cl.Close(); err != nil {
			return fail(err)
		}
	}
	// The selector beside the best simulated algorithm, where both ran.
	type key struct {
		n    int
		size int64
	}
	sel, best := map[key]sim.Result{}, map[key]sim.Result{}
	var keys []key
	for _, r := range all {
		k := key{r.Ranks, r.Bytes}
		if r.Algorithm == collectives.AlgoAuto {
			sel[k] = r
			keys = append(keys, k)
		} else if b, ok := best[k]; !ok || r.Time < b.Time {
			best[k] = r
		}
	}
	if len(keys) > 0 && len(best) > 0 {
		fmt.Fprintf(stdout, "# the selector's choice beside the best simulated algorithm\n# %6s %10s %-10s %12s %-10s %12s %8s\n", "ranks", "size", "selector", "time(us)", "best", "time(us)", "slower")
		for _, k := range keys {
			b, ok := best[k]
			if !ok {
				continue
			}
			a := sel[k]
			fmt.Fprintf(stdout, "  %6d %10d %-10s %12.1f %-10s %12.1f %+7.0f%%\n", k.n, k.size, a.Algo, a.Time*1e6, b.Algorithm, b.Time*1e6, 100*(a.Time-b.Time)/b.Time)
		}
	}
	if *plot != "" {
		title := fmt.Sprintf("hcomm sim %s: predicted busbw (lines), measured (×)", coll)
		if err := os.WriteFile(*plot, []byte(sim.PlotSVG(title, all, points)), 0o644); err != nil {
			return fail(fmt.Errorf("-plot: %w", err))
		}
	}
	if *jsonOut != "" {
		type row struct {
			Ranks     int     `json:"ranks"`
			Bytes     int64   `json:"size"`
			Algorithm string  `json:"algorithm"`
			Ran       string  `json:"ran"`
			TimeUs    float64 `json:"time_us"`
			AlgBW     float64 `json:"algbw"`
			BusBW     float64 `json:"busbw"`
		}
		var rows []row
		for _, r := range all {
			rows = append(rows, row{r.Ranks, r.Bytes, r.Algorithm.String(), r.Algo, r.Time * 1e6, r.AlgBW, r.BusBW})
		}
		b, _ := json.MarshalIndent(map[string]any{"collective": coll, "profile": prof, "predictions": rows}, "", " ")
		if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
			return fail(fmt.Errorf("-J: %w", err))
		}
	}
	return 0
}

// simAlgos parses -a for coll.
func simAlgos(coll, list string) ([]collectives.Algorithm, error) {
	has := collectives.Algorithms(map[string]string{"allreduce": "AllReduce", "broadcast": "Broadcast", "reduce": "Reduce",
		"allgather": "AllGather", "reducescatter": "ReduceScatter", "alltoall": "AlltoAll"}[coll])
	if list == "" {
		return append([]collectives.Algorithm{collectives.AlgoAuto}, has...), nil
	}
	names := sim.AlgoNames()
	var out []collectives.Algorithm
	for _, s := range strings.Split(list, ",") {
		a, ok := names[strings.ToLower(strings.TrimSpace(s))]
		if !ok || (a != collectives.AlgoAuto && !slices.Contains(has, a)) {
			var hs []string
			for _, h := range has {
				hs = append(hs, h.String())
			}
			return nil, fmt.Errorf("-a: %s has no algorithm %q (it has auto, %s)", coll, s, strings.Join(hs, ", "))
		}
		out = append(out, a)
	}
	return out, nil
}

// parseInts parses a comma-separated list of positive integers.
func parseInts(s, flagName string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("%s %q: want positive integers, comma-separated", flagName, s)
		}
		out = append(out, v)
	}
	return out, nil
}

// simFitCmd is `hcomm sim fit`.
func simFitCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("hcomm sim fit", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cores := fs.Int("cores", 0, "cores of the measured host (0: a core per rank); ranks beyond them take turns")
	hostFile := fs.String("host", "", "the measured host's costs, as hcomm sim probe writes them (its cores, and what a crowded host costs a message)")
	out := fs.String("o", "", "write the fitted profile (JSON) to this file; default: standard output only")
	buffMB := fs.Int64("buffsize", 16, "the measured runs' HCCL_BUFFSIZE in MB")
	boot := fs.Int("bootstrap", 0, "also refit this many times (2–1000) to the files drawn with replacement, and print each value's 10th percentile, median and 90th: how well the runs fix it")
	if code, ok := simParse(fs, args, stderr); !ok {
		return code
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "hcomm sim fit: give the hcomm bench -J files to fit (2–4 ranks of one host)")
		return 2
	}
	if *boot != 0 && (*boot < 2 || *boot > 1000) {
		fmt.Fprintf(stderr, "hcomm sim fit: -bootstrap %d: want 2 to 1000 resamples, or 0 for none\n", *boot)
		return 2
	}
	var pts []sim.Measured
	var runs []sim.Run
	for _, f := range fs.Args() {
		ms, err := sim.ReadBench(f)
		if err != nil {
			fmt.Fprintf(stderr, "hcomm sim fit: %v\n", err)
			return 1
		}
		pts = append(pts, ms...)
		runs = append(runs, ms)
	}
	host := sim.HostCosts{Cores: *cores}
	if *hostFile != "" {
		var err error
		if host, err = sim.ReadHostCosts(*hostFile); err != nil {
			fmt.Fprintf(stderr, "hcomm sim fit: %v\n", err)
			return 1
		}
		if *cores != 0 && *cores != host.Cores {
			fmt.Fprintf(stderr, "hcomm sim fit: -cores %d and %s's %d cores disagree\n", *cores, *hostFile, host.Cores)
			return 2
		}
	}
	fit, err := sim.Fit(pts, host, sim.Options{BufferSize: *buffMB << 20})
	if err != nil {
		fmt.Fprintf(stderr, "hcomm sim fit: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "# %6s %-14s %10s %12s %12s %7s\n", "ranks", "collective", "size", "measured(us)", "fitted(us)", "error")
	var sq float64
	for i, p := range fit.Points {
		e := (fit.Pred[i] - p.Time) / p.Time
		sq += e * e
		fmt.Fprintf(stdout, "  %6d %-14s %10d %12.1f %12.1f %+6.0f%%\n", p.Ranks, p.Collective, p.Bytes, p.Time*1e6, fit.Pred[i]*1e6, 100*e)
	}
	fmt.Fprintf(stdout, "# rms relative error %.0f%% over %d points\n", 100*math.Sqrt(sq/float64(len(fit.Points))), len(fit.Points))
	if *boot > 0 {
		spread, err := sim.Bootstrap(runs, host, sim.Options{BufferSize: *buffMB << 20}, *boot, 1)
		if err != nil {
			fmt.Fprintf(stderr, "hcomm sim fit: -bootstrap: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "# refitted to %d resamples of the %d files: 10th percentile, median, 90th\n", *boot, len(runs))
		for _, sp := range spread {
			fmt.Fprintf(stdout, "#   %-18s %9.4g %9.4g %9.4g", sp.Name, sp.P10, sp.Mid, sp.P90)
			if sp.Name == "oversub_exponent" {
				// What the exponent's range makes of a crowded host's
				// slowdown: the factor every prediction there carries.
				fmt.Fprintf(stdout, "   slowdown at 8 ranks a core %.1f–%.1f×, at 32 %.1f–%.1f×",
					math.Pow(8, sp.P10), math.Pow(8, sp.P90), math.Pow(32, sp.P10), math.Pow(32, sp.P90))
			}
			fmt.Fprintln(stdout)
		}
	}
	b, _ := json.MarshalIndent(fit.Profile, "", " ")
	b = append(b, '\n')
	stdout.Write(b)
	if *out != "" {
		if err := os.WriteFile(*out, b, 0o644); err != nil {
			fmt.Fprintf(stderr, "hcomm sim fit: %v\n", err)
			return 1
		}
	}
	return 0
}

// simParse parses a sim subcommand's flags with the sim usage; false with
// the exit code when the command ends there (help: 0, a bad flag: 2).
func simParse(fs *flag.FlagSet, args []string, stderr io.Writer) (int, bool) {
	fs.Usage = func() {
		fmt.Fprint(stderr, simUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, false
		}
		return 2, false
	}
	return 0, true
}

// ringMember is the hidden subcommand that runs one process of the probe's
// ring.
const ringMember = "ring-member"

// simProbeCmd is `hcomm sim probe`.
func simProbeCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("hcomm sim probe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	procs := fs.Int("n", 0, "processes of the crowded ring (default 4 × cores, at least 4)")
	msgs := fs.Int("m", 4000, "messages each process passes on")
	out := fs.String("o", "", "write the host's costs (JSON) to this file, for hcomm sim fit -host")
	if code, ok := simParse(fs, args, stderr); !ok {
		return code
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "hcomm sim probe: takes no arguments, have %q\n", fs.Args())
		return 2
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "hcomm sim probe: %v\n", err)
		return 1
	}
	h, err := sim.Probe(context.Background(), sim.ProbeOptions{Command: []string{exe, "sim", ringMember}, Procs: *procs, Messages: *msgs})
	if err != nil {
		fmt.Fprintf(stderr, "hcomm sim probe: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "# %d cores: a message's processor time %.1f µs with no wait, %.1f among %d processes (switch %.1f µs); a hop round %d processes %.1f µs (wake-up %.1f µs)\n",
		h.Cores, h.BaseCPUUs, h.CrowdedCPUUs, h.Procs, h.SwitchUs, h.Procs, h.HopUs, h.WakeUs)
	b, _ := json.MarshalIndent(h, "", " ")
	b = append(b, '\n')
	stdout.Write(b)
	if *out != "" {
		if err := os.WriteFile(*out, b, 0o644); err != nil {
			fmt.Fprintf(stderr, "hcomm sim probe: %v\n", err)
			return 1
		}
	}
	return 0
}
