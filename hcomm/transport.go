package hcomm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/channel/inproc"
	"github.com/hcomm-dev/hcomm/internal/bootstrap"
)

// Transport selection: which channel.Dialer carries a channel.
//
// The transports are one static table, fastest first, as NCCL's
// ncclTransports[] with canConnect: each entry says which protocols it
// carries, whether it reaches a peer (canReach: inproc a peer in this process
// — same process token in the bootstrap —, shm one on this host — same
// shm.HostID —, tcp any), and how a communicator makes its Dialer. Protocols
// map onto transports as DESIGN.md says:
//
//	HCCS, SIO, HCCS_ONLY   inproc (same process), else shm (same host)
//	PCIE                   shm (same host); inproc where shm is off
//	ROCE, UBC_CTP, UBC_TP,
//	UB_MEM, UBOE           tcp
//	AUTO                   the fastest that reaches the peer: inproc > shm > tcp
//
// Config.Transport (HCOMM_TRANSPORT) forces one transport on every channel,
// whatever the protocol; Config.ShmDisable (HCOMM_SHM_DISABLE=1) takes shm out
// of the choice. A channel whose protocol cannot reach its peer fails with
// ErrNotSupport naming both ranks and where they are.

// Transport names.
const (
	TransportInproc = "inproc"
	TransportShm    = "shm"
	TransportTCP    = "tcp"
)

// transport is one way to carry a channel.
type transport struct {
	name string
	// protocols are the protocols it carries besides ProtocolAuto, which
	// every transport carries.
	protocols []Protocol
	// canReach reports whether the transport reaches peer from me under cfg.
	canReach func(cfg *Config, me, peer *peerInfo) bool
	// newDialer makes a communicator's Dialer of this transport.
	newDialer func(c *Comm) (channel.Dialer, error)
	// takesLent says that its channels take writes into memory the peer
	// registers after the channel is made (channel.ReceiverChecker).
	takesLent bool
}

// transports are every transport hcomm has, fastest first.
var transports = [...]transport{
	{name: TransportInproc, protocols: []Protocol{ProtocolHCCS, ProtocolSIO, ProtocolHCCSOnly},
		canReach:  func(_ *Config, me, peer *peerInfo) bool { return me.Proc == peer.Proc },
		newDialer: func(c *Comm) (channel.Dialer, error) { return inproc.NewDialer(c.boot.fabric), nil }, takesLent: true},
	{name: TransportShm, protocols: []Protocol{ProtocolHCCS, ProtocolSIO, ProtocolHCCSOnly, ProtocolPCIE},
		canReach: shmReaches, newDialer: newShmDialer}, // transport_shm.go
	{name: TransportTCP, protocols: []Protocol{ProtocolROCE, ProtocolUBCCTP, ProtocolUBCTP, ProtocolUBMem, ProtocolUBOE},
		canReach:  func(*Config, *peerInfo, *peerInfo) bool { return true },
		newDialer: newTCPDialer, takesLent: true}, // transport_tcp.go
}

// shmReaches reports whether shm reaches peer: it is on, and both ranks
// published the same non-empty shm.HostID.
func shmReaches(cfg *Config, me, peer *peerInfo) bool {
	return !cfg.ShmDisable && me.ShmHost != "" && me.ShmHost == peer.ShmHost
}

// carries reports whether t carries protocol p. shmOff says shm is off
// here (disabled, or the system lacks what it needs): PCIE then goes over
// inproc to a peer in this process.
func (t *transport) carries(p Protocol, shmOff bool) bool {
	if p == ProtocolAuto || slices.Contains(t.protocols, p) {
		return true
	}
	return p == ProtocolPCIE && shmOff && t.name == TransportInproc
}

// transportNamed returns the table's entry for name, or nil.
func transportNamed(name string) *transport {
	for i := range transports {
		if transports[i].name == name {
			return &transports[i]
		}
	}
	return nil
}

