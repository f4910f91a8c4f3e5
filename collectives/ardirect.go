package collectives

import (
	"encoding/binary"
	"fmt"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// The direct all-reduce: between ranks that read each other's memory (one
// process; processes of a host whose kernel lets them: lent.go), every
// rank owns a block of the result, reduces it from every rank's send
// buffer where it lies, and then reads every other rank's reduced block
// where it lies, in its recv. Each byte of input crosses between ranks
// once and each byte of output once, each by its reader, into its
// reader's cache; the staged schedules (halving-doubling, the ring) write
// every piece into the reader's inbox first, a second crossing and a
// copy. One handshake, two notifies a pair, no pipeline slot to free.
//
// The hello carries the loan (lent.go: both buffers' addresses, where send
// lies in its memory file) and where recv lies in its memory file. Two
// turns in the gather slots carry the hand-offs: the first's nDone says a
// reader is done with this rank's send buffer, the second's nReady that
// this rank's block is reduced and its nDone that a reader has read it;
// the collective ends once every peer's two nDones are in (drainGathers),
// so neither buffer changes under a reader.
//
// Every pair of the call must read lent memory (the selector picks it only
// where the configuration lets them; directReads). A rank with a pair that
// cannot runs the ring instead: where the kernel refuses every pair, every
// rank does and the call runs; where it refuses only some, the hellos
// differ and every rank's call fails at once with ErrMismatch, naming the
// two schedules, instead of waiting for reads that never come.

// arDirectMin is the least block (bytes a rank, count/n elements) from
// which the selector takes the direct all-reduce where ranks read each
// other's memory (preferLent). AMD EPYC 2-core VM, stop 36, out of place,
// µs, two launches each (the selector's choice against direct):
// 2 ranks in process, 1 MiB 93.6 (hd) against 64.4, 256 KiB 35.6 against
// 31.1; 2 shm processes, 1 MiB 97–102 against 67–75, 4 MiB 389–400
// against 277–289, 256 KiB 37–42 alike, 64 MiB 10.5–10.9 ms against
// 9.0–11.0; 4 shm processes (2 on a core), 1 MiB 325–336 (ring) against
// 258–285, 4 MiB 1517–1622 against 865–920, 256 KiB 283–296 against
// 243–362, 64 KiB 71–73 against 203–242 (the hand-offs, n-1 a peer, cost
// more than the copies they save while the ranks take turns on the
// cores); 4 ranks in process, 1 MiB 267–304 against 186–195; 8 in
// process, 2 MiB 2368–2878 against 1532–1568, 32 MiB 36.4–36.7 ms
// against 21.4.
const arDirectMin = 256 << 10

// arDirectPiece is the part of a block read and reduced at a time: the
// peer's piece is read into this rank's scratch, where the reduction
// finds it in the cache.
const arDirectPiece = 128 << 10

// allReduceDirect is the direct all-reduce of count elements of dt.
func allReduceDirect(sc *sched, h header, send, recv device.Ptr, count int64, dt hcomm.DataType, op hcomm.ReduceOp) {
	st := sc.st
	me, n := st.comm.Rank(), st.comm.Size()
	es := int64(dt.Size())
	h.algo = AlgoDirect
	h.flags |= flagLent
	others := sc.others()
	if sc.need(others); !sc.ok() {
		return
	}
	ln := sc.lend(recv, 0, nil, send, nil, lendRead)
	for _, p := range others {
		if !ln.reads[p] || directRefused != nil && directRefused(me, p) {
			// A pair that cannot read (the kernel refuses it): the
			// ring, as where no rank reads. Where every pair is
			// refused, as on a host whose policy refuses them all,
			// every rank comes here and the call runs; where only some
			// are, the ranks that read name the direct schedule in
			// their hellos and these the ring, and every rank's call
			// fails at once with ErrMismatch, naming both.
			h.algo = AlgoRing
			h.flags &^= flagLent
			sc.open(h, AlgoRing)
			allReduceRing(sc, send, recv, count, dt, op)
			return
		}
	}
	// Where recv lies in its memory file, for the peers that read it
	// through a mapping (shm); none in process.
	rf := device.FileRef{FD: -1}
	if !st.allInproc && recv != 0 {
		if f, err := st.comm.Device().FileOf(recv, 1); err == nil {
			rf = f
		}
	}
	words := append(ln.words(), uint64(int64(rf.FD)), rf.Ino, uint64(rf.Off))
	recvFiles := make([]channel.PeerFile, n)
	learn := ln.learn(me)
	sc.hello(h, others, sc.countTable(nil, words...), int64(8*len(words)), func(p int, rest []byte) error {
		if err := learn(p, rest); err != nil {
			return err
		}
		if len(rest) < 8*(loanWords+3) {
			return fmt.Errorf("rank %d's hello carries %d bytes of buffer addresses, want %d (the direct all-reduce)", p, len(rest), 8*(loanWords+3))
		}
		le := binary.LittleEndian
		b := rest[8*loanWords:]
		recvFiles[p] = channel.PeerFile{FD: int64(le.Uint64(b)), Ino: le.Uint64(b[8:]), Off: int64(le.Uint64(b[16:]))}
		return nil
	})
	// The two turns in the gather slots, this rank's and every peer's.
	sc.claimGather(others)
	k1 := make([]uint64, n)
	for _, p := range others {
		k1[p] = sc.nextGather(p)
	}
	k2, _ := sc.claimGather(others)
	k2p := make([]uint64, n)
	for _, p := range others {
		k2p[p] = sc.nextGather(p)
	}

	// This rank's block: its own input, then every peer's in turn (me+1,
	// me+2, …: an order fixed for the block, so that the result is the
	// same run after run), a piece at a time.
	lo, cnt := chunk(count, n, me)
	scratch := sc.mySlot(st.lay.scratchOff())
	per := min(sc.piece(), st.lay.piece, arDirectPiece) / es
	for off := int64(0); off < cnt; off += per {
		m := min(per, cnt-off)
		at := (lo + off) * es
		for i := 1; i < n; i++ {
			p := mod(me+i, n)
			sc.readFrom(ln, p, nil, at, scratch, m*es)
			a := recv.Add(at)
			if i == 1 {
				a = send.Add(at)
			}
			sc.reduceTo(recv.Add(at), a, scratch, m, dt, op)
		}
	}
	for _, p := range others {
		sc.record(p, nDone+int(k1[p])) // done with p's send buffer
	}
	sc.publish(k2, others) // this rank's block is reduced
	// Every peer's block, where it lies in the peer's recv.
	for i := 1; i < n; i++ {
		p := mod(me-i, n)
		plo, pcnt := chunk(count, n, p)
		sc.wait(p, nReady+int(k2p[p]))
		sc.readFrom(ln, p, recvFiles, plo*es, recv.Add(plo*es), pcnt*es)
		sc.record(p, nDone+int(k2p[p]))
	}
}

// readFrom reads n bytes at off in peer's send buffer (recvFiles nil) or
// recv buffer (recvFiles: where each peer's recv lies in its memory file)
// into dst, in one task: the addresses and files are the peer's hello's,
// known when the task runs.
func (s *sched) readFrom(ln *loan, peer int, recvFiles []channel.PeerFile, off int64, dst device.Ptr, n int64) {
	if n == 0 {
		return
	}
	ch := s.ch(peer)
	s.launchNow("collective direct read", n, func(stop <-chan struct{}) error {
		return s.readPeer(stop, ch, ln, peer, recvFiles, off, dst, n)
	})
}

// readPeer reads n bytes at off in peer's send buffer (recvFiles nil) or
// recv buffer (recvFiles: where each peer's recv lies in its memory file)
// into dst, now: the lent reads' one way to a peer's buffer, for a task
// that runs once the peer's hello has come.
func (s *sched) readPeer(stop <-chan struct{}, ch *hcomm.Channel, ln *loan, peer int, recvFiles []channel.PeerFile, off int64, dst device.Ptr, n int64) error {
	lentReads.Add(1)
	src, f, which := ln.from[peer], ln.files[peer], "send"
	if recvFiles != nil {
		src, f, which = ln.at[peer], recvFiles[peer], "recv"
	}
	if src == 0 {
		return fmt.Errorf("collectives: rank %d has no %s buffer address of rank %d", s.st.comm.Rank(), which, peer)
	}
	if f.FD >= 0 {
		f.Off += off
	}
	return hcomm.ReadLentNbi(stop, ch, dst, src.Add(off), n, f)
}

// directRefused, when a test sets it, makes the pair (me, p) one that
// cannot read for the direct all-reduce, as a pair whose kernel refuses
// it is.
var directRefused func(me, p int) bool

// directReads reports whether every pair of the communicator may read the
// other's memory, as the direct all-reduce needs: all in one process, or
// processes of a host that the configuration lets read (st.cma). The same
// on every rank.
func (st *state) directReads() bool { return st.allInproc || st.cma }
