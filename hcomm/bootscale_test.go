package hcomm_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// rootRanks makes n ranks as goroutines that join through a root info, the
// tcp transport forced, as ranks of n processes would; they are destroyed,
// and the root closed after them, when the test ends. The timeouts are
// generous: 64 ranks in one process under -race starve their pings.
func rootRanks(t *testing.T, name string, n int) []*hcomm.Comm {
	t.Helper()
	cfg := &hcomm.Config{Name: name, Transport: hcomm.TransportTCP, BufferSize: 64 << 10,
		ConnectTimeout: 60 * time.Second, ExecTimeout: 60 * time.Second, LivenessTimeout: time.Minute}
	root, err := hcomm.GetRootInfo(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	return initRanks(t, n, func(r int) (*hcomm.Comm, error) { return hcomm.InitRootInfo(n, root, r, cfg) })
}

// bootLoad joins n ranks of this process through rank 0's TCP store (the
// tcp transport forced, as ranks of n processes would), runs one 8-byte
// all-reduce and returns how many messages rank 0's store served by the
// time every rank had its result, and how long that took.
func bootLoad(t *testing.T, n int) (int64, time.Duration) {
	t.Helper()
	start := time.Now()
	comms := rootRanks(t, "bootscale", n)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for r, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v := []float64{float64(r + 1)}
			if err := collectives.AllReduceSlice(context.Background(), c, v, v, hcomm.Sum, nil); err != nil {
				errs[r] = err
				return
			}
			if want := float64(n*(n+1)) / 2; v[0] != want {
				errs[r] = fmt.Errorf("all-reduce gave %v, want %v", v[0], want)
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return hcomm.RootServed(comms[0]), took
}

// Rank 0's store serves O(n) messages for an init and the first
// collective: at most bootMsgsPerRank per rank at 4, 16 and 64 ranks — the
// ranks trade their descriptions over a ring and set up their channels
// over each other's mailboxes, not through rank 0.
func TestBootRootLoadLinear(t *testing.T) {
	sizes := []int{4, 16, 64}
	if testing.Short() || raceEnabled {
		sizes = sizes[:2] // 64 ranks' full mesh in one process, under the race detector, on a shared machine: minutes
	}
	for _, n := range sizes {
		served, took := bootLoad(t, n)
		t.Logf("%d ranks: rank 0's store served %d messages (%.1f per rank); init and first all-reduce in %v", n, served, float64(served)/float64(n), took)
		if served > bootMsgsPerRank*int64(n) {
			t.Errorf("%d ranks: rank 0's store served %d messages, more than %d per rank", n, served, bootMsgsPerRank)
		}
	}
}

// bootMsgsPerRank bounds the messages rank 0's store serves per rank of a
// job for its init and first collective: 5 for the rendezvous (claim,
// description, the successor's, the loss watch and its cancellation), and
// room for the watches' first waits — 9 at 4, 16 and 64 ranks here. (A
// slow wait publishes where the rank waits in its own mailbox, wait.go: no
// message to rank 0.)
const bootMsgsPerRank = 16

// A sub-communicator of a multi-process communicator sets its channels up
// in the ranks' mailboxes too: its first collective adds no channel-setup
// messages to rank 0's store — only the split's own exchange there.
func TestBootSubCommMailboxes(t *testing.T) {
	const n = 8
	comms := rootRanks(t, "bootsub", n)
	// The parents' loss watches look at rank 0's store now and then (three messages
	// a look, four with a skip): a slow machine may see one in the window.
	looks := func() (k int64) {
		for _, c := range comms {
			k += hcomm.WatchLooks(c)
		}
		return k
	}
	// The init's last messages are on their way when InitRootInfo returns
	// (each parent watch's first waits, the gather watch's cancellations):
	// let them land, so that the window counts only the split's.
	before := hcomm.RootServed(comms[0])
	for range 100 {
		time.Sleep(20 * time.Millisecond)
		now := hcomm.RootServed(comms[0])
		if now == before {
			break
		}
		before = now
	}
	looksBefore := looks()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for r, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sub, err := c.Split(r%2, r, nil)
			if err != nil {
				errs[r] = err
				return
			}
			defer sub.Destroy()
			v := []float64{float64(r)}
			if err := collectives.AllReduceSlice(context.Background(), sub, v, v, hcomm.Sum, nil); err != nil {
				errs[r] = err
				return
			}
			want := 12.0 // 0+2+4+6
			if r%2 == 1 {
				want = 16 // 1+3+5+7
			}
			if v[0] != want {
				errs[r] = fmt.Errorf("all-reduce of the split gave %v, want %v", v[0], want)
			}
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	// The split's own exchange is n+1 messages per rank in the parent's
	// store (a SET, n GETs), and each sub-communicator's revocation watch
	// two (its wait and the wait's cancellation at Destroy); the sub-communicators' 2·C(4,2) channel
	// setups would add some 190 more (283 in all before they met in the
	// mailboxes).
	got := hcomm.RootServed(comms[0]) - before
	watch := looks() - looksBefore // a sub-communicator has no watch of its own: its parent's tells it
	if most := int64((n+4)*n) + 4*watch; got > most {
		t.Errorf("the split and the sub-communicators' first all-reduce cost rank 0's store %d messages; want at most %d (%d looks of the loss watches among them)", got, most, watch)
	} else {
		t.Logf("the split and the sub-communicators' first all-reduce: %d messages at rank 0's store (%d looks of the loss watches)", got, watch)
	}
}

// A rank's bootstrap mailbox connections do not grow with the peers it set
// channels up with: a setup dials the lower rank's mailbox and hangs up
// when it is over, and the tree gather's connection to the parent closes
// when the init returns. After every rank has set up a channel to every
// other (a full mesh, as a direct all-to-all would), each holds one
// connection it dialled (to its ring successor) and one it accepted (from
// its ring predecessor) — where it held one to every lower rank, and every
// higher one held one to it.
func TestBootMailboxConnsBounded(t *testing.T) {
	const n = 12
	comms := rootRanks(t, "bootconns", n)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for r, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var descs []hcomm.ChannelDesc
			for p := 0; p < n; p++ {
				if p != r {
					d := hcomm.ChannelDescInit(1)
					d[0].RemoteRank = p
					descs = append(descs, d[0])
				}
			}
			_, errs[r] = c.ChannelAcquire(hcomm.EngineCPUTS, descs)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	// The mailboxes' ends of the closed connections go when their goodbyes
	// are read: give them a moment.
	deadline := time.Now().Add(10 * time.Second)
	for r, c := range comms {
		for {
			dialled, accepted := hcomm.MailboxConns(c)
			if dialled == 1 && accepted == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("rank %d of %d, a channel to every other rank: its mailbox holds %d connections it dialled and %d it accepted; want 1 and 1 (its ring successor's, its ring predecessor's)",
					r, n, dialled, accepted)
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
