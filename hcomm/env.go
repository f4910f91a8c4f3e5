package hcomm

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/hcomm-dev/hcomm/internal/bootstrap"
	"github.com/hcomm-dev/hcomm/internal/procs"
)

// InitFromEnv joins a communicator described by the environment variables of
// the launcher that started this process, so that hcomm programs run under
// the engines people already use. cfg may be nil. The first launcher whose
// rank variable is set wins:
//
//	torchrun, Kubernetes training operators, hcomm run:
//	    RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE; MASTER_ADDR and
//	    MASTER_PORT (both required)
//	Open MPI's mpirun:
//	    OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
//	    OMPI_COMM_WORLD_LOCAL_SIZE; the address as below (mpirun -x MASTER_ADDR
//	    -x MASTER_PORT passes them), else 127.0.0.1 when every rank is local
//	Slurm's srun:
//	    SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_STEP_TASKS_PER_NODE
//	    with SLURM_NODEID; the address as below, else the first host of
//	    SLURM_STEP_NODELIST / SLURM_JOB_NODELIST / SLURM_NODELIST
//	    ("node[03-06,9]" gives node03; one bracket group at most)
//
// Rank 0's bootstrap address, in order: HCOMM_MASTER_ADDR ("host:port");
// MASTER_ADDR with MASTER_PORT, else HCOMM_ROOT_PORT, else DefaultRootPort
// (29500); for srun, the first host of the node list with that port; for
// mpirun with every rank on one host, 127.0.0.1. Rank 0 listens on that port
// on the interface of HCOMM_SOCKET_IFNAME when it is set, else on the
// address MASTER_ADDR names when it is one of this host's (a host name that
// resolves only to loopback, as /etc/hosts often has it, counts as none),
// else on every interface. A port in use fails rank 0 at once, saying so
// (another job on the port). LOCAL_RANK (or its launcher's twin) picks the
// device id; without it the rank does.
//
// The processors: unless GOMAXPROCS is set, a rank that shares its host with
// others (LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE, Slurm's tasks per
// node) and is not bound to its own processors by the launcher lowers
// GOMAXPROCS to its share of the processors, as hcomm run sets it.
//
// The secret: HCOMM_SECRET, any string, shared by every rank (a launcher
// should set a random one per job). Without it the secret is derived from
// what every rank of the job sees — the launcher, the address and the
// launcher's job id (TORCHELASTIC_RUN_ID, SLURM_JOB_ID.SLURM_STEP_ID,
// OMPI_MCA_ess_base_jobid) — which keeps apart jobs that reuse a port and
// refuses malformed or stray connections, but is no secret from someone who
// can read those: set HCOMM_SECRET where the network is shared. (The world
// size is left out of it on purpose: a rank launched with another WORLD_SIZE
// then reaches the store, which fails the job at once naming it, instead of
// being refused as a stranger while the others wait out the timeout.)
//
// InitFromEnv is InitFromEnvContext with context.Background().
func InitFromEnv(cfg *Config) (*Comm, error) {
	return InitFromEnvContext(context.Background(), cfg)
}

// InitFromEnvContext is InitFromEnv bounded by ctx as well, as
// InitRootInfoContext is.
func InitFromEnvContext(ctx context.Context, cfg *Config) (*Comm, error) {
	const op = "InitFromEnv"
	if ctx == nil {
		return nil, noRankErr(op, "", ErrPara, nil, "nil context")
	}
	c, err := resolveAll(cfg)
	if err != nil {
		return nil, noRankErr(op, c.Name, ErrPara, err, "")
	}
	le, err := parseLaunchEnv(os.Getenv)
	if err != nil {
		return nil, noRankErr(op, c.Name, ErrPara, err, "")
	}
	shareProcessors(os.Getenv, le.localSize, procs.Shared())
	return joinEnv(ctx, op, c, le)
}

// joinEnv joins the communicator le describes.
func joinEnv(ctx context.Context, op string, c Config, le launchEnv) (*Comm, error) {
	listen, err := listenAddr(c, le.addr)
	if err != nil {
		return nil, &Error{Op: op, Comm: c.Name, Rank: le.rank, Peer: -1, Code: ErrNetwork, Err: err}
	}
	return join(ctx, op, c, joinSpec{nRanks: le.size, rank: le.rank, localRank: le.localRank, addr: le.addr,
		listen: listen, secret: le.secret})
}

// shareProcessors lowers GOMAXPROCS to this rank's share of cpus processors
// among local ranks of this host (procs.PerRank, as hcomm run sets it),
// unless GOMAXPROCS is set, the count is unknown (0) or cpus is 0 (the
// launcher bound the rank to its own). It never raises GOMAXPROCS (a cgroup
// limit the runtime found stays). It returns the value set, 0 for none.
func shareProcessors(getenv func(string) string, local, cpus int) int {
	if cpus <= 0 {
		return 0
	}
	g, ok := procs.PerRank(getenv, local, cpus)
	if !ok || g >= runtime.GOMAXPROCS(0) {
		return 0
	}
	runtime.GOMAXPROCS(g)
	return g
}

