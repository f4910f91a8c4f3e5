package collectives_test

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// TestHCOMMCrowded: HCOMM_CROWDED moves the collectives' choice of a
// crowded communicator's schedules both ways — ranks in one process that
// outnumber its processors are crowded unless it says 0, two ranks are not
// unless it says 1 (or the machine has one processor), and above 8 ranks
// the handshake runs down the binomial tree exactly when crowded — and a
// value it does not know fails the first collective, naming it.
func TestHCOMMCrowded(t *testing.T) {
	many := max(runtime.NumCPU()+1, 9) // more ranks than processors, and above helloFullMax
	for _, c := range []struct {
		env  string
		n    int
		want bool
	}{
		{"", many, true}, {"0", many, false}, {"1", 2, true}, {"", 2, runtime.NumCPU() < 2},
	} {
		t.Setenv("HCOMM_CROWDED", c.env)
		comms, err := hcomm.InitAll(c.n, &hcomm.Config{BufferSize: 1 << 20, Name: "crowded"})
		if err != nil {
			t.Fatal(err)
		}
		crowded, tree, err := collectives.ScheduleCrowded(comms[0])
		if err != nil || crowded != c.want || tree != (c.want && c.n > 8) {
			t.Errorf("HCOMM_CROWDED=%q, %d ranks in one process on %d processors: crowded %v, tree %v, %v; want %v, %v",
				c.env, c.n, runtime.NumCPU(), crowded, tree, err, c.want, c.want && c.n > 8)
		}
		for _, cm := range comms {
			cm.Destroy()
		}
	}
	t.Setenv("HCOMM_CROWDED", "yes")
	// Bounded: were the value let through, rank 0's barrier would wait for
	// rank 1, which makes no call.
	comms, err := hcomm.InitAll(2, &hcomm.Config{BufferSize: 1 << 20, Name: "crowded", ConnectTimeout: 5 * time.Second, ExecTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, cm := range comms {
			cm.Destroy()
		}
	}()
	if err := collectives.BarrierContext(context.Background(), comms[0]); err == nil || !strings.Contains(err.Error(), `HCOMM_CROWDED="yes"`) {
		t.Errorf("HCOMM_CROWDED=yes: the first collective returned %v, want an error naming HCOMM_CROWDED=\"yes\"", err)
	}
}
