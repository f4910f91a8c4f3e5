package hcomm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/hcomm-dev/hcomm/internal/bootstrap"
)

// The agreement of a shrink (shrink.md has the protocol and its failure
// cases): every participant proposes what it suspects to the coordinator —
// the lowest rank it does not suspect — whose store is the participant's
// standby store; the coordinator decides once every rank it does not
// suspect has proposed or been found gone or stuck; a participant whose
// coordinator goes away suspects it and starts over at the next one.

// decideHook, when set (by tests, before any communicator exists), runs in
// the coordinator once it has every proposal, before it publishes its
// decision: a test stops or kills the coordinator there.
var decideHook func(rank int)

// shrinkHook, when set (by tests, before any communicator exists), runs at
// the points of a shrink a test needs to order: "dialed" (a participant
// has joined its coordinator's store, or is the coordinator, and is about to
// propose), "decided" (the coordinator
// has published its decision), "await" (a participant has proposed and is
// about to wait for the decision), "read" (a participant has the decision).
var shrinkHook func(point string, rank int)

func runShrinkHook(point string, rank int) {
	if shrinkHook != nil {
		shrinkHook(point, rank)
	}
}

// probeTimeout bounds a liveness probe of a rank's standby store: a rank
// whose process accepts the connection but sends no challenge within it is
// stuck (stopped, frozen). A live process answers in microseconds; the bound
// leaves room for a loaded machine.
const probeTimeout = 2 * time.Second

// probeInterval is how often a coordinator probes the ranks it still waits
// for, and a participant its coordinator.
const probeInterval = 250 * time.Millisecond

// standby is a rank's standby store: a bootstrap store that each rank of a
// multi-process communicator serves from its init on, so that a shrink can
// meet at the lowest live rank's store when rank 0's is gone (DESIGN.md: no
// single point of failure on rank 0). Its address is in the rank's peerInfo.
type standby struct {
	srv  *bootstrap.Server
	addr string

	mu      sync.Mutex
	onLost  func(local bootstrap.Store, rank int, reason string)
	holds   int  // hold calls not yet released
	closing bool // close was called during a hold
}

// startStandby starts a standby store on ifc, admitting the connections
// that prove secret.
func startStandby(cfg Config, ifc bootstrap.Iface, secret bootstrap.Secret) (*standby, error) {
	sb := &standby{}
	srv, err := bootstrap.Listen(net.JoinHostPort(ifc.IP.String(), "0"), secret,
		bootstrap.ServerOptions{Logger: cfg.bootLogger(), OnLost: sb.lost, IdleTimeout: cfg.livenessTimeout()})
	if err != nil {
		return nil, err
	}
	sb.srv = srv
	sb.addr = net.JoinHostPort(ifc.IP.String(), strconv.Itoa(srv.Addr().(*net.TCPAddr).Port))
	return sb, nil
}

// lost is the store's OnLost hook: it passes the loss to the hook the
// store's current user set.
func (sb *standby) lost(local bootstrap.Store, rank int, reason string) {
	sb.mu.Lock()
	f := sb.onLost
	sb.mu.Unlock()
	if f != nil {
		f(local, rank, reason)
	}
}

func (sb *standby) setOnLost(f func(local bootstrap.Store, rank int, reason string)) {
	sb.mu.Lock()
	sb.onLost = f
	sb.mu.Unlock()
}

// close stops the store, or, during a hold, once the last hold is
// released; nil-safe.
func (sb *standby) close() {
	if sb == nil {
		return
	}
	sb.mu.Lock()
	if sb.holds > 0 {
		sb.closing = true
		sb.mu.Unlock()
		return
	}
	sb.mu.Unlock()
	sb.srv.Close()
}

