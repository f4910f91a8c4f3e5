package hcomm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hcomm-dev/hcomm/internal/bootstrap"
)

type shrinkCounter struct{}

// Shrink makes a new communicator of the ranks of c that are left
// (MPIX_Comm_shrink, ncclCommShrink): it is collective over the surviving
// ranks, each of which calls it with the same exclude list (nil: none) and
// its own ctx. The new communicator leaves out the ranks in exclude and every
// rank found lost — dead or stuck — before or during the shrink; its ranks
// are the survivors renumbered densely in their old order, and oldRanks
// (the same list on every survivor) gives, for each new rank, its rank in c.
// No relaunch and no new root info are needed, and rank 0 need not be among
// the survivors: the survivors agree on the membership at the lowest live
// rank, tolerating ranks (that one included) that fail during the shrink
// (shrink.md: the protocol and its failure cases).
//
// Shrink first revokes c (Revoke): every rank's pending and later
// operations on c fail with ErrRevoked, so that every survivor comes to the
// shrink; c stays valid for Destroy only. A rank listed in its own exclude
// leaves: it tells the others and returns nil, nil, nil. A rank the others
// found lost or stuck that calls Shrink gets an error wrapping ErrRankLost.
// cfg nil means c's configuration (named "<c's name>/shrink<k>"). The new
// communicator has its own device context and HCCL buffer; destroy it and c
// in any order.
//
// Shrink is bounded by ctx and Config.ConnectTimeout (HCCL_CONNECT_TIMEOUT)
// and ended by Abort or Destroy of c: a survivor that never calls Shrink, or
// ranks that pass different exclude lists, make the others wait until
// then. Every survivor must make the same number of Shrink calls on c.
// Errors are *Error: ErrPara for an exclude rank outside [0, Size()), ctx's
// error (context.Canceled: ErrUnavail; context.DeadlineExceeded:
// ErrTimeout), ErrRankLost as above.
func (c *Comm) Shrink(ctx context.Context, exclude []int, cfg *Config) (*Comm, []int, error) {
	const op = "Shrink"
	if c == nil {
		return nil, nil, nilCommErr(op)
	}
	if ctx == nil {
		return nil, nil, c.errorf(op, -1, ErrPara, nil, "nil context")
	}
	c.mu.Lock()
	closed, aborted := c.closed, c.aborted
	c.mu.Unlock()
	if closed {
		return nil, nil, c.errorf(op, -1, ErrUnavail, nil, "communicator is destroyed")
	}
	if aborted {
		return nil, nil, c.errorf(op, -1, ErrUnavail, ErrAborted, "")
	}
	sus := &suspicion{why: make(map[int]string)}
	leaves := false
	for i, r := range exclude {
		if r < 0 || r >= c.size {
			return nil, nil, c.errorf(op, r, ErrPara, nil, "exclude[%d] = %d is outside [0, %d)", i, r, c.size)
		}
		if r == c.rank {
			leaves = true
		}
		sus.add(r, fmt.Sprintf("rank %d is excluded", r))
	}
	c.Revoke()
	for _, r := range c.LostRanks() {
		sus.add(r, fmt.Sprintf("rank %d is lost", r))
	}
	ctr := c.Value(shrinkCounter{}, func() any { return new(atomic.Uint64) }).(*atomic.Uint64)
	k := ctr.Add(1)
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ConnectTimeout)
	defer cancel()
	unstop := context.AfterFunc(c.stopped, cancel)
	defer unstop()
	fail := func(peer int, code Result, err error, format string, args ...any) (*Comm, []int, error) {
		if c.stopped.Err() != nil {
			code, err = ErrUnavail, ErrAborted
		} else if ctx.Err() != nil {
			code, err = ended(ctx, code, err)
		}
		return nil, nil, c.errorf(op, peer, code, err, format, args...)
	}

	multi := c.boot.client != nil && c.boot.standby != nil
	var next *standby // this rank's standby store in the new communicator
	if multi && !leaves {
		var err error
		if next, err = startStandby(c.cfg, c.boot.iface, c.boot.secret); err != nil {
			return fail(-1, ErrTCPConnect, err, "starting this rank's standby store for the new communicator")
		}
	}
	keep := false
	defer func() {
		if !keep {
			next.close()
		}
	}()
	prefix := "shrink" + strconv.FormatUint(k, 10) + "/"

	var (
		dec     shrinkDecision
		cli     *bootstrap.Client // multi: the connection to the coordinator's standby store
		coord   int
		decided = make(map[int]chan error) // coordinator sides started by this rank
	)
	defer func() {
		cancel()
		for _, ch := range decided {
			<-ch
		}
		if !keep && cli != nil {
			cli.Close() // idempotent: some paths closed it already
		}
	}()
	for {
		coord = sus.lowest(c.size)
		if coord < 0 || (coord == c.rank && leaves) {
			return fail(-1, ErrRemote, ErrRankLost, "no rank is left to coordinate the shrink: %v are lost or excluded", sus.list())
		}
		// Meet at the coordinator's store.
		var s bootstrap.Store
		var local bootstrap.Store // the coordinator's own view, when this rank is the coordinator
		if multi {
			if coord == c.rank {
				local = bootstrap.Prefix(c.boot.standby.srv.Local(), prefix)
			} else if why, err := c.probeRank(ctx, coord); err != nil {
				return fail(coord, ErrTimeout, err, "probing rank %d, the shrink's coordinator", coord)
			} else if why != "" {
				sus.add(coord, why)
				continue
			}
			dctx, dcancel := context.WithTimeout(ctx, 2*probeTimeout)
			var err error
			cli, err = bootstrap.Dial(dctx, c.boot.peers[coord].Standby, c.boot.secret, bootstrap.Claim{Rank: c.rank, NRanks: c.size})
			dcancel()
			if err != nil {
				if ctx.Err() != nil {
					return fail(coord, ErrTimeout, err, "joining the shrink at rank %d's standby store", coord)
				}
				sus.add(coord, fmt.Sprintf("rank %d, the shrink's coordinator, could not be joined: %v", coord, err))
				continue
			}
			cli.KeepAlive(keepAliveInterval)
			s = bootstrap.Prefix(cli, prefix)
		} else {
			s = bootstrap.Prefix(c.boot.store, prefix)
			local = s
		}
		if coord == c.rank && decided[coord] == nil {
			ch := make(chan error, 1)
			decided[coord] = ch
			go func() { ch <- c.decide(ctx, local, prefix, sus, multi) }()
		}
		p := shrinkProposal{Rank: c.rank, Suspects: sus.list(), Leaves: leaves}
		if next != nil {
			p.Standby = next.addr
		}
		b, _ := json.Marshal(p)
		runShrinkHook("dialed", c.rank)
		set := func(ctx context.Context) error { return s.Set(ctx, "prop/"+strconv.Itoa(c.rank), b) }
		var perr error
		if multi && coord != c.rank {
			// A coordinator stopped after the dial never answers the
			// Set: probe it meanwhile, as the wait for its decision does.
			perr = c.underProbe(ctx, cli, coord, set)
		} else {
			perr = set(ctx)
		}
		if err := perr; err != nil {
			if c.dropCoord(ctx, cli, coord, sus, err) {
				continue
			}
			return fail(coord, ErrTCPConnect, err, "proposing to rank %d, the shrink's coordinator", coord)
		}
		if leaves {
			if cli != nil {
				cli.Close()
			}
			return nil, nil, nil
		}
		runShrinkHook("await", c.rank)
		b, err := c.awaitDecision(ctx, s, cli, coord, multi)
		if err != nil {
			if c.dropCoord(ctx, cli, coord, sus, err) {
				continue
			}
			if cli != nil {
				cli.Close()
			}
			return fail(coord, ErrTimeout, err, "waiting for the decision of rank %d, the shrink's coordinator", coord)
		}
		runShrinkHook("read", c.rank)
		if dec, err = parseDecision(b, c.size, multi); err != nil {
			if cli != nil {
				cli.Close()
			}
			return fail(coord, ErrInternal, err, "the shrink's decision from rank %d is malformed", coord)
		}
		if multi && coord != c.rank {
			// Replicate the decision before acting on it: a participant
			// that loses the coordinator before reading it, and meets at
			// this rank's store next, finds it here (shrink.md).
			c.boot.mu.Lock()
			sb := c.boot.standby
			c.boot.mu.Unlock()
			if sb != nil {
				bootstrap.Prefix(sb.srv.Local(), prefix).Set(ctx, "decision", b)
			}
		}
		break
	}
	me := slices.Index(dec.Members, c.rank)
	if me < 0 {
		if cli != nil {
			cli.Close()
		}
		return fail(c.rank, ErrRemote, ErrRankLost, "the survivors %v left this rank out: they found it lost or stuck", dec.Members)
	}
	// A decision read at another store than its coordinator's was copied
	// there: its coordinator was lost before this rank read it. Its store
	// is the new communicator's; if it cannot be joined, this rank builds
	// its end over the store it read the decision from, with rank 0 lost
	// from the start, as the members that joined it will find it lost.
	storePfx, lost0 := "c", ""
	if multi && dec.Coord != coord {
		why := sus.reason(dec.Coord)
		if why == "" {
			dctx, dcancel := context.WithTimeout(ctx, 2*probeTimeout)
			cc, err := bootstrap.Dial(dctx, c.boot.peers[dec.Coord].Standby, c.boot.secret, bootstrap.Claim{Rank: c.rank, NRanks: c.size})
			dcancel()
			if err == nil {
				cli.Close()
				cli, coord = cc, dec.Coord
				cli.KeepAlive(keepAliveInterval)
			} else {
				why = fmt.Sprintf("rank %d, the shrink's coordinator, could not be joined: %v", dec.Coord, err)
			}
		}
		if why != "" {
			storePfx, lost0, coord = prefix+"c", why, -1
		}
	}
	nc, err := c.rebuild(op, k, dec, me, coord, cli, storePfx, lost0, next, cfg)
	if err != nil {
		return nil, nil, err
	}
	keep = true
	return nc, slices.Clone(dec.Members), nil
}

