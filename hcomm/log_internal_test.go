package hcomm

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

func TestDebugLevel(t *testing.T) {
	for _, tc := range []struct {
		in  string
		lvl slog.Level
		on  bool
	}{
		{"", 0, false}, {"WARN", slog.LevelWarn, true}, {"warn", slog.LevelWarn, true},
		{"INFO", slog.LevelInfo, true}, {"TRACE", LevelTrace, true}, {"DEBUG", LevelTrace, true}, {"NONE", 0, false},
	} {
		lvl, on, err := debugLevel(tc.in)
		if err != nil || lvl != tc.lvl || on != tc.on {
			t.Errorf("debugLevel(%q) = %v, %v, %v; want %v, %v", tc.in, lvl, on, err, tc.lvl, tc.on)
		}
	}
	if _, _, err := debugLevel("LOUD"); err == nil || !strings.Contains(err.Error(), "HCOMM_DEBUG") {
		t.Errorf("debugLevel(LOUD) error = %v", err)
	}
}

// Config.Logger wins over HCOMM_DEBUG, and every line carries the
// communicator and rank.
func TestLoggerCarriesCommAndRank(t *testing.T) {
	var buf bytes.Buffer
	cfg, err := Config{Name: "lg", Logger: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))}.resolve()
	if err != nil {
		t.Fatal(err)
	}
	c := &Comm{name: "lg", rank: 3, cfg: cfg}
	c.log(slog.LevelInfo, "hello", "k", 1)
	c.log(LevelTrace, "hidden")
	c.Logger().Warn("via Logger")
	out := buf.String()
	for _, s := range []string{`level=INFO msg=hello comm=lg rank=3 k=1`, `level=WARN msg="via Logger" comm=lg rank=3`} {
		if !strings.Contains(out, s) {
			t.Errorf("log lacks %q:\n%s", s, out)
		}
	}
	if strings.Contains(out, "hidden") {
		t.Errorf("a TRACE record passed an INFO logger:\n%s", out)
	}
	var none Comm
	none.Logger().Error("discarded") // no logger: no output, no panic
}

// BeginOp's per-thread slot: the tag a queued wait names is the newest
// collective begun on the thread, and it stays until every collective begun
// there has ended, also when a library overlaps two; LastOp counts them all.
func TestBeginOpSlots(t *testing.T) {
	c := &Comm{name: "ops"}
	th := &Thread{}
	other := &Thread{}
	if got := c.opOf(th); got.op != "" {
		t.Fatalf("before any BeginOp: %v", got)
	}
	seq1, end1 := c.BeginOp(th, "AllReduce", "oneshot")
	seq2, end2 := c.BeginOp(th, "Broadcast", "ring")
	seq3, end3 := c.BeginOp(other, "Barrier", "oneshot")
	if seq1 != 1 || seq2 != 2 || seq3 != 3 {
		t.Fatalf("numbers %d %d %d, want 1 2 3", seq1, seq2, seq3)
	}
	if got := c.opOf(th).String(); got != "Broadcast #2 (ring)" {
		t.Fatalf("thread issuing %q, want the newest, Broadcast #2 (ring)", got)
	}
	end1()
	if got := c.opOf(th).String(); got != "Broadcast #2 (ring)" {
		t.Fatalf("after the first end: %q, want Broadcast #2 still", got)
	}
	end2()
	if got := c.opOf(th); got.op != "" {
		t.Fatalf("after both ends: %v, want none", got)
	}
	if got := c.opOf(other).String(); got != "Barrier #3 (oneshot)" {
		t.Fatalf("other thread: %q", got)
	}
	end3()
	if op, seq := c.LastOp(); op != "Barrier" || seq != 3 {
		t.Fatalf("LastOp = %s #%d", op, seq)
	}
}
