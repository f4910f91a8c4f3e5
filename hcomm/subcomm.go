package hcomm

import (
	"context"
	"encoding/binary"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"sync/atomic"

	"github.com/hcomm-dev/hcomm/internal/bootstrap"
	"github.com/hcomm-dev/hcomm/internal/procs"
)

// SplitNoColor is the color of a rank that joins no sub-communicator in
// Split (NCCL_SPLIT_NOCOLOR).
const SplitNoColor = -1

// CreateSubComm makes a communicator of some of this communicator's ranks
// (HcclCreateSubCommConfig). It is collective over the ranks listed: each of
// them calls it with the same ranks, in the same order, and the same
// subCommID, unique among this communicator's sub-communicators; ranks not
// listed do not call it. The new communicator's rank r is ranks[r]; it has
// its own HCCL buffer and channels, runs on this communicator's device
// context (so the same streams serve both, and its asynchronous errors are
// this communicator's), and shares this communicator's bootstrap, which
// therefore stays open until both are destroyed. Destroy it before this
// communicator. cfg may be nil: the parent's configuration, named
// "<parent>/<subCommID>".
//
// CreateSubComm does not block: it trades nothing with the other ranks (they
// meet when they acquire channels, ChannelAcquireContext), so it has no
// context-taking form.
func (c *Comm) CreateSubComm(ranks []int, subCommID uint64, cfg *Config) (*Comm, error) {
	const op = "CreateSubComm"
	if err := c.usable(op); err != nil {
		return nil, err
	}
	me := -1
	seen := make(map[int]bool, len(ranks))
	for i, r := range ranks {
		if r < 0 || r >= c.size {
			return nil, c.errorf(op, r, ErrPara, nil, "ranks[%d] = %d is outside [0, %d)", i, r, c.size)
		}
		if seen[r] {
			return nil, c.errorf(op, r, ErrPara, nil, "ranks[%d] = %d is listed twice", i, r)
		}
		seen[r] = true
		if r == c.rank {
			me = i
		}
	}
	if me < 0 {
		return nil, c.errorf(op, -1, ErrPara, nil, "this rank (%d) is not among the ranks %v", c.rank, ranks)
	}
	return c.sub(op, ranks, "id"+strconv.FormatUint(subCommID, 10), cfg)
}

type splitCounter struct{}

// Split divides the communicator's ranks by color (ncclCommSplit): it is
// collective over every rank of this communicator, each passing its own color
// and key; the ranks that passed the same color form a new communicator,
// ranked by key and then by their rank here. A rank passing SplitNoColor (any
// negative color) joins none and gets nil, nil. Each new communicator is
// made as by CreateSubComm. Setup is bounded by the connect timeout, and
// ended by Abort or Destroy (an error wrapping ErrAborted).
//
// Split is SplitContext with context.Background().
func (c *Comm) Split(color, key int, cfg *Config) (*Comm, error) {
	return c.SplitContext(context.Background(), color, key, cfg)
}

// SplitContext is Split bounded by ctx as well: a ctx that ends before every
// rank has published its color fails the call with an *Error matching ctx's
// error (context.Canceled: code ErrUnavail; context.DeadlineExceeded: code
// ErrTimeout, Timeout() true). A split that fails so is spent, as one that
// times out: this rank's next Split meets the other ranks' next one.
func (c *Comm) SplitContext(ctx context.Context, color, key int, cfg *Config) (*Comm, error) {
	const op = "Split"
	if err := c.usable(op); err != nil {
		return nil, err
	}
	if ctx == nil {
		return nil, c.errorf(op, -1, ErrPara, nil, "nil context")
	}
	ctr := c.Value(splitCounter{}, func() any { return new(atomic.Uint64) }).(*atomic.Uint64)
	k := ctr.Add(1)
	base := "split" + strconv.FormatUint(k, 10) + "/"
	ctx, done := c.setupCtx(ctx)
	defer done()
	var mine [16]byte
	binary.LittleEndian.PutUint64(mine[:], uint64(int64(color)))
	binary.LittleEndian.PutUint64(mine[8:], uint64(int64(key)))
	if err := c.boot.store.Set(ctx, base+"r"+strconv.Itoa(c.rank), mine[:]); err != nil {
		return nil, c.splitErr(ctx, op, -1, ResultOf(err), err, "publishing this rank's color")
	}
	type member struct{ rank, key int }
	var group []member
	for r := 0; r < c.size; r++ {
		v, err := c.boot.store.Get(ctx, base+"r"+strconv.Itoa(r))
		if err != nil {
			return nil, c.splitErr(ctx, op, r, ErrInternal, err, fmt.Sprintf("waiting for rank %d's color (every rank must call Split)", r))
		}
		if len(v) != 16 {
			return nil, c.errorf(op, r, ErrInternal, nil, "rank %d published %d bytes of color and key, want 16", r, len(v))
		}
		col := int(int64(binary.LittleEndian.Uint64(v)))
		if col == color && color >= 0 {
			group = append(group, member{r, int(int64(binary.LittleEndian.Uint64(v[8:])))})
		}
	}
	if color < 0 {
		return nil, nil
	}
	slices.SortStableFunc(group, func(a, b member) int {
		if a.key != b.key {
			return a.key - b.key
		}
		return a.rank - b.rank
	})
	ranks := make([]int, len(group))
	for i, m := range group {
		ranks[i] = m.rank
	}
	return c.sub(op, ranks, "split"+strconv.FormatUint(k, 10)+"c"+strconv.Itoa(color), cfg)
}