// Transports returns the names of the transports hcomm has, fastest first:
// inproc, shm, tcp. (shm reaches no peer on a system without what it needs:
// see channel/shm.)
func Transports() []string {
	out := make([]string, len(transports))
	for i := range transports {
		out[i] = transports[i].name
	}
	return out
}

// procToken tells this process apart from every other in a communicator.
var procToken = func() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}()

var (
	hostIDOnce sync.Once
	hostIDVal  string
)

// hostID names this host: hostname plus the kernel's boot id, so that two
// containers with one hostname on different machines differ and a host that
// rebooted is another host.
func hostID() string {
	hostIDOnce.Do(func() {
		h, _ := os.Hostname()
		b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
		boot := strings.TrimSpace(string(b))
		if err != nil || boot == "" {
			boot = "no-boot-id-" + procToken // unknown: never claim to share a host
		}
		hostIDVal = h + "/" + boot
	})
	return hostIDVal
}

// peerInfo is what each rank publishes in the bootstrap.
type peerInfo struct {
	Rank     int    `json:"rank"`
	NRanks   int    `json:"nranks"`
	Host     string `json:"host"`     // hostID()
	ShmHost  string `json:"shm_host"` // shmHostID(): equal and non-empty = reachable over shm
	Proc     string `json:"proc"`     // procToken
	Hostname string `json:"hostname"` // for messages
	PID      int    `json:"pid"`
	CPUs     int    `json:"cpus,omitempty"` // runtime.NumCPU() of the rank's process: Crowded (0: not told)
	// CPUSet is the processors the rank's process may run on, in the
	// kernel's list form ("0-3"; procs.Affinity): a host's ranks together
	// share their union (HostProcessors). "" when not told.
	CPUSet string `json:"cpuset,omitempty"`
	Addr   string `json:"addr"` // the address this rank's tcp transport uses
	// Standby is the address of the rank's standby store (agree.go), where
	// a shrink meets when this rank is the lowest live one; "" in-process.
	Standby string `json:"standby,omitempty"`
	// Mailbox is the address of the rank's bootstrap mailbox (ring.go),
	// where its ring predecessor hands it the ranks' descriptions and the
	// higher ranks set up their channels with it; "" in-process.
	Mailbox string `json:"mailbox,omitempty"`
}

func (p peerInfo) where() string {
	return fmt.Sprintf("%s pid %d", p.Hostname, p.PID)
}

// bootState is what a communicator got from its bootstrap and shares with the
// communicators made with it (InitAll's group shares one).
type bootState struct {
	store  bootstrap.Store   // prefixed view for this communicator
	client *bootstrap.Client // the connection to rank 0's store; nil for InitAll
	root   *bootstrap.Server // rank 0's store, on rank 0 of a multi-process init; else nil
	// mail is this process's mailbox (ring.go) and ns the namespace of
	// this communicator's channel setups in the mailboxes; nil and "" when
	// the setups go through store (in-process, a shrunk communicator).
	mail   *mailbox
	ns     string
	peers  []peerInfo
	fabric *inproc.Fabric
	iface  bootstrap.Iface  // the interface of HCOMM_SOCKET_IFNAME (zero for InitAll)
	secret bootstrap.Secret // the communicator's secret; transports reuse it
	// standby is this rank's standby store (a multi-process communicator's;
	// nil otherwise, or once a shrink took it over); guarded by mu.
	standby *standby
	// release frees what the bootstrap holds (store client, rank 0's server);
	// called by the last Destroy of the group.
	release func() error
	mu      sync.Mutex
	refs    int
}

// takeStandby hands this rank's standby store over to its caller (a shrink
// whose coordinator this rank is): release no longer closes it.
func (b *bootState) takeStandby() *standby {
	b.mu.Lock()
	defer b.mu.Unlock()
	sb := b.standby
	b.standby = nil
	return sb
}

