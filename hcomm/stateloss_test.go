package hcomm_test

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/hcomm"
)

// stateLossRank is one rank of TestCommStatusRankLost
// (HCOMM_TEST_ROLE=stateloss): it joins, registers a state callback, says
// READY and waits, doing nothing, for the callback to be told of a
// transition; it reports that transition and GetStatus, destroys the
// communicator and reports whether the callback was told exactly the move
// to INVALID after it, before Destroy returned.
func stateLossRank(t *testing.T) {
	c, err := hcomm.InitFromEnv(nil)
	if err != nil {
		t.Fatalf("init: %v", err)
	}
	told := make(chan string, 16)
	unreg, err := c.RegCommStateCallback(func(_ *hcomm.Comm, from, to hcomm.CommStatus) {
		told <- fmt.Sprintf("%v->%v", from, to)
	})
	if err != nil {
		t.Fatalf("RegCommStateCallback: %v", err)
	}
	defer unreg()
	fmt.Println("READY")
	// Only the callback is watched here: GetStatus would itself notice the
	// loss and move the communicator, which is not what is tested.
	select {
	case s := <-told:
		fmt.Printf("STATE %s\n", s)
	case <-time.After(30 * time.Second):
		fmt.Println("STATE none within 30s")
	}
	fmt.Printf("STATE-STATUS %v\n", c.GetStatus())
	if err := c.Destroy(); err != nil {
		fmt.Printf("STATE-DESTROY-ERR %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
	}
	var after []string
	for more := true; more; {
		select {
		case s := <-told:
			after = append(after, s)
		default:
			more = false
		}
	}
	fmt.Printf("STATE-AFTER %s\n", strings.Join(after, " "))
}

// TestCommStatusRankLost: three ranks as processes, idle, each with a state
// callback; rank 2 (then, in a second run, rank 0, whose store goes with
// it) is killed (SIGKILL). Each survivor's callback must be told
// READY->ERROR within 5 s of the signal (the loss detection's bound; the
// execution timeout is 600 s), without the survivor polling GetStatus;
// GetStatus then says ERROR; and Destroy tells the callback ERROR->INVALID,
// and nothing else, before it returns.
func TestCommStatusRankLost(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	const n = 3
	for _, tr := range crossProcessTransports(t) {
		for _, victim := range []int{2, 0} {
			t.Run(fmt.Sprintf("%s/rank%d", tr, victim), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
				defer cancel()
				procs := launchReady(t, ctx, n, "stateloss", tr, "HCCL_EXEC_TIMEOUT=600")
				sent := time.Now()
				procs[victim].cmd.Process.Signal(syscall.SIGKILL)
				for _, p := range procs {
					if p.rank == victim {
						continue
					}
					sl := waitLine(t, p, "STATE ", 40*time.Second)
					if sl.text != "STATE READY->ERROR" {
						t.Fatalf("rank %d's callback, after rank %d was killed: %s, want READY->ERROR\n%s", p.rank, victim, sl.text, p.log)
					}
					if took := sl.at.Sub(sent); took > 5*time.Second {
						t.Errorf("rank %d's callback told READY->ERROR %v after rank %d was killed; the bound is 5s", p.rank, took, victim)
					} else {
						t.Logf("rank %d: READY->ERROR %v after the kill", p.rank, took.Round(time.Millisecond))
					}
					if st := waitLine(t, p, "STATE-STATUS ", 10*time.Second); st.text != "STATE-STATUS ERROR" {
						t.Errorf("rank %d: GetStatus after the loss: %s, want ERROR", p.rank, st.text)
					}
					if a := waitLine(t, p, "STATE-AFTER", 30*time.Second); a.text != "STATE-AFTER ERROR->INVALID" {
						t.Errorf("rank %d: the callback was told %q by the time Destroy returned, want only ERROR->INVALID\n%s", p.rank, strings.TrimPrefix(a.text, "STATE-AFTER "), p.log)
					}
					if err := <-p.done; err != nil {
						t.Errorf("rank %d: %v\n%s", p.rank, err, p.log)
					}
					p.done <- nil
				}
			})
		}
	}
}
