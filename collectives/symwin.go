package collectives

import (
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// HCCL's symmetric-window calls (HcclCommSymWinRegister, …) over
// RegisterWindow: the same windows under HCCL's names.

// CommSymWinRegister registers [p, p+size) of this rank's device memory as
// a symmetric window of c (HcclCommSymWinRegister): RegisterWindow, which
// says what that means and what it costs. Collective: every rank calls it
// with a range of the same size. Departure: HCCL's flag argument (which
// must be 1) is left out.
func CommSymWinRegister(c *hcomm.Comm, p device.Ptr, size int64) (*Window, error) {
	return RegisterWindow(c, p, size)
}

// CommSymWinDeregister withdraws a window (HcclCommSymWinDeregister):
// w.Deregister. Errors: ErrPtr for a nil window.
func CommSymWinDeregister(w *Window) error {
	if w == nil {
		return collErr(nil, "CommSymWinDeregister", hcomm.ErrPtr, nil, "nil window")
	}
	return w.Deregister()
}

// CommSymWinGet returns the live window of c that holds [p, p+size) on this
// rank, and p's offset in it (HcclCommSymWinGet). Safe for concurrent use.
// Errors: ErrPtr for a nil c; ErrPara for a negative size; ErrNotFound when
// no live window of c holds the range.
func CommSymWinGet(c *hcomm.Comm, p device.Ptr, size int64) (*Window, int64, error) {
	const name = "CommSymWinGet"
	if c == nil {
		return nil, 0, collErr(c, name, hcomm.ErrPtr, nil, "nil communicator")
	}
	if size < 0 {
		return nil, 0, collErr(c, name, hcomm.ErrPara, nil, "size %d is negative", size)
	}
	st, err := lockLocal(c)
	if err != nil {
		return nil, 0, collErr(c, name, hcomm.ResultOf(err), err, "")
	}
	defer st.mu.Unlock()
	if w, off, ok := st.windowOf(p, size); ok {
		return w, off, nil
	}
	return nil, 0, collErr(c, name, hcomm.ErrNotFound, nil, "no live window of this rank holds [%#x, +%d)", uintptr(p), size)
}

// SymWinGetPeerPointer returns where offset of peer's part of window w lies
// for this process (HcclSymWinGetPeerPointer): a device pointer this rank
// may copy from and to with the device API, as HCCL's kernels load and
// store through it. Only a peer in this process (the inproc transport) has
// one: its memory is this process's. Over shm the peer's memory is mapped
// inside the transport, at no device address of this process, and over tcp
// not at all: both fail with ErrNotSupport — reach the window there with
// ReadOnThread and WriteOnThread on the window's channel, as the
// collectives do. Safe for concurrent use.
//
// Errors: ErrPtr for a nil window; ErrPara for a peer outside the
// communicator or an offset outside the window; ErrUnavail for a window
// deregistered; ErrNotSupport as above. For this rank itself it returns
// its own memory.
func SymWinGetPeerPointer(w *Window, offset int64, peer int) (device.Ptr, error) {
	const name = "SymWinGetPeerPointer"
	if w == nil {
		return 0, collErr(nil, name, hcomm.ErrPtr, nil, "nil window")
	}
	c := w.c
	w.st.mu.Lock()
	live := w.live
	w.st.mu.Unlock()
	switch {
	case !live:
		return 0, collErr(c, name, hcomm.ErrUnavail, nil, "window %d is deregistered", w.id)
	case peer < 0 || peer >= c.Size():
		return 0, collErr(c, name, hcomm.ErrPara, nil, "peer %d is outside [0, %d)", peer, c.Size())
	case offset < 0 || offset >= w.size:
		return 0, collErr(c, name, hcomm.ErrPara, nil, "offset %d is outside window %d's %d bytes", offset, w.id, w.size)
	case peer == c.Rank():
		return w.base[peer].Add(offset), nil
	}
	if tr := w.chans[peer].Transport(); tr != hcomm.TransportInproc {
		return 0, collErr(c, name, hcomm.ErrNotSupport, nil, "rank %d's window is reached over %s, which maps no peer memory at a device address of this process (inproc does): use ReadOnThread or WriteOnThread on its channel", peer, tr)
	}
	return w.base[peer].Add(offset), nil
}
