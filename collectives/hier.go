package collectives

import (
	"fmt"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// The two-level all-reduce (HCCL's level0/level1): ranks are grouped by host
// (hcomm's HostOf: the ranks that reach each other through shared memory);
// each group reduces to its first rank over shared memory, those leaders —
// one per host — all-reduce among themselves over the network, and each
// leader broadcasts the result to its group. Only one rank per host sends
// anything across the network, and the network carries each host's data
// once instead of the flat ring's n-1 times per link. The levels are
// sub-communicators, made at the first two-level collective and kept until
// the communicator is destroyed; each level runs the algorithm its own
// selector picks for its transport.

// hier is a communicator's two-level structure.
type hier struct {
	hosts   int         // number of host groups
	local   *hcomm.Comm // this rank's group (rank 0 is the leader)
	leaders *hcomm.Comm // the leaders, one per host; nil on other ranks
}

// Sub-communicator ids of the two levels (unique among the communicator's
// sub-communicators as long as callers keep their own ids below 1<<62).
const (
	hierLocalID   = 1<<62 + 1<<20 // + host index
	hierLeadersID = 1<<62 + 1<<21
)

// hierarchy returns the communicator's two-level structure, making the
// sub-communicators at the first call (collective: every rank calls it at the
// same collective).
func (st *state) hierarchy() (*hier, error) {
	if st.hier != nil {
		return st.hier, nil
	}
	c := st.comm
	index := map[string]int{}
	var groups [][]int
	for r := 0; r < c.Size(); r++ {
		h := c.HostOf(r)
		i, ok := index[h]
		if !ok {
			i = len(groups)
			index[h] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], r)
	}
	mine := index[c.HostOf(c.Rank())]
	h := &hier{hosts: len(groups)}
	var err error
	if h.local, err = c.CreateSubComm(groups[mine], uint64(hierLocalID+mine), nil); err != nil {
		return nil, fmt.Errorf("two-level collectives: the group of host %d: %w", mine, err)
	}
	if groups[mine][0] == c.Rank() {
		leaders := make([]int, len(groups))
		for i, g := range groups {
			leaders[i] = g[0]
		}
		if h.leaders, err = c.CreateSubComm(leaders, hierLeadersID, nil); err != nil {
			h.local.Destroy()
			return nil, fmt.Errorf("two-level collectives: the leaders: %w", err)
		}
	}
	st.hier = h
	return h, nil
}

// close destroys the levels.
func (h *hier) close() {
	if h.leaders != nil {
		h.leaders.Destroy()
	}
	h.local.Destroy()
}

// multiHost reports whether the communicator spans hosts with several ranks
// on at least one of them: where the two-level schedule pays.
func multiHost(c *hcomm.Comm) bool {
	hosts := map[string]int{}
	for r := 0; r < c.Size(); r++ {
		hosts[c.HostOf(r)]++
	}
	if len(hosts) < 2 {
		return false
	}
	for _, k := range hosts {
		if k > 1 {
			return true
		}
	}
	return false
}

// allReduceHier issues the two-level all-reduce on s.
func allReduceHier(sc *sched, s *device.Stream, send, recv device.Ptr, count int64, dt hcomm.DataType, op hcomm.ReduceOp) {
	if !sc.ok() {
		return
	}
	h, err := sc.st.hierarchy()
	if err != nil {
		sc.do(err)
		return
	}
	sc.do(Reduce(send, recv, count, dt, op, 0, h.local, s, nil))
	if sc.ok() && h.leaders != nil {
		sc.do(AllReduce(recv, recv, count, dt, op, h.leaders, s, nil))
	}
	if sc.ok() {
		sc.do(Broadcast(recv, count, dt, 0, h.local, s, nil))
	}
}
