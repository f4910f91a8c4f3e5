package hcomm

import (
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hcomm-dev/hcomm/channel/tcp"
	"github.com/hcomm-dev/hcomm/internal/metrics"
)

// Defaults, from HCCL's documentation.
const (
	DefaultBufferSize     = 200 << 20          // HCCL_BUFFSIZE: 200 MB
	DefaultExecTimeout    = 1836 * time.Second // HCCL_EXEC_TIMEOUT: 1836 s
	DefaultConnectTimeout = 120 * time.Second  // HCCL_CONNECT_TIMEOUT: 120 s
	// DefaultLivenessTimeout is HCOMM_LIVENESS_TIMEOUT's default: a rank
	// silent this long is lost (Config.LivenessTimeout).
	DefaultLivenessTimeout = 10 * time.Second
)

// Config sets up a communicator (HcclCommConfig). The zero value of a field
// means "take the environment variable, else HCCL's default"; a value set in
// code wins over the environment.
type Config struct {
	// Name names the communicator in errors and logs ("comm0" when empty).
	Name string
	// BufferSize is HCCL_BUFFSIZE in bytes (the variable itself is in MB). As in
	// HCCL, the communicator's HCCL buffer is twice this size.
	BufferSize int64
	// ExecTimeout bounds every notify wait that does not give its own timeout
	// (HCCL_EXEC_TIMEOUT, seconds). Negative means never time out (HCCL's 0).
	ExecTimeout time.Duration
	// ConnectTimeout bounds channel setup (HCCL_CONNECT_TIMEOUT, seconds).
	ConnectTimeout time.Duration
	// LivenessTimeout is how long a rank may stay silent on its bootstrap
	// connection — no keep-alive, or, for rank 0's store, no answer — before
	// the other ranks take it for lost, "not responding (alive but
	// stuck?)" (HCOMM_LIVENESS_TIMEOUT, seconds; default 10 s). It does not
	// depend on ExecTimeout: a stopped rank, rank 0 included, is found
	// within it however long the collectives may wait.
	LivenessTimeout time.Duration

	// Transport forces one transport on every channel: "inproc", "shm" or
	// "tcp" (HCOMM_TRANSPORT). Empty lets each channel's protocol and the
	// peer's locality choose (see transport.go).
	Transport string
	// ShmDisable keeps channels off the shared-memory transport
	// (HCOMM_SHM_DISABLE=1, like NCCL_SHM_DISABLE). Only true is taken from
	// code; false leaves the decision to the environment.
	ShmDisable bool
	// ShmCMADisable keeps the shared-memory channels from reading a peer's
	// memory through the kernel (HCOMM_SHM_CMA_DISABLE=1; Open MPI's
	// btl_vader_single_copy_mechanism=none): the collectives then stage
	// every byte between processes through the HCCL buffers (two copies)
	// instead of reading a peer's send buffer in one (see channel/shm,
	// "Reading memory the peer lends"). Only true is taken from code.
	ShmCMADisable bool
	// SocketIfname picks the network interface whose address rank 0's
	// bootstrap store listens on and tcp channels use (HCOMM_SOCKET_IFNAME,
	// NCCL_SOCKET_IFNAME's syntax: "eth0", "eth,ib", "^docker,lo", "=eth0").
	SocketIfname string
	// TCPSpin is how long a wait on a tcp channel — a notify wait, a read,
	// a fence — reads the channel's sockets itself, busy-polling them
	// without blocking, with no byte read (the bound counts from the last
	// read that brought some), before it sleeps and leaves them to the channel's
	// background readers (HCOMM_TCP_SPIN, a duration: "200us", "1ms"; 0
	// there turns polling off). Polling saves the wake-up through the host
	// that a sleeping waiter pays for every message (tcp.DefaultSpin; the
	// figures are in channel/tcp's documentation); the waiter keeps its
	// processor that long, yielding it between looks. A small collective
	// that runs in its caller (package collectives' lane) polls its peers'
	// sockets as long there. Negative turns polling off.
	TCPSpin time.Duration
	// TCPCongestion chooses the congestion control of tcp channels'
	// sockets (HCOMM_TCP_CONGESTION; linux). "" or "auto": in a
	// communicator of 2 ranks, a socket whose peer is on this host uses
	// cubic where the host lets this process choose it, and every other
	// socket keeps the host's default — bbr, which paces even loopback,
	// held the 2-process 1 MiB broadcast to 114–170 µs launch by launch
	// where cubic ran it in 102–109, and the collectives' 512 KiB pieces
	// between 2 ranks over tcp are measured under cubic; with 4 processes
	// on 2 cores bbr measured faster (the README's transport settings and
	// BENCHMARKS.md, stop 51). "system": every socket keeps the host's
	// default (net.ipv4.tcp_congestion_control). Any other value names the
	// algorithm every socket uses ("cubic", "reno", "bbr", ...): one the
	// host refuses this process fails the communicator's making, naming it
	// and what the host allows.
	TCPCongestion string

	// Deterministic is how reproducible the reducing collectives are
	// (HCCL_DETERMINISTIC, HcclCommConfig's hcclDeterministic). The zero
	// value takes the variable, else DeterministicOff; see Determinism.
	Deterministic Determinism

	// Metrics receives hcomm's Prometheus collectors (see internal/metrics
	// for the series). nil means no metrics; hcomm never uses the global
	// registry. Communicators sharing a Registerer share the collectors.
	Metrics prometheus.Registerer
	// TraceDir, when set, makes the communicator keep a timeline of its
	// collectives and of every task its device's streams run, and Destroy
	// write it there as NAME-rankR-PID.json in the Chrome trace event
	// format, for Perfetto or chrome://tracing (HCOMM_TRACE; the directory
	// is made if missing). Comm.WriteTrace writes it at any time; trace.go
	// says what it holds. Empty: no timeline, and no cost.
	TraceDir string
	// Logger receives hcomm's log records, each with the communicator's name
	// and rank. nil takes HCOMM_DEBUG (WARN, INFO or TRACE: text on stderr;
	// unset: no logging).
	Logger *slog.Logger

	logger  *slog.Logger // resolved: Logger, else HCOMM_DEBUG's
	metrics *metrics.Set // resolved from Metrics; nil = none
}

