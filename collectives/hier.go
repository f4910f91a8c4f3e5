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
	groups  [][]int     // the ranks of each host, ascending; hosts in the order of their first rank
	mine    int         // this rank's host: its index in groups and its rank among the leaders
	local   *hcomm.Comm // this rank's group (rank 0 is the leader); nil until the first two-level collective
	leaders *hcomm.Comm // the leaders, one per host; nil on other ranks
}

// hostGroups returns the ranks of each host of c (by HostOf), ascending,
// hosts in the order of their first rank, and the index of c's rank's host.
func hostGroups(c *hcomm.Comm) (groups [][]int, mine int) {
	index := map[string]int{}
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
	return groups, index[c.HostOf(c.Rank())]
}

// shape returns the communicator's host groups without making the levels'
// sub-communicators (the selector's view: hierarchy makes them).
func (st *state) shape() *hier {
	if st.hier == nil {
		groups, mine := hostGroups(st.comm)
		st.hier = &hier{hosts: len(groups), groups: groups, mine: mine}
	}
	return st.hier
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
	h := st.shape()
	if h.local != nil {
		return h, nil
	}
	c := st.comm
	groups, mine := h.groups, h.mine
	local, err := c.CreateSubComm(groups[mine], uint64(hierLocalID+mine), nil)
	if err != nil {
		return nil, fmt.Errorf("two-level collectives: the group of host %d: %w", mine, err)
	}
	if groups[mine][0] == c.Rank() {
		leaders := make([]int, len(groups))
		for i, g := range groups {
			leaders[i] = g[0]
		}
		if h.leaders, err = c.CreateSubComm(leaders, hierLeadersID, nil); err != nil {
			local.Destroy()
			return nil, fmt.Errorf("two-level collectives: the leaders: %w", err)
		}
	}
	h.local = local
	return h, nil
}