// dropCoord decides, after a store call to the coordinator failed with err,
// whether the coordinator is lost: its connection ended without a goodbye
// or a probe finds it gone or stuck. Then it suspects it, closes cli and
// reports true: the caller starts over at the next coordinator.
func (c *Comm) dropCoord(ctx context.Context, cli *bootstrap.Client, coord int, sus *suspicion, err error) bool {
	if cli == nil || ctx.Err() != nil {
		return false
	}
	why := ""
	if errors.Is(err, errCoordLost) { // awaitDecision's probe found it
		why = err.Error()
	}
	select {
	case <-cli.Done():
		if cli.Lost() {
			why = fmt.Sprintf("rank %d, the shrink's coordinator, is gone (its store connection closed: %v)", coord, err)
		}
	default:
	}
	if why == "" {
		why, _ = c.probeRank(ctx, coord)
	}
	if why == "" {
		return false
	}
	cli.Close()
	sus.add(coord, why)
	return true
}

// errCoordLost ends a wait for the decision whose coordinator a probe found
// gone or stuck.
var errCoordLost = errors.New("the coordinator is lost")

// awaitDecision waits for the coordinator's decision in s; with multi it
// probes the coordinator meanwhile, and gives up (errCoordLost) when it is
// gone or stuck or its connection ends.
func (c *Comm) awaitDecision(ctx context.Context, s bootstrap.Store, cli *bootstrap.Client, coord int, multi bool) ([]byte, error) {
	if !multi || coord == c.rank {
		return s.Get(ctx, "decision")
	}
	var b []byte
	err := c.underProbe(ctx, cli, coord, func(ctx context.Context) error {
		var err error
		b, err = s.Get(ctx, "decision")
		return err
	})
	return b, err
}

