//go:build linux

package shm

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/memcopy"
	"github.com/hcomm-dev/hcomm/internal/reduce"
	"github.com/hcomm-dev/hcomm/notify"
)

// wordStride is the distance between two notify words on a notify page: one
// cache line each, so that a wait spinning on one notify does not slow the
// records of its neighbours.
const wordStride = 64

var pageSize = os.Getpagesize()

// remoteMem is one range the peer shared, mapped here.
type remoteMem struct {
	mem   channel.Mem // in the peer's address space
	m     []byte      // the mapping (from the page below the range)
	b     []byte      // the range's bytes in the mapping
	lines *lineHold   // the prepared lines into the mapping (PrepareLine)
}

// lineHold counts the prepared lines (linePut) that store into a mapping of
// the peer's memory. A line's Put takes no lock — a locked instruction
// before the store is on the path of every hand-off, and the hand-off
// between two processes on sibling cores takes 25 ns one way here — so the
// mapping must not become a hole while a Put may still run: when the
// channel closes (or the peer leaves) with lines prepared, the mapping is
// retired instead of unmapped (the shared memory goes at once, private
// memory takes its place: a Put racing with the close stores there and
// does no harm), and its addresses are unmapped when the last of its lines
// is garbage.
type lineHold struct {
	mu      sync.Mutex
	lines   int  // prepared lines not yet collected
	retired bool // the mapping was retired; the last line's collection unmaps it
	addr    unsafe.Pointer
	n       uintptr
}

// hold counts one more line into the mapping; false once it is retired.
func (h *lineHold) hold() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.retired {
		return false
	}
	h.lines++
	return true
}

// drop is a line's collection: the last one of a retired mapping unmaps it.
func (h *lineHold) drop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lines--; h.lines == 0 && h.retired {
		unix.MunmapPtr(h.addr, h.n)
		retiredMaps.Add(-1)
	}
}

// unmap gives the mapping m up: unmapped at once when no line stores into
// it, else mapped over with private memory (as retire does a notify page)
// and unmapped by the last line's drop.
func (h *lineHold) unmap(m []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lines == 0 {
		unix.Munmap(m)
		return
	}
	h.addr, h.n = unsafe.Pointer(&m[0]), uintptr(len(m))
	if _, err := unix.MmapPtr(-1, 0, h.addr, h.n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED); err != nil {
		// Cannot happen for a range this process mapped; if it did, the
		// memory stays mapped (and shared) rather than become a hole.
		return
	}
	h.retired = true
	retiredMaps.Add(1)
}

// retiredMaps counts the retired mappings of peers' memory that prepared
// lines still hold (for tests).
var retiredMaps atomic.Int64

// Transport is the shared-memory transport to one peer: the peer's memory
// and notify page are mapped into this process, so a write is one copy and a
// record one atomic. Safe for concurrent use.
type Transport struct {
	name       string
	rank, peer int
	peerPID    int
	populate   bool
	cma        bool      // both ends can read the other's memory through the kernel (ReadPeer)
	viaFiles   bool      // both ends can open the other's descriptors, to map its memory files (ReadPeer)
	files      peerFiles // the peer's memory files mapped for ReadPeer (peerfile.go)

	// mu is held for reading by every operation that touches a mapping and
	// for writing by Close, which unmaps.
	mu         sync.RWMutex
	closed     bool
	down       atomic.Bool // closed, or the peer's memory unmapped: a prepared line's Put looks at it without mu
	mems       []remoteMem // mems[0] is the peer's HCCL buffer
	peerPage   []byte      // the peer's notify page
	peerNotify int
	ownPage    []byte // this end's notify page
	ownFD      int    // its descriptor, until sent
	notifies   []*notify.Notify

	conn      *net.UnixConn
	closing   atomic.Bool
	lost      atomic.Pointer[error] // why the peer is gone
	watchDone chan struct{}

	closeOnce sync.Once
	closeErr  error
}

