package bench

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// Result is one placement (out-of-place or in-place) of a row.
type Result struct {
	NA     bool    `json:"na,omitempty"` // the collective has no such placement
	TimeUs float64 `json:"time_us"`
	AlgBW  float64 `json:"algbw_gbps"`
	BusBW  float64 `json:"busbw_gbps"`
	Wrong  int64   `json:"wrong"` // -1: not checked
	// Iter is -I's per-iteration statistics; nil without -I.
	Iter *IterStats `json:"per_iter,omitempty"`
}

// Row is one size of one data type and op.
type Row struct {
	Coll  string  `json:"collective"`
	Size  int64   `json:"size"`
	Count int64   `json:"count"`
	Type  string  `json:"type"`
	RedOp string  `json:"redop"`
	Root  int     `json:"root"`
	Out   *Result `json:"out_of_place"`
	In    *Result `json:"in_place"`
}

// report prints a run in nccl-tests' layout (or JSON or CSV) and keeps the
// figures its footer and the plot need.
type report struct {
	o        Options
	out      io.Writer
	progress io.Writer // stderr when it is a terminal, else nil
	nranks   int
	// procRanks is the number of ranks in this process (-g, or 1 under a
	// launcher): nranks/procRanks processes take part.
	procRanks int
	pids      []int    // by rank, for the JSON report's devices
	hosts     []string // by rank
	mem       *memUse  // -M
	total     int      // rows expected, for the progress line
	rows      []Row
	csv       *csv.Writer
	wrong     int64
	bwSum     float64
	bwN       int
	matrices  []Matrix // p2p's per-pair figures, for JSON
}

// Matrix is a per-pair figure of hcomm bench p2p: Values[src][dst].
type Matrix struct {
	What   string      `json:"what"`
	Size   int64       `json:"size"`
	Values [][]float64 `json:"values"`
}

func (r *report) printf(format string, args ...any) { fmt.Fprintf(r.out, format, args...) }

// nprocs is the number of processes the ranks run in.
func (r *report) nprocs() int { return r.nranks / max(r.procRanks, 1) }

func (r *report) header(pids []int, hosts []string) {
	o := r.o
	r.pids, r.hosts = pids, hosts
	switch {
	case o.JSON:
		return
	case o.CSV:
		r.csv = csv.NewWriter(r.out)
		r.csv.Write([]string{"collective", "nranks", "size", "count", "type", "redop", "root", "placement", "time_us", "algbw_gbps", "busbw_gbps", "wrong"})
		return
	}
	step := fmt.Sprintf("%g(factor)", o.StepFactor)
	if o.StepFactor == 0 {
		step = fmt.Sprintf("%d(bytes)", o.StepBytes)
	}
	check := 0
	if o.Check {
		check = 1
	}
	r.printf("# hcomm bench %s: nRanks %d minBytes %d maxBytes %d step: %s warmup iters: %d iters: %d validation: %d\n",
		o.Coll, r.nranks, o.MinBytes, o.MaxBytes, step, o.Warmup, o.Iters, check)
	r.printf("#\n# Using devices\n")
	for i := range pids {
		r.printf("#  Rank %2d Group  0 Pid %6d on %10s device %2d [host]\n", i, pids[i], hosts[i], i)
	}
	if o.PerIter {
		r.printf("# Per-Iteration Report: device event timing; i_* is the slowest rank's time of each iteration")
		if o.PerIterSkip > 0 {
			r.printf("; summary skips first %d iterations", o.PerIterSkip)
		}
		r.printf("\n")
	}
	r.printf("#\n")
	if o.PerIter {
		// nccl-tests 2.19's -I layout: four more columns per placement.
		r.printf("# %10s  %12s  %8s  %6s  %6s              out-of-place (+ per-iteration)                                in-place (+ per-iteration)\n", "", "", "", "", "")
		r.printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %7s  %7s  %7s  %7s  %6s  %6s %6s  %7s  %7s  %7s  %7s\n", "size", "count", "type", "redop", "root",
			"time", "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%", "time", "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%")
		r.printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %7s  %7s  %7s  %7s  %6s  %6s  %5s  %7s  %7s  %7s  %7s\n", "(B)", "(elements)", "", "", "",
			"(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(%)", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(%)")
		return
	}
	r.printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n", "", "", "", "", "")
	r.printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "size", "count", "type", "redop", "root",
		"time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong")
	r.printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n", "(B)", "(elements)", "", "", "",
		"(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "")
}

// timeStr formats microseconds as nccl-tests does: two decimals below
// 100 µs, one below 10 ms, none above.
func timeStr(us float64) string {
	switch {
	case us >= 10000:
		return fmt.Sprintf("%7.0f", us)
	case us >= 100:
		return fmt.Sprintf("%7.1f", us)
	}
	return fmt.Sprintf("%7.2f", us)
}

