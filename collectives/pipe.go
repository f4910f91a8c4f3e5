package collectives

import (
	"fmt"

	"github.com/hcomm-dev/hcomm/device"
)

// Two ways for a piece of data to cross from one rank to another, both built
// from the data-plane ops only:
//
//   - a pipe: the sender writes the piece into its slot of the receiver's
//     inbox (two slots per sender, used in turn) and records nData; the
//     receiver consumes it and records nAck, after which the sender may write
//     that slot again. Used where each piece has one receiver that combines
//     it with something of its own (ring reduce-scatter, all-to-all, send/recv).
//   - a gather slot: the owner puts a piece into one of its own two gather
//     slots and records nReady to its readers; each reader reads the piece
//     straight into its output and records nDone. Used where a piece has
//     several receivers that only copy it (all-gather, broadcast): one copy
//     per receiver, where a pipe would cost a write and a copy.
//
// Every rank keeps the counters of every pipe and gather slot it takes part
// in, and all ranks issue the same schedule, so the counters agree without
// being exchanged.

// undoPipes records, from a task, that a send/receive call whose handshake
// with peer found a mismatch advanced the counters of the pipes with peer by
// sent and recvd pieces: the call's work is skipped on both ranks, whose
// counters then disagree by what each issued. The counters are taken back
// when the next call starts (settlePipes, from lockLocal), never in the
// middle of a call: the task may run while the call that advanced them is
// still issuing its pieces, and taken back there the counters would go below
// what that call has counted so far (sent under acked: the wait for the
// acknowledgements would find more than two pieces outstanding). Once the
// call is issued, every piece it counts has been counted, so the counters
// stay at or above what is taken back. Since they only add up, it does not
// matter that calls issued meanwhile counted from the advanced values (their
// work is skipped too: it follows the failure on the stream, or, on another
// stream, waits on it through an event).
func (st *state) undoPipes(peer int, sent, recvd uint64) {
	st.undoMu.Lock()
	defer st.undoMu.Unlock()
	if st.undoS == nil {
		n := st.comm.Size()
		st.undoS, st.undoR = make([]uint64, n), make([]uint64, n)
	}
	st.undoS[peer] += sent
	st.undoR[peer] += recvd
	st.undoing.Store(true)
}

// settlePipes applies what undoPipes recorded. st.mu is held, and no call
// is being issued (lockLocal calls it as a call starts). The pieces a call
// sent are all counted as acknowledged by its end (drainPipes), so that
// acked goes back by as many as sent.
func (st *state) settlePipes() {
	if !st.undoing.Load() {
		return
	}
	st.undoMu.Lock()
	defer st.undoMu.Unlock()
	for p := range st.undoS {
		st.sent[p] -= st.undoS[p]
		st.acked[p] -= st.undoS[p] // the call's drainPipes counted them as acknowledged
		st.recvd[p] -= st.undoR[p]
		st.undoS[p], st.undoR[p] = 0, 0
	}
	st.undoing.Store(false)
}

// pipeSend writes n bytes (at most one piece) at src into peer's inbox.
func (s *sched) pipeSend(peer int, src device.Ptr, n int64) {
	if k, ok := s.pipeNext(peer); ok {
		s.writeNotify(peer, s.peerSlot(peer, s.st.lay.inboxSlotOff(s.st.comm.Rank(), k)), src, n, nData+int(k))
	}
}

// pipeNext counts the next piece to peer and returns its slot, once the
// peer has consumed the slot's previous piece; false: the schedule failed.
func (s *sched) pipeNext(peer int) (k uint64, ok bool) {
	s.jitter()
	st := s.st
	if !s.inStep(peer) {
		return 0, false
	}
	i := st.sent[peer]
	st.sent[peer]++
	k = i % 2
	for i-st.acked[peer] >= 2 { // at most once: inStep
		// The peer consumed the slot's previous piece.
		s.wait(peer, nAck+int(st.acked[peer]%2))
		st.acked[peer]++
	}
	return k, true
}

// pipeRecv waits for the next piece from peer and returns where it lies in
// this rank's HCCL buffer; done must be called once it is consumed.
func (s *sched) pipeRecv(peer int) (slot device.Ptr, done func()) {
	s.jitter()
	st := s.st
	j := st.recvd[peer]
	st.recvd[peer]++
	k := j % 2
	s.wait(peer, nData+int(k))
	return s.mySlot(st.lay.inboxSlotOff(peer, k)), func() { s.record(peer, nAck+int(k)) }
}