// makeNotifies makes this end's notify page (a sealed memfd of n words, one
// per cache line) and a shared notify on each word.
func (t *Transport) makeNotifies(n int) error {
	t.ownFD = -1
	if n == 0 {
		return nil
	}
	size := roundPage(int64(n) * wordStride)
	fd, err := unix.MemfdCreate("hcomm-shm-notify", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return fmt.Errorf("memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		unix.Close(fd)
		return fmt.Errorf("sizing the notify page: %w", err)
	}
	if err := unix.Fallocate(fd, 0, 0, size); err != nil {
		unix.Close(fd)
		return fmt.Errorf("reserving the notify page: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		unix.Close(fd)
		return fmt.Errorf("sealing the notify page: %w", err)
	}
	m, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return fmt.Errorf("mapping the notify page: %w", err)
	}
	t.ownFD, t.ownPage = fd, m
	t.notifies = make([]*notify.Notify, n)
	for i := range t.notifies {
		t.notifies[i] = notify.NewShared(fmt.Sprintf("%s notify %d", t.name, i), wordAt(m, i))
	}
	return nil
}

func (t *Transport) closeOwnFD() {
	if t.ownFD >= 0 {
		unix.Close(t.ownFD)
		t.ownFD = -1
	}
}

// retire gives up the notify page m, whose words the notifies ns are: the
// shared memory goes at once (m is mapped over with private memory, so the
// memfd is no longer held here), but the addresses stay valid until every
// one of ns is unreachable, and only then are they unmapped. A notify's
// calls do not lock out Detach (notify.NewShared): one that raced with the
// close may touch its word once more, and finds private memory there
// instead of a hole.
func retire(m []byte, ns []*notify.Notify) {
	addr, n := unsafe.Pointer(&m[0]), uintptr(len(m))
	if _, err := unix.MmapPtr(-1, 0, addr, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED); err != nil {
		// Cannot happen for a range this process mapped; if it did, the
		// memory stays mapped (and shared) rather than become a hole.
		return
	}
	left := &retired{addr: addr, n: n}
	left.refs.Store(int32(len(ns)))
	for _, x := range ns {
		runtime.AddCleanup(x, func(r *retired) {
			if r.refs.Add(-1) == 0 {
				unix.MunmapPtr(r.addr, r.n)
				unmapped.Add(1)
			}
		}, left)
	}
	if len(ns) == 0 {
		unix.MunmapPtr(addr, n)
	}
}

// unmapped counts the retired pages unmapped (for tests).
var unmapped atomic.Int64

// retired is a notify page mapped over with private memory, waiting for
// its notifies to be gone.
type retired struct {
	addr unsafe.Pointer
	n    uintptr
	refs atomic.Int32
}

func wordAt(page []byte, i int) *uint32 {
	return (*uint32)(unsafe.Pointer(&page[i*wordStride]))
}

func roundPage(n int64) int64 {
	p := int64(pageSize)
	return (n + p - 1) / p * p
}

// checkFile checks that fd is a memory file the peer cannot shrink and that
// [off, off+n) lies inside it: a mapping of it can then never fault.
func checkFile(fd int, off, n uint64) error {
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return fmt.Errorf("not a sealable memory file (F_GET_SEALS: %w)", err)
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return errors.New("memory file is not sealed against shrinking")
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("fstat: %w", err)
	}
	if st.Size < 0 || off > uint64(st.Size) || n > uint64(st.Size)-off {
		return fmt.Errorf("range [%d, +%d) of the file runs past its end (%d bytes)", off, n, st.Size)
	}
	return nil
}

// mapMem checks entry e of the peer's description (index i) and maps it.
func (t *Transport) mapMem(e memEntry, fds []int, i int) error {
	rm := remoteMem{mem: channel.Mem{Tag: e.Tag, Addr: device.Ptr(e.Addr), Size: int64(e.Size)}}
	if e.Size == 0 {
		t.mems = append(t.mems, rm)
		return nil
	}
	fd := fds[e.FD] // decodeMsg checked the index
	if err := checkFile(fd, e.Offset, e.Size); err != nil {
		return err
	}
	base := e.Offset &^ uint64(pageSize-1)
	skew := e.Offset - base
	flags := unix.MAP_SHARED
	if t.populate {
		flags |= unix.MAP_POPULATE
	}
	m, err := unix.Mmap(fd, int64(base), int(skew+e.Size), unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		return fmt.Errorf("mapping %d bytes: %w", skew+e.Size, err)
	}
	rm.m, rm.b, rm.lines = m, m[skew:skew+e.Size:skew+e.Size], &lineHold{}
	t.mems = append(t.mems, rm)
	return nil
}

