//go:build linux

package shm_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/channel/shm"
	"github.com/hcomm-dev/hcomm/device"
)

// lent is an allocation the peer process made and filled (its "lend").
type lent struct {
	addr device.Ptr
	file channel.PeerFile
}

func (p *peer) lend(n int64, seed int) lent {
	p.t.Helper()
	f := strings.Fields(p.do("lend %d %d", n, seed))
	v := make([]uint64, 4)
	for i := range v {
		v[i], _ = strconv.ParseUint(f[i], 10, 64)
	}
	return lent{addr: device.Ptr(v[0]), file: channel.PeerFile{FD: int64(v[1]), Ino: v[2], Off: int64(v[3])}}
}

// readingPeer starts the peer, this end probing process_vm_readv at
// connect or not (cma), and skips the test unless the pair reads the
// peer's memory some way; both ends must agree that it does.
func readingPeer(t *testing.T, cma bool) *peer {
	t.Helper()
	old := shm.SetProbeCMA(cma)
	p := startPeer(t, bufSize)
	shm.SetProbeCMA(old)
	if !p.e.tr.ReadsPeer() {
		t.Skip("the kernel lets these processes neither process_vm_readv nor open each other's descriptors: the collectives stage instead")
	}
	if got := p.do("reads"); got != "true" {
		t.Fatalf("the peer's end says ReadsPeer %s, this end true", got)
	}
	return p
}

// readsAs reads n bytes of the peer's l at off, through file (or none), and
// checks them against the peer's pattern seed.
func readsAs(t *testing.T, p *peer, l lent, off, n int64, seed int, file channel.PeerFile) {
	t.Helper()
	dst := make([]byte, n)
	if file.FD >= 0 {
		file.Off += off
	}
	if err := p.e.tr.ReadPeer(nil, dst, l.addr.Add(off), file); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, off+n)
	pattern(want, seed)
	for i := range dst {
		if dst[i] != want[off+int64(i)] {
			t.Fatalf("byte %d of [%#x+%d, +%d): %#x, want %#x", i, uintptr(l.addr), off, n, dst[i], want[off+int64(i)])
		}
	}
}

// TestReadPeer: the peer's memory that it never registered nor shared,
// read by address (the kernel's copy) and through its memory file (mapped
// here), at odd offsets and sizes on both sides of the file threshold; a
// file hint that does not check out (another inode, another descriptor)
// falls back to the kernel's copy and reads the right bytes; memory freed
// and allocated again (a descriptor number reused) is never read from the
// old file; more files than the cache holds are read right and the cache
// stays bounded; an address the peer has not mapped is ErrOutOfRange; a
// closed end maps nothing any more.
func TestReadPeer(t *testing.T) {
	p := readingPeer(t, true)
	if !shm.CMA(p.e.tr) {
		t.Skip("the kernel refuses process_vm_readv between these processes (TestReadPeerThroughFilesOnly covers the files alone)")
	}
	const n = 3<<20 + 5
	a := p.lend(n, 1)
	for _, c := range []struct{ off, n int64 }{{0, n}, {1, 100}, {4093, 8 << 10}, {7, 1<<20 + 9}, {n - 17, 17}} {
		readsAs(t, p, a, c.off, c.n, 1, channel.NoPeerFile)
		readsAs(t, p, a, c.off, c.n, 1, a.file)
	}
	if shm.FilesMapped(p.e.tr) != 1 {
		t.Fatalf("%d files mapped after reading one allocation through its file, want 1", shm.FilesMapped(p.e.tr))
	}
	wrong := a.file
	wrong.Ino++
	readsAs(t, p, a, 0, 1<<20, 1, wrong)
	wrong = a.file
	wrong.FD = 1 << 20
	readsAs(t, p, a, 0, 1<<20, 1, wrong)
	wrong = a.file
	wrong.Off = 1 << 40 // past the file: the kernel's copy, by address
	dst := make([]byte, 1<<20)
	if err := p.e.tr.ReadPeer(nil, dst, a.addr, wrong); err != nil {
		t.Fatalf("a file offset past the file: %v, want the kernel's copy", err)
	}

	// Freed and allocated again: the same descriptor number, most likely,
	// but another file; what this end mapped of the first is not read.
	p.do("free %d", a.addr)
	b := p.lend(n, 2)
	readsAs(t, p, b, 0, n, 2, b.file)
	readsAs(t, p, b, 5, 1<<20, 2, b.file)

	for i := 0; i < shm.FilesMax+3; i++ {
		l := p.lend(1<<20, 10+i)
		readsAs(t, p, l, 3, 1<<20-3, 10+i, l.file)
		p.do("free %d", l.addr)
	}
	if got := shm.FilesMapped(p.e.tr); got > shm.FilesMax {
		t.Fatalf("%d files mapped, the cache holds at most %d", got, shm.FilesMax)
	}

	err := p.e.tr.ReadPeer(nil, make([]byte, 64), 4096, channel.NoPeerFile)
	if !errors.Is(err, shm.ErrOutOfRange) || !strings.Contains(err.Error(), "0x1000") {
		t.Fatalf("reading the peer's page 1: %v, want ErrOutOfRange naming it", err)
	}
	p.e.tr.Close()
	if got := shm.FilesMapped(p.e.tr); got != 0 {
		t.Fatalf("%d files still mapped after Close", got)
	}
	if err := p.e.tr.ReadPeer(nil, make([]byte, 64), b.addr, b.file); !errors.Is(err, channel.ErrClosed) {
		t.Fatalf("ReadPeer after Close: %v, want ErrClosed", err)
	}
}