// launchEnv is what InitFromEnv read.
type launchEnv struct {
	launcher              string // "torchrun", "mpirun", "srun"
	rank, size, localRank int
	localSize             int // ranks on this host, 0 when unknown
	addr                  string
	secret                bootstrap.Secret
}

// listenAddr is where rank 0 listens for a store dialled at addr: on
// HCOMM_SOCKET_IFNAME's interface, else on addr's host when it is an address
// of this host, else on every interface.
func listenAddr(c Config, addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	if c.SocketIfname != "" {
		ifc, err := bootstrap.PickIface(c.SocketIfname)
		if err != nil {
			return "", err
		}
		return net.JoinHostPort(ifc.IP.String(), port), nil
	}
	if ip := localAddr(host); ip != nil {
		return net.JoinHostPort(ip.String(), port), nil
	}
	return ":" + port, nil
}

// localAddr returns the address of this host that host names: an IP
// literal of this host (loopback included: every rank then runs here),
// "localhost", or a name that resolves to a non-loopback address of this
// host; nil otherwise — a name that resolves only to loopback here may
// resolve to the host's real address elsewhere.
func localAddr(host string) net.IP {
	if host == "localhost" {
		return net.IPv4(127, 0, 0, 1)
	}
	mine := func(ip net.IP) bool {
		addrs, err := net.InterfaceAddrs()
		if err != nil {
			return false
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
				return true
			}
		}
		return false
	}
	if ip := net.ParseIP(host); ip != nil {
		if ip.IsLoopback() || mine(ip) {
			return ip
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ips, err := net.DefaultResolver.LookupIP(ctx, "ip", host)
	if err != nil {
		return nil
	}
	for _, ip := range ips {
		if !ip.IsLoopback() && mine(ip) {
			return ip
		}
	}
	return nil
}

func parseLaunchEnv(getenv func(string) string) (launchEnv, error) {
	var le launchEnv
	num := func(name string, min int) (int, error) {
		v := getenv(name)
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < min {
			return 0, fmt.Errorf("environment variable %s=%q: want an integer >= %d", name, v, min)
		}
		return n, nil
	}
	optNum := func(name string) (int, error) {
		if getenv(name) == "" {
			return -1, nil
		}
		return num(name, 0)
	}
	var rankVar, sizeVar, localVar, localSizeVar, job string
	switch {
	case getenv("RANK") != "":
		le.launcher, rankVar, sizeVar, localVar, localSizeVar = "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"
		job = getenv("TORCHELASTIC_RUN_ID")
	case getenv("OMPI_COMM_WORLD_RANK") != "":
		le.launcher, rankVar, sizeVar, localVar, localSizeVar = "mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"
		job = getenv("OMPI_MCA_ess_base_jobid") + getenv("OMPI_MCA_orte_ess_jobid")
	case getenv("SLURM_PROCID") != "":
		le.launcher, rankVar, sizeVar, localVar = "srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"
		if getenv(sizeVar) == "" {
			sizeVar = "SLURM_NPROCS"
		}
		job = getenv("SLURM_JOB_ID") + "." + getenv("SLURM_STEP_ID")
	default:
		return le, fmt.Errorf("no launcher environment: set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun style), " +
			"or run under mpirun (OMPI_COMM_WORLD_*) or srun (SLURM_PROCID, SLURM_NTASKS)")
	}
	var err error
	if le.rank, err = num(rankVar, 0); err != nil {
		return le, err
	}
	if le.size, err = num(sizeVar, 1); err != nil {
		return le, err
	}
	if le.rank >= le.size {
		return le, fmt.Errorf("%s=%d is outside [0, %s=%d)", rankVar, le.rank, sizeVar, le.size)
	}
	if le.localRank, err = optNum(localVar); err != nil {
		return le, err
	}
	if localSizeVar != "" {
		n, err := optNum(localSizeVar)
		if err != nil {
			return le, err
		}
		le.localSize = max(n, 0)
	} else {
		le.localSize = slurmLocalTasks(getenv)
	}
	if le.addr, err = rootAddrFromEnv(getenv, le); err != nil {
		return le, err
	}
	if s := getenv("HCOMM_SECRET"); s != "" {
		le.secret = bootstrap.DeriveSecret(s)
	} else {
		le.secret = bootstrap.DeriveSecret(fmt.Sprintf("env\x00%s\x00%s\x00%s", le.launcher, le.addr, job))
	}
	return le, nil
}

// slurmLocalTasks returns how many tasks of the step run on this node:
// SLURM_STEP_TASKS_PER_NODE (else SLURM_TASKS_PER_NODE; "4(x2),3" means 4,
// 4, 3) at index SLURM_NODEID, or the one count when every node has the
// same; else SLURM_NTASKS_PER_NODE; 0 when unknown.
func slurmLocalTasks(getenv func(string) string) int {
	list := getenv("SLURM_STEP_TASKS_PER_NODE")
	if list == "" {
		list = getenv("SLURM_TASKS_PER_NODE")
	}
	var counts []int
	for _, part := range strings.Split(list, ",") {
		if part == "" {
			continue
		}
		num, rep := part, "1"
		if i := strings.IndexByte(part, '('); i >= 0 && strings.HasPrefix(part[i:], "(x") && strings.HasSuffix(part, ")") {
			num, rep = part[:i], part[i+2:len(part)-1]
		}
		n, err1 := strconv.Atoi(num)
		r, err2 := strconv.Atoi(rep)
		if err1 != nil || err2 != nil || n < 0 || r < 1 || r > MaxRanks {
			counts = nil
			break
		}
		for ; r > 0; r-- {
			counts = append(counts, n)
		}
	}
	if len(counts) > 0 {
		same := true
		for _, n := range counts {
			same = same && n == counts[0]
		}
		if same {
			return counts[0]
		}
		if id, err := strconv.Atoi(getenv("SLURM_NODEID")); err == nil && id >= 0 && id < len(counts) {
			return counts[id]
		}
	}
	if n, err := strconv.Atoi(getenv("SLURM_NTASKS_PER_NODE")); err == nil && n > 0 {
		return n
	}
	return 0
}

// rootAddrFromEnv finds rank 0's store address (see InitFromEnv).
func rootAddrFromEnv(getenv func(string) string, le launchEnv) (string, error) {
	launcher := le.launcher
	if a := getenv("HCOMM_MASTER_ADDR"); a != "" {
		return checkHostPort("HCOMM_MASTER_ADDR", a)
	}
	port := getenv("MASTER_PORT")
	portVar := "MASTER_PORT"
	if port == "" {
		port, portVar = getenv("HCOMM_ROOT_PORT"), "HCOMM_ROOT_PORT"
	}
	if launcher == "torchrun" && (getenv("MASTER_ADDR") == "" || getenv("MASTER_PORT") == "") {
		return "", fmt.Errorf("RANK is set but MASTER_ADDR=%q, MASTER_PORT=%q: set both (or HCOMM_MASTER_ADDR=host:port)",
			getenv("MASTER_ADDR"), getenv("MASTER_PORT"))
	}
	if port == "" {
		port, portVar = strconv.Itoa(DefaultRootPort), "the default port"
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return "", fmt.Errorf("%s=%q is not a port in [1, 65535]", portVar, port)
	}
	host := getenv("MASTER_ADDR")
	if host == "" && launcher == "srun" {
		list := getenv("SLURM_STEP_NODELIST")
		for _, v := range []string{"SLURM_JOB_NODELIST", "SLURM_NODELIST"} {
			if list == "" {
				list = getenv(v)
			}
		}
		h, err := firstSlurmHost(list)
		if err != nil {
			return "", fmt.Errorf("%v: set MASTER_ADDR (or HCOMM_MASTER_ADDR=host:port)", err)
		}
		host = h
	}
	if host == "" && launcher == "mpirun" && le.localSize == le.size {
		host = "127.0.0.1" // every rank runs on this host
	}
	if host == "" {
		return "", fmt.Errorf("%s gives no address for rank 0's bootstrap store: set MASTER_ADDR (and MASTER_PORT), or HCOMM_MASTER_ADDR=host:port", launcher)
	}
	return checkHostPort("MASTER_ADDR", net.JoinHostPort(host, port))
}

func checkHostPort(name, a string) (string, error) {
	h, p, err := net.SplitHostPort(a)
	if err != nil {
		return "", fmt.Errorf("%s=%q: %v", name, a, err)
	}
	if n, err := strconv.Atoi(p); h == "" || err != nil || n < 1 || n > 65535 {
		return "", fmt.Errorf("%s=%q: want host:port with a port in [1, 65535]", name, a)
	}
	return a, nil
}

// firstSlurmHost returns the first host of a Slurm node list: "a,b" gives a,
// "gpu[03-06,9],cpu1" gives gpu03, "n[1-2]-ib" gives n1-ib. Lists with more
// than one bracket group in the first entry are refused.
func firstSlurmHost(list string) (string, error) {
	list = strings.TrimSpace(list)
	if list == "" {
		return "", fmt.Errorf("srun: no node list (SLURM_STEP_NODELIST, SLURM_JOB_NODELIST, SLURM_NODELIST)")
	}
	depth, end := 0, len(list)
	for i, r := range list {
		switch r {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			if depth == 0 && end == len(list) {
				end = i
			}
		}
	}
	first := list[:end]
	open := strings.IndexByte(first, '[')
	if open < 0 {
		if strings.ContainsAny(first, "]") {
			return "", fmt.Errorf("srun: node list %q is malformed", list)
		}
		return first, nil
	}
	closeAt := strings.IndexByte(first, ']')
	if closeAt < open || strings.Count(first, "[") != 1 || strings.Count(first, "]") != 1 || open == 0 {
		return "", fmt.Errorf("srun: node list %q is too complex for hcomm to read", list)
	}
	inner := first[open+1 : closeAt]
	lo, _, _ := strings.Cut(inner, ",")
	lo, _, _ = strings.Cut(lo, "-")
	if lo == "" || strings.Trim(lo, "0123456789") != "" {
		return "", fmt.Errorf("srun: node list %q has a bad range %q", list, inner)
	}
	return first[:open] + lo + first[closeAt+1:], nil
}