func (b *bootState) unref() error {
	b.mu.Lock()
	b.refs--
	last := b.refs == 0
	b.mu.Unlock()
	if last && b.release != nil {
		return b.release()
	}
	return nil
}

// resolveNet fills the transport fields of c from the environment.
func (c Config) resolveNet() (Config, error) {
	if c.Transport == "" {
		c.Transport = os.Getenv("HCOMM_TRANSPORT")
	}
	c.Transport = strings.ToLower(strings.TrimSpace(c.Transport))
	switch c.Transport {
	case "", TransportInproc, TransportShm, TransportTCP:
	default:
		return c, fmt.Errorf("transport %q (Config.Transport or HCOMM_TRANSPORT) is not one of inproc, shm, tcp", c.Transport)
	}
	if err := envSwitch("HCOMM_SHM_DISABLE", &c.ShmDisable); err != nil {
		return c, err
	}
	if err := envSwitch("HCOMM_SHM_CMA_DISABLE", &c.ShmCMADisable); err != nil {
		return c, err
	}
	if c.SocketIfname == "" {
		c.SocketIfname = os.Getenv("HCOMM_SOCKET_IFNAME")
	}
	if c.Transport == TransportShm && c.ShmDisable {
		return c, fmt.Errorf("transport shm is forced (HCOMM_TRANSPORT) and disabled (HCOMM_SHM_DISABLE) at once")
	}
	return c, nil
}

// envSwitch sets *v from the variable name (0 or 1, or any strconv.ParseBool
// form) unless code set it already (only true is taken from code).
func envSwitch(name string, v *bool) error {
	if *v {
		return nil
	}
	if s := os.Getenv(name); s != "" {
		b, err := strconv.ParseBool(s)
		if err != nil {
			return fmt.Errorf("environment variable %s=%q: want 0 or 1", name, s)
		}
		*v = b
	}
	return nil
}

// TransportTo names the transport a channel to peer with protocol p would
// run on — TransportInproc, TransportShm or TransportTCP — without setting
// one up: the choice ChannelAcquire makes, from HCOMM_TRANSPORT and where
// the peer runs. A library that sets its channels up lazily asks it ahead
// (the collectives' selector does: whether a peer's memory is mapped). It
// is local and safe for concurrent use; a peer outside the communicator,
// this rank, or a protocol that cannot reach the peer is an *Error.
func (c *Comm) TransportTo(peer int, p Protocol) (string, error) {
	const op = "TransportTo"
	if err := c.usable(op); err != nil {
		return "", err
	}
	if peer < 0 || peer >= c.size || peer == c.rank {
		return "", c.errorf(op, peer, ErrPara, nil, "peer %d is outside [0, %d) or this rank", peer, c.size)
	}
	t, err := c.pickTransport(peer, p)
	if err != nil {
		return "", c.errorf(op, peer, ErrNotSupport, err, "")
	}
	return t.name, nil
}

// TakesLentTo reports whether the channels of this rank to peer (the
// transport TransportTo names for ProtocolAuto) take writes into memory the
// peer registers after the channel is made — a receive buffer lent for one
// call (WriteLentWithNotifyNbi) — known before any channel is made and the
// same on both ends: inproc and tcp do, shm does not, and a Dialer of
// InitAllOver's does when it says so (channel.ReceiverChecker). false for
// a peer outside the communicator, this rank, or one no transport reaches.
func (c *Comm) TakesLentTo(peer int) bool {
	if c.usable("TakesLentTo") != nil || peer < 0 || peer >= c.size || peer == c.rank {
		return false
	}
	t, err := c.pickTransport(peer, ProtocolAuto)
	return err == nil && t.takesLent
}

