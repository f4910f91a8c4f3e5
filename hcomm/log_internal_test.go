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