// hold keeps the store serving until the returned release is called, even
// if close is called meanwhile (close then takes effect at the release): a
// member of a shrink keeps serving the decision it copied there to the
// participants that look for it late. release is idempotent; hold is
// nil-safe.
func (sb *standby) hold() (release func()) {
	if sb == nil {
		return func() {}
	}
	sb.mu.Lock()
	sb.holds++
	sb.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			sb.mu.Lock()
			sb.holds--
			last := sb.holds == 0 && sb.closing
			sb.mu.Unlock()
			if last {
				sb.srv.Close()
			}
		})
	}
}

// shrinkProposal is what a participant tells the coordinator.
type shrinkProposal struct {
	Rank     int    `json:"rank"`
	Suspects []int  `json:"suspects"`          // ranks it knows lost, or excluded
	Leaves   bool   `json:"leaves,omitempty"`  // it excluded itself
	Standby  string `json:"standby,omitempty"` // its standby store for the new communicator
}

// shrinkDecision is what the coordinator publishes: the new communicator's
// members, by their rank in the old one, ascending (new rank i is
// Members[i]), their standby stores, and the coordinator that decided
// (Members[0]: its standby store is the new communicator's store). A
// participant that reads it copies it into its own standby store, where a
// participant that lost the coordinator before reading it finds it.
type shrinkDecision struct {
	Members []int    `json:"members"`
	Standby []string `json:"standby,omitempty"`
	Coord   int      `json:"coord"`
}

// parseDecision parses a decision and checks it against a communicator of
// size ranks (multi: with the members' standby stores).
func parseDecision(b []byte, size int, multi bool) (shrinkDecision, error) {
	var d shrinkDecision
	if err := json.Unmarshal(b, &d); err != nil {
		return d, err
	}
	if len(d.Members) == 0 || (multi && len(d.Standby) != len(d.Members)) {
		return d, fmt.Errorf("%d members, %d standby stores", len(d.Members), len(d.Standby))
	}
	for i, r := range d.Members {
		if r < 0 || r >= size || (i > 0 && r <= d.Members[i-1]) {
			return d, fmt.Errorf("the members %v are not ascending ranks of [0, %d)", d.Members, size)
		}
	}
	if d.Coord != d.Members[0] {
		return d, fmt.Errorf("the coordinator %d is not the first member of %v", d.Coord, d.Members)
	}
	return d, nil
}

// suspicion is a participant's set of suspected ranks, with why.
type suspicion struct {
	mu  sync.Mutex
	why map[int]string
}

func (s *suspicion) add(r int, why string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.why[r]; ok {
		return false
	}
	s.why[r] = why
	return true
}

func (s *suspicion) has(r int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.why[r]
	return ok
}

func (s *suspicion) list() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]int, 0, len(s.why))
	for r := range s.why {
		out = append(out, r)
	}
	slices.Sort(out)
	return out
}

// reason returns why r is suspected ("" if it is not).
func (s *suspicion) reason(r int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.why[r]
}

// lowest returns the lowest rank below n not suspected, or -1.
func (s *suspicion) lowest(n int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for r := 0; r < n; r++ {
		if _, ok := s.why[r]; !ok {
			return r
		}
	}
	return -1
}

// probeRank probes rank r's standby store: nil when it answers; otherwise
// why r is to be suspected ("gone": its process left no listener; "not
// responding": alive but stuck). A ctx that ends gives ctx's error.
func (c *Comm) probeRank(ctx context.Context, r int) (string, error) {
	addr := c.boot.peers[r].Standby
	err := bootstrap.Probe(ctx, addr, probeTimeout)
	switch {
	case err == nil:
		return "", nil
	case errors.Is(err, bootstrap.ErrGone):
		return fmt.Sprintf("rank %d is gone (nothing listens at its standby store %s: its process died)", r, addr), nil
	case errors.Is(err, bootstrap.ErrStuck):
		return fmt.Sprintf("rank %d is not responding (alive but stuck? its standby store %s sent nothing within %v)", r, addr, probeTimeout), nil
	case ctx.Err() != nil:
		return "", ctx.Err()
	}
	return "", nil // a probe that could not tell: no verdict
}