// pickTransport chooses the transport of a channel to peer with protocol p:
// the forced one, or the fastest that carries p and reaches the peer.
func (c *Comm) pickTransport(peer int, p Protocol) (*transport, error) {
	me, them := &c.boot.peers[c.rank], &c.boot.peers[peer]
	if t := c.customTransport(); t != nil { // InitAllOver
		return t, nil
	}
	where := fmt.Sprintf("rank %d is on %s, rank %d on %s", c.rank, me.where(), peer, them.where())
	if f := c.cfg.Transport; f != "" {
		t := transportNamed(f)
		if t == nil {
			return nil, fmt.Errorf("transport %s is forced (HCOMM_TRANSPORT) but hcomm has no such transport", f)
		}
		if !t.canReach(&c.cfg, me, them) {
			return nil, fmt.Errorf("transport %s is forced (HCOMM_TRANSPORT) but cannot reach the peer: %s", f, where)
		}
		return t, nil
	}
	if _, ok := protocolNames[p]; !ok {
		return nil, fmt.Errorf("unknown protocol %d", int32(p))
	}
	shmOff := c.cfg.ShmDisable || me.ShmHost == ""
	var tried []string
	for i := range transports {
		t := &transports[i]
		if !t.carries(p, shmOff) {
			continue
		}
		if t.canReach(&c.cfg, me, them) {
			return t, nil
		}
		tried = append(tried, t.name)
	}
	why := ""
	if c.cfg.ShmDisable && me.Host == them.Host {
		why = " (shm is disabled by HCOMM_SHM_DISABLE)"
	}
	return nil, fmt.Errorf("protocol %v cannot reach the peer over %s%s: %s", p, strings.Join(tried, " or "), why, where)
}

// dialer returns the communicator's Dialer of transport t, making it on
// first use. One Dialer of each kind per communicator; Destroy closes them.
func (c *Comm) dialer(t *transport) (channel.Dialer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("communicator is destroyed")
	}
	if d, ok := c.dialers[t.name]; ok {
		return d, nil
	}
	d, err := t.newDialer(c)
	if err != nil {
		return nil, err
	}
	c.dialers[t.name] = d
	return d, nil
}

// exchanger returns the Exchange of one channel setup between this rank and
// peer: round i of it is the key base/i, one value per rank, in the pair's
// store (pairStore: the lower rank's mailbox).
func (c *Comm) exchanger(base string, peer int) channel.Exchange {
	var n int
	var mu sync.Mutex
	me, them := "r"+strconv.Itoa(c.rank), "r"+strconv.Itoa(peer)
	return func(ctx context.Context, mine []byte) ([]byte, error) {
		mu.Lock()
		i := n
		n++
		mu.Unlock()
		s, release, err := c.pairStore(ctx, peer)
		if err != nil {
			return nil, err
		}
		defer release()
		return bootstrap.Exchange(ctx, s, base+"/"+strconv.Itoa(i), me, them, mine)
	}
}

// setupMsg is hcomm's own first round of every channel setup: both ends must
// have chosen the same transport.
type setupMsg struct {
	Transport string `json:"transport"`
	Rank      int    `json:"rank"`
}

// handshake runs the first exchange round and checks the peer's choice.
func handshake(ctx context.Context, ex channel.Exchange, rank, peer int, transport string) error {
	mine, _ := json.Marshal(setupMsg{Transport: transport, Rank: rank})
	b, err := ex(ctx, mine)
	if err != nil {
		return err
	}
	var theirs setupMsg
	if err := json.Unmarshal(b, &theirs); err != nil {
		return fmt.Errorf("rank %d's channel setup message is malformed: %v", peer, err)
	}
	if theirs.Rank != peer {
		return fmt.Errorf("the setup message for rank %d's end of the channel says rank %d", peer, theirs.Rank)
	}
	if theirs.Transport != transport {
		return fmt.Errorf("rank %d chose transport %q for this channel and rank %d %q: set HCOMM_TRANSPORT and HCOMM_SHM_DISABLE alike on every rank",
			rank, transport, peer, theirs.Transport)
	}
	return nil
}
