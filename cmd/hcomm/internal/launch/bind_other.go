//go:build !linux

package launch

import (
	"errors"
	"os/exec"
)

// DefaultBind is `hcomm run`'s --bind-to default: BindNone where binding
// is not implemented.
const DefaultBind = BindNone

// startBound fails: binding ranks to processors is implemented on Linux
// only.
func startBound(*exec.Cmd, []int) error {
	return errors.New("--bind-to core: binding ranks to processors is implemented on Linux only (use --bind-to none)")
}
