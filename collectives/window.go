package collectives

import (
	"fmt"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// Window is device memory that every rank of a communicator registered
// together, so that the collectives may read a peer's buffer in place instead
// of staging it through the peer's HCCL buffer: NCCL's symmetric window
// (ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC), built on HCCL's
// CommMemReg and a channel acquired with the registered memory.
//
// The windows are symmetric: every rank registers a range of the same size,
// and a collective uses them when its buffers lie at the same offset in the
// same window on every rank (for an in-place AllGather: its receive buffer).
// Each rank can then compute where a peer's buffer lies without asking. A
// collective whose ranks disagree — one rank's buffer in a window and
// another's not, or at another offset — fails on every rank with ErrMismatch
// naming both calls, before any data moves.
//
// Which collectives use a window, and when: Broadcast and AllGather with the
// direct algorithm, and AlltoAll (pairwise), when the peers' memory is
// mapped (inproc and shm): each rank reads the root's or every peer's buffer
// straight into its output — one copy per receiver and none through an HCCL
// buffer. The V forms, the other collectives and algorithms ignore windows
// (a V form's peer displacements, or a zero-count rank's send pointer, are
// not known or not meaningful at enqueue time). On tcp, windows are
// registered but not used.
type Window struct {
	c     *hcomm.Comm
	st    *state
	id    uint32
	size  int64
	base  []device.Ptr     // each rank's start of the window, in that rank's address space
	chans []*hcomm.Channel // by peer: the channel that carries the window
	h     *hcomm.MemHandle // this rank's registration
	live  bool             // false once deregistered
}

// RegisterWindow registers [p, p+size) of this rank's device memory as a
// window of c. It is collective: every rank calls it, in the same order
// relative to the other collective set-up calls, with a range of the same
// size; it returns once every rank has registered. The memory must stay
// allocated until Deregister.
func RegisterWindow(c *hcomm.Comm, p device.Ptr, size int64) (*Window, error) {
	const name = "RegisterWindow"
	if err := c.Check(); err != nil {
		return nil, collErr(c, name, hcomm.ResultOf(err), err, "")
	}
	if size <= 0 {
		return nil, collErr(c, name, hcomm.ErrPara, nil, "window size %d: want a positive size", size)
	}
	if err := c.Device().CheckRange(p, size); err != nil {
		return nil, collErr(c, name, hcomm.ErrPara, err, "window [%#x, +%d) is not live device memory of this rank", uintptr(p), size)
	}
	st, err := getState(c)
	if err != nil {
		return nil, collErr(c, name, hcomm.ResultOf(err), err, "setting up the collective channels")
	}
	st.mu.Lock()
	st.windows++
	id := uint32(st.windows)
	st.mu.Unlock()
	tag := fmt.Sprintf("%s/window/%d", chanTag, id)
	h, err := c.CommMemReg(tag, p, size)
	if err != nil {
		return nil, err
	}
	w := &Window{c: c, st: st, id: id, size: size, h: h, live: true,
		base: make([]device.Ptr, c.Size()), chans: make([]*hcomm.Channel, c.Size())}
	w.base[c.Rank()] = p
	if c.Size() > 1 {
		descs := hcomm.ChannelDescInit(c.Size() - 1)
		for i, j := 0, 0; i < c.Size(); i++ {
			if i == c.Rank() {
				continue
			}
			descs[j].RemoteRank = i
			descs[j].NotifyNum = 1
			descs[j].Tag = tag
			descs[j].MemHandles = []*hcomm.MemHandle{h}
			j++
		}
		chs, err := c.ChannelAcquire(hcomm.EngineCPUTS, descs)
		if err != nil {
			c.CommMemDereg(h)
			return nil, err
		}
		for _, ch := range chs {
			peer := ch.RemoteRank()
			mems, err := c.ChannelGetRemoteMems(ch)
			if err != nil {
				c.CommMemDereg(h)
				return nil, err
			}
			found := false
			for _, m := range mems {
				if m.Tag != tag {
					continue
				}
				if m.Size != size {
					c.CommMemDereg(h)
					return nil, collErr(c, name, hcomm.ErrPara, nil, "window %d is %d bytes on rank %d and %d on this rank: windows are symmetric, every rank registers the same size", id, m.Size, peer, size)
				}
				w.base[peer], found = m.Addr, true
			}
			if !found {
				c.CommMemDereg(h)
				return nil, collErr(c, name, hcomm.ErrInternal, nil, "rank %d's channel carries no window %d: ranks called RegisterWindow in different orders", peer, id)
			}
			w.chans[peer] = ch
		}
	}
	st.mu.Lock()
	st.wins = append(st.wins, w)
	st.mu.Unlock()
	return w, nil
}

// Deregister withdraws this rank's window: later collectives do not use it,
// and peers can no longer read the memory (their reads fail rather than see
// freed memory). It is local, but every rank should deregister before its
// next collective on those buffers: a rank that still uses the window while
// another does not is a mismatch. Collectives that used the window must be
// complete (their streams synchronized) on this rank. The channels that
// carried it are destroyed (hcomm's ChannelDestroy), so that the memory is
// given back at once: over shm, no peer keeps it mapped once Deregister
// returns here and the peer has seen the channel close (its transport
// unmaps it on the goodbye). Idempotent.
func (w *Window) Deregister() error {
	w.st.mu.Lock()
	defer w.st.mu.Unlock()
	if !w.live {
		return nil
	}
	w.live = false
	for i, x := range w.st.wins {
		if x == w {
			w.st.wins = append(w.st.wins[:i], w.st.wins[i+1:]...)
			break
		}
	}
	var chs []*hcomm.Channel
	for _, ch := range w.chans {
		if ch != nil {
			chs = append(chs, ch)
		}
	}
	w.chans = make([]*hcomm.Channel, len(w.chans))
	err := w.c.CommMemDereg(w.h)
	if len(chs) > 0 {
		if derr := w.c.ChannelDestroy(chs); err == nil {
			err = derr
		}
	}
	return err
}

// Size returns the window's size in bytes, the same on every rank.
func (w *Window) Size() int64 { return w.size }

// windowOf returns the live window holding [p, p+n) on this rank, and p's
// offset in it. st.mu is held.
func (st *state) windowOf(p device.Ptr, n int64) (*Window, int64, bool) {
	for _, w := range st.wins {
		b := w.base[st.comm.Rank()]
		if p >= b && n >= 0 && int64(p-b) <= w.size && n <= w.size-int64(p-b) {
			return w, int64(p - b), true
		}
	}
	return nil, 0, false
}

// readWindow enqueues the read of n bytes at offset off of peer's window w
// into dst.
func (s *sched) readWindow(w *Window, peer int, off int64, dst device.Ptr, n int64) {
	if s.ok() && n > 0 {
		s.do(hcomm.ReadOnThread(s.t, w.chans[peer], dst, w.base[peer].Add(off), n))
	}
}

// lendWindow is the owner's side of a window read: the peers in readers
// read this rank's window during the collective, and the collective's end
// (drainGathers) waits for each of them to say it is done. It takes a turn
// in this rank's gather slots, which carry that signal; no data goes there.
func (s *sched) lendWindow(readers []int) { s.claimGather(readers) }

// doneWithWindow tells owner, after the reads of its window issued before,
// that this rank has finished reading: the other end of lendWindow.
func (s *sched) doneWithWindow(owner int) {
	s.record(owner, nDone+int(s.nextGather(owner)))
}
