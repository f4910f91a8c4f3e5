package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// TestTraceCommand: the timelines of two ranks that ran three all-reduces,
// summarised a row per rank and span name, the collective's count right.
func TestTraceCommand(t *testing.T) {
	dir := t.TempDir()
	comms, err := hcomm.InitAll(2, &hcomm.Config{Name: "tc", BufferSize: 1 << 20, TraceDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	for _, c := range comms {
		go func() {
			x := make([]float32, 100)
			for range 3 {
				if err := collectives.AllReduceSlice(context.Background(), c, x, x, hcomm.Sum, nil); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range comms {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range comms {
		if err := c.Destroy(); err != nil {
			t.Fatal(err)
		}
	}
	files, _ := filepath.Glob(filepath.Join(dir, "tc-rank*.json"))
	if len(files) != 2 {
		t.Fatalf("timelines written: %v, want 2", files)
	}
	var out, errb bytes.Buffer
	if code := Main(append([]string{"trace", "-top", "0"}, files...), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, rank := range []string{"0", "1"} {
		found := false
		for _, line := range strings.Split(out.String(), "\n") {
			f := strings.Fields(line)
			if len(f) >= 4 && f[0] == rank && f[1] == "collective" && f[2] == "AllReduce" {
				found = f[3] == "3"
			}
		}
		if !found {
			t.Errorf("no row of rank %s's 3 AllReduce collectives:\n%s", rank, out.String())
		}
	}
}

// TestTraceBadInput: no files, a negative -top, a file that is not a
// timeline and a span with a negative duration are refused, naming what.
func TestTraceBadInput(t *testing.T) {
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.json")
	os.WriteFile(junk, []byte("not json"), 0o644)
	neg := filepath.Join(dir, "neg.json")
	os.WriteFile(neg, []byte(`{"traceEvents":[{"name":"x","ph":"X","ts":1,"dur":-2,"pid":0,"tid":1}]}`), 0o644)
	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"trace"}, 2, "usage"},
		{[]string{"trace", "-top", "-1", junk}, 2, "usage"},
		{[]string{"trace", junk}, 1, "junk.json: not a Chrome trace event file"},
		{[]string{"trace", neg}, 1, `event 0 ("x") is a span without a duration`},
		{[]string{"trace", filepath.Join(dir, "missing.json")}, 1, "missing.json"},
	} {
		var out, errb bytes.Buffer
		if code := Main(c.args, &out, &errb); code != c.code || !strings.Contains(errb.String(), c.says) {
			t.Errorf("%v: exit %d, %q; want %d saying %q", c.args, code, errb.String(), c.code, c.says)
		}
	}
}