// TestReadPeerSmallThroughFile: a read of 4 KiB — the least the
// collectives read from a peer of another process (collectives'
// pairReadMin: a 2-process all-to-all's 4 KiB blocks, a broadcast of 4 KiB)
// — goes through the peer's memory file mapped here, not the kernel's copy,
// when the file checks out: process_vm_readv cost such a call 2.3–2.9 µs
// on the development VM, the mapping 0.4–0.6 (stop 47). Before, reads below
// 8 KiB took the kernel's copy, and this fails.
func TestReadPeerSmallThroughFile(t *testing.T) {
	p := readingPeer(t, true)
	a := p.lend(64<<10, 3)
	readsAs(t, p, a, 0, 4<<10, 3, a.file)
	if got := shm.FilesMapped(p.e.tr); got != 1 {
		t.Fatalf("%d files mapped after a 4 KiB read with the peer's file, want 1: it took the kernel's copy", got)
	}
}

// TestNoPeerReads: an end that dials with NoPeerReads says so, and neither
// end of the pair reads the other's memory: ReadsPeer false on both, and
// ReadPeer fails with ErrNoPeerReads.
func TestNoPeerReads(t *testing.T) {
	p := startPeerWith(t, bufSize, shm.Options{NoPeerReads: true})
	if p.e.tr.ReadsPeer() {
		t.Fatal("ReadsPeer true on the end that dialed with NoPeerReads")
	}
	if got := p.do("reads"); got != "false" {
		t.Fatalf("the peer's end says ReadsPeer %s, want false", got)
	}
	a := p.lend(1<<20, 1)
	if err := p.e.tr.ReadPeer(nil, make([]byte, 64), a.addr, a.file); !errors.Is(err, shm.ErrNoPeerReads) {
		t.Fatalf("ReadPeer: %v, want ErrNoPeerReads", err)
	}
}

// TestReadPeerThroughFilesOnly: a pair where process_vm_readv is refused
// (this end does not try it, as under Yama's ptrace_scope 1) but the peer's
// descriptors can be opened still reads: through the peer's memory file, at
// every size, small ones included; a read without a file to map, or with
// one that does not check out, fails with ErrNoPeerReads saying why instead
// of reading anything else.
func TestReadPeerThroughFilesOnly(t *testing.T) {
	p := readingPeer(t, false)
	const n = 1<<20 + 9
	a := p.lend(n, 3)
	for _, c := range []struct{ off, n int64 }{{0, n}, {5, 1}, {4095, 4097}, {100, 64 << 10}} {
		readsAs(t, p, a, c.off, c.n, 3, a.file)
	}
	wrong := a.file
	wrong.Ino++
	for _, f := range []channel.PeerFile{channel.NoPeerFile, wrong} {
		err := p.e.tr.ReadPeer(nil, make([]byte, 64), a.addr, f)
		if !errors.Is(err, shm.ErrNoPeerReads) || !strings.Contains(err.Error(), "process_vm_readv") {
			t.Fatalf("file %+v with process_vm_readv refused: %v, want ErrNoPeerReads saying why", f, err)
		}
	}
}

// writesAs writes a pattern (seed) of n bytes into the peer's l at off,
// through file (or none), applies the same to want (this end's picture of
// the whole of l), and checks that the peer's whole allocation now hashes as
// want does: the bytes written, and nothing around them.
func writesAs(t *testing.T, p *peer, l lent, want []byte, off, n int64, seed int, file channel.PeerFile) {
	t.Helper()
	src := make([]byte, n)
	pattern(src, seed)
	if file.FD >= 0 {
		file.Off += off
	}
	if err := p.e.tr.WritePeer(nil, l.addr.Add(off), src, file); err != nil {
		t.Fatal(err)
	}
	copy(want[off:], src)
	if got := p.do("hashat %d %d", l.addr, len(want)); got != hashOf(want) {
		t.Fatalf("[%#x, +%d) after writing [+%d, +%d) with seed %d: hash %s, want %s", uintptr(l.addr), len(want), off, n, seed, got, hashOf(want))
	}
}

