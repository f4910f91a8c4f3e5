package hcomm

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hcomm-dev/hcomm/channel/inproc"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/bootstrap"
	"github.com/hcomm-dev/hcomm/internal/procs"
)

// Communicators across processes and hosts. Every rank runs one of
// InitRootInfo, InitClusterInfo or InitFromEnv; they differ only in how a
// rank learns rank 0's bootstrap address and the communicator's secret:
//
//  1. Rank 0 serves the bootstrap store (a small TCP key/value store,
//     internal/bootstrap) at that address; every rank, rank 0 included,
//     connects to it, proves it knows the secret (HMAC challenge-response;
//     the secret never crosses the wire), claims its rank of a job of n
//     ranks, and publishes where it runs (host id, process, address). The
//     store checks the claims as they come: a rank count other than rank 0's
//     or a rank two processes claim fails every rank at once, naming them;
//     once all n have joined, a newcomer (another job on the port) is
//     refused alone.
//  2. The descriptions go up and down a tree of the ranks' own small
//     stores (mailboxes, ring.go), not through rank 0: each rank reads
//     only its tree parent's and ring successor's descriptions from rank
//     0's store, so that it serves O(n) messages per init
//     (internal/bootstrap/spec.md counts them). A rank's init returns
//     once its tree children have every description (as NCCL's
//     bootstrap ends with an all-gather), or a rank is lost meanwhile:
//     destroying a communicator the moment its init returns fails no
//     other rank's init.
//  3. Channels are then set up pairwise (ChannelAcquire) in the mailbox
//     of the lower rank of the two: each pair trades transport messages
//     under keys named by the two ranks, the engine, protocol, tag and a
//     per-key counter.
//
// Setup is bounded by Config.ConnectTimeout (HCCL_CONNECT_TIMEOUT): ranks may
// start in any order within it; connecting retries while rank 0 is not up.
// Rank 0's communicator owns the store, and each rank's its mailbox:
// destroying it ends the channel setups that meet there, so a rank
// destroys its communicator after its peers have acquired the channels
// they will use with it (nothing else needs the stores once every init
// has returned), or last.

// DefaultRootPort is the port of rank 0's bootstrap store when nothing names
// one: InitClusterInfo without HCOMM_ROOT_PORT, InitFromEnv under Slurm
// without MASTER_PORT. It is torchrun's default MASTER_PORT.
const DefaultRootPort = 29500

// MaxRanks bounds the rank count of a communicator.
const MaxRanks = 1 << 16

// RootInfo is what every rank needs to join a communicator (HcclRootInfo):
// the address of rank 0's bootstrap store and the communicator's secret.
// It is a value: copy it, send it to the other ranks as String(), parse it
// back with ParseRootInfo.
type RootInfo struct {
	Addr   string   // "host:port" of rank 0's store
	Secret [16]byte // random; proves a connection belongs to the communicator
}

const rootInfoScheme = "hcomm1://"

// String encodes r as "hcomm1://<32 hex digits of secret>@<host:port>".
// The string holds the secret: hand it only to the communicator's ranks.
func (r RootInfo) String() string {
	return rootInfoScheme + hex.EncodeToString(r.Secret[:]) + "@" + r.Addr
}

// MarshalText implements encoding.TextMarshaler (String).
func (r RootInfo) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler (ParseRootInfo).
func (r *RootInfo) UnmarshalText(b []byte) error {
	v, err := ParseRootInfo(string(b))
	if err != nil {
		return err
	}
	*r = v
	return nil
}