// peekDecision looks for a decision under prefix in rank r's standby store: r
// read it from a coordinator since lost, and left with it. It reports
// false when there is none, or r's store cannot be read, or what is there
// does not parse.
func (c *Comm) peekDecision(ctx context.Context, r int, prefix string) ([]byte, bool) {
	dctx, cancel := context.WithTimeout(ctx, 2*probeTimeout)
	defer cancel()
	cli, err := bootstrap.Dial(dctx, c.boot.peers[r].Standby, c.boot.secret, bootstrap.Claim{Rank: c.rank, NRanks: c.size})
	if err != nil {
		return nil, false
	}
	defer cli.Close()
	b, ok, err := bootstrap.Prefix(cli, prefix).TryGet(dctx, "decision")
	if err != nil || !ok {
		return nil, false
	}
	if _, err := parseDecision(b, c.size, true); err != nil {
		c.cfg.bootLogger().Warn("hcomm: malformed shrink decision in a standby store; ignored", "comm", c.name, "rank", c.rank, "from", r, "err", err)
		return nil, false
	}
	return b, true
}

// decide is the coordinator's side of the agreement over s (its own store's
// view of this shrink's keys): it waits until every rank of size it does
// not suspect has proposed, probing those that have not (multi, when ranks
// are processes with standby stores), adds what each proposal suspects, and
// publishes the decision. sus is shared with this rank's participant side.
// With multi it also looks, in the standby store of each live rank it still
// waits for, for a decision of this shrink (under prefix there): one
// found means a coordinator decided before it was lost, and that rank holds
// the decision; this coordinator then publishes that decision, unchanged,
// so that every participant reaches the same one.
func (c *Comm) decide(ctx context.Context, s bootstrap.Store, prefix string, sus *suspicion, multi bool) error {
	props := make(map[int]shrinkProposal)
	lastProbe := time.Now()
	for {
		for _, r := range c.LostRanks() {
			sus.add(r, fmt.Sprintf("rank %d is lost", r))
		}
		var missing []int
		for r := 0; r < c.size; r++ {
			if sus.has(r) {
				continue
			}
			if _, ok := props[r]; ok {
				continue
			}
			b, ok, err := s.TryGet(ctx, "prop/"+strconv.Itoa(r))
			if err != nil {
				return err
			}
			var p shrinkProposal
			if ok && json.Unmarshal(b, &p) == nil && p.Rank == r {
				props[r] = p
				for _, x := range p.Suspects {
					if x >= 0 && x < c.size {
						sus.add(x, fmt.Sprintf("rank %d suspects rank %d", r, x))
					}
				}
				if p.Leaves {
					sus.add(r, fmt.Sprintf("rank %d leaves", r))
				}
				continue
			}
			if ok {
				c.cfg.bootLogger().Warn("hcomm: malformed shrink proposal; ignored", "comm", c.name, "rank", c.rank, "from", r)
			}
			missing = append(missing, r)
		}
		if len(missing) == 0 {
			if decideHook != nil {
				decideHook(c.rank)
			}
			d := shrinkDecision{Coord: c.rank}
			for r := 0; r < c.size; r++ {
				if p, ok := props[r]; ok && !sus.has(r) {
					d.Members = append(d.Members, r)
					d.Standby = append(d.Standby, p.Standby)
				}
			}
			b, _ := json.Marshal(d)
			if err := s.Set(ctx, "decision", b); err != nil {
				return err
			}
			runShrinkHook("decided", c.rank)
			return nil
		}
		if multi && time.Since(lastProbe) >= probeInterval {
			lastProbe = time.Now()
			var (
				wg    sync.WaitGroup
				mu    sync.Mutex
				found []byte
			)
			for _, r := range missing {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if why, _ := c.probeRank(ctx, r); why != "" {
						sus.add(r, why)
						return
					}
					if b, ok := c.peekDecision(ctx, r, prefix); ok {
						mu.Lock()
						found = b
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			if found != nil {
				return s.Set(ctx, "decision", found)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}
