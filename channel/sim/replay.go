package sim

import (
	"container/heap"
	"fmt"
	"math"
	"sync"
)

// The ranks' goroutines run a case in whatever order the Go scheduler
// picks, and their virtual times cannot be known while they run: a
// processor of a crowded host, or a NIC, goes to whichever charge reaches
// it first in virtual time, which a goroutine that runs ahead cannot know.
// So a case is traced and replayed: each rank's charges are recorded in the
// order its streams make them (a trace), with the messages each wait
// waited for, and Finish replays every rank's trace as a discrete-event
// simulation — charges taken in the order of their virtual start times,
// ties by rank — which places each on its host's processors and NIC first
// come, first served. The replay is deterministic: the same schedule on the
// same profile gives the same times, however the goroutines ran.
//
// The per-rank order is causal: a message is recorded when its stream sends
// it, a wait when it has returned, so every message a wait depends on is
// recorded before it, and the replay can always go on.

// opKind is what a traced charge is.
type opKind uint8

const (
	// opWork is d of processor time, lat after the rank's clock and after
	// every message of after has arrived (a fence, a read's round trip, a
	// local copy).
	opWork opKind = iota
	// opSend is a message: d of processor time (and of the host's NIC when
	// nic), arriving lat after it ends, then far of processor time on host
	// farHost (a reduction at the far end), and never before message prev.
	opSend
	// opWait is a wait that returned: at the latest arrival of after (and
	// the wake-up after it when the wait blocked on a crowded host), d of
	// processor time.
	opWait
)

// charge is one traced charge of a rank.
type charge struct {
	kind    opKind
	nic     bool
	farHost int32
	ev      int32   // opSend: the message
	prev    int32   // opSend: the channel's previous message, or -1
	after   []int32 // opWork, opWait: messages to wait for
	d       float64 // seconds of processor time
	lat     float64 // seconds of latency
	far     float64 // opSend: seconds of processor time at the far end
}

// trace is what a World records between Reset and Finish.
type trace struct {
	mu   sync.Mutex
	ops  [][]charge // by rank
	msgs int32      // messages recorded
}

// message allocates a message of the trace.
func (tr *trace) message() int32 {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.msgs++
	return tr.msgs - 1
}

// record appends o to rank r's trace.
func (tr *trace) record(r int, o charge) {
	tr.mu.Lock()
	tr.ops[r] = append(tr.ops[r], o)
	tr.mu.Unlock()
}

// reset empties the trace of n ranks.
func (tr *trace) reset(n int) {
	tr.mu.Lock()
	if tr.ops == nil {
		tr.ops = make([][]charge, n)
	}
	for r := range tr.ops {
		tr.ops[r] = tr.ops[r][:0]
	}
	tr.msgs = 0
	tr.mu.Unlock()
}

// job is a charge ready to be placed: rank's next op, or (rank −1) the far
// end's processor time of message ev.
type job struct {
	t    float64
	rank int
	ev   int32
}

type jobs []job

func (h jobs) Len() int { return len(h) }
func (h jobs) Less(i, j int) bool {
	if h[i].t != h[j].t {
		return h[i].t < h[j].t
	}
	if h[i].rank != h[j].rank {
		return h[i].rank < h[j].rank
	}
	return h[i].ev < h[j].ev
}
func (h jobs) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *jobs) Push(x any)   { *h = append(*h, x.(job)) }
func (h *jobs) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// msgState is a message in the replay.
type msgState struct {
	done    bool
	arrive  float64 // once done
	landed  float64 // once its send is placed: its own arrival, far work included
	ranks   []int   // ranks whose next op waits for it
	settles []int32 // messages that wait for it to arrive (their prev)
}

// replay is the state of one Finish.
type replay struct {
	w     *World
	ops   [][]charge
	now   []float64
	next  []int
	msgs  []msgState
	sends []charge // each message's send op
	procs [][]float64
	nics  []float64
	q     jobs
}