// resolve fills the zero fields from the environment and HCCL's defaults.
func (c Config) resolve() (Config, error) {
	if c.Name == "" {
		c.Name = "comm0"
	}
	if c.BufferSize == 0 {
		// The buffer is twice BufferSize bytes: both must fit an int64.
		mb, err := envScaled("HCCL_BUFFSIZE", DefaultBufferSize>>20, 1, 1<<20, math.MaxInt64/2, "MB")
		if err != nil {
			return c, err
		}
		c.BufferSize = mb << 20
	}
	if c.BufferSize < 0 || c.BufferSize > math.MaxInt64/2 {
		return c, fmt.Errorf("Config.BufferSize %d is outside [0, %d] (the HCCL buffer is twice its size)", c.BufferSize, int64(math.MaxInt64/2))
	}
	if c.ExecTimeout == 0 {
		s, err := envScaled("HCCL_EXEC_TIMEOUT", int64(DefaultExecTimeout/time.Second), 0, int64(time.Second), math.MaxInt64, "seconds")
		if err != nil {
			return c, err
		}
		c.ExecTimeout = time.Duration(s) * time.Second
		if s == 0 {
			c.ExecTimeout = -1
		}
	}
	if c.ConnectTimeout == 0 {
		s, err := envScaled("HCCL_CONNECT_TIMEOUT", int64(DefaultConnectTimeout/time.Second), 1, int64(time.Second), math.MaxInt64, "seconds")
		if err != nil {
			return c, err
		}
		c.ConnectTimeout = time.Duration(s) * time.Second
	}
	if c.LivenessTimeout == 0 {
		s, err := envScaled("HCOMM_LIVENESS_TIMEOUT", int64(DefaultLivenessTimeout/time.Second), 1, int64(time.Second), math.MaxInt64, "seconds")
		if err != nil {
			return c, err
		}
		c.LivenessTimeout = time.Duration(s) * time.Second
	}
	if c.LivenessTimeout < 0 {
		return c, fmt.Errorf("Config.LivenessTimeout %v is negative", c.LivenessTimeout)
	}
	if c.TraceDir == "" {
		c.TraceDir = os.Getenv("HCOMM_TRACE")
	}
	if c.TCPSpin == 0 {
		d, err := envSpin()
		if err != nil {
			return c, err
		}
		c.TCPSpin = d
	}
	if c.TCPCongestion == "" {
		c.TCPCongestion = os.Getenv("HCOMM_TCP_CONGESTION")
	}
	if !validCongestion(c.TCPCongestion) {
		return c, fmt.Errorf("Config.TCPCongestion (HCOMM_TCP_CONGESTION) %q: want auto, system or an algorithm's name such as cubic", c.TCPCongestion)
	}
	if c.Deterministic == DeterministicDefault {
		d, err := envDeterministic()
		if err != nil {
			return c, err
		}
		c.Deterministic = d
	}
	if c.Deterministic < DeterministicDefault || c.Deterministic > DeterministicStrict {
		return c, fmt.Errorf("Config.Deterministic %d: want DeterministicOff, DeterministicOn or DeterministicStrict", int(c.Deterministic))
	}
	return c.resolveObs()
}

// envScaled reads the integer variable name (def when unset or empty), at
// least min, that the caller multiplies by unit (bytes per MB, nanoseconds
// per second): a value whose product exceeds limit is refused, naming the
// variable and its value, rather than wrapping around to a small or negative
// size.
func envScaled(name string, def, min, unit, limit int64, what string) (int64, error) {
	v, ok := os.LookupEnv(name)
	if !ok || v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < min {
		return 0, fmt.Errorf("environment variable %s=%q: want an integer >= %d", name, v, min)
	}
	if n > limit/unit {
		return 0, fmt.Errorf("environment variable %s=%q: %d %s overflows (at most %d)", name, v, n, what, limit/unit)
	}
	return n, nil
}