func (r *report) row(row Row) {
	r.rows = append(r.rows, row)
	for _, res := range []*Result{row.Out, row.In} {
		if res == nil || res.NA {
			continue
		}
		r.bwSum += res.BusBW
		r.bwN++
		if res.Wrong > 0 {
			r.wrong += res.Wrong
		}
	}
	if r.progress != nil {
		fmt.Fprintf(r.progress, "\r%s %s %s %d B: row %d/%d\x1b[K", row.Coll, row.Type, row.RedOp, row.Size, len(r.rows), r.total)
	}
	switch {
	case r.o.JSON:
	case r.csv != nil:
		for _, p := range []struct {
			name string
			res  *Result
		}{{"out-of-place", row.Out}, {"in-place", row.In}} {
			if p.res == nil || p.res.NA {
				continue
			}
			r.csv.Write([]string{row.Coll, strconv.Itoa(r.nranks), strconv.FormatInt(row.Size, 10), strconv.FormatInt(row.Count, 10),
				row.Type, row.RedOp, strconv.Itoa(row.Root), p.name, strconv.FormatFloat(p.res.TimeUs, 'f', 3, 64),
				strconv.FormatFloat(p.res.AlgBW, 'f', 4, 64), strconv.FormatFloat(p.res.BusBW, 'f', 4, 64), strconv.FormatInt(p.res.Wrong, 10)})
		}
		r.csv.Flush()
	default:
		r.printf("%12d  %12d  %8s  %6s  %6d", row.Size, row.Count, row.Type, row.RedOp, row.Root)
		for _, res := range []*Result{row.Out, row.In} {
			if res == nil || res.NA {
				r.printf("  %7s  %6s  %6s  %5s", "N/A", "N/A", "N/A", "N/A")
				if r.o.PerIter {
					r.printf("  %7s  %7s  %7s  %7s", "N/A", "N/A", "N/A", "N/A")
				}
				continue
			}
			wrong := "N/A"
			if res.Wrong >= 0 {
				wrong = strconv.FormatInt(res.Wrong, 10)
			}
			r.printf("  %7s  %6.2f  %6.2f  %5s", timeStr(res.TimeUs), res.AlgBW, res.BusBW, wrong)
			if it := res.Iter; it != nil {
				r.printf("  %7s  %7s  %7s  %7s", floatStr(it.MinUs, 7), floatStr(it.MaxUs, 7), floatStr(it.P99Us, 7), floatStr(it.CVPct, 7))
			} else if r.o.PerIter {
				r.printf("  %7s  %7s  %7s  %7s", "N/A", "N/A", "N/A", "N/A")
			}
		}
		r.printf("\n")
	}
}

func (r *report) avgBusBW() float64 {
	if r.bwN == 0 {
		return 0
	}
	return r.bwSum / float64(r.bwN)
}

// footer prints the closing lines and reports whether the run passed.
func (r *report) footer() bool {
	if r.progress != nil {
		fmt.Fprint(r.progress, "\r\x1b[K")
	}
	avg := r.avgBusBW()
	bwOK := r.o.MinBW <= 0 || avg >= r.o.MinBW
	ok := r.wrong == 0 && bwOK
	switch {
	case r.o.JSON:
		enc := json.NewEncoder(r.out)
		enc.SetIndent("", "  ")
		enc.Encode(struct {
			Coll        string   `json:"collective"`
			NRanks      int      `json:"nranks"`
			Rows        []Row    `json:"rows"`
			Matrices    []Matrix `json:"matrices,omitempty"`
			OutOfBounds int64    `json:"out_of_bounds"`
			AvgBusBW    float64  `json:"avg_busbw_gbps"`
			MinBW       float64  `json:"min_bw_gbps,omitempty"`
			OK          bool     `json:"ok"`
		}{r.o.Coll, r.nranks, r.rows, r.matrices, r.wrong, avg, r.o.MinBW, ok})
	case r.csv != nil:
	default:
		verdict := "OK"
		if r.wrong != 0 {
			verdict = "FAILED"
		}
		r.printf("# %-20s : %d %s\n", "Out of bounds values", r.wrong, verdict)
		bwVerdict := ""
		if r.o.MinBW > 0 {
			bwVerdict = "OK"
			if !bwOK {
				bwVerdict = "FAILED"
			}
		}
		// C's %g: six significant digits, as nccl-tests prints it.
		r.printf("# %-20s : %s %s\n", "Avg bus bandwidth", strconv.FormatFloat(avg, 'g', 6, 64), bwVerdict)
		if m := r.mem; m != nil {
			r.printf("# %-20s : Initialization %s | User-Allocated %s | Total  %s\n", "GPU memory usage", memString(m.hccl), memString(m.user), memString(m.hccl+m.user))
		}
		r.printf("#\n")
	}
	return ok
}

// memUse is -M's report: the device memory of the rank that uses the most.
// A communicator allocates one block of device memory, its HCCL buffer
// (twice HCCL_BUFFSIZE), at initialization, and the benchmark its send and
// receive buffers (p2p: its receive and source buffers); the collectives
// allocate none of their own over device buffers, so these are all a rank
// holds, for the whole run: the total is also the peak. nccl-tests'
// "Collective" figure (memory NCCL allocated during the run) is therefore
// left out.
type memUse struct {
	hccl, user int64
}

// memory gathers -M's figures (a collective: every rank calls it), user
// being the bytes this rank allocated for the benchmark.
func (r *report) memory(ctx context.Context, c *hcomm.Comm, user int64) error {
	if !r.o.Memory {
		return nil
	}
	_, hccl, err := c.GetHcclBuffer()
	if err != nil {
		return err
	}
	v := []float64{float64(hccl), float64(user)}
	if err := bounded(ctx, c.Rank(), "the other ranks' memory figures", func(ctx context.Context) error {
		return collectives.AllReduceSlice(ctx, c, v, v, hcomm.Max, nil)
	}); err != nil {
		return err
	}
	r.mem = &memUse{hccl: int64(v[0]), user: int64(v[1])}
	return nil
}

// memString formats a byte count as nccl-tests' getMemString: binary units,
// two decimals below 10, one below 100, none above.
func memString(n int64) string {
	v, unit := float64(n), "B"
	for _, u := range []struct {
		name string
		size float64
	}{{"GB", 1 << 30}, {"MB", 1 << 20}, {"KB", 1 << 10}} {
		if math.Abs(v) >= u.size {
			v, unit = v/u.size, u.name
			break
		}
	}
	prec := 0
	switch a := math.Abs(v); {
	case a < 10:
		prec = 2
	case a < 100:
		prec = 1
	}
	return strconv.FormatFloat(v, 'f', prec, 64) + " " + unit
}