// mapPeerNotifies checks and maps the peer's notify page of n words.
func (t *Transport) mapPeerNotifies(fd, n int) error {
	size := uint64(roundPage(int64(n) * wordStride))
	if err := checkFile(fd, 0, size); err != nil {
		return fmt.Errorf("notify page: %w", err)
	}
	m, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("mapping the notify page: %w", err)
	}
	t.peerPage = m
	return nil
}

func (t *Transport) remoteMems() []channel.Mem {
	out := make([]channel.Mem, len(t.mems))
	for i, m := range t.mems {
		out[i] = m.mem
	}
	return out
}

// startWatch starts the goroutine that watches the socket for the peer's
// goodbye or death. Close stops it.
func (t *Transport) startWatch() {
	t.watchDone = make(chan struct{})
	go t.watch()
}

// watch reads the socket until it ends. Nothing is expected on it but BYE;
// its end without one means the peer's process is gone.
func (t *Transport) watch() {
	defer close(t.watchDone)
	for {
		m, fds, err := recvMsgFDs(t.conn)
		closeFDs(fds)
		if t.closing.Load() {
			return
		}
		var cause error
		switch {
		case err == nil && m.Type == msgBye:
			cause = fmt.Errorf("rank %d (pid %d) closed its end of %s: %w", t.peer, t.peerPID, t.name, channel.ErrPeerClosed)
		case err == nil:
			cause = fmt.Errorf("rank %d (pid %d) sent %v after connecting: %w", t.peer, t.peerPID, m.Type, channel.ErrPeerLost)
		case errors.Is(err, io.EOF):
			cause = fmt.Errorf("rank %d (pid %d) of %s is lost: its socket closed without a goodbye (the process exited or was killed): %w",
				t.peer, t.peerPID, t.name, channel.ErrPeerLost)
		default:
			cause = fmt.Errorf("rank %d (pid %d) of %s is lost: %v: %w", t.peer, t.peerPID, t.name, err, channel.ErrPeerLost)
		}
		t.lose(cause)
		if err == nil && m.Type == msgBye {
			t.unmapPeer()
		}
		return
	}
}

// unmapPeer unmaps the peer's memory and notify page once the peer closed
// its end in order: nothing of this end may use them any more (every
// operation fails on the peer's goodbye first), and a peer that closed a
// channel to stop sharing memory (hcomm's ChannelDestroy, a deregistered
// window) must not stay mapped here until this end closes too. This end's
// own notify page stays until Close: its notifies point into it.
func (t *Transport) unmapPeer() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.down.Store(true)
	t.unmapMems()
	if t.peerPage != nil {
		unix.Munmap(t.peerPage)
		t.peerPage = nil
	}
	t.dropFiles()
}

// unmapMems unmaps the peer's memory (retiring the mappings that prepared
// lines store into). mu is held for writing.
func (t *Transport) unmapMems() {
	for _, m := range t.mems {
		if m.m != nil {
			m.lines.unmap(m.m)
		}
	}
	t.mems = nil
}

// lose records why the peer is gone and breaks every local notify with it.
func (t *Transport) lose(cause error) {
	if !t.lost.CompareAndSwap(nil, &cause) {
		return
	}
	for _, n := range t.notifies {
		n.Break(cause)
	}
}

// Lost returns why the peer is gone (wrapping channel.ErrPeerLost or channel.ErrPeerClosed),
// or nil while it is connected.
func (t *Transport) Lost() error {
	if p := t.lost.Load(); p != nil {
		return *p
	}
	return nil
}

// Name returns "shm".
func (t *Transport) Name() string { return "shm" }

