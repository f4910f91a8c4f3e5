package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"strconv"
	"strings"
	"time"
)

// -J FILE.json writes the run as nccl-tests writes it, following nccl-tests
// 2.19.6's src/util.cu (JSON_FILE_VERSION 3), so that its tools
// (tools/analyze_perf_json.py) and scripts read hcomm's files: the same keys
// in the same nesting and order, booleans written as the strings "true" and
// "false" and a NaN as "nan" as nccl-tests writes them, the root as a
// string padded to six columns. Where hcomm differs from NCCL:
// "nccl_version" is 0 (no NCCL is involved); "devices" describe hcomm's host
// devices (device_hex "host"); "env" is the process environment with the
// values of variables that look secret (HCOMM_SECRET, *TOKEN*,
// *PASSWORD*, *SECRET*, *CREDENTIAL*, *_KEY) replaced by "***"; a
// placement a collective does not have is null, as nccl-tests writes an
// out-of-place placement it did not run. The file is written once the run
// is over, also after a failure, whose error is then in "errors".

const jsonFileVersion = 3 // nccl-tests' JSON_FILE_VERSION

// jsonBool is written as nccl-tests' jsonBool writes: "true" or "false".
type jsonBool bool

func (b jsonBool) MarshalJSON() ([]byte, error) { return json.Marshal(strconv.FormatBool(bool(b))) }

// jsonDouble is written as nccl-tests' jsonDouble writes: %lf, and "nan".
type jsonDouble float64

func (d jsonDouble) MarshalJSON() ([]byte, error) {
	v := float64(d)
	switch {
	case math.IsNaN(v):
		return []byte(`"nan"`), nil
	case math.IsInf(v, 0):
		return json.Marshal(strconv.FormatFloat(v, 'f', -1, 64))
	}
	return strconv.AppendFloat(nil, v, 'f', 6, 64), nil
}

type ncclJSON struct {
	Version     int        `json:"version"`
	StartTime   string     `json:"start_time"`
	Args        []string   `json:"args"`
	Env         []string   `json:"env"`
	NCCLVersion int        `json:"nccl_version"`
	Config      jsonConfig `json:"config"`
	Results     []jsonRow  `json:"results"`
	OutOfBounds struct {
		Count int64    `json:"count"`
		Okay  jsonBool `json:"okay"`
	} `json:"out_of_bounds"`
	AverageBusBandwidth struct {
		Bandwidth jsonDouble `json:"bandwidth"`
		Okay      any        `json:"okay"` // "unchecked", "true" or "false"
	} `json:"average_bus_bandwidth"`
	Errors  []string `json:"errors"`
	EndTime string   `json:"end_time"`
}

type jsonConfig struct {
	NThreads             int          `json:"nthreads"`
	NGPUs                int          `json:"ngpus"`
	MinimumBytes         int64        `json:"minimum_bytes"`
	MaximumBytes         int64        `json:"maximum_bytes"`
	StepFactor           *float64     `json:"step_factor,omitempty"`
	StepBytes            *int64       `json:"step_bytes,omitempty"`
	WarmupIters          int          `json:"warmup_iters"`
	Iterations           int          `json:"iterations"`
	AggregatedIterations int          `json:"aggregated_iterations"`
	Validation           int          `json:"validation"`
	Graph                int          `json:"graph"`
	BlockingCollectives  jsonBool     `json:"blocking_collectives"`
	PerIterTiming        jsonBool     `json:"per_iter_timing"`
	PerIterSkip          int          `json:"per_iter_skip"`
	ParallelInit         jsonBool     `json:"parallel_init"`
	Devices              []jsonDevice `json:"devices"`
}

type jsonDevice struct {
	Rank       int    `json:"rank"`
	Group      int    `json:"group"`
	PID        int    `json:"pid"`
	Hostname   string `json:"hostname"`
	Device     int    `json:"device"`
	DeviceHex  string `json:"device_hex"`
	DeviceInfo string `json:"device_info"`
}

type jsonRow struct {
	Size              int64          `json:"size"`
	Count             int64          `json:"count"`
	Type              string         `json:"type"`
	RedOp             string         `json:"redop"`
	Root              string         `json:"root"`
	OutOfPlace        *jsonPlacement `json:"out_of_place"`
	OutOfPlacePerIter *IterStats     `json:"out_of_place_per_iter,omitempty"`
	InPlace           *jsonPlacement `json:"in_place"`
	InPlacePerIter    *IterStats     `json:"in_place_per_iter,omitempty"`
	ActualIterations  int            `json:"actual_iterations"`
	ExperimentName    string         `json:"experiment_name"`
}

