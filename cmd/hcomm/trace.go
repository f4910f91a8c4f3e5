package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
)

const traceUsage = `usage:
  hcomm trace [-top K] FILE.json...
        summarise timelines that HCOMM_TRACE (hcomm.Config.TraceDir) wrote:
        per rank and span name, how many, their total, mean, median, 90th and
        99th percentile and longest (µs), the most time first
`

// traceCmd is `hcomm trace`.
func traceCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("hcomm trace", flag.ContinueOnError)
	fs.SetOutput(stderr)
	top := fs.Int("top", 12, "span names per rank, those with the most time first (0: all)")
	fs.Usage = func() {
		fmt.Fprint(stderr, traceUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if fs.NArg() == 0 || *top < 0 {
		fs.Usage()
		return 2
	}
	rows, err := traceRows(fs.Args())
	if err != nil {
		fmt.Fprintf(stderr, "hcomm trace: %v\n", err)
		return 1
	}
	printTraceRows(stdout, rows, *top)
	return 0
}

// traceRow is the spans of one name on one rank.
type traceRow struct {
	pid  int
	cat  string
	name string
	durs []float64 // µs, sorted
	sum  float64
}

// traceRows reads the files' complete spans ("X" events) and groups them by
// rank (the event's process) and name.
func traceRows(files []string) ([]*traceRow, error) {
	type key struct {
		pid       int
		cat, name string
	}
	by := map[key]*traceRow{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var doc struct {
			TraceEvents []struct {
				Name string   `json:"name"`
				Cat  string   `json:"cat"`
				Ph   string   `json:"ph"`
				Dur  *float64 `json:"dur"`
				Pid  int      `json:"pid"`
			} `json:"traceEvents"`
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			return nil, fmt.Errorf("%s: not a Chrome trace event file: %v", f, err)
		}
		if doc.TraceEvents == nil {
			return nil, fmt.Errorf("%s: no traceEvents", f)
		}
		for i, e := range doc.TraceEvents {
			if e.Ph != "X" {
				continue
			}
			if e.Dur == nil || *e.Dur < 0 || math.IsNaN(*e.Dur) {
				return nil, fmt.Errorf("%s: event %d (%q) is a span without a duration of 0 or more", f, i, e.Name)
			}
			k := key{e.Pid, e.Cat, e.Name}
			r := by[k]
			if r == nil {
				r = &traceRow{pid: e.Pid, cat: e.Cat, name: e.Name}
				by[k] = r
			}
			r.durs = append(r.durs, *e.Dur)
			r.sum += *e.Dur
		}
	}
	rows := make([]*traceRow, 0, len(by))
	for _, r := range by {
		slices.Sort(r.durs)
		rows = append(rows, r)
	}
	slices.SortFunc(rows, func(a, b *traceRow) int {
		if a.pid != b.pid {
			return a.pid - b.pid
		}
		if a.sum != b.sum {
			if a.sum > b.sum {
				return -1
			}
			return 1
		}
		return strings.Compare(a.cat+a.name, b.cat+b.name)
	})
	return rows, nil
}

// quantile is the q-quantile of sorted xs, the nearest rank's.
func quantile(xs []float64, q float64) float64 {
	return xs[int(q*float64(len(xs)-1)+0.5)]
}

func printTraceRows(w io.Writer, rows []*traceRow, top int) {
	fmt.Fprintf(w, "# %4s  %-10s %-34s %8s %12s %9s %9s %9s %9s %9s\n", "rank", "kind", "name", "count", "total(us)", "mean", "p50", "p90", "p99", "max")
	shown, pid := 0, math.MinInt
	for _, r := range rows {
		if r.pid != pid {
			pid, shown = r.pid, 0
		}
		if top > 0 && shown >= top {
			continue
		}
		shown++
		n := len(r.durs)
		fmt.Fprintf(w, "  %4d  %-10s %-34s %8d %12.1f %9.2f %9.2f %9.2f %9.2f %9.2f\n", r.pid, r.cat, r.name, n, r.sum, r.sum/float64(n),
			quantile(r.durs, 0.5), quantile(r.durs, 0.9), quantile(r.durs, 0.99), r.durs[n-1])
	}
}