// usable is the check at the start of every operation; the caller holds mu
// for reading.
func (t *Transport) usable(op string) error {
	if t.closed {
		return fmt.Errorf("shm %s on %s (rank %d -> rank %d): %w", op, t.name, t.rank, t.peer, channel.ErrClosed)
	}
	if err := t.Lost(); err != nil {
		return fmt.Errorf("shm %s on %s (rank %d -> rank %d): %w", op, t.name, t.rank, t.peer, err)
	}
	return nil
}

// peerBytes returns the mapped bytes of the peer's [p, p+n), which must lie
// inside one range the peer shared at connect. The caller holds mu for
// reading.
func (t *Transport) peerBytes(op string, p device.Ptr, n int64) ([]byte, error) {
	if err := t.usable(op); err != nil {
		return nil, err
	}
	for i := range t.mems {
		m := &t.mems[i]
		if m.mem.Contains(p, n) {
			off := int64(p - m.mem.Addr)
			return m.b[off : off+n : off+n], nil
		}
	}
	h := t.mems[0].mem
	return nil, fmt.Errorf("shm %s on %s (rank %d -> rank %d): range [%#x, +%d) of rank %d is outside the memory it shared at connect "+
		"(HCCL buffer [%#x, +%d) and %d other ranges; memory registered after the connect needs a new channel): %w",
		op, t.name, t.rank, t.peer, uintptr(p), n, t.peer, uintptr(h.Addr), h.Size, len(t.mems)-1, ErrOutOfRange)
}

// Write copies src into the peer's memory at dst. The copy is not
// interruptible (stop is not watched): it is bounded by len(src).
func (t *Transport) Write(_ <-chan struct{}, dst device.Ptr, src []byte) error {
	t.mu.RLock()
	defer t.mu.RUnlock()
	b, err := t.peerBytes("Write", dst, int64(len(src)))
	if err != nil {
		return err
	}
	copy(b, src)
	return nil
}

var _ channel.FlagWriter = (*Transport)(nil)
var _ channel.PeerWriter = (*Transport)(nil)