type jsonPlacement struct {
	Time   jsonDouble  `json:"time"` // µs
	AlgBW  jsonDouble  `json:"alg_bw"`
	BusBW  jsonDouble  `json:"bus_bw"`
	NWrong *jsonDouble `json:"nwrong"` // null: not checked
}

// createJSON creates -J's file as nccl-tests does: never over an existing
// file, but next to it as FILE.0, FILE.1, …; it says where on stdout when
// stdout has the table.
func createJSON(path string, stdout io.Writer, table bool) (*os.File, error) {
	try := path
	for i := 0; ; i++ {
		f, err := os.OpenFile(try, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err == nil {
			if table {
				fmt.Fprintf(stdout, "# Writing JSON output to %s\n", try)
			}
			return f, nil
		}
		if !errors.Is(err, fs.ErrExist) || i == 1000 {
			return nil, fmt.Errorf("-J: %w", err)
		}
		try = path + "." + strconv.Itoa(i)
	}
}

// secretEnv says whether the environment variable name looks secret.
func secretEnv(name string) bool {
	u := strings.ToUpper(name)
	for _, s := range []string{"SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIAL"} {
		if strings.Contains(u, s) {
			return true
		}
	}
	return strings.HasSuffix(u, "_KEY")
}

// writeJSON writes rank 0's report r to f; runErr is the run's error, if
// it failed.
func writeJSON(f *os.File, r *report, start, end time.Time, environ []string, runErr error) error {
	const stamp = "2006-01-02 15:04:05" // nccl-tests' TIME_STRING_FORMAT
	o := r.o
	doc := ncclJSON{Version: jsonFileVersion, StartTime: start.Format(stamp), EndTime: end.Format(stamp),
		Args: o.Args, Env: []string{}, Results: []jsonRow{}, Errors: []string{}}
	for _, kv := range environ {
		if k, _, ok := strings.Cut(kv, "="); ok && secretEnv(k) {
			kv = k + "=***"
		}
		doc.Env = append(doc.Env, kv)
	}
	cfg := jsonConfig{NThreads: 1, NGPUs: r.procRanks, MinimumBytes: o.MinBytes, MaximumBytes: o.MaxBytes,
		WarmupIters: o.Warmup, Iterations: o.Iters, AggregatedIterations: 1, PerIterTiming: jsonBool(o.PerIter),
		PerIterSkip: o.PerIterSkip, Devices: []jsonDevice{}}
	if o.StepFactor > 1 {
		cfg.StepFactor = &o.StepFactor
	} else {
		cfg.StepBytes = &o.StepBytes
	}
	if o.Check {
		cfg.Validation = 1
	}
	for i := range r.pids {
		cfg.Devices = append(cfg.Devices, jsonDevice{Rank: i, PID: r.pids[i], Hostname: r.hosts[i], Device: i,
			DeviceHex: "host", DeviceInfo: "hcomm host device"})
	}
	doc.Config = cfg
	place := func(res *Result) (*jsonPlacement, *IterStats) {
		if res == nil || res.NA {
			return nil, nil
		}
		p := &jsonPlacement{Time: jsonDouble(res.TimeUs), AlgBW: jsonDouble(res.AlgBW), BusBW: jsonDouble(res.BusBW)}
		if res.Wrong >= 0 {
			w := jsonDouble(res.Wrong)
			p.NWrong = &w
		}
		return p, res.Iter
	}
	for _, row := range r.rows {
		jr := jsonRow{Size: row.Size, Count: row.Count, Type: row.Type, RedOp: row.RedOp, Root: fmt.Sprintf("%6d", row.Root),
			ActualIterations: o.Iters}
		jr.OutOfPlace, jr.OutOfPlacePerIter = place(row.Out)
		jr.InPlace, jr.InPlacePerIter = place(row.In)
		doc.Results = append(doc.Results, jr)
	}
	doc.OutOfBounds.Count = r.wrong
	doc.OutOfBounds.Okay = r.wrong == 0
	avg := r.avgBusBW()
	doc.AverageBusBandwidth.Bandwidth = jsonDouble(avg)
	doc.AverageBusBandwidth.Okay = "unchecked"
	if o.MinBW > 0 {
		doc.AverageBusBandwidth.Okay = jsonBool(avg >= o.MinBW)
	}
	if runErr != nil {
		doc.Errors = append(doc.Errors, runErr.Error())
	}
	if err := json.NewEncoder(f).Encode(doc); err != nil {
		return fmt.Errorf("-J %s: %w", f.Name(), err)
	}
	return f.Close()
}