// drainPipes waits until every peer has consumed every piece this rank wrote
// into its inbox (the nAck of each piece not waited for yet). A collective
// ends with it, as with drainGathers: the receiver's nAck of its last pieces
// is the last thing it issues to this rank, and nothing else in the
// collective waits for it; without the wait this rank's stream could be done,
// and the rank destroy its communicator, while the receiver's stream still
// has that record to issue, which then fails with ErrPeerClosed. The wait
// costs a one-way latency at the end (the receiver records nAck as soon as it
// has consumed the piece), not a round trip: the record is already under way
// when this rank's stream reaches the wait.
func (s *sched) drainPipes() {
	st := s.st
	for p := range st.acked {
		if !s.inStep(p) {
			return
		}
		for st.acked[p] != st.sent[p] { // at most twice: inStep
			s.wait(p, nAck+int(st.acked[p]%2))
			st.acked[p]++
		}
	}
}

// inStep reports whether the pieces written into peer's inbox whose nAck
// this rank has not waited for fit in the inbox's two slots, as they always
// do when the ranks issue the same schedule; otherwise it fails the schedule
// (the counters are out of step: a bug), so that the waits for the
// acknowledgements, which count up to sent, are bounded by the two slots.
func (s *sched) inStep(peer int) bool {
	st := s.st
	if d := st.sent[peer] - st.acked[peer]; d > 2 {
		s.do(fmt.Errorf("collectives: rank %d's pipe to rank %d is out of step: %d pieces written, %d acknowledged, more than the inbox's 2 slots apart",
			st.comm.Rank(), peer, st.sent[peer], st.acked[peer]))
		return false
	}
	return true
}

// claimGather returns this rank's next gather slot, once every rank that read
// it last time has recorded that it is done; readers are the ranks that will
// read it this time.
func (s *sched) claimGather(readers []int) (k uint64, slot device.Ptr) {
	st := s.st
	me := st.comm.Rank()
	k = st.gathers[me] % 2
	st.gathers[me]++
	for _, p := range st.readers[k] {
		s.wait(p, nDone+int(k))
	}
	st.readers[k] = readers
	return k, s.mySlot(st.lay.gatherSlotOff(k))
}

// drainGathers waits until every peer that was told to read one of this
// rank's gather slots has done so. A collective ends with it, so that once a
// rank's collective is complete no peer still reads this rank's memory for
// it: the rank may then reuse its HCCL buffer freely, or destroy its
// communicator, without pulling it from under a slow reader.
func (s *sched) drainGathers() {
	st := s.st
	for k := range st.readers {
		for _, p := range st.readers[k] {
			s.wait(p, nDone+k)
		}
		st.readers[k] = nil
	}
}

// publish tells the readers of gather slot k that it holds their piece.
func (s *sched) publish(k uint64, readers []int) {
	for _, p := range readers {
		s.record(p, nReady+int(k))
	}
}

// nextGather returns which gather slot of owner the next piece it publishes
// will be in (what claimGather returns on owner).
func (s *sched) nextGather(owner int) uint64 {
	k := s.st.gathers[owner] % 2
	s.st.gathers[owner]++
	return k
}

// readGather waits until owner has published gather slot k, reads n bytes at
// off in it into dst, and tells owner it is done.
func (s *sched) readGather(owner int, k uint64, dst device.Ptr, off, n int64) {
	s.jitter()
	s.wait(owner, nReady+int(k))
	s.read(owner, dst, s.peerSlot(owner, s.st.lay.gatherSlotOff(k)+off), n)
	s.record(owner, nDone+int(k))
}

// others returns every rank but this one, in rank order (shared: do not
// modify).
func (s *sched) others() []int { return s.st.peers() }

// peers is sched.others, for the state: st.others, made on first use.
func (st *state) peers() []int {
	if st.others == nil {
		me, n := st.comm.Rank(), st.comm.Size()
		ps := make([]int, 0, n-1)
		for p := 0; p < n; p++ {
			if p != me {
				ps = append(ps, p)
			}
		}
		st.others = ps
	}
	return st.others
}
