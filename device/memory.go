package device

import (
	"os"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Ptr is an address in device memory (from Malloc) or in pinned host memory
// (from MallocHost). Zero is the nil address. Every call that takes a Ptr and a
// length checks the whole range against the live allocations of the process
// before it touches a byte: a bad address or length is an ErrInvalidValue error
// naming both, never a silent overwrite.
type Ptr uintptr

// Add returns p advanced by off bytes.
func (p Ptr) Add(off int64) Ptr { return p + Ptr(off) }

// MemcpyKind is the direction of a copy. The values are aclrtMemcpyKind's.
type MemcpyKind int32

// Copy kinds, with ACL's values.
const (
	MemcpyHostToHost          MemcpyKind = 0 // ACL_MEMCPY_HOST_TO_HOST
	MemcpyHostToDevice        MemcpyKind = 1 // ACL_MEMCPY_HOST_TO_DEVICE
	MemcpyDeviceToHost        MemcpyKind = 2 // ACL_MEMCPY_DEVICE_TO_HOST
	MemcpyDeviceToDevice      MemcpyKind = 3 // ACL_MEMCPY_DEVICE_TO_DEVICE
	MemcpyDefault             MemcpyKind = 4 // ACL_MEMCPY_DEFAULT: direction taken from the addresses
	MemcpyHostToBufToDevice   MemcpyKind = 5 // ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE: not supported
	MemcpyInnerDeviceToDevice MemcpyKind = 6 // ACL_MEMCPY_INNER_DEVICE_TO_DEVICE: both on the same device
	MemcpyInterDeviceToDevice MemcpyKind = 7 // ACL_MEMCPY_INTER_DEVICE_TO_DEVICE: on two different devices
)

var kindNames = [...]string{"HostToHost", "HostToDevice", "DeviceToHost", "DeviceToDevice", "Default",
	"HostToBufToDevice", "InnerDeviceToDevice", "InterDeviceToDevice"}

func (k MemcpyKind) String() string {
	if k >= 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "MemcpyKind(" + itoa(int64(k)) + ")"
}

// allocation is one live Malloc or MallocHost.
type allocation struct {
	dev  *Device
	base Ptr
	mem  []byte
	fd   int           // the memory file behind mem (Share), or -1
	ino  atomic.Uint64 // fd's inode number, once FileOf has looked (0: not yet)
	host bool          // MallocHost: pinned host memory rather than device memory
	lazy bool          // MallocLazy: pages committed at first touch (Memset to zero gives them back)

	// use is held for reading by every task that touches the memory, and for
	// writing by Free, so that a Free racing with queued work waits for it and
	// the work after it fails cleanly instead of touching unmapped memory.
	use   sync.RWMutex
	freed bool
	// keeps counts the Held.Keep not yet released: a Free then unmaps
	// nothing, and the last Release does (under use, held for writing).
	keeps    int
	unmapped bool
}

// pin holds the allocations behind r and o for the duration of an access and
// reports whether both are still live. unpin releases them.
func pin(rs ...region) bool {
	for i, r := range rs {
		if r.a == nil || seen(rs[:i], r.a) {
			continue
		}
		r.a.use.RLock()
		if r.a.freed {
			r.a.use.RUnlock()
			unpin(rs[:i]...)
			return false
		}
	}
	return true
}

func unpin(rs ...region) {
	for i, r := range rs {
		if r.a == nil || seen(rs[:i], r.a) {
			continue
		}
		r.a.use.RUnlock()
	}
}

func seen(rs []region, a *allocation) bool {
	for _, r := range rs {
		if r.a == a {
			return true
		}
	}
	return false
}

// release marks a freed and unmaps it once no task is using it, and no
// Held.Keep holds it (the last Release unmaps it then).
func (a *allocation) release(be backend) error {
	a.use.Lock()
	defer a.use.Unlock()
	if a.freed {
		return nil
	}
	a.freed = true
	if a.keeps > 0 {
		return nil
	}
	a.unmapped = true
	return be.free(a.mem, a.fd)
}

func (a *allocation) size() int64 { return int64(len(a.mem)) }

// allocTable holds every live allocation of the process, sorted by base, so that
// a range can be checked in O(log n) and copies between devices can be checked
// too. Every data-plane call checks its ranges here, from every rank at once,
// while allocations change rarely: writers (under mu) publish a new sorted
// slice, and readers load the current one without a lock.
type allocTable struct {
	mu    sync.Mutex
	snap  atomic.Pointer[[]*allocation]
	epoch atomic.Uint64 // bumped by every change (AllocEpoch)
}

var allocs allocTable

// list returns the current sorted allocations (never modified in place).
func (t *allocTable) list() []*allocation {
	if p := t.snap.Load(); p != nil {
		return *p
	}
	return nil
}

// edit replaces the table with what fn makes of a copy of it. t.mu is held.
func (t *allocTable) edit(fn func([]*allocation) []*allocation) {
	cur := t.list()
	next := fn(append(make([]*allocation, 0, len(cur)+1), cur...))
	t.snap.Store(&next)
	t.epoch.Add(1)
}

// AllocEpoch returns a number that changes whenever memory is allocated or
// freed, by any device context of the process. A caller that checked a
// range (Map, Bytes, CheckRange) may keep what it found while the number
// stays the same: no allocation has come or gone since, so the range is
// still the same live memory. The collectives' small-message path checks
// its buffers this way once for a run of calls on the same buffers.
func AllocEpoch() uint64 { return allocs.epoch.Load() }

func (t *allocTable) insert(a *allocation) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.edit(func(s []*allocation) []*allocation {
		i := sort.Search(len(s), func(i int) bool { return s[i].base > a.base })
		return slices.Insert(s, i, a)
	})
}