// TestWritePeer: the peer's memory that it never registered nor shared,
// written by address (the kernel's copy) and through its memory file
// (mapped here, writable), at odd offsets and sizes on both sides of the
// file threshold, nothing around the range touched; a file this end mapped
// to read is mapped again to write, and stays one file in the cache; a file
// hint that does not check out falls back to the kernel's copy and writes
// the right bytes; an address the peer has not mapped is ErrOutOfRange; a
// closed end writes nothing.
func TestWritePeer(t *testing.T) {
	p := readingPeer(t, true)
	if !shm.CMA(p.e.tr) {
		t.Skip("the kernel refuses process_vm_writev between these processes (TestWritePeerThroughFilesOnly covers the files alone)")
	}
	const n = 3<<20 + 5
	a := p.lend(n, 1)
	want := make([]byte, n)
	pattern(want, 1)
	readsAs(t, p, a, 0, 1<<20, 1, a.file) // mapped to read first
	seed := 20
	for _, c := range []struct{ off, n int64 }{{0, n}, {1, 100}, {4093, 8 << 10}, {7, 1<<20 + 9}, {n - 17, 17}} {
		writesAs(t, p, a, want, c.off, c.n, seed, channel.NoPeerFile)
		writesAs(t, p, a, want, c.off, c.n, seed+1, a.file)
		seed += 2
	}
	if got := shm.FilesMapped(p.e.tr); got != 1 {
		t.Fatalf("%d files mapped after reading and writing one allocation through its file, want 1", got)
	}
	readsAs(t, p, a, 0, 0, 1, a.file) // the writable mapping reads too
	wrong := a.file
	wrong.Ino++
	writesAs(t, p, a, want, 5, 1<<20, seed, wrong)
	wrong = a.file
	wrong.Off = 1 << 40 // past the file: the kernel's copy, by address
	writesAs(t, p, a, want, 0, 1<<20, seed+1, wrong)

	err := p.e.tr.WritePeer(nil, 4096, make([]byte, 64), channel.NoPeerFile)
	if !errors.Is(err, shm.ErrOutOfRange) || !strings.Contains(err.Error(), "0x1000") {
		t.Fatalf("writing the peer's page 1: %v, want ErrOutOfRange naming it", err)
	}
	stop := make(chan struct{})
	close(stop)
	big := p.lend(5<<20, 4) // more than one piece
	bigWant := make([]byte, 5<<20)
	pattern(bigWant, 4)
	err = p.e.tr.WritePeer(stop, big.addr, make([]byte, 5<<20), big.file)
	if !errors.Is(err, device.ErrStreamAbort) {
		t.Fatalf("a write of 5 MiB with its stop closed: %v, want it stopped after the first piece", err)
	}
	copy(bigWant, make([]byte, shm.PeerReadPiece)) // the first piece went
	if got := p.do("hashat %d %d", big.addr, len(bigWant)); got != hashOf(bigWant) {
		t.Fatalf("a stopped write wrote past its first piece: hash %s, want %s", got, hashOf(bigWant))
	}
	p.e.tr.Close()
	if got := shm.FilesMapped(p.e.tr); got != 0 {
		t.Fatalf("%d files still mapped after Close", got)
	}
	if err := p.e.tr.WritePeer(nil, a.addr, make([]byte, 64), a.file); !errors.Is(err, channel.ErrClosed) {
		t.Fatalf("WritePeer after Close: %v, want ErrClosed", err)
	}
}

// TestWritePeerThroughFilesOnly: a pair where process_vm_writev is refused
// (this end does not try the kernel's copies) but the peer's descriptors
// can be opened writes through the peer's memory file, small writes
// included; a write without a file to map, or with one that does not check
// out, fails with ErrNoPeerReads saying why and writes nothing.
func TestWritePeerThroughFilesOnly(t *testing.T) {
	p := readingPeer(t, false)
	const n = 1<<20 + 9
	a := p.lend(n, 3)
	want := make([]byte, n)
	pattern(want, 3)
	for i, c := range []struct{ off, n int64 }{{0, n}, {5, 1}, {4095, 4097}, {100, 64 << 10}} {
		writesAs(t, p, a, want, c.off, c.n, 30+i, a.file)
	}
	wrong := a.file
	wrong.Ino++
	for _, f := range []channel.PeerFile{channel.NoPeerFile, wrong} {
		err := p.e.tr.WritePeer(nil, a.addr, make([]byte, 64), f)
		if !errors.Is(err, shm.ErrNoPeerReads) || !strings.Contains(err.Error(), "process_vm_writev") {
			t.Fatalf("file %+v with process_vm_writev refused: %v, want ErrNoPeerReads saying why", f, err)
		}
	}
	if got := p.do("hashat %d %d", a.addr, n); got != hashOf(want) {
		t.Fatalf("the refused writes changed the peer's memory: hash %s, want %s", got, hashOf(want))
	}
}
