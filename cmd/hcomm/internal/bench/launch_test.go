package bench

import (
	"errors"
	"strings"
	"testing"

	"github.com/hcomm-dev/hcomm/hcomm"
)

// A rank of a real launch (its rank variable set) that cannot join the
// others says why, without the hint to run in one process, which does not
// apply to it.
func TestLaunchedRankFailsWithoutHint(t *testing.T) {
	old := initFromEnv
	defer func() { initFromEnv = old }()
	initFromEnv = func(*hcomm.Config) (*hcomm.Comm, error) {
		return nil, errors.New("two processes claim rank 1")
	}
	for _, vars := range [][2]string{{"WORLD_SIZE", "RANK"}, {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"}, {"SLURM_NTASKS", "SLURM_PROCID"}} {
		env := func(k string) string {
			switch k {
			case vars[0]:
				return "2"
			case vars[1]:
				return "1"
			}
			return ""
		}
		code, _, errs := bench(t, Hooks{Getenv: env}, "allreduce", "-b", "8", "-e", "8")
		if code != 1 || !strings.Contains(errs, "two processes claim rank 1") || strings.Contains(errs, "-g N") {
			t.Errorf("%s and %s set: exit %d, stderr %q", vars[0], vars[1], code, errs)
		}
	}
}