// WriteFlagged stores src into the peer's memory at dst as flagged words
// (channel.FlagWriter): atomic 8-byte stores into the shared mapping, which
// the peer polls in its own.
func (t *Transport) WriteFlagged(_ <-chan struct{}, dst device.Ptr, src []byte, flag uint32) error {
	if err := channel.CheckFlagged(dst, len(src)); err != nil {
		return fmt.Errorf("shm WriteFlagged on %s (rank %d -> rank %d): %w", t.name, t.rank, t.peer, err)
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	b, err := t.peerBytes("WriteFlagged", dst, int64(channel.FlaggedLen(len(src))))
	if err != nil {
		return err
	}
	if !channel.Aligned8(b) {
		return fmt.Errorf("shm WriteFlagged on %s (rank %d -> rank %d): the mapping of %#x is not 8-byte aligned", t.name, t.rank, t.peer, uintptr(dst))
	}
	channel.PutFlagged(b, src, flag)
	return nil
}

// WriteLine stores src into the line at the peer's dst (channel.PutLine):
// plain stores into the shared mapping, then one release store of the flag
// word, which the peer polls in its own.
func (t *Transport) WriteLine(_ <-chan struct{}, dst device.Ptr, src []byte, flag uint32) error {
	t.mu.RLock()
	defer t.mu.RUnlock()
	b, err := t.lineBytes("WriteLine", dst, len(src))
	if err != nil {
		return err
	}
	channel.PutLine(b, src, flag)
	return nil
}

// PrepareLine checks the line at the peer's dst once (channel.FlagWriter).
// Its Put takes no lock: it checks the channel with two atomic loads, and
// the mapping stays addressable while the line is reachable (lineHold).
func (t *Transport) PrepareLine(dst device.Ptr) (channel.LinePut, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	b, err := t.lineBytes("PrepareLine", dst, 0)
	if err != nil {
		return nil, err
	}
	var h *lineHold
	for _, m := range t.mems {
		if m.mem.Contains(dst, channel.LineSize) {
			h = m.lines
		}
	}
	if h == nil || !h.hold() {
		// lineBytes found the line in a mapping that Close retires
		// only under mu, held here for reading.
		return nil, fmt.Errorf("shm PrepareLine on %s (rank %d -> rank %d): the mapping of %#x is gone", t.name, t.rank, t.peer, uintptr(dst))
	}
	l := &linePut{t: t, b: b}
	runtime.AddCleanup(l, (*lineHold).drop, h)
	return l, nil
}

// lineBytes checks a line write of n bytes to dst and returns the line (mu
// held for reading).
func (t *Transport) lineBytes(op string, dst device.Ptr, n int) ([]byte, error) {
	if err := channel.CheckLine(dst, n); err != nil {
		return nil, fmt.Errorf("shm %s on %s (rank %d -> rank %d): %w", op, t.name, t.rank, t.peer, err)
	}
	b, err := t.peerBytes(op, dst, channel.LineSize)
	if err != nil {
		return nil, err
	}
	if !channel.Aligned8(b) {
		return nil, fmt.Errorf("shm %s on %s (rank %d -> rank %d): the mapping of %#x is not 8-byte aligned", op, t.name, t.rank, t.peer, uintptr(dst))
	}
	return b, nil
}

// linePut is a line of the peer's mapped memory, checked once.
type linePut struct {
	t *Transport
	b []byte
}

func (l *linePut) Put(src []byte, flag uint32) error {
	if l.t.down.Load() || l.t.lost.Load() != nil {
		l.t.mu.RLock()
		err := l.t.usable("Put")
		l.t.mu.RUnlock()
		if err == nil {
			err = fmt.Errorf("shm Put on %s (rank %d -> rank %d): the peer's memory is unmapped: %w", l.t.name, l.t.rank, l.t.peer, channel.ErrClosed)
		}
		return err
	}
	if len(src) > channel.LineData {
		return fmt.Errorf("shm Put on %s: a line carries at most %d bytes, not %d", l.t.name, channel.LineData, len(src))
	}
	channel.PutLine(l.b, src, flag)
	// The line on its way now: a fence waits for the store to leave this
	// core. Unfenced, the line waited behind the poll that follows the Put
	// (bench p2p over shm, 8 bytes, interleaved: 0.138–0.159 µs a round
	// trip against 0.105–0.107 with the read lock this Put took before;
	// fenced and unlocked 0.114–0.117 against the lock's 0.141–0.188, with
	// pingpong shm at 131–163 ns).
	channel.Fence()
	return nil
}

// setReads takes each end's READY flags (probeReads): a way of reading is
// the pair's when both ends have it, so that both agree.
func (t *Transport) setReads(mine, theirs uint8) {
	t.cma = mine&theirs&readyReads != 0
	t.viaFiles = mine&theirs&readyFiles != 0
}

// ReadsPeer reports whether ReadPeer works on this pair: at connect, each
// end read a word of the other's memory through the kernel, or opened the
// other's descriptors (to map the memory files of what it reads). The same
// on both ends.
func (t *Transport) ReadsPeer() bool { return t.cma || t.viaFiles }

// peerReadPiece bounds one process_vm_readv: between two, a stop or a
// Close is seen (a 4 MiB copy takes about a millisecond here).
const peerReadPiece = 4 << 20

// ReadPeer copies len(dst) bytes of the peer's address space at src into
// dst: memory the peer lent for one operation, which it need not have
// shared at connect. From peerFileMin bytes on, when file names where src
// lies in the peer's memory file and that file checks out, from a mapping
// of the file (peerfile.go); otherwise through the kernel
// (process_vm_readv), which checks the range against the peer's mappings: a
// range that is not mapped there is ErrOutOfRange naming it (the bytes
// before the hole may have been copied). Fails with ErrNoPeerReads when the
// pair cannot (ReadsPeer). A stop is seen between pieces of peerReadPiece.
func (t *Transport) ReadPeer(stop <-chan struct{}, dst []byte, src device.Ptr, file channel.PeerFile) error {
	return t.peerCopy(readWay, stop, dst, src, file)
}

// WritePeer copies src into the peer's address space at dst: memory the peer
// lent for one operation (a collective's receive buffer), which it need not
// have shared at connect — ReadPeer's mirror, on a pair that reads
// (ReadsPeer). From peerFileMin bytes on, when file names where dst lies in
// the peer's memory file and that file checks out, into a writable mapping
// of the file with a streaming copy (what is written is the peer's output,
// read by nobody here); otherwise through the kernel (process_vm_writev),
// which checks the range against the peer's mappings: a range that is not
// mapped there is ErrOutOfRange naming it (the bytes before the hole may
// have been written). Nothing here can tell the range the peer lent from
// any other range of its memory file: a peer that names another has that
// range of its own memory written, which it could have written itself. A
// stop is seen between pieces of peerReadPiece.
func (t *Transport) WritePeer(stop <-chan struct{}, dst device.Ptr, src []byte, file channel.PeerFile) error {
	return t.peerCopy(writeWay, stop, src, dst, file)
}

// peerWay is what tells a read of the peer's memory from a write.
type peerWay struct {
	write                  bool
	op, verb, past, kernel string // for errors: "ReadPeer", "reading", "read from", "process_vm_readv"
}

var (
	readWay  = peerWay{false, "ReadPeer", "reading", "read from", "process_vm_readv"}
	writeWay = peerWay{true, "WritePeer", "writing", "written to", "process_vm_writev"}
)

// peerCopy is ReadPeer (local the destination) and WritePeer (local the
// source) of len(local) bytes at remote in the peer's address space.
func (t *Transport) peerCopy(w peerWay, stop <-chan struct{}, local []byte, remote device.Ptr, file channel.PeerFile) error {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if err := t.usable(w.op); err != nil {
		return err
	}
	// where names the call in an error (made only then: a read of a few
	// KiB must not pay for it).
	where := func() string { return fmt.Sprintf("shm %s on %s (rank %d -> rank %d)", w.op, t.name, t.rank, t.peer) }
	if !t.cma && !t.viaFiles {
		return fmt.Errorf("%s: %w", where(), ErrNoPeerReads)
	}
	if uint64(remote) > ^uint64(0)-uint64(len(local)) {
		return fmt.Errorf("%s: range [%#x, +%d) of rank %d wraps around: %w", where(), uintptr(remote), len(local), t.peer, ErrOutOfRange)
	}
	var mapped []byte
	if t.viaFiles && (len(local) >= peerFileMin || !t.cma) && len(local) > 0 {
		var e *peerFile
		if mapped, e = t.fileBytes(file, len(local), w.write); e != nil {
			defer t.releaseFile(e)
		}
	}
	if mapped == nil && !t.cma && len(local) > 0 {
		return fmt.Errorf("%s: [%#x, +%d) of rank %d: its memory file (%+v) could not be mapped here, and the kernel does not let these processes use %s: %w",
			where(), uintptr(remote), len(local), t.peer, file, w.kernel, ErrNoPeerReads)
	}
	for done := 0; done < len(local); {
		if done > 0 {
			select {
			case <-stop:
				return &device.Error{Op: "shm." + w.op, Device: -1, Stream: -1, Code: device.ErrStreamAbort,
					Msg: fmt.Sprintf("stopped after %d of %d bytes %s rank %d", done, len(local), w.past, t.peer)}
			default:
			}
		}
		m := min(peerReadPiece, len(local)-done)
		switch {
		case mapped != nil && w.write:
			memcopy.Stream(mapped[done:done+m], local[done:done+m])
		case mapped != nil:
			memcopy.Read(local[done:done+m], mapped[done:done+m])
		}
		if mapped != nil {
			done += m
			continue
		}
		at := uintptr(remote) + uintptr(done)
		var n int
		var err error
		if w.write {
			n, err = writePeer(t.peerPID, local[done:done+m], at)
		} else {
			n, err = readPeer(t.peerPID, local[done:done+m], at)
		}
		if err != nil || n == 0 {
			if err == nil || err == unix.EFAULT {
				err = ErrOutOfRange
			}
			if err == unix.ESRCH {
				err = channel.ErrPeerLost
			}
			return fmt.Errorf("%s: %s [%#x, +%d) of rank %d (pid %d): %w", where(), w.verb, at, m, t.peer, t.peerPID, err)
		}
		done += n
	}
	return nil
}

// writePeer is one process_vm_writev of src to dst in pid's address space;
// it returns what was copied (less than asked when the range runs into an
// unmapped page).
func writePeer(pid int, src []byte, dst uintptr) (int, error) {
	for {
		n, err := unix.ProcessVMWritev(pid, []unix.Iovec{{Base: &src[0], Len: uint64(len(src))}}, []unix.RemoteIovec{{Base: dst, Len: len(src)}}, 0)
		if err != unix.EINTR {
			return n, err
		}
	}
}

// readPeer is one process_vm_readv of len(dst) bytes at src in pid's
// address space; it returns what was copied (less than asked when the
// range runs into an unmapped page).
func readPeer(pid int, dst []byte, src uintptr) (int, error) {
	for {
		n, err := unix.ProcessVMReadv(pid, []unix.Iovec{{Base: &dst[0], Len: uint64(len(dst))}}, []unix.RemoteIovec{{Base: src, Len: len(dst)}}, 0)
		if err != unix.EINTR {
			return n, err
		}
	}
}

// Read copies the peer's memory at src into dst.
func (t *Transport) Read(_ <-chan struct{}, dst []byte, src device.Ptr) error {
	t.mu.RLock()
	defer t.mu.RUnlock()
	b, err := t.peerBytes("Read", src, int64(len(dst)))
	if err != nil {
		return err
	}
	copy(dst, b)
	return nil
}

// WriteReduce computes peer[dst] = peer[dst] op src over count elements of
// dt, in place in the peer's memory. The peer must not touch that range
// until the record that follows (as with every write).
func (t *Transport) WriteReduce(_ <-chan struct{}, dst device.Ptr, src []byte, count int, dt reduce.DataType, op reduce.Op) error {
	t.mu.RLock()
	defer t.mu.RUnlock()
	b, err := t.peerBytes("WriteReduce", dst, int64(len(src)))
	if err != nil {
		return err
	}
	if err := reduce.Reduce(b, src, count, dt, op); err != nil {
		return fmt.Errorf("shm WriteReduce on %s (rank %d -> rank %d): %w", t.name, t.rank, t.peer, err)
	}
	return nil
}

// ReadReduce computes dst = dst op peer[src] over count elements of dt.
func (t *Transport) ReadReduce(_ <-chan struct{}, dst []byte, src device.Ptr, count int, dt reduce.DataType, op reduce.Op) error {
	t.mu.RLock()
	defer t.mu.RUnlock()
	b, err := t.peerBytes("ReadReduce", src, int64(len(dst)))
	if err != nil {
		return err
	}
	if err := reduce.Reduce(dst, b, count, dt, op); err != nil {
		return fmt.Errorf("shm ReadReduce on %s (rank %d -> rank %d): %w", t.name, t.rank, t.peer, err)
	}
	return nil
}

// NotifyRecord records the peer's notify idx: an atomic on its word in the
// peer's notify page, and a futex wake when the peer sleeps on it. It is a
// release: the bytes of every earlier Write are visible to the peer once its
// wait returns.
func (t *Transport) NotifyRecord(_ <-chan struct{}, idx int) error {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if err := t.usable("NotifyRecord"); err != nil {
		return err
	}
	if idx < 0 || idx >= t.peerNotify {
		return fmt.Errorf("shm NotifyRecord on %s (rank %d -> rank %d): rank %d has no notify %d on this channel (it has %d)",
			t.name, t.rank, t.peer, t.peer, idx, t.peerNotify)
	}
	notify.Signal(wordAt(t.peerPage, idx))
	return nil
}

// WriteWithNotify is Write and then NotifyRecord under one hold of the
// mapping lock and one check of the channel (channel.WriteNotifier): a small
// hand-off (a collective's hello) costs one lock instead of two.
func (t *Transport) WriteWithNotify(_ <-chan struct{}, dst device.Ptr, src []byte, idx int) error {
	t.mu.RLock()
	defer t.mu.RUnlock()
	b, err := t.peerBytes("Write", dst, int64(len(src)))
	if err != nil {
		return err
	}
	if idx < 0 || idx >= t.peerNotify {
		return fmt.Errorf("shm NotifyRecord on %s (rank %d -> rank %d): rank %d has no notify %d on this channel (it has %d)",
			t.name, t.rank, t.peer, t.peer, idx, t.peerNotify)
	}
	copy(b, src)
	notify.Signal(wordAt(t.peerPage, idx))
	return nil
}

var _ channel.Poster = (*Transport)(nil)

// PreparePost checks the range and the notify once (channel.Poster). The
// post holds the mapping's bytes; each Post takes the mapping lock and
// checks the channel, so that it never touches a mapping Close removed.
func (t *Transport) PreparePost(dst device.Ptr, n int64, idx int) (channel.Post, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	b, err := t.peerBytes("PreparePost", dst, n)
	if err != nil {
		return nil, err
	}
	if idx < 0 || idx >= t.peerNotify {
		return nil, fmt.Errorf("shm PreparePost on %s (rank %d -> rank %d): rank %d has no notify %d on this channel (it has %d)",
			t.name, t.rank, t.peer, t.peer, idx, t.peerNotify)
	}
	return &post{t: t, b: b, word: wordAt(t.peerPage, idx)}, nil
}

// post is a prepared write into the peer's memory and record of its notify.
type post struct {
	t    *Transport
	b    []byte
	word *uint32
}

func (p *post) Post(src []byte) error {
	p.t.mu.RLock()
	defer p.t.mu.RUnlock()
	if err := p.t.usable("Post"); err != nil {
		return err
	}
	if len(src) > len(p.b) {
		return fmt.Errorf("shm Post on %s: %d bytes into a range of %d", p.t.name, len(src), len(p.b))
	}
	copy(p.b, src)
	notify.Signal(p.word)
	return nil
}

// fenceWord is the target of Fence's atomic.
var fenceWord atomic.Uint32

// Fence returns at once, after a full memory barrier: an operation of this
// transport is complete at the peer when it returns (a write is a copy into
// memory the peer maps, coherent across cores), so there is nothing to wait
// for. The barrier (an atomic read-modify-write) orders this goroutine's
// earlier stores before its later ones; NotifyRecord carries the same order
// on its own, which is why a write followed by a record needs no fence.
func (t *Transport) Fence(<-chan struct{}) error {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if err := t.usable("Fence"); err != nil {
		return err
	}
	fenceWord.Add(1)
	return nil
}

// Close says goodbye to the peer, stops the watcher, breaks and detaches the
// local notifies (their waits fail with channel.ErrClosed), and unmaps the peer's
// memory, its notify page and this end's. Operations after Close fail with
// channel.ErrClosed. Idempotent; later calls return the first call's result.
func (t *Transport) Close() error {
	t.closeOnce.Do(func() {
		t.closing.Store(true)
		if t.conn != nil {
			t.conn.SetWriteDeadline(time.Now().Add(time.Second))
			_ = sendMsg(t.conn, &msg{Type: msgBye}, nil)
			t.closeErr = t.conn.Close()
		}
		<-t.watchDone
		t.release(fmt.Errorf("shm %s (rank %d -> rank %d): %w", t.name, t.rank, t.peer, channel.ErrClosed))
	})
	return t.closeErr
}

// release detaches the notifies and unmaps everything.
func (t *Transport) release(why error) {
	for _, n := range t.notifies {
		n.Detach(why)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	t.down.Store(true)
	t.unmapMems()
	if t.peerPage != nil {
		unix.Munmap(t.peerPage)
	}
	if t.ownPage != nil {
		retire(t.ownPage, t.notifies)
	}
	t.peerPage, t.ownPage = nil, nil
	t.dropFiles()
	t.closeOwnFD()
}

var (
	_ channel.Transport = (*Transport)(nil)
	_ channel.Dialer    = (*Dialer)(nil)
)