// Finish replays the trace recorded since Reset and returns the time each
// rank's last charge ends, in seconds. Call it only once every rank's
// streams are synchronized. It fails when the trace cannot be replayed (a
// wait on a message never sent), which a case that completed cannot
// produce.
func (w *World) Finish() ([]float64, error) {
	w.tr.mu.Lock()
	defer w.tr.mu.Unlock()
	n := len(w.tr.ops)
	rp := &replay{w: w, ops: w.tr.ops, now: make([]float64, n), next: make([]int, n),
		msgs: make([]msgState, w.tr.msgs), sends: make([]charge, w.tr.msgs),
		procs: make([][]float64, w.p.Hosts), nics: make([]float64, w.p.Hosts)}
	if w.p.Cores > 0 && w.p.OversubExp == 0 { // the slowdown model shares nothing
		for h := range rp.procs {
			rp.procs[h] = make([]float64, w.p.Cores)
		}
	}
	for r := range rp.ops {
		for _, o := range rp.ops[r] {
			if o.kind == opSend {
				rp.sends[o.ev] = o
			}
		}
	}
	for r := range n {
		rp.ready(r)
	}
	for rp.q.Len() > 0 {
		j := heap.Pop(&rp.q).(job)
		if j.rank < 0 {
			s := rp.sends[j.ev]
			rp.landed(j.ev, rp.place(int(s.farHost), j.t, s.far))
			continue
		}
		rp.run(j.rank, j.t)
	}
	for r := range n {
		if rp.next[r] < len(rp.ops[r]) {
			return nil, fmt.Errorf("sim: the trace stalls: rank %d's charge %d of %d waits for a message never sent", r, rp.next[r], len(rp.ops[r]))
		}
	}
	return rp.now, nil
}

// ready queues rank r's next op once the messages it waits for have
// arrived; until then it waits on the first that has not.
func (rp *replay) ready(r int) {
	if rp.next[r] >= len(rp.ops[r]) {
		return
	}
	o := &rp.ops[r][rp.next[r]]
	t := rp.now[r]
	for _, m := range o.after {
		ms := &rp.msgs[m]
		if !ms.done {
			ms.ranks = append(ms.ranks, r)
			return
		}
		t = max(t, ms.arrive)
	}
	if o.kind == opWork {
		t += o.lat
	}
	heap.Push(&rp.q, job{t: t, rank: r})
}

// run places rank r's next op, which can start at t.
func (rp *replay) run(r int, t float64) {
	o := &rp.ops[r][rp.next[r]]
	host := rp.w.Host(r)
	switch o.kind {
	case opWork:
		rp.now[r] = rp.place(host, t, o.d)
	case opWait:
		d := o.d
		if t > rp.now[r] && rp.w.crowded {
			d += rp.w.switching // it slept, and is switched back in
			if rp.idle(host, t) {
				t += rp.w.wake // on a halted processor
			}
		}
		rp.now[r] = rp.place(host, t, d)
	case opSend:
		if o.nic {
			t = max(t, rp.nics[host])
		}
		end := rp.place(host, t, o.d)
		if o.nic {
			rp.nics[host] = end
		}
		rp.now[r] = end
		at := end + o.lat
		if o.far > 0 {
			heap.Push(&rp.q, job{t: at, rank: -1, ev: o.ev})
		} else {
			rp.landed(o.ev, at)
		}
	}
	rp.next[r]++
	rp.ready(r)
}

// landed notes that message m's bytes are in place at t; it has arrived
// once the channel's previous message has too.
func (rp *replay) landed(m int32, t float64) {
	ms := &rp.msgs[m]
	ms.landed = t
	rp.settle(m)
}

// settle marks message m arrived when it and its channel's previous
// message are in, and then the messages that waited for it.
func (rp *replay) settle(m int32) {
	for {
		ms := &rp.msgs[m]
		at := ms.landed
		if p := rp.sends[m].prev; p >= 0 {
			ps := &rp.msgs[p]
			if !ps.done {
				ps.settles = append(ps.settles, m)
				return
			}
			at = max(at, ps.arrive)
		}
		ms.done, ms.arrive = true, at
		ranks, settles := ms.ranks, ms.settles
		ms.ranks, ms.settles = nil, nil
		for _, r := range ranks {
			rp.ready(r)
		}
		if len(settles) == 0 {
			return
		}
		m = settles[0] // a message is the previous of one at most
	}
}

// place runs d seconds of host's processor time from t on the processor
// free earliest (first come, first served) and returns when it ends; on a
// processor of its own without Profile.Cores.
func (rp *replay) place(host int, t, d float64) float64 {
	ps := rp.procs[host]
	if len(ps) == 0 || d <= 0 {
		return t + max(d, 0)
	}
	best := 0
	for i, f := range ps {
		if f <= t {
			best = i
			break
		}
		if f < ps[best] {
			best = i
		}
	}
	end := math.Max(t, ps[best]) + d
	ps[best] = end
	return end
}

// idle reports whether a processor of host has nothing to run at t.
func (rp *replay) idle(host int, t float64) bool {
	for _, f := range rp.procs[host] {
		if f <= t {
			return true
		}
	}
	return len(rp.procs[host]) == 0
}