// splitErr is the error of a Split whose store operation failed with err:
// the communicator's own state (aborted, destroyed, a rank lost) first, then
// ctx's end, then code.
func (c *Comm) splitErr(ctx context.Context, op string, peer int, code Result, err error, msg string) error {
	if e := c.usable(op); e != nil {
		return e
	}
	code, err = ended(ctx, code, err)
	return c.errorf(op, peer, code, err, "%s", msg)
}

// sub makes this rank's end of the sub-communicator of ranks (parent ranks,
// in the new order), keyed id in the parent's bootstrap store.
func (c *Comm) sub(op string, ranks []int, id string, cfg *Config) (*Comm, error) {
	var conf Config
	if cfg != nil {
		conf = *cfg
	} else {
		conf = c.cfg
		conf.Name = c.name + "/" + id
	}
	conf, err := conf.resolve()
	if err != nil {
		return nil, c.errorf(op, -1, ErrPara, err, "")
	}
	if conf, err = conf.resolveNet(); err != nil {
		return nil, c.errorf(op, -1, ErrPara, err, "")
	}
	me := slices.Index(ranks, c.rank)
	peers := make([]peerInfo, len(ranks))
	for i, r := range ranks {
		if r >= len(c.boot.peers) {
			return nil, c.errorf(op, r, ErrInternal, nil, "no bootstrap record of rank %d", r)
		}
		peers[i] = c.boot.peers[r]
		peers[i].Rank = i
		peers[i].NRanks = len(ranks)
	}
	parent := c.boot
	parent.mu.Lock()
	parent.refs++ // the sub-communicator uses the parent's store
	parent.mu.Unlock()
	// Its channel setups meet in the processes' mailboxes too (ring.go),
	// under a namespace of its own.
	ns := ""
	if parent.ns != "" {
		ns = parent.ns + "/sub/" + id
	}
	boot := &bootState{store: bootstrap.Prefix(parent.store, "sub/"+id+"/"), peers: peers, fabric: parent.fabric,
		iface: parent.iface, secret: parent.secret, mail: parent.mail, ns: ns, release: parent.unref}
	// newComm takes a reference on boot; when it fails, or when the new
	// communicator is destroyed, boot's release drops the parent's.
	return newCommOn(op, conf, me, len(ranks), c.dev.ID(), c, boot)
}

// ProcessesHere returns how many processes the communicator's ranks on this
// rank's host run in (1 for ranks that are goroutines of one process): with
// more of them than the host has cores, a rank that busy-waits takes a core
// from a peer it waits for, so the waits that would spin should sleep or
// yield instead.
func (c *Comm) ProcessesHere() int { return c.procsHere() }

// Crowded reports whether some host of the communicator has more of its
// ranks' processes than processors — or, where one process runs all the
// host's ranks, more ranks than processors — as every rank published it
// when the communicator was made (hostCPUs: the union of the host's ranks'
// CPU affinity sets, so that ranks a launcher bound to a core each are not
// crowded; a host whose ranks did not say counts as uncrowded). Every rank
// computes the same answer from the same table, so that a choice made on
// it (the collectives' handshake pattern) is the communicator's, not one
// host's.
func (c *Comm) Crowded() bool { return crowded(c.boot.peers) }

// HostProcessors returns how many processors the communicator's ranks on
// this rank's host share: the union of the CPU affinity sets they published
// (a launcher that binds ranks — hcomm run, mpirun --bind-to core, srun
// --cpu-bind — gives each only its share, and runtime.NumCPU follows the
// binding), or the fewest processors any of them counted when one did not
// say; this process's runtime.NumCPU() when none did. What a choice between
// spinning and sleeping on the host, or between schedules that need a
// processor a rank, should weigh ProcessesHere against.
func (c *Comm) HostProcessors() int {
	me := c.boot.peers[min(c.rank, len(c.boot.peers)-1)]
	var here []peerInfo
	for _, p := range c.boot.peers {
		if p.Host == me.Host {
			here = append(here, p)
		}
	}
	if n := hostCPUs(here); n > 0 {
		return n
	}
	return runtime.NumCPU()
}

// hostCPUs is how many processors the ranks of one host (peers) share:
// the union of their published affinity sets, or when one did not publish
// its set, the fewest processors any of them counted; 0 when unknown.
func hostCPUs(peers []peerInfo) int {
	sets := make([]string, 0, len(peers))
	least := 0
	for i, p := range peers {
		sets = append(sets, p.CPUSet)
		if i == 0 || p.CPUs < least {
			least = p.CPUs
		}
	}
	if n, ok := procs.Union(sets); ok {
		return n
	}
	return max(least, 0)
}

// crowded is Crowded over a table of peers.
func crowded(peers []peerInfo) bool {
	type host struct {
		procs map[string]bool
		ranks []peerInfo
	}
	hosts := map[string]*host{}
	for _, p := range peers {
		h := hosts[p.Host]
		if h == nil {
			h = &host{procs: map[string]bool{}}
			hosts[p.Host] = h
		}
		h.procs[p.Proc] = true
		h.ranks = append(h.ranks, p)
	}
	for _, h := range hosts {
		cpus := hostCPUs(h.ranks)
		if cpus <= 0 {
			continue
		}
		if len(h.procs) > cpus || len(h.procs) == 1 && len(h.ranks) > cpus {
			return true
		}
	}
	return false
}

// HostOf returns a label of the host rank runs on, equal for two ranks
// exactly when they share a host and can reach each other through shared
// memory (ranks of one process always do): what a two-level schedule groups
// ranks by. It is "" for a rank outside [0, Size()).
func (c *Comm) HostOf(rank int) string {
	if rank < 0 || rank >= c.size || rank >= len(c.boot.peers) {
		return ""
	}
	p := c.boot.peers[rank]
	if p.ShmHost != "" {
		return "shm:" + p.ShmHost
	}
	return "proc:" + p.Proc // no shared memory here: only a process's own ranks group
}