// remove deletes the allocation that starts exactly at p and belongs to dev
// (any device when dev is nil).
func (t *allocTable) remove(p Ptr, dev *Device) *allocation {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := t.list()
	i := sort.Search(len(cur), func(i int) bool { return cur[i].base >= p })
	if i == len(cur) || cur[i].base != p || (dev != nil && cur[i].dev != dev) {
		return nil
	}
	a := cur[i]
	t.edit(func(s []*allocation) []*allocation { return slices.Delete(s, i, i+1) })
	return a
}

// find returns the live allocation that holds [p, p+n), or nil.
func (t *allocTable) find(p Ptr, n int64) *allocation {
	cur := t.list()
	// The last allocation whose base is <= p (a hand-written search: this is
	// on the path of every data-plane call).
	lo, hi := 0, len(cur)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if cur[m].base <= p {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo == 0 {
		return nil
	}
	a := cur[lo-1]
	off := int64(p - a.base)
	if off < 0 || off > a.size() || n > a.size()-off {
		return nil
	}
	return a
}

// region is a checked range: the allocation and the bytes of [p, p+n).
type region struct {
	a   *allocation
	mem []byte
}

// resolve checks [p, p+n) and returns its bytes. what names the argument in the
// error ("dst", "src", "desc", "range"); the message follows it with the range
// ("dst [0x1000, +8) is not in any live allocation").
func resolve(op string, dev *Device, stream int64, what string, p Ptr, n int64) (region, error) {
	devID := -1
	if dev != nil {
		devID = dev.id
	}
	if n < 0 {
		return region{}, newErr(op, devID, stream, ErrInvalidValue, "%s length %d is negative", what, n)
	}
	if p == 0 {
		if n == 0 {
			return region{}, nil
		}
		return region{}, newErr(op, devID, stream, ErrInvalidValue, "%s is a nil address", what)
	}
	a := allocs.find(p, n)
	if a == nil {
		if b := allocs.find(p, 0); b != nil {
			return region{}, newErr(op, devID, stream, ErrInvalidValue,
				"%s [%#x, +%d) runs %d bytes past the end of its allocation [%#x, +%d)",
				what, uintptr(p), n, n-(b.size()-int64(p-b.base)), uintptr(b.base), b.size())
		}
		return region{}, newErr(op, devID, stream, ErrInvalidValue,
			"%s [%#x, +%d) is not in any live allocation", what, uintptr(p), n)
	}
	off := int64(p - a.base)
	return region{a: a, mem: a.mem[off : off+n : off+n]}, nil
}

func itoa(v int64) string {
	if v == 0 {
		return "0"
	}
	neg := v < 0
	if neg {
		v = -v
	}
	var b [24]byte
	i := len(b)
	for v > 0 {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
	}
	if neg {
		i--
		b[i] = '-'
	}
	return string(b[i:])
}

// Malloc allocates size bytes of device memory on d, zeroed
// (aclrtMalloc / cuMemAlloc). size must be positive.
func (d *Device) Malloc(size int64) (Ptr, error) { return d.malloc("Malloc", size, false, false) }

// MallocLazy is Malloc for memory that is large but used only in part, or
// only later: its pages are committed when first touched, not at the call,
// so the allocation costs address space, not memory, until it is used. A
// communicator's HCCL buffer is one: 2 × HCCL_BUFFSIZE bytes (400 MB by
// default), of which the collectives use the slots of the peers they talk
// to. The memory reads as zeros and can be shared (Share) as Malloc's can.
//
// What it gives up: Malloc reserves every page at the call, so that running
// out of memory is an ErrMemoryAllocation error there; a page of MallocLazy
// memory that cannot be had when it is first touched is the kernel's to
// handle (the OOM killer, as for any memory a process touches). A request
// larger than all the memory the process may use is still refused at the
// call. Memset to zero gives its pages back.
func (d *Device) MallocLazy(size int64) (Ptr, error) {
	return d.malloc("MallocLazy", size, false, true)
}

// MallocHost allocates size bytes of pinned host memory (aclrtMallocHost /
// cuMemAllocHost): the host side of an asynchronous copy.
func (d *Device) MallocHost(size int64) (Ptr, error) {
	return d.malloc("MallocHost", size, true, false)
}

func (d *Device) malloc(op string, size int64, host, lazy bool) (Ptr, error) {
	if err := d.check(op); err != nil {
		return 0, err
	}
	if size <= 0 {
		return 0, newErr(op, d.id, -1, ErrInvalidValue, "size %d must be positive", size)
	}
	if size > maxAlloc {
		return 0, newErr(op, d.id, -1, ErrMemoryAllocation, "size %d exceeds the %d-byte limit of one allocation", size, int64(maxAlloc))
	}
	mem, fd, err := d.be.alloc(size, host, lazy)
	if err != nil {
		return 0, &Error{Op: op, Device: d.id, Stream: -1, Code: ErrMemoryAllocation,
			Msg: "allocating " + itoa(size) + " bytes", Err: err}
	}
	a := &allocation{dev: d, base: Ptr(unsafe.Pointer(&mem[0])), mem: mem, fd: fd, host: host, lazy: lazy}
	allocs.insert(a)
	d.mu.Lock()
	d.nalloc++
	d.mu.Unlock()
	return a.base, nil
}

// maxAlloc bounds one allocation (1 TiB): a larger request is a mistake, not a
// wish the kernel should try to honour.
const maxAlloc = 1 << 40

// Free releases memory from Malloc or MallocHost on d. p must be the address
// the allocation returned. Work still queued on a stream that touches the memory
// must be complete first (synchronize), as with aclrtFree; a later access through
// p is an ErrInvalidValue error, but a slice obtained from Bytes must not be used
// after Free.
func (d *Device) Free(p Ptr) error {
	if err := d.check("Free"); err != nil {
		return err
	}
	a := allocs.remove(p, d)
	if a == nil {
		return newErr("Free", d.id, -1, ErrInvalidValue, "address %#x is not the start of a live allocation on this device", uintptr(p))
	}
	d.mu.Lock()
	d.nalloc--
	d.mu.Unlock()
	if err := a.release(d.be); err != nil {
		return &Error{Op: "Free", Device: d.id, Stream: -1, Code: ErrInternal, Err: err}
	}
	return nil
}

// Bytes returns the n bytes at p, memory of d, as a slice, after checking the
// range: the host backend's memory itself. The slice is valid until the memory
// is freed. It exists for the host backend's transports and data plane, which
// move bytes with the processor; code meant to run on any backend uses Map,
// whose views say when bytes must be fetched and flushed. On a backend without
// host-visible memory it returns ErrFeatureNotSupported.
func (d *Device) Bytes(p Ptr, n int64) ([]byte, error) {
	if err := d.check("Bytes"); err != nil {
		return nil, err
	}
	r, err := resolveOwn("Bytes", d, -1, "range", p, n)
	if err != nil {
		return nil, err
	}
	return r.mem, nil
}

// Held is a checked range of a device's memory that code other than its
// owner's touches — the in-process channels of the host backend, copying
// into and out of a peer's memory. Between Pin and Unpin the memory cannot
// be freed: a Free racing with the copy (the peer's, after its Abort, say)
// waits for it, and a Pin after the Free fails instead of touching
// unmapped memory.
type Held struct{ r region }

// Hold checks the n bytes at p, memory of d, as Bytes does, and returns
// them as a Held.
func (d *Device) Hold(p Ptr, n int64) (Held, error) {
	if err := d.check("Hold"); err != nil {
		return Held{}, err
	}
	r, err := resolveOwn("Hold", d, -1, "range", p, n)
	if err != nil {
		return Held{}, err
	}
	return Held{r}, nil
}

// Pin returns the bytes, held until Unpin, or false when the memory has
// been freed (nothing to unpin then).
func (h Held) Pin() ([]byte, bool) {
	if !pin(h.r) {
		return nil, false
	}
	return h.r.mem, true
}

// Bytes returns the bytes without pinning them, and whether Hold found
// them: for a caller that keeps the memory from being freed by other means,
// or mapped past its Free (Keep).
func (h Held) Bytes() ([]byte, bool) { return h.r.mem, h.r.a != nil }

// Unpin ends a successful Pin; on the zero Held it does nothing.
func (h Held) Unpin() { unpin(h.r) }

// Keep holds the mapping of h's allocation past its Free until Release:
// the Free still ends the allocation (its address is invalid from then on,
// Pin fails, the owner's accounting drops it), but the memory stays mapped,
// so that bytes taken from h before the Free (Bytes) may still be stored to
// without faulting the process. For a caller that checks the memory's
// lifetime by other means, and could lose the race between its check and
// its store (the in-process channel's lines into a peer's HCCL buffer,
// checked against the channel's close, which comes before the buffer's
// Free). It reports false, holding nothing, when the memory is freed
// already. Each successful Keep needs one Release.
func (h Held) Keep() bool {
	a := h.r.a
	if a == nil {
		return false
	}
	a.use.Lock()
	defer a.use.Unlock()
	if a.freed {
		return false
	}
	a.keeps++
	return true
}

// Release ends a Keep: the last one of an allocation freed meanwhile
// unmaps it.
func (h Held) Release() error {
	a := h.r.a
	if a == nil {
		return nil
	}
	a.use.Lock()
	defer a.use.Unlock()
	if a.keeps == 0 {
		return nil // a Release without its Keep: nothing held
	}
	a.keeps--
	if a.keeps > 0 || !a.freed || a.unmapped {
		return nil
	}
	a.unmapped = true
	if err := a.dev.be.free(a.mem, a.fd); err != nil {
		return &Error{Op: "Release", Device: a.dev.id, Stream: -1, Code: ErrInternal, Err: err}
	}
	return nil
}

// Memset sets n bytes at p, memory of d, to value and returns when done
// (aclrtMemset). Zeroing MallocLazy memory gives its whole pages back
// instead of writing them: they read as zeros, in every process that maps
// them, and are committed again when next touched.
func (d *Device) Memset(p Ptr, n int64, value byte) error {
	if err := d.check("Memset"); err != nil {
		return err
	}
	r, err := resolveOwn("Memset", d, -1, "dst", p, n)
	if err != nil {
		return err
	}
	if value == 0 && r.a != nil && r.a.lazy && r.a.fd >= 0 {
		zeroLazy(r.a, r.mem)
		return nil
	}
	fill(r.mem, value)
	return nil
}

// zeroLazy zeroes b, a range of the MallocLazy allocation a: its whole pages
// by giving them back (discard: they read as zeros and are committed again
// at their next touch), the rest by writing zeros — so that clearing a
// large buffer used in part commits none of it.
func zeroLazy(a *allocation, b []byte) {
	if len(b) == 0 {
		return
	}
	page := int64(os.Getpagesize())
	off := int64(uintptr(unsafe.Pointer(&b[0])) - uintptr(a.base))
	lo := (off + page - 1) &^ (page - 1)
	hi := (off + int64(len(b))) &^ (page - 1)
	if hi-lo >= page && discard(a.fd, lo, hi-lo) {
		fill(b[:lo-off], 0)
		fill(b[hi-off:], 0)
		return
	}
	fill(b, 0)
}

func fill(b []byte, v byte) {
	if len(b) == 0 {
		return
	}
	b[0] = v
	for i := 1; i < len(b); i *= 2 {
		copy(b[i:], b[:i])
	}
}

// checkKind resolves both sides of a copy and checks them against kind.
func checkKind(op string, d *Device, stream int64, dst, src Ptr, n int64, kind MemcpyKind) (dr, sr region, err error) {
	switch kind {
	case MemcpyHostToBufToDevice:
		return dr, sr, newErr(op, d.id, stream, ErrFeatureNotSupported, "copy kind %v is not supported by the %s backend", kind, d.be.name())
	case MemcpyHostToHost, MemcpyHostToDevice, MemcpyDeviceToHost, MemcpyDeviceToDevice, MemcpyDefault,
		MemcpyInnerDeviceToDevice, MemcpyInterDeviceToDevice:
	default:
		return dr, sr, newErr(op, d.id, stream, ErrInvalidValue, "unknown copy kind %d", int32(kind))
	}
	if dr, err = resolve(op, d, stream, "dst", dst, n); err != nil {
		return
	}
	if sr, err = resolve(op, d, stream, "src", src, n); err != nil {
		return
	}
	if n == 0 {
		return
	}
	side := func(r region) string {
		if r.a.host {
			return "host"
		}
		return "device"
	}
	want := func(r region, host bool, what string) error {
		if r.a.host != host {
			return newErr(op, d.id, stream, ErrInvalidValue, "copy kind %v needs %s memory at %s, got %s memory", kind, map[bool]string{true: "host", false: "device"}[host], what, side(r))
		}
		return nil
	}
	switch kind {
	case MemcpyHostToHost:
		err = firstErr(want(dr, true, "dst"), want(sr, true, "src"))
	case MemcpyHostToDevice:
		err = firstErr(want(dr, false, "dst"), want(sr, true, "src"))
	case MemcpyDeviceToHost:
		err = firstErr(want(dr, true, "dst"), want(sr, false, "src"))
	case MemcpyDeviceToDevice:
		err = firstErr(want(dr, false, "dst"), want(sr, false, "src"))
	case MemcpyInnerDeviceToDevice:
		err = firstErr(want(dr, false, "dst"), want(sr, false, "src"))
		if err == nil && (dr.a.dev.id != d.id || sr.a.dev.id != d.id) {
			err = newErr(op, d.id, stream, ErrInvalidValue, "copy kind %v needs both sides on device %d, got dst on %d and src on %d", kind, d.id, dr.a.dev.id, sr.a.dev.id)
		}
	case MemcpyInterDeviceToDevice:
		err = firstErr(want(dr, false, "dst"), want(sr, false, "src"))
		if err == nil && dr.a.dev.id == sr.a.dev.id {
			err = newErr(op, d.id, stream, ErrInvalidValue, "copy kind %v needs two different devices, both sides are on device %d", kind, dr.a.dev.id)
		}
	}
	return
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// Memcpy copies n bytes from src to dst and returns when done (aclrtMemcpy).
// The kind must match where dst and src live (MemcpyDefault infers it); the
// ranges may be memory of any context of the process (an inter-device copy).
// Overlapping ranges are copied as by memmove.
func (d *Device) Memcpy(dst, src Ptr, n int64, kind MemcpyKind) error {
	if err := d.check("Memcpy"); err != nil {
		return err
	}
	dr, sr, err := checkKind("Memcpy", d, -1, dst, src, n, kind)
	if err != nil {
		return err
	}
	d.be.copy(dr.mem, sr.mem)
	return nil
}

// MemcpyHtoD copies the Go slice src to d's device (or pinned host) memory at
// dst and returns when done.
func (d *Device) MemcpyHtoD(dst Ptr, src []byte) error {
	if err := d.check("MemcpyHtoD"); err != nil {
		return err
	}
	dr, err := resolveOwn("MemcpyHtoD", d, -1, "dst", dst, int64(len(src)))
	if err != nil {
		return err
	}
	d.be.copy(dr.mem, src)
	return nil
}

// MemcpyDtoH copies len(dst) bytes at src, memory of d, into the Go slice dst
// and returns when done.
func (d *Device) MemcpyDtoH(dst []byte, src Ptr) error {
	if err := d.check("MemcpyDtoH"); err != nil {
		return err
	}
	sr, err := resolveOwn("MemcpyDtoH", d, -1, "src", src, int64(len(dst)))
	if err != nil {
		return err
	}
	d.be.copy(dst, sr.mem)
	return nil
}

// removeDevice removes and returns one allocation of dev, or nil when none is left.
func (t *allocTable) removeDevice(dev *Device) *allocation {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, a := range t.list() {
		if a.dev == dev {
			t.edit(func(s []*allocation) []*allocation { return slices.Delete(s, i, i+1) })
			return a
		}
	}
	return nil
}
