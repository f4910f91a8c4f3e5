package hcomm

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"

	"github.com/hcomm-dev/hcomm/internal/metrics"
)

// LevelTrace is below slog.LevelDebug: HCOMM_DEBUG=TRACE logs every
// collective issued and every data-plane failure in detail.
const LevelTrace = slog.Level(-8)

// debugLevel parses HCOMM_DEBUG: WARN, INFO or TRACE (DEBUG is taken as
// TRACE, as is NCCL_DEBUG's name for its most verbose level); empty means no
// logging.
func debugLevel(v string) (slog.Level, bool, error) {
	switch strings.ToUpper(strings.TrimSpace(v)) {
	case "":
		return 0, false, nil
	case "WARN", "WARNING":
		return slog.LevelWarn, true, nil
	case "INFO":
		return slog.LevelInfo, true, nil
	case "TRACE", "DEBUG":
		return LevelTrace, true, nil
	case "VERSION", "NONE", "OFF":
		return 0, false, nil
	}
	return 0, false, fmt.Errorf("environment variable HCOMM_DEBUG=%q: want WARN, INFO or TRACE", v)
}

// ReplaceLevelNames, as a slog.HandlerOptions.ReplaceAttr, prints
// LevelTrace as "TRACE" (slog would print "DEBUG-4").
func ReplaceLevelNames(_ []string, a slog.Attr) slog.Attr {
	if a.Key == slog.LevelKey {
		if l, ok := a.Value.Any().(slog.Level); ok && l == LevelTrace {
			a.Value = slog.StringValue("TRACE")
		}
	}
	return a
}

var (
	envLoggerOnce sync.Once
	envLogger     *slog.Logger
	envLoggerErr  error
)

// loggerFromEnv returns the process's HCOMM_DEBUG logger (text on stderr),
// nil when HCOMM_DEBUG is unset.
func loggerFromEnv() (*slog.Logger, error) {
	envLoggerOnce.Do(func() {
		lvl, on, err := debugLevel(os.Getenv("HCOMM_DEBUG"))
		if err != nil || !on {
			envLoggerErr = err
			return
		}
		envLogger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl, ReplaceAttr: ReplaceLevelNames}))
	})
	return envLogger, envLoggerErr
}

// resolveObs fills the resolved logger of c: Config.Logger wins over
// HCOMM_DEBUG. (The metrics are a rank's: withMetrics.)
func (c Config) resolveObs() (Config, error) {
	c.logger = c.Logger
	if c.logger == nil {
		l, err := loggerFromEnv()
		if err != nil {
			return c, err
		}
		c.logger = l
	}
	return c, nil
}

// withMetrics fills the resolved metrics of rank's communicator: hcomm's
// collectors on Config.Metrics (nil = none), labelled with the rank, with
// errors_total's series for the codes a data-plane task fails with at zero
// from the start. A sub-communicator (parent not nil) on its parent's
// registry reports with its parent's, under the parent's rank: the series
// stay one per process's rank.
func (c Config) withMetrics(rank int, parent *Comm) (Config, error) {
	if parent != nil && c.Metrics == parent.cfg.Metrics {
		c.metrics = parent.cfg.metrics
		return c, nil
	}
	m, err := metrics.New(c.Metrics, rank, taskErrorCodes()...)
	if err != nil {
		return c, fmt.Errorf("Config.Metrics: %w", err)
	}
	c.metrics = m
	return c, nil
}

// taskErrorCodes are the errors_total labels of the codes a data-plane task
// fails with (taskFailed: a device error's code, a lost peer's).
func taskErrorCodes() []string {
	return []string{resultLabel(ErrTimeout), resultLabel(ErrRemote), resultLabel(ErrUnavail),
		resultLabel(ErrPara), resultLabel(ErrPtr), resultLabel(ErrRuntime)}
}

// logEnabled reports whether the communicator logs at lvl.
func (c *Comm) logEnabled(lvl slog.Level) bool {
	return c.cfg.logger != nil && c.cfg.logger.Enabled(context.Background(), lvl)
}

// log writes one record with the communicator's name and rank.
func (c *Comm) log(lvl slog.Level, msg string, args ...any) {
	if !c.logEnabled(lvl) {
		return
	}
	c.cfg.logger.Log(context.Background(), lvl, msg, append([]any{"comm", c.name, "rank", c.rank}, args...)...)
}

// Logger returns the communicator's logger with its name and rank attached,
// for the libraries built on hcomm; it discards everything when logging is
// off.
func (c *Comm) Logger() *slog.Logger {
	if c.cfg.logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.cfg.logger.With("comm", c.name, "rank", c.rank)
}
