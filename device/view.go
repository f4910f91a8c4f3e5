package device

import (
	"os"
	"sync/atomic"
)

// View is a host-addressable image of a range of device memory, from Map:
// the way code above this package reads or writes device memory with the
// processor (a handshake's header, a reduction the host runs) without
// assuming that device memory is host memory.
//
// On a backend whose memory the host can address — the host backend — a view
// is the memory itself: Bytes aliases it, and Fetch and Flush only check
// their range. On a backend whose memory the host cannot address (an
// accelerator's), Map makes a host copy of the range: Fetch copies device
// bytes into it, Flush copies it back, each a synchronous copy. Code that
// keeps the contract below is correct on both:
//
//  1. Map's view holds the memory's bytes as of the call. Before reading
//     bytes that device work — a stream task, a copy, a peer's write
//     through a transport — may have changed since, Fetch them.
//  2. After writing bytes of a view, Flush them before device work reads
//     them (a copy, a transport's write to a peer).
//  3. Device work must not write the range between a Fetch and the reads it
//     serves, nor read it between the host's writes and their Flush: the
//     caller orders them, typically by running the view's user as a stream
//     task after the waits that say the peers' writes have landed.
//  4. A view is valid until Unmap, and never after the memory is freed.
//
// A View is a small value, cheap to copy; copies share the image. Fetch and
// Flush are safe for concurrent use on disjoint ranges. The zero View is
// empty: Bytes is nil, and Fetch and Flush of an empty range succeed.
type View struct {
	mem []byte
	st  *staging // nil: mem is the device memory itself
}

// staging is what a copied view needs to reach its memory.
type staging struct {
	dev      *Device
	p        Ptr
	unmapped atomic.Bool
}

// Map returns a view of the n bytes at p, which must be memory of d (not of
// another context: copy such memory with Memcpy first). See View for the
// contract. Errors: ErrInvalidValue for a range outside d's live memory,
// ErrInvalidHandle for a closed device. Safe for concurrent use.
//
// The host backend maps without copying or allocating, unless
// HCOMM_DEVICE_VIEW=copy was set when d was opened: then every view is a
// copy, as on an accelerator, so that tests can check that the code above
// keeps the contract on the host.
func (d *Device) Map(p Ptr, n int64) (View, error) {
	const op = "Map"
	if err := d.check(op); err != nil {
		return View{}, err
	}
	r, err := resolveOwn(op, d, -1, "range", p, n)
	if err != nil {
		return View{}, err
	}
	if !d.copyViews || n == 0 {
		return View{mem: r.mem}, nil
	}
	v := View{mem: make([]byte, n), st: &staging{dev: d, p: p}}
	if err := v.Fetch(0, n); err != nil {
		return View{}, err
	}
	return v, nil
}

// Bytes returns the view's image: the device memory itself when the view is
// mapped (Mapped), else the host copy that Fetch fills and Flush writes back.
func (v View) Bytes() []byte { return v.mem }

// Len returns the view's size in bytes.
func (v View) Len() int64 { return int64(len(v.mem)) }

// Mapped reports whether the view is the device memory itself (zero copy):
// then Fetch and Flush move nothing.
func (v View) Mapped() bool { return v.st == nil }

// Fetch makes the device's current bytes of [off, off+n) of the view visible
// in Bytes (device to host). It returns ErrInvalidValue for a range outside
// the view or memory freed since Map, ErrInvalidHandle after Unmap.
func (v View) Fetch(off, n int64) error { return v.sync("View.Fetch", off, n, false) }

// Flush makes the bytes written to [off, off+n) of Bytes visible to the
// device (host to device). Errors as Fetch's.
func (v View) Flush(off, n int64) error { return v.sync("View.Flush", off, n, true) }

func (v View) sync(op string, off, n int64, toDevice bool) error {
	if off < 0 || n < 0 || off > int64(len(v.mem)) || n > int64(len(v.mem))-off {
		dev := -1
		if v.st != nil {
			dev = v.st.dev.id
		}
		return newErr(op, dev, -1, ErrInvalidValue, "range [%d, +%d) is outside the %d-byte view", off, n, len(v.mem))
	}
	if v.st == nil || n == 0 {
		return nil
	}
	d := v.st.dev
	if v.st.unmapped.Load() {
		return newErr(op, d.id, -1, ErrInvalidHandle, "view is unmapped")
	}
	if err := d.check(op); err != nil {
		return err
	}
	r, err := resolveOwn(op, d, -1, "range", v.st.p.Add(off), n)
	if err != nil {
		return err
	}
	if !pin(r) {
		return newErr(op, d.id, -1, ErrInvalidValue, "memory at %#x was freed", uintptr(v.st.p))
	}
	defer unpin(r)
	if toDevice {
		d.be.copy(r.mem, v.mem[off:off+n])
	} else {
		d.be.copy(v.mem[off:off+n], r.mem)
	}
	return nil
}

// Unmap ends the view: later Fetch and Flush of a copied view return
// ErrInvalidHandle, and its image must no longer be used. Bytes not flushed
// are lost. Unmap is idempotent; on a mapped view it does nothing (the memory
// stays valid until it is freed).
func (v View) Unmap() error {
	if v.st != nil {
		v.st.unmapped.Store(true)
	}
	return nil
}

// CheckRange reports whether [p, p+n) is live memory of d, without touching
// it: nil when it is (or n is 0), else an ErrInvalidValue error naming the
// range and what is wrong with it (not allocated, past the end of its
// allocation, another context's memory). Safe for concurrent use.
func (d *Device) CheckRange(p Ptr, n int64) error {
	const op = "CheckRange"
	if err := d.check(op); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	_, err := resolveOwn(op, d, -1, "range", p, n)
	return err
}

// resolveOwn is resolve for a call that touches memory of d only (Map,
// Memset, the copies to and from Go slices): memory of another context is an
// error, as on ACL, where a context reaches another device's memory only
// through an explicit device-to-device copy.
func resolveOwn(op string, d *Device, stream int64, what string, p Ptr, n int64) (region, error) {
	r, err := resolve(op, d, stream, what, p, n)
	if err != nil {
		return r, err
	}
	if r.a != nil && r.a.dev != d {
		return region{}, newErr(op, d.id, stream, ErrInvalidValue,
			"%s [%#x, +%d) is memory of another device context (device %d): reach it with Memcpy or MemcpyAsync (an inter-device copy)",
			what, uintptr(p), n, r.a.dev.id)
	}
	return r, nil
}

// copyViewsFromEnv reports whether HCOMM_DEVICE_VIEW asks for copied views.
func copyViewsFromEnv() bool { return os.Getenv("HCOMM_DEVICE_VIEW") == "copy" }