// ParseRootInfo parses what RootInfo.String returns. It is strict: the
// scheme, exactly 32 lowercase hex digits, '@', and a host:port with a
// non-empty host and a port in [1, 65535]; nothing else.
func ParseRootInfo(s string) (RootInfo, error) {
	var r RootInfo
	bad := func(why string) (RootInfo, error) {
		q := s
		if len(q) > 80 {
			q = q[:80] + "…"
		}
		return RootInfo{}, noRankErr("ParseRootInfo", "", ErrPara, nil, "root info %q: %s (want %s<32 hex digits>@host:port)", q, why, rootInfoScheme)
	}
	rest, ok := strings.CutPrefix(s, rootInfoScheme)
	if !ok {
		return bad("no " + rootInfoScheme + " prefix")
	}
	sec, addr, ok := strings.Cut(rest, "@")
	if !ok {
		return bad("no '@' between secret and address")
	}
	if len(sec) != 32 || strings.ToLower(sec) != sec {
		return bad("the secret is not 32 lowercase hex digits")
	}
	if _, err := hex.Decode(r.Secret[:], []byte(sec)); err != nil {
		return bad("the secret is not 32 lowercase hex digits")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return bad("address: " + err.Error())
	}
	if host == "" || strings.ContainsAny(host, " \t\r\n@/") {
		return bad("address has no valid host")
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 || strconv.Itoa(p) != port {
		return bad("port is not a number in [1, 65535]")
	}
	r.Addr = addr
	return r, nil
}

// pendingRoots are the stores GetRootInfo started and no InitRootInfo of
// rank 0 has claimed yet, by secret.
var (
	pendingMu    sync.Mutex
	pendingRoots = map[[16]byte]*pendingRoot{}
)

type pendingRoot struct {
	srv   *bootstrap.Server
	timer *time.Timer
}

func claimRoot(secret [16]byte) *bootstrap.Server {
	pendingMu.Lock()
	defer pendingMu.Unlock()
	p, ok := pendingRoots[secret]
	if !ok {
		return nil
	}
	delete(pendingRoots, secret)
	p.timer.Stop()
	return p.srv
}

// Close stops the bootstrap store that GetRootInfo started for r if rank 0's
// InitRootInfo has not claimed it yet; otherwise (or in another process) it
// does nothing. Idempotent.
func (r RootInfo) Close() error {
	if srv := claimRoot(r.Secret); srv != nil {
		return srv.Close()
	}
	return nil
}

// GetRootInfo makes a communicator's root info (HcclGetRootInfo) and starts
// its bootstrap store: call it on rank 0, hand the root info to every rank
// (as a string: RootInfo.String), and call InitRootInfo on every rank,
// rank 0 in this process.
//
// The store listens on an ephemeral port of the interface that
// Config.SocketIfname (HCOMM_SOCKET_IFNAME) picks, else the first non-loopback
// interface. Its lifetime: rank 0's InitRootInfo with this root info takes it
// over, and that communicator's Destroy stops it. Until then it belongs to
// the root info: RootInfo.Close stops it, and it stops by itself when no
// InitRootInfo claimed it within Config.ConnectTimeout.
func GetRootInfo(cfg *Config) (RootInfo, error) {
	const op = "GetRootInfo"
	c, err := resolveAll(cfg)
	if err != nil {
		return RootInfo{}, &Error{Op: op, Comm: c.Name, Rank: 0, Peer: -1, Code: ErrPara, Err: err}
	}
	ifc, err := bootstrap.PickIface(c.SocketIfname)
	if err != nil {
		return RootInfo{}, &Error{Op: op, Comm: c.Name, Rank: 0, Peer: -1, Code: ErrNetwork, Err: err}
	}
	secret, err := bootstrap.NewSecret()
	if err != nil {
		return RootInfo{}, &Error{Op: op, Comm: c.Name, Rank: 0, Peer: -1, Code: ErrSyscall, Err: err}
	}
	srv, err := bootstrap.Listen(net.JoinHostPort(ifc.IP.String(), "0"), secret, bootstrap.ServerOptions{Logger: c.bootLogger(), OnLost: publishLoss})
	if err != nil {
		return RootInfo{}, &Error{Op: op, Comm: c.Name, Rank: 0, Peer: -1, Code: ErrTCPConnect, Err: err}
	}
	port := srv.Addr().(*net.TCPAddr).Port
	r := RootInfo{Addr: net.JoinHostPort(ifc.IP.String(), strconv.Itoa(port)), Secret: secret}
	pendingMu.Lock()
	pendingRoots[secret] = &pendingRoot{srv: srv, timer: time.AfterFunc(c.ConnectTimeout, func() {
		if s := claimRoot(secret); s != nil {
			c.bootLogger().Warn("hcomm: no InitRootInfo claimed the root info within HCCL_CONNECT_TIMEOUT; its bootstrap store is stopped",
				"addr", r.Addr, "timeout", c.ConnectTimeout)
			s.Close()
		}
	})}
	pendingMu.Unlock()
	return r, nil
}

// InitRootInfo joins rank of an nRanks communicator whose rank 0 made root
// with GetRootInfo (HcclCommInitRootInfo). Every rank calls it, within
// Config.ConnectTimeout of each other; it returns once all have joined. On
// rank 0 it takes over the store GetRootInfo started in this process; a rank
// 0 in a process that did not call GetRootInfo starts a store on root.Addr
// itself. cfg may be nil.
//
// InitRootInfo is InitRootInfoContext with context.Background().
func InitRootInfo(nRanks int, root RootInfo, rank int, cfg *Config) (*Comm, error) {
	return InitRootInfoContext(context.Background(), nRanks, root, rank, cfg)
}

// InitRootInfoContext is InitRootInfo bounded by ctx as well as by
// Config.ConnectTimeout: when ctx ends before every rank has joined, the
// call returns an *Error matching ctx's error (context.Canceled: code
// ErrUnavail; context.DeadlineExceeded: code ErrTimeout, Timeout() true) and
// leaves nothing open. ctx bounds the setup only, not the communicator.
func InitRootInfoContext(ctx context.Context, nRanks int, root RootInfo, rank int, cfg *Config) (*Comm, error) {
	const op = "InitRootInfo"
	if ctx == nil {
		return nil, &Error{Op: op, Rank: rank, Peer: -1, Code: ErrPara, Msg: "nil context"}
	}
	c, err := resolveAll(cfg)
	if err != nil {
		return nil, &Error{Op: op, Comm: c.Name, Rank: rank, Peer: -1, Code: ErrPara, Err: err}
	}
	if _, err := ParseRootInfo(root.String()); err != nil {
		return nil, &Error{Op: op, Comm: c.Name, Rank: rank, Peer: -1, Code: ErrPara, Err: err}
	}
	return join(ctx, op, c, joinSpec{nRanks: nRanks, rank: rank, localRank: -1, addr: root.Addr,
		listen: root.Addr, secret: bootstrap.Secret(root.Secret)})
}

// joinSpec is what an init entry point learned about the rendezvous.
type joinSpec struct {
	nRanks, rank, localRank int
	addr                    string // rank 0's store, as every rank dials it
	listen                  string // where rank 0 listens when it starts the store
	secret                  bootstrap.Secret
}

func resolveAll(cfg *Config) (Config, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	c, err := c.resolve()
	if err != nil {
		return c, err
	}
	return c.resolveNet()
}

// bootLogger is where the bootstrap logs refused connections: the
// communicator's logger (Config.Logger, else HCOMM_DEBUG's); with neither,
// nothing — a library that writes to slog's default logger unasked lands its
// lines in the middle of its program's output (a benchmark's table).
func (c Config) bootLogger() *slog.Logger {
	if c.logger != nil {
		return c.logger
	}
	return slog.New(slog.DiscardHandler)
}

// join runs the rendezvous, bounded by ctx and c.ConnectTimeout, and makes
// the communicator.
func join(ctx context.Context, op string, c Config, js joinSpec) (*Comm, error) {
	fail := func(code Result, err error, format string, args ...any) (*Comm, error) {
		return nil, &Error{Op: op, Comm: c.Name, Rank: js.rank, Peer: -1, Code: code, Err: err, Msg: fmt.Sprintf(format, args...)}
	}
	if js.nRanks <= 0 || js.nRanks > MaxRanks {
		return fail(ErrPara, nil, "rank count %d is outside [1, %d]", js.nRanks, MaxRanks)
	}
	if js.rank < 0 || js.rank >= js.nRanks {
		return fail(ErrPara, nil, "rank %d is outside [0, %d)", js.rank, js.nRanks)
	}
	ifc, err := bootstrap.PickIface(c.SocketIfname)
	if err != nil {
		return fail(ErrNetwork, err, "")
	}
	ctx, cancel := context.WithTimeout(ctx, c.ConnectTimeout)
	defer cancel()

	var srv *bootstrap.Server
	if js.rank == 0 {
		if srv = claimRoot(js.secret); srv == nil {
			srv, err = bootstrap.Listen(js.listen, js.secret, bootstrap.ServerOptions{Logger: c.bootLogger(), OnLost: publishLoss})
			if errors.Is(err, syscall.EADDRINUSE) {
				return fail(ErrTCPConnect, err, "rank 0 starting the bootstrap store: address %s in use: another job on this port (MASTER_PORT)?", js.listen)
			}
			if err != nil {
				return fail(ErrTCPConnect, err, "rank 0 starting the bootstrap store")
			}
		}
		srv.Expect(js.nRanks) // a rank that claims another count, or a taken rank, fails the job at once
	}
	cli, err := bootstrap.Dial(ctx, js.addr, js.secret, bootstrap.Claim{Rank: js.rank, NRanks: js.nRanks})
	if err != nil {
		closeStore(srv, c.ConnectTimeout)
		switch {
		case errors.Is(err, bootstrap.ErrJobFailed):
			return fail(ErrPara, err, "")
		case errors.Is(err, bootstrap.ErrAuth):
			return fail(ErrTCPConnect, err, "")
		}
		code, err := ended(ctx, ErrTCPConnect, err)
		return fail(code, err, "joining the bootstrap within HCCL_CONNECT_TIMEOUT %v", c.ConnectTimeout)
	}
	sb, err := startStandby(c, ifc, js.secret)
	if err != nil {
		cli.Close()
		closeStore(srv, c.ConnectTimeout)
		return fail(ErrTCPConnect, err, "rank %d starting its standby store", js.rank)
	}
	mb, err := startMailbox(c, ifc, js.secret, js.rank, js.nRanks)
	if err != nil {
		sb.close()
		cli.Close()
		closeStore(srv, c.ConnectTimeout)
		return fail(ErrTCPConnect, err, "rank %d starting its bootstrap mailbox", js.rank)
	}
	peers, code, err := rendezvous(ctx, cli, js, ifc, sb.addr, mb)
	if err != nil {
		if !errors.Is(err, ErrRankLost) && !errors.Is(err, bootstrap.ErrJobFailed) && ctx.Err() == nil {
			// The others wait for this rank on the ring: tell them why it
			// will not come, rather than leave them to time out.
			postLoss(bootstrap.Prefix(cli, "c"), js.rank, fmt.Sprintf("it failed during its setup: %v", err))
		}
		mb.close()
		sb.close()
		cli.Close()
		closeStore(srv, c.ConnectTimeout)
		if errors.Is(err, bootstrap.ErrJobFailed) {
			code = ErrPara // another rank's claim did not fit: the store says which
		} else {
			code, err = ended(ctx, code, err)
		}
		return fail(code, err, "")
	}
	boot := &bootState{store: bootstrap.Prefix(cli, "c"), client: cli, root: srv, peers: peers, fabric: inproc.Default, iface: ifc,
		secret: js.secret, standby: sb, mail: mb, ns: "c"}
	mb.setOnLost(boot.mailLost)
	mbox := mb
	boot.release = func() error {
		if mbox != nil {
			mbox.close()
		}
		cli.Close()
		if srv != nil {
			srv.Close()
		}
		boot.takeStandby().close()
		return nil
	}
	dev := js.localRank
	if dev < 0 || dev >= device.MaxDevices {
		dev = js.rank % device.MaxDevices
	}
	// join holds a reference of its own on boot: when newComm fails (the
	// HCCL buffer cannot be reserved, say), this rank tells the others
	// before its store connection closes — a loss event naming it, so that
	// they fail their first channel setups at once instead of waiting out
	// HCCL_CONNECT_TIMEOUT — and rank 0's store stays up for failLinger so
	// that they can read it.
	boot.refs = 1
	cm, err := newComm(op, c, js.rank, js.nRanks, dev, boot)
	if err != nil {
		postLoss(boot.store, js.rank, fmt.Sprintf("it failed during its setup: %v", err))
		if s := srv; s != nil {
			srv = nil // release leaves it to the timer
			time.AfterFunc(min(failLinger, c.ConnectTimeout), func() { s.Close() })
		}
		// Its mailbox too: the others' channel setups that meet there wait
		// for the loss event rather than fail on a store that closed.
		m := mbox
		mbox = nil
		time.AfterFunc(min(failLinger, c.ConnectTimeout), m.close)
		boot.unref()
		return nil, err
	}
	boot.unref()
	cm.watch()
	return cm, nil
}

// peersHook, when set (by tests, before any communicator exists), runs in
// a joining rank other than 0 before it reads rank 0's list of ranks: a test
// delays the read there.
var peersHook func(rank int)

// failLinger bounds how long the store of a job whose rendezvous failed
// outlives rank 0's init call, so that ranks that dial late learn why.
const failLinger = 3 * time.Second

// closeStore closes rank 0's store (srv; nil: none) after a failed
// rendezvous: at once, unless the store failed the job (a rank that did not
// fit) — then it keeps refusing late ranks with the reason for failLinger
// (at most timeout) before it closes by itself, rather than leave them to
// wait out HCCL_CONNECT_TIMEOUT for a store that is gone. (The process's
// exit ends it sooner; a launcher stops the late ranks then.)
func closeStore(srv *bootstrap.Server, timeout time.Duration) {
	if srv == nil {
		return
	}
	if srv.Failed() == "" {
		srv.Close()
		return
	}
	time.AfterFunc(min(failLinger, timeout), func() { srv.Close() })
}

func rendezvous(ctx context.Context, cli *bootstrap.Client, js joinSpec, ifc bootstrap.Iface, standby string, mb *mailbox) ([]peerInfo, Result, error) {
	n, err := cli.Add(ctx, "claim/"+strconv.Itoa(js.rank), 1)
	if err != nil {
		return nil, ErrTCPConnect, err
	}
	if n != 1 {
		return nil, ErrPara, fmt.Errorf("rank %d is claimed by %d processes: give each process its own rank", js.rank, n)
	}
	me := peerInfo{Rank: js.rank, NRanks: js.nRanks, Host: hostID(), ShmHost: shmHostID(), Proc: procToken, PID: os.Getpid(), CPUs: runtime.NumCPU(), CPUSet: procs.FormatList(procs.Affinity()), Addr: ifc.IP.String(),
		Standby: standby, Mailbox: mb.addr}
	me.Hostname, _ = os.Hostname()
	mine, _ := json.Marshal(me)
	if js.nRanks == 1 {
		return []peerInfo{me}, Success, nil
	}
	if err := cli.Set(ctx, "info/"+strconv.Itoa(js.rank), mine); err != nil {
		return nil, ErrTCPConnect, err
	}
	if peersHook != nil && js.rank != 0 {
		peersHook(js.rank)
	}
	// A rank lost meanwhile (its connection to rank 0's store or to a
	// mailbox ended, or rank 0's store published it), or the job failed,
	// ends the rest at once, with that as the error.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := watchGather(ctx, cancel, mb, cli)
	defer stop()
	// From rank 0's store: the descriptions of this rank's ring successor
	// (which watches this rank's liveness) and tree parent (the gather's
	// way up). Everything else comes down the tree.
	// The two at once: each waits for its rank to join.
	succ, parent := (js.rank+1)%js.nRanks, treeParent(js.rank)
	// The ring's connection stays for the communicator's life; the
	// parent's closes when the gather is over (unless it is the ring's too).
	var (
		pc      *bootstrap.Client
		pcode   Result
		perr    error
		release = func() {}
		pdone   = make(chan struct{})
	)
	go func() {
		defer close(pdone)
		if js.rank != 0 {
			pc, release, pcode, perr = dialPeer(ctx, cli, mb, js, parent, false)
		}
	}()
	nc, _, code, err := dialPeer(ctx, cli, mb, js, succ, true)
	<-pdone
	defer release()
	if err != nil {
		return nil, code, err
	}
	mb.setRing(succ, nc)
	if perr != nil {
		return nil, pcode, perr
	}
	all, err := treeGather(ctx, mb, pc, mine)
	if err != nil {
		switch {
		case errors.Is(err, ErrRankLost):
			return nil, ErrRemote, err
		case errors.Is(err, bootstrap.ErrJobFailed):
			return nil, ErrPara, err
		}
		return nil, ErrTimeout, err
	}
	peers := make([]peerInfo, js.nRanks)
	for r, b := range all {
		p, err := checkInfo(b, r, js.nRanks)
		if err != nil {
			return nil, ErrPara, err
		}
		peers[r] = p
	}
	return peers, Success, nil
}

// dialPeer reads rank r's description from rank 0's store (cli), waiting
// for it to join, and connects to its mailbox: for the mailbox's life when
// keep is set (mailbox.dial), else until the caller calls release
// (mailbox.use). release is never nil: a no-op when keep is set or the
// call fails.
func dialPeer(ctx context.Context, cli *bootstrap.Client, mb *mailbox, js joinSpec, r int, keep bool) (_ *bootstrap.Client, release func(), _ Result, _ error) {
	none := func() {}
	b, err := cli.Get(ctx, "info/"+strconv.Itoa(r))
	if cause := context.Cause(ctx); err != nil && cause != nil && !errors.Is(cause, context.Canceled) && !errors.Is(cause, context.DeadlineExceeded) {
		err = cause // the watch's verdict: a rank lost, the job failed
	}
	if err != nil {
		if errors.Is(err, ErrRankLost) {
			return nil, none, ErrRemote, err
		}
		if errors.Is(err, bootstrap.ErrJobFailed) {
			return nil, none, ErrPara, err
		}
		return nil, none, ErrTimeout, fmt.Errorf("rank %d waiting for rank %d to join: %w", js.rank, r, err)
	}
	p, err := checkInfo(b, r, js.nRanks)
	if err != nil {
		return nil, none, ErrPara, err
	}
	if p.Mailbox == "" {
		return nil, none, ErrPara, fmt.Errorf("rank %d (on %s) has no bootstrap mailbox: is it an older hcomm?", r, p.where())
	}
	var nc *bootstrap.Client
	release = none
	if keep {
		nc, err = mb.dial(ctx, p.Mailbox)
	} else {
		nc, release, err = mb.use(ctx, p.Mailbox)
	}
	if err == nil {
		return nc, release, Success, nil
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) && !errors.Is(cause, context.DeadlineExceeded) {
		return nil, none, ErrRemote, cause // the watch's verdict: a rank lost, the job failed
	}
	if ctx.Err() == nil {
		// Its process died — or it failed its init and closed: then the
		// watch says why in a moment (the job failed, its own loss).
		if v := awaitVerdict(ctx, verdictWait); v != nil {
			return nil, none, ErrRemote, v
		}
	}
	if errors.Is(err, bootstrap.ErrGone) {
		return nil, none, ErrRemote, fmt.Errorf("rank %d connecting to rank %d's bootstrap mailbox: rank %d is lost: it is gone (nothing listens at %s): %w", js.rank, r, r, p.Mailbox, ErrRankLost)
	}
	return nil, none, ErrTCPConnect, fmt.Errorf("rank %d connecting to rank %d's bootstrap mailbox: %w", js.rank, r, err)
}

// checkInfo parses rank r's description and checks that it fits a
// communicator of n ranks.
func checkInfo(b []byte, r, n int) (peerInfo, error) {
	var p peerInfo
	switch err := json.Unmarshal(b, &p); {
	case err != nil:
		return p, fmt.Errorf("rank %d's description is malformed: %v", r, err)
	case p.Rank != r:
		return p, fmt.Errorf("the description of rank %d says rank %d", r, p.Rank)
	case p.NRanks != n:
		return p, fmt.Errorf("rank %d (on %s) joined a communicator of %d ranks; this one has %d", r, p.where(), p.NRanks, n)
	case p.Host == "" || p.Proc == "":
		return p, fmt.Errorf("rank %d's description is malformed: no host or process", r)
	}
	return p, nil
}
