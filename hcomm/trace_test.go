package hcomm_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
)

// traceFile is the part of the Chrome trace event format the tests read.
type traceFile struct {
	TraceEvents []struct {
		Name string         `json:"name"`
		Cat  string         `json:"cat"`
		Ph   string         `json:"ph"`
		Ts   float64        `json:"ts"`
		Dur  float64        `json:"dur"`
		Pid  int            `json:"pid"`
		Tid  int64          `json:"tid"`
		Args map[string]any `json:"args"`
	} `json:"traceEvents"`
	OtherData map[string]any `json:"otherData"`
}

func readTrace(t *testing.T, b []byte) traceFile {
	t.Helper()
	var f traceFile
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatalf("the timeline is not JSON: %v\n%.400s", err, b)
	}
	return f
}

// With Config.TraceDir, every rank's Destroy writes its timeline, over
// every in-process transport: a process named after the rank, a span per
// collective (its op and algorithm) on the stream it ran on, holding the
// tasks that stream ran for it, and nothing dropped. WriteTrace writes the
// same while the communicator lives, and a second Destroy writes nothing.
func TestTraceTimeline(t *testing.T) {
	for _, tr := range []hcommtest.Transport{hcommtest.Inproc, hcommtest.TCP} {
		t.Run(tr.String(), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "made") // made by the communicator
			comms := hcommtest.Options{Config: &hcomm.Config{Name: "tl", BufferSize: 1 << 20, TraceDir: dir}}.New(t, 2, tr)
			streams := make([]int64, 2)
			written := make([][]byte, 2)
			hcommtest.Each(t, comms, func(t testing.TB, c *hcomm.Comm) {
				s, err := c.Device().CreateStream()
				if err != nil {
					t.Fatal(err)
				}
				defer s.Destroy()
				streams[c.Rank()] = s.ID()
				const n = 70000 // 280 KB: the broadcast's pipes, more than one piece
				buf, err := c.Device().Malloc(4 * n)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Device().Free(buf)
				for range 3 {
					if err := collectives.AllReduce(buf, buf, 1000, hcomm.Float32, hcomm.Sum, c, s, nil); err != nil {
						t.Fatal(err)
					}
				}
				for range 2 {
					if err := collectives.Broadcast(buf, n, hcomm.Float32, 0, c, s, nil); err != nil {
						t.Fatal(err)
					}
				}
				if err := s.SynchronizeWithTimeout(-1); err != nil {
					t.Fatal(err)
				}
				var w bytes.Buffer
				if err := c.WriteTrace(&w); err != nil {
					t.Fatal(err)
				}
				written[c.Rank()] = w.Bytes()
			})
			paths := make([]string, 2)
			for _, c := range comms {
				paths[c.Rank()] = c.TracePath()
				if err := c.Destroy(); err != nil {
					t.Fatal(err)
				}
			}
			for r, p := range paths {
				if want := fmt.Sprintf("tl-rank%d-%d.json", r, os.Getpid()); filepath.Dir(p) != dir || filepath.Base(p) != want {
					t.Errorf("rank %d's TracePath %q, want %s in %s", r, p, want, dir)
				}
				st, err := os.Stat(p)
				if err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
				if err := comms[r].Destroy(); err != nil {
					t.Fatal(err)
				}
				if again, err := os.Stat(p); err != nil || !again.ModTime().Equal(st.ModTime()) || again.Size() != st.Size() {
					t.Errorf("rank %d: a second Destroy touched the timeline (%v)", r, err)
				}
				b, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				checkTimeline(t, r, streams[r], readTrace(t, b))
				checkTimeline(t, r, streams[r], readTrace(t, written[r]))
			}
		})
	}
}

func checkTimeline(t *testing.T, rank int, stream int64, f traceFile) {
	t.Helper()
	named := false
	type span struct{ from, to float64 }
	var colls []span
	var tasks []span
	count := map[string]int{}
	for _, e := range f.TraceEvents {
		if e.Pid != rank {
			t.Fatalf("rank %d's timeline has an event of process %d: %+v", rank, e.Pid, e)
		}
		switch {
		case e.Ph == "M" && e.Name == "process_name":
			named = e.Args["name"] == fmt.Sprintf("tl rank %d (pid %d)", rank, os.Getpid())
		case e.Ph == "X" && e.Dur < 0:
			t.Errorf("rank %d: span %q lasts %v µs", rank, e.Name, e.Dur)
		case e.Ph == "X" && e.Cat == "collective" && e.Tid == stream:
			if a, _ := e.Args["algorithm"].(string); a == "" {
				t.Errorf("rank %d: collective %q without its algorithm: %v", rank, e.Name, e.Args)
			}
			count[e.Name]++
			colls = append(colls, span{e.Ts, e.Ts + e.Dur})
		case e.Ph == "X" && e.Cat == "task" && e.Tid == stream:
			tasks = append(tasks, span{e.Ts, e.Ts + e.Dur})
		}
	}
	if !named {
		t.Errorf("rank %d: no process_name naming the communicator and rank", rank)
	}
	if count["AllReduce"] != 3 || count["Broadcast"] != 2 {
		t.Errorf("rank %d: collective spans on stream %d: %v, want 3 AllReduce and 2 Broadcast", rank, stream, count)
	}
	for _, c := range colls {
		in := 0
		for _, k := range tasks {
			if k.from >= c.from-0.01 && k.to <= c.to+0.01 {
				in++
			}
		}
		if in == 0 {
			t.Errorf("rank %d: the collective span %v holds none of its stream's %d tasks", rank, c, len(tasks))
		}
	}
	if d, ok := f.OtherData["spans_dropped"].(float64); !ok || d != 0 {
		t.Errorf("rank %d: spans_dropped %v, want 0", rank, f.OtherData["spans_dropped"])
	}
}

// Without a trace directory a communicator keeps no timeline: no path, and
// WriteTrace says how to turn it on. HCOMM_TRACE turns it on for a
// communicator whose Config leaves TraceDir empty. A directory that cannot
// be made fails the communicator's creation, naming it.
func TestTraceOffAndFromEnvironment(t *testing.T) {
	comms := hcommtest.Options{Config: &hcomm.Config{BufferSize: 1 << 20}}.New(t, 1, hcommtest.Inproc)
	if p := comms[0].TracePath(); p != "" {
		t.Errorf("TracePath without a trace directory: %q", p)
	}
	err := comms[0].WriteTrace(&bytes.Buffer{})
	if hcomm.ResultOf(err) != hcomm.ErrPara || !strings.Contains(fmt.Sprint(err), "HCOMM_TRACE") {
		t.Errorf("WriteTrace without a timeline: %v, want a parameter error naming HCOMM_TRACE", err)
	}

	dir := t.TempDir()
	t.Setenv("HCOMM_TRACE", dir)
	comms = hcommtest.Options{Config: &hcomm.Config{Name: "env", BufferSize: 1 << 20}}.New(t, 1, hcommtest.Inproc)
	p := comms[0].TracePath()
	if filepath.Dir(p) != dir {
		t.Fatalf("TracePath with HCOMM_TRACE=%s: %q", dir, p)
	}
	if err := comms[0].Destroy(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Errorf("HCOMM_TRACE: no timeline written: %v", err)
	}

	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = hcomm.InitAll(1, &hcomm.Config{BufferSize: 1 << 20, TraceDir: filepath.Join(file, "sub")})
	if err == nil || !strings.Contains(err.Error(), "trace directory") || !errors.Is(err, os.ErrExist) && !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("InitAll with a trace directory under a file: %v, want an error naming the trace directory", err)
	}
}