// underProbe runs call, a call to the coordinator's store over cli, while
// it probes the coordinator; it ends call and returns errCoordLost when a
// probe finds the coordinator gone or stuck or cli's connection ends.
func (c *Comm) underProbe(ctx context.Context, cli *bootstrap.Client, coord int, call func(context.Context) error) error {
	gctx, gcancel := context.WithCancel(ctx)
	defer gcancel()
	var lost error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(probeInterval)
		defer t.Stop()
		for {
			select {
			case <-gctx.Done():
				return
			case <-cli.Done():
				lost = fmt.Errorf("rank %d, the shrink's coordinator, is gone (its store connection closed): %w", coord, errCoordLost)
				gcancel()
				return
			case <-t.C:
				if why, _ := c.probeRank(gctx, coord); why != "" {
					lost = fmt.Errorf("%s: %w", why, errCoordLost)
					gcancel()
					return
				}
			}
		}
	}()
	err := call(gctx)
	gcancel()
	wg.Wait()
	if err != nil && lost != nil {
		return lost
	}
	return err
}

// rebuild makes this rank's end (rank me) of the communicator decided by
// dec: over the coordinator's standby store (multi: cli is connected to it,
// and it becomes the new communicator's rank-0 store, under storePfx) or
// over c's own store. A non-empty lost0 says why rank 0 (the coordinator)
// is lost already: cli is then another member's store, and the new
// communicator starts failed (ErrRankLost naming rank 0). Multi, a rank
// other than the coordinator keeps its old standby store serving, for a
// late participant to find the decision there, until the new
// communicator's Destroy or the connect timeout, whichever comes first.
func (c *Comm) rebuild(op string, k uint64, dec shrinkDecision, me, coord int, cli *bootstrap.Client, storePfx, lost0 string, next *standby, cfg *Config) (*Comm, error) {
	var conf Config
	if cfg != nil {
		conf = *cfg
	} else {
		conf = c.cfg
		conf.Name = c.name + "/shrink" + strconv.FormatUint(k, 10)
	}
	conf, err := conf.resolve()
	if err == nil {
		conf, err = conf.resolveNet()
	}
	if err != nil {
		if cli != nil {
			cli.Close()
		}
		return nil, c.errorf(op, -1, ErrPara, err, "")
	}
	n := len(dec.Members)
	peers := make([]peerInfo, n)
	for i, r := range dec.Members {
		peers[i] = c.boot.peers[r]
		peers[i].Rank, peers[i].NRanks = i, n
		if cli != nil {
			peers[i].Standby = dec.Standby[i]
		}
	}
	var boot *bootState
	if cli != nil {
		// The coordinator's standby store is the new communicator's
		// store: the coordinator is its rank 0, and it publishes the losses
		// of the new ranks.
		var srv *standby
		unhold := func() {}
		if coord != c.rank {
			c.boot.mu.Lock()
			rel := c.boot.standby.hold()
			c.boot.mu.Unlock()
			t := time.AfterFunc(conf.ConnectTimeout, rel)
			unhold = func() {
				t.Stop()
				rel()
			}
		}
		if coord == c.rank {
			srv = c.boot.takeStandby()
			members := dec.Members
			srv.setOnLost(func(local bootstrap.Store, old int, reason string) {
				if i := slices.Index(members, old); i >= 0 {
					publishLoss(local, i, reason)
				}
			})
		}
		boot = &bootState{store: bootstrap.Prefix(cli, storePfx), client: cli, peers: peers, fabric: c.boot.fabric, iface: c.boot.iface,
			secret: c.boot.secret, standby: next, release: func() error {
				cli.Close()
				srv.close()
				next.close()
				unhold()
				return nil
			}}
	} else {
		parent := c.boot
		parent.mu.Lock()
		parent.refs++ // the new communicator uses c's store
		parent.mu.Unlock()
		boot = &bootState{store: bootstrap.Prefix(parent.store, "shrink"+strconv.FormatUint(k, 10)+"/c"), peers: peers,
			fabric: parent.fabric, iface: parent.iface, secret: parent.secret, release: parent.unref}
	}
	nc, err := newComm(op, conf, me, n, c.dev.ID(), boot)
	if err != nil {
		return nil, err
	}
	if cli != nil {
		nc.watch()
		if lost0 != "" {
			nc.rankLost(0, lost0)
		}
	}
	return nc, nil
}
