package hcomm

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/internal/bootstrap"
)

// syncBuf is a log sink safe for the store's goroutines.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// refuseStranger starts a root info's store with cfg, has a stranger (wrong
// secret) knock, and returns once the store has refused it.
func refuseStranger(t *testing.T, cfg *Config) {
	t.Helper()
	root, err := GetRootInfo(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pendingMu.Lock()
	srv := pendingRoots[root.Secret].srv
	pendingMu.Unlock()
	defer root.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var wrong bootstrap.Secret
	wrong[0] = root.Secret[0] + 1
	if _, err := bootstrap.Dial(ctx, root.Addr, wrong, bootstrap.Claim{Rank: 1, NRanks: 2}); !errors.Is(err, bootstrap.ErrAuth) {
		t.Fatalf("a stranger's dial: %v; want ErrAuth", err)
	}
	for srv.Refused() == 0 {
		time.Sleep(time.Millisecond)
	}
}

// With neither Config.Logger nor HCOMM_DEBUG, hcomm logs nothing, not even a
// stranger's refusal (it would land in the middle of a benchmark's table);
// with a logger, the refusal is logged.
func TestBootstrapRefusalQuietUnlessLogging(t *testing.T) {
	if os.Getenv("HCOMM_DEBUG") != "" {
		t.Skip("HCOMM_DEBUG is set")
	}
	var def syncBuf
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&def, nil)))
	defer slog.SetDefault(old)

	refuseStranger(t, &Config{ConnectTimeout: 5 * time.Second})
	time.Sleep(20 * time.Millisecond) // a late log line would land now
	if s := def.String(); s != "" {
		t.Errorf("with logging off, hcomm wrote to slog's default logger:\n%s", s)
	}

	var mine syncBuf
	refuseStranger(t, &Config{ConnectTimeout: 5 * time.Second, Logger: slog.New(slog.NewTextHandler(&mine, nil))})
	deadline := time.Now().Add(2 * time.Second)
	for !strings.Contains(mine.String(), "refused connection") && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if !strings.Contains(mine.String(), "refused connection") {
		t.Errorf("with Config.Logger, the refusal was not logged: %q", mine.String())
	}
	if s := def.String(); s != "" {
		t.Errorf("with Config.Logger, hcomm wrote to slog's default logger:\n%s", s)
	}
}