// close destroys the levels.
func (h *hier) close() {
	if h.leaders != nil {
		h.leaders.Destroy()
	}
	if h.local != nil {
		h.local.Destroy()
	}
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

// levels returns the communicator's two levels for a two-level schedule
// (making them at the first), or false when the call has failed already or
// their making failed it.
func (sc *sched) levels() (*hier, bool) {
	if !sc.ok() {
		return nil, false
	}
	h, err := sc.st.hierarchy()
	if err != nil {
		sc.do(err)
		return nil, false
	}
	return h, true
}

// allReduceHier issues the two-level all-reduce on s.
func allReduceHier(sc *sched, s *device.Stream, send, recv device.Ptr, count int64, dt hcomm.DataType, op hcomm.ReduceOp) {
	h, ok := sc.levels()
	if !ok {
		return
	}
	sc.do(Reduce(send, recv, count, dt, op, 0, h.local, s, levelOptions))
	if sc.ok() && h.leaders != nil {
		sc.do(AllReduce(recv, recv, count, dt, op, h.leaders, s, levelOptions))
	}
	if sc.ok() {
		sc.do(Broadcast(recv, count, dt, 0, h.local, s, levelOptions))
	}
}

// allGatherHier issues the two-level all-gather on s of count elements per
// rank: within each host every rank gathers the host's blocks, each at its
// place in recv (an AllGatherV over the host's shared memory); the leaders
// then exchange their hosts' blocks over the network (one all-gather when
// every host holds the same number of consecutive ranks, as launchers
// place them; else one AllGatherV per run of consecutive ranks that the
// most fragmented host has); and each leader broadcasts the whole output
// to its host. The network carries each block once per leader link rather
// than once per rank, in log or ring steps among hosts rather than ranks.
// In place (send is this rank's block of recv) as the flat forms.
func allGatherHier(sc *sched, s *device.Stream, send, recv device.Ptr, count int64, dt hcomm.DataType) {
	h, ok := sc.levels()
	if !ok {
		return
	}
	es := int64(dt.Size())
	g := h.groups[h.mine]
	counts, displs := make([]int64, len(g)), make([]int64, len(g))
	for i, r := range g {
		counts[i], displs[i] = count, int64(r)*count
	}
	sc.do(AllGatherV(send, count, recv, counts, displs, dt, h.local, s, levelOptions))
	if sc.ok() && h.leaders != nil {
		hostRuns, most := runsOf(h.groups)
		if most == 1 && uniformHosts(h.groups) {
			m := int64(len(g)) * count
			sc.do(AllGather(recv.Add(int64(g[0])*count*es), recv, m, dt, h.leaders, s, levelOptions))
		} else {
			lc, ld := make([]int64, len(h.groups)), make([]int64, len(h.groups))
			for j := 0; j < most && sc.ok(); j++ {
				for i, runs := range hostRuns {
					lc[i], ld[i] = 0, 0
					if j < len(runs) {
						lc[i], ld[i] = int64(runs[j][1])*count, int64(runs[j][0])*count
					}
				}
				sc.do(AllGatherV(recv.Add(ld[h.mine]*es), lc[h.mine], recv, lc, ld, dt, h.leaders, s, levelOptions))
			}
		}
	}
	if sc.ok() {
		sc.do(Broadcast(recv, int64(sc.st.comm.Size())*count, dt, 0, h.local, s, levelOptions))
	}
}

// uniformHosts reports whether host i holds ranks [i·m, (i+1)·m) for one m:
// the leaders' blocks are then equal and in their order, an all-gather's.
func uniformHosts(groups [][]int) bool {
	m := len(groups[0])
	for i, g := range groups {
		if len(g) != m || g[0] != i*m || g[m-1] != (i+1)*m-1 {
			return false
		}
	}
	return true
}

// broadcastHier issues the two-level broadcast on s: root's data reaches
// its host's leader (a broadcast within root's host, from root, when root
// does not lead it), the leaders broadcast it among themselves from root's
// host, and each leader broadcasts it within its host (root's host last
// when root leads it, so that the network step goes first).
func broadcastHier(sc *sched, s *device.Stream, buf device.Ptr, count int64, dt hcomm.DataType, root int) {
	h, ok := sc.levels()
	if !ok {
		return
	}
	rh, rl := 0, 0 // root's host and its rank there
	for i, g := range h.groups {
		for j, r := range g {
			if r == root {
				rh, rl = i, j
			}
		}
	}
	if h.mine == rh && rl != 0 {
		sc.do(Broadcast(buf, count, dt, rl, h.local, s, levelOptions))
	}
	if sc.ok() && h.leaders != nil {
		sc.do(Broadcast(buf, count, dt, rh, h.leaders, s, levelOptions))
	}
	if sc.ok() && (h.mine != rh || rl == 0) {
		sc.do(Broadcast(buf, count, dt, 0, h.local, s, levelOptions))
	}
}

// hierScratch is the part of this rank's HCCL buffer that a two-level
// reduce-scatter works in: the inbox, gather and scratch slots, which no
// peer touches while the call's levels run on their own sub-communicators
// (every earlier collective drained its pipes and gather slots, and no
// later one starts on a peer before this rank has answered its handshake,
// which its stream issues after this call's levels).
func (st *state) hierScratch() (device.Ptr, int64) {
	return st.buf.Add(st.lay.inboxOff), st.lay.bufSize - st.lay.inboxOff
}

// hierRSFits reports whether the two-level reduce-scatter of count
// elements of es bytes per rank fits the leaders' working space: the whole
// input summed over the host, then the host's blocks summed over every host.
func hierRSFits(st *state, count, es int64) bool {
	_, room := st.hierScratch()
	m := 0
	for _, g := range st.shape().groups {
		m = max(m, len(g))
	}
	need := (int64(st.comm.Size()) + int64(m)) * count * es
	return count <= room/es && need <= room
}

// reduceScatterHier issues the two-level reduce-scatter on s of count
// elements per rank: within each host the whole input is reduced to the
// leader (shared memory), into its HCCL buffer's working space
// (hierScratch); the leaders reduce-scatter it among themselves over the
// network, each keeping its host's blocks (one ReduceScatterV per run of
// consecutive ranks that the most fragmented host has: one where hosts
// hold consecutive ranks); and each leader scatters its host's blocks to
// their ranks. The network carries n-1 blocks' worth per leader in as
// many steps as there are hosts, not ranks. hierRSFits must hold.
func reduceScatterHier(sc *sched, s *device.Stream, send, recv device.Ptr, count int64, dt hcomm.DataType, op hcomm.ReduceOp) {
	h, ok := sc.levels()
	if !ok {
		return
	}
	st := sc.st
	es, n := int64(dt.Size()), int64(st.comm.Size())
	whole, _ := st.hierScratch()      // the host's sum of the whole input (leaders)
	mine := whole.Add(n * count * es) // the host's blocks, summed over every host (leaders)
	sc.do(Reduce(send, whole, n*count, dt, op, 0, h.local, s, levelOptions))
	if sc.ok() && h.leaders != nil {
		hostRuns, most := runsOf(h.groups)
		lc, ld := make([]int64, len(h.groups)), make([]int64, len(h.groups))
		var done int64 // elements of this host's blocks reduced so far
		for j := 0; j < most && sc.ok(); j++ {
			for i, runs := range hostRuns {
				lc[i], ld[i] = 0, 0
				if j < len(runs) {
					lc[i], ld[i] = int64(runs[j][1])*count, int64(runs[j][0])*count
				}
			}
			sc.do(ReduceScatterV(whole, lc, ld, mine.Add(done*es), lc[h.mine], dt, op, h.leaders, s, levelOptions))
			done += lc[h.mine]
		}
	}
	if sc.ok() {
		sc.do(Scatter(mine, recv, count, dt, 0, h.local, s, levelOptions))
	}
}

// hierA2AFits reports whether the two-level all-to-all of bytes per rank
// (its whole send buffer) can run: hosts holding m consecutive ranks each
// (uniformHosts: a host's blocks for another host are then one run of its
// send buffer), and room in the leaders' working space for the host's send
// buffers twice (gathered, then packed for the hosts).
func hierA2AFits(st *state, bytes int64) bool {
	h := st.shape()
	if h.hosts < 2 || !uniformHosts(h.groups) {
		return false
	}
	_, room := st.hierScratch()
	m := int64(len(h.groups[0]))
	return bytes <= room/(2*m)
}

// alltoAllHier issues the two-level all-to-all on s of block bytes per
// peer: within each host the ranks' whole send buffers are gathered to the
// leader (shared memory), into its HCCL buffer's working space
// (hierScratch); the leader packs, for each host, what its ranks send there
// — m runs of m blocks, one from each of its ranks, since hosts hold
// consecutive ranks — and the leaders exchange the packs (an all-to-all
// among the hosts, m·m blocks to a pair); each leader then sorts what came
// into its ranks' receive orders and scatters them. The network carries
// hosts-1 messages a leader, each of m·m blocks, where the flat schedule
// sends (n-m)·m of one block from each host; it pays for it with the
// gather, the scatter and two passes over the host's blocks in the
// leader. hierA2AFits must hold.
func alltoAllHier(sc *sched, s *device.Stream, send, recv device.Ptr, block int64) {
	h, ok := sc.levels()
	if !ok {
		return
	}
	st := sc.st
	n, hosts, m := int64(st.comm.Size()), int64(h.hosts), int64(len(h.groups[h.mine]))
	whole := n * block       // a rank's send (and receive) buffer
	a, _ := st.hierScratch() // the host's send buffers, then what came from the hosts, (leaders)
	b := a.Add(m * whole)    // the packs for the hosts, then the host's receive buffers (leaders)
	sc.do(Gather(send, a, whole, hcomm.Uint8, 0, h.local, s, levelOptions))
	if sc.ok() && h.leaders != nil {
		// a holds rank i's send buffer at i·whole; the blocks for host g
		// are its g·m … g·m+m-1: to b[g][i].
		sc.launchStop("alltoall hier pack", func(<-chan struct{}) error {
			return st.permute(a, b, m*whole, func(from, to []byte) {
				for g := int64(0); g < hosts; g++ {
					for i := int64(0); i < m; i++ {
						copy(to[(g*m+i)*m*block:(g*m+i+1)*m*block], from[i*whole+g*m*block:i*whole+(g+1)*m*block])
					}
				}
			})
		})
		sc.do(AlltoAll(b, m*m*block, hcomm.Uint8, a, m*m*block, hcomm.Uint8, h.leaders, s, levelOptions))
		// a holds host g's pack at g·m·m·block: its rank i's block for
		// this host's rank j at (i·m + j)·block; rank j receives it as
		// the block of rank g·m+i.
		sc.launchStop("alltoall hier unpack", func(<-chan struct{}) error {
			return st.permute(a, b, m*whole, func(from, to []byte) {
				for g := int64(0); g < hosts; g++ {
					for i := int64(0); i < m; i++ {
						for j := int64(0); j < m; j++ {
							src := ((g*m+i)*m + j) * block
							dst := j*whole + (g*m+i)*block
							copy(to[dst:dst+block], from[src:src+block])
						}
					}
				}
			})
		})
	}
	if sc.ok() {
		sc.do(Scatter(b, recv, whole, hcomm.Uint8, 0, h.local, s, levelOptions))
	}
}

// permute maps n bytes at from and at to in this rank's memory, lets move
// rearrange them, and flushes to.
func (st *state) permute(from, to device.Ptr, n int64, move func(from, to []byte)) error {
	dev := st.comm.Device()
	f, err := dev.Map(from, n)
	if err != nil {
		return err
	}
	defer f.Unmap()
	t, err := dev.Map(to, n)
	if err != nil {
		return err
	}
	defer t.Unmap()
	move(f.Bytes(), t.Bytes())
	return t.Flush(0, n)
}

// runsOf returns each host's runs of consecutive ranks (first, length), in
// order, and the most runs any host has.
func runsOf(groups [][]int) (runs [][][2]int, most int) {
	runs = make([][][2]int, len(groups))
	for i, grp := range groups {
		for j, r := range grp {
			if j > 0 && r == grp[j-1]+1 {
				runs[i][len(runs[i])-1][1]++
				continue
			}
			runs[i] = append(runs[i], [2]int{r, 1})
		}
		most = max(most, len(runs[i]))
	}
	return runs, most
}