// validCongestion says whether v is a TCPCongestion: empty, or a name of at
// most 15 lower-case letters, digits and underscores (the kernel's names
// are at most 15 bytes).
func validCongestion(v string) bool {
	if len(v) > 15 {
		return false
	}
	for _, r := range v {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
			return false
		}
	}
	return true
}

// envSpin reads HCOMM_TCP_SPIN: a duration ("200us", "1ms"), or 0 for no
// polling (returned as -1, Config's "off"); unset or empty is
// tcp.DefaultSpin.
func envSpin() (time.Duration, error) {
	v, ok := os.LookupEnv("HCOMM_TCP_SPIN")
	if !ok || v == "" {
		return tcp.DefaultSpin, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 || d > time.Second {
		return 0, fmt.Errorf("environment variable HCOMM_TCP_SPIN=%q: want a duration from 0 to 1s, such as 200us (0: no polling)", v)
	}
	if d == 0 {
		return -1, nil
	}
	return d, nil
}

// CommConfigInit returns a Config with every field unset
// (HcclCommConfigInit): each takes its environment variable, else HCCL's
// default, when a communicator is made with it. In Go this is the zero
// Config; the call exists so that code written after HCCL's reads the same.
//
// HcclCommConfig's fields map onto Config as follows: hcclBufferSize (MB) is
// BufferSize (bytes); hcclDeterministic is Deterministic; hcclCommName is
// Name; hcclExecTimeOut (s) is ExecTimeout. hcclUdi, hcclOpExpansionMode,
// hcclAlgo, hcclRetryEnable/Params, hcclBufferName, hcclWorldRankID,
// hcclJobID, aclGraphZeroCopyEnable, the RDMA traffic class and service
// level and hcclQos have no counterpart: hcomm's collectives choose their algorithm
// per call (collectives.Options), expand on the host, and run over
// transports without those network knobs.
func CommConfigInit() Config { return Config{} }

// CommConfigCapability names one field of HcclCommConfig
// (HcclCommConfigCapability), with HCCL's values.
type CommConfigCapability uint32

// CommConfigCapability values.
const (
	ConfigBufferSize       CommConfigCapability = 0  // HCCL_COMM_CONFIG_BUFFER_SIZE: Config.BufferSize
	ConfigDeterministic    CommConfigCapability = 1  // HCCL_COMM_CONFIG_DETERMINISTIC: Config.Deterministic
	ConfigCommName         CommConfigCapability = 2  // HCCL_COMM_CONFIG_COMM_NAME: Config.Name
	ConfigOpExpansionMode  CommConfigCapability = 3  // HCCL_COMM_CONFIG_OP_EXPANSION_MODE
	ConfigSupportInitByEnv CommConfigCapability = 4  // HCCL_COMM_CONFIG_SUPPORT_INIT_BY_ENV: unset fields take the environment
	ConfigWorldRankID      CommConfigCapability = 5  // HCCL_COMM_CONFIG_WORLD_RANKID
	ConfigJobID            CommConfigCapability = 6  // HCCL_COMM_CONFIG_JOBID
	ConfigAclGraphZeroCopy CommConfigCapability = 7  // HCCL_COMM_CONFIG_ACLGRAPH_ZEROCOPY_ENABLE
	ConfigExecTimeout      CommConfigCapability = 8  // HCCL_COMM_CONFIG_EXEC_TIMEOUT: Config.ExecTimeout
	ConfigAlgo             CommConfigCapability = 9  // HCCL_COMM_CONFIG_ALGO
	ConfigRetry            CommConfigCapability = 10 // HCCL_COMM_CONFIG_RETRY
	ConfigBufferName       CommConfigCapability = 11 // HCCL_COMM_CONFIG_BUFFER_NAME
)

// Supported reports whether hcomm's Config has the field: BufferSize,
// Deterministic, CommName, SupportInitByEnv and ExecTimeout.
func (k CommConfigCapability) Supported() bool {
	switch k {
	case ConfigBufferSize, ConfigDeterministic, ConfigCommName, ConfigSupportInitByEnv, ConfigExecTimeout:
		return true
	}
	return false
}

// GetCommConfigCapability returns HCCL's measure of the configuration a
// communicator accepts (HcclGetCommConfigCapability): a field k is
// supported when k < the value returned. HCCL's fields come in the order
// they were added, so its answer is cumulative; hcomm's are not (it has
// ConfigExecTimeout but not ConfigOpExpansionMode), so it returns the first
// field it lacks, ConfigOpExpansionMode (3): what HCCL's rule reads
// correctly. Ask CommConfigCapability.Supported for each field instead.
func GetCommConfigCapability() CommConfigCapability {
	k := ConfigBufferSize
	for k.Supported() {
		k++
	}
	return k
}
