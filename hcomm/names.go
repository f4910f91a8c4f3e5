package hcomm

import (
	"sort"
	"strconv"
	"strings"
	"sync"
)

// The communicators of this process by name, for CommGetHandleWithName.
// Every communicator is added when it is made and removed when it is
// destroyed. Names are not required to be unique: the ranks of an InitAll
// share their communicator's name, and two communicators made with the same
// Config.Name share it too; a lookup that matches more than one fails
// rather than pick one.
var commNames struct {
	mu sync.Mutex
	m  map[string][]*Comm
}

func registerName(c *Comm) {
	commNames.mu.Lock()
	defer commNames.mu.Unlock()
	if commNames.m == nil {
		commNames.m = make(map[string][]*Comm)
	}
	commNames.m[c.name] = append(commNames.m[c.name], c)
}

func unregisterName(c *Comm) {
	commNames.mu.Lock()
	defer commNames.mu.Unlock()
	cs := commNames.m[c.name]
	for i, x := range cs {
		if x == c {
			cs = append(cs[:i:i], cs[i+1:]...)
			break
		}
	}
	if len(cs) == 0 {
		delete(commNames.m, c.name)
		return
	}
	commNames.m[c.name] = cs
}

// GetCommName returns the communicator's name (HcclGetCommName): its
// Config.Name, "comm0" by default. It is the same on every rank.
func (c *Comm) GetCommName() string { return c.Name() }

// CommGetHandleWithName returns the live communicator of this process named
// name (HcclCommGetHandleWithName). Safe for concurrent use.
//
// Errors: ErrNotFound when no live communicator has the name (never made,
// or destroyed); ErrPara when several have it — the ranks of an InitAll
// share their communicator's name, as may two communicators given the same
// Config.Name — naming their ranks; CommGetHandleWithRank picks one.
// Departure: HCCL has one communicator of a name per process, so its lookup
// cannot be ambiguous.
func CommGetHandleWithName(name string) (*Comm, error) {
	return lookupName("CommGetHandleWithName", name, -1)
}

// CommGetHandleWithRank returns the live communicator of this process named
// name whose rank is rank: CommGetHandleWithName for the ranks of an InitAll,
// which share one name. hcomm's; HCCL has no such call. Errors as
// CommGetHandleWithName's.
func CommGetHandleWithRank(name string, rank int) (*Comm, error) {
	return lookupName("CommGetHandleWithRank", name, rank)
}

func lookupName(op, name string, rank int) (*Comm, error) {
	commNames.mu.Lock()
	var match []*Comm
	for _, c := range commNames.m[name] {
		if rank < 0 || c.rank == rank {
			match = append(match, c)
		}
	}
	commNames.mu.Unlock()
	switch len(match) {
	case 1:
		return match[0], nil
	case 0:
		if rank >= 0 {
			return nil, noRankErr(op, name, ErrNotFound, nil, "no live communicator of this process is named %q with rank %d", name, rank)
		}
		return nil, noRankErr(op, name, ErrNotFound, nil, "no live communicator of this process is named %q", name)
	}
	ranks := make([]int, len(match))
	for i, c := range match {
		ranks[i] = c.rank
	}
	sort.Ints(ranks)
	rs := make([]string, len(ranks))
	for i, r := range ranks {
		rs[i] = strconv.Itoa(r)
	}
	hint := "; CommGetHandleWithRank picks one rank"
	if rank >= 0 {
		hint = "; give the communicators different Config.Name"
	}
	return nil, noRankErr(op, name, ErrPara, nil, "%d live communicators of this process are named %q (ranks %s)%s", len(match), name, strings.Join(rs, ", "), hint)
}

// errorStrings are HCCL's texts of HcclGetErrorString, code by code.
var errorStrings = [...]string{
	Success:         "no error",
	ErrPara:         "parameter error",
	ErrPtr:          "empty pointer",
	ErrMemory:       "memory error",
	ErrInternal:     "internal error",
	ErrNotSupport:   "not support feature",
	ErrNotFound:     "not found specific resource",
	ErrUnavail:      "resource unavailable",
	ErrSyscall:      "call system interface error",
	ErrTimeout:      "timeout",
	ErrOpenFile:     "open file fail",
	ErrTCPConnect:   "tcp connect fail",
	ErrROCEConnect:  "roce connect fail",
	ErrTCPTransfer:  "tcp transfer fail",
	ErrROCETransfer: "roce transfer fail",
	ErrRuntime:      "call runtime api fail",
	ErrDrv:          "call driver api fail",
	ErrProfiling:    "call profiling api fail",
	ErrCCE:          "call cce api fail",
	ErrNetwork:      "call network api fail",
	ErrAgain:        "try again",
	ErrRemote:       "error cqe",
	ErrSuspending:   "communicator suspending",
	ErrOpRetryFail:  "op retry fail",
	ErrOOM:          "out of memory",
}

// GetErrorString returns HCCL's text for a result code (HcclGetErrorString):
// "no error" for Success, "parameter error" for ErrPara, "error cqe" for
// ErrRemote, and so on; "unknow error" (HCCL's spelling) for a code outside
// HCCL's range. HCCL's table stops at HCCL_E_REMOTE: the texts of
// ErrSuspending, ErrOpRetryFail and ErrOOM are hcomm's. Result.Error gives
// the code's name instead ("HCCL_E_PARA (HcclResult 1)").
func GetErrorString(r Result) string {
	if r < 0 || int(r) >= len(errorStrings) || errorStrings[r] == "" {
		return "unknow error"
	}
	return errorStrings[r]
}
