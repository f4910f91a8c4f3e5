package hcomm

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/hcomm-dev/hcomm/internal/bootstrap"
)

// InitFromEnv joins a communicator described by the environment variables of
// the launcher that started this process, so that hcomm programs run under
// the engines people already use. cfg may be nil. The first launcher whose
// rank variable is set wins:
//
//	torchrun, Kubernetes training operators, hcomm run:
//	    RANK, WORLD_SIZE, LOCAL_RANK; MASTER_ADDR and MASTER_PORT (both required)
//	Open MPI's mpirun:
//	    OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK;
//	    the address as below (mpirun -x MASTER_ADDR -x MASTER_PORT passes them)
//	Slurm's srun:
//	    SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; the address as below, else
//	    the first host of SLURM_STEP_NODELIST / SLURM_JOB_NODELIST /
//	    SLURM_NODELIST ("node[03-06,9]" gives node03; one bracket group at most)
//
// Rank 0's bootstrap address, in order: HCOMM_MASTER_ADDR ("host:port");
// MASTER_ADDR with MASTER_PORT, else HCOMM_ROOT_PORT, else DefaultRootPort
// (29500); for srun, the first host of the node list with that port. Rank 0
// listens on that port on every interface, or on the interface of
// HCOMM_SOCKET_IFNAME when it is set. LOCAL_RANK (or its launcher's twin)
// picks the device id; without it the rank does.
//
// The secret: HCOMM_SECRET, any string, shared by every rank (a launcher
// should set a random one per job). Without it the secret is derived from what every rank of
// the job sees — the address, world size and the launcher's job id
// (TORCHELASTIC_RUN_ID, SLURM_JOB_ID.SLURM_STEP_ID, OMPI_MCA_ess_base_jobid) —
// which keeps apart jobs that reuse a port and refuses malformed or stray
// connections, but is no secret from someone who can read those: set
// HCOMM_SECRET where the network is shared.
//
// InitFromEnv is InitFromEnvContext with context.Background().
func InitFromEnv(cfg *Config) (*Comm, error) {
	return InitFromEnvContext(context.Background(), cfg)
}

// InitFromEnvContext is InitFromEnv bounded by ctx as well, as
// InitRootInfoContext is.
func InitFromEnvContext(ctx context.Context, cfg *Config) (*Comm, error) {
	const op = "InitFromEnv"
	c, err := resolveAll(cfg)
	if err != nil {
		return nil, noRankErr(op, c.Name, ErrPara, err, "")
	}
	le, err := parseLaunchEnv(os.Getenv)
	if err != nil {
		return nil, noRankErr(op, c.Name, ErrPara, err, "")
	}
	listen, err := listenAddr(c, le.addr)
	if err != nil {
		return nil, &Error{Op: op, Comm: c.Name, Rank: le.rank, Peer: -1, Code: ErrNetwork, Err: err}
	}
	return join(ctx, op, c, joinSpec{nRanks: le.size, rank: le.rank, localRank: le.localRank, addr: le.addr,
		listen: listen, secret: le.secret})
}

// launchEnv is what InitFromEnv read.
type launchEnv struct {
	launcher              string // "torchrun", "mpirun", "srun"
	rank, size, localRank int
	addr                  string
	secret                bootstrap.Secret
}

// listenAddr is where rank 0 listens for a store dialled at addr: the port
// on every interface, or on HCOMM_SOCKET_IFNAME's.
func listenAddr(c Config, addr string) (string, error) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	if c.SocketIfname == "" {
		return ":" + port, nil
	}
	ifc, err := bootstrap.PickIface(c.SocketIfname)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(ifc.IP.String(), port), nil
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
	var rankVar, sizeVar, localVar, job string
	switch {
	case getenv("RANK") != "":
		le.launcher, rankVar, sizeVar, localVar = "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"
		job = getenv("TORCHELASTIC_RUN_ID")
	case getenv("OMPI_COMM_WORLD_RANK") != "":
		le.launcher, rankVar, sizeVar, localVar = "mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"
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
	if le.addr, err = rootAddrFromEnv(getenv, le.launcher); err != nil {
		return le, err
	}
	if s := getenv("HCOMM_SECRET"); s != "" {
		le.secret = bootstrap.DeriveSecret(s)
	} else {
		le.secret = bootstrap.DeriveSecret(fmt.Sprintf("env\x00%s\x00%d\x00%s\x00%s", le.launcher, le.size, le.addr, job))
	}
	return le, nil
}

// rootAddrFromEnv finds rank 0's store address (see InitFromEnv).
func rootAddrFromEnv(getenv func(string) string, launcher string) (string, error) {
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
