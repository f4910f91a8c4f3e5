package hcomm

import (
	"errors"
	"log/slog"
	"strings"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/metrics"
)

// Observability glue of the data plane: bytes moved and task failures
// (Config.Metrics, Config.Logger / HCOMM_DEBUG). Notify waits are timed in
// wait.go, collectives in optag.go.

// moved counts n bytes moved over ch in direction dir when err is nil, and
// returns err.
func (c *Comm) moved(ch *Channel, dir string, n int64, err error) error {
	if err == nil && c.cfg.metrics != nil {
		if dir == metrics.Write {
			ch.written.Add(n) // the series found when the channel was made: no lookup a call
		} else {
			ch.read.Add(n)
		}
	}
	return err
}

// resultLabel is the errors_total label of r: its name in snake case.
func resultLabel(r Result) string {
	if r >= 0 && int(r) < len(resultNames) {
		return strings.ReplaceAll(resultNames[r], " ", "_")
	}
	return "unknown"
}

// taskFailed turns the error of a data-plane task into an *Error with the
// communicator's context, counts it and logs it.
func (c *Comm) taskFailed(op string, peer int, err error) error {
	var he *Error
	if !errors.As(err, &he) {
		code := ErrRuntime
		var de *device.Error
		if errors.As(err, &de) {
			code = fromDevice(de)
		}
		he = c.errorf(op, peer, code, err, "")
		err = he
	}
	c.cfg.metrics.CountError(resultLabel(he.Code))
	c.log(slog.LevelWarn, "task failed", "op", op, "peer", peer, "code", resultLabel(he.Code), "err", err)
	return err
}
