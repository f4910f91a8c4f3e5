//go:build linux

package device_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hcomm-dev/hcomm/device"
)

func countFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestShareMapsTheSameBytes maps a shared range a second time, as a peer
// process would, and sees writes through either mapping in the other.
func TestShareMapsTheSameBytes(t *testing.T) {
	d := open(t, 0)
	const size = 3*4096 + 100
	p, err := d.Malloc(size)
	if err != nil {
		t.Fatal(err)
	}
	at := p.Add(4096 + 17)
	fd, off, err := d.Share(at, 1000)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if off != 4096+17 {
		t.Fatalf("offset = %d, want %d", off, 4096+17)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL; seals&want != want {
		t.Fatalf("seals %#x lack %#x", seals, want)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Size < size {
		t.Fatalf("file size %d (err %v), want at least %d", st.Size, err, size)
	}
	m, err := unix.Mmap(fd, 4096, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	if err := d.MemcpyHtoD(at, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if string(m[17:22]) != "hello" {
		t.Fatalf("second mapping reads %q", m[17:22])
	}
	copy(m[17:], "HELLO")
	got := make([]byte, 5)
	if err := d.MemcpyDtoH(got, at); err != nil {
		t.Fatal(err)
	}
	if string(got) != "HELLO" {
		t.Fatalf("device reads %q after a write through the second mapping", got)
	}
}

func TestShareChecksTheRange(t *testing.T) {
	d := open(t, 0)
	p, _ := d.Malloc(4096)
	for _, c := range []struct {
		p device.Ptr
		n int64
	}{{p, 4097}, {p.Add(4000), 97}, {0, 1}, {0, 0}, {p, -1}, {p.Add(1 << 30), 1}} {
		fd, _, err := d.Share(c.p, c.n)
		if !errors.Is(err, device.ErrInvalidValue) {
			if fd >= 0 {
				unix.Close(fd)
			}
			t.Errorf("Share(%#x, %d) = %v, want ErrInvalidValue", uintptr(c.p), c.n, err)
		}
	}
	o := open(t, 0)
	if _, _, err := o.Share(p, 8); !errors.Is(err, device.ErrInvalidHandle) {
		t.Errorf("Share from another context = %v, want ErrInvalidHandle", err)
	}
	d.Free(p)
	if _, _, err := d.Share(p, 8); !errors.Is(err, device.ErrInvalidValue) {
		t.Errorf("Share after Free = %v", err)
	}
}

// TestMallocBeyondMemoryNamesTheLimit asks for more than the machine has:
// the error says how much was asked, what bounds it and that /dev/shm's size
// does not.
func TestMallocBeyondMemoryNamesTheLimit(t *testing.T) {
	d := open(t, 0)
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		t.Fatal(err)
	}
	total := int64(si.Totalram)*int64(si.Unit) + int64(si.Totalswap)*int64(si.Unit)
	want := 2*total + 12345
	_, err := d.Malloc(want)
	if !errors.Is(err, device.ErrMemoryAllocation) {
		t.Fatalf("Malloc(%d) = %v, want ErrMemoryAllocation", want, err)
	}
	for _, s := range []string{itoa(want), "/dev/shm", "MemAvailable", "HCCL_BUFFSIZE"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
	// A large request that fits passes the check and is usable to its end.
	p, err := d.Malloc(48 << 20)
	if err != nil {
		t.Fatalf("Malloc(48 MiB): %v", err)
	}
	if err := d.Memset(p.Add(48<<20-4096), 4096, 7); err != nil {
		t.Fatal(err)
	}
	if err := d.Free(p); err != nil {
		t.Fatal(err)
	}
}

func itoa(v int64) string {
	var b []byte
	for {
		b = append([]byte{byte('0' + v%10)}, b...)
		v /= 10
		if v == 0 {
			return string(b)
		}
	}
}

// TestFreeAndCloseReleaseDescriptors: every allocation holds a memory file;
// Free and Close give them all back.
func TestFreeAndCloseReleaseDescriptors(t *testing.T) {
	before := countFDs(t)
	d, err := device.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	var ps []device.Ptr
	for i := 0; i < 20; i++ {
		p, err := d.Malloc(int64(1+i*1000) + 4096)
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	if n := countFDs(t); n < before+20 {
		t.Fatalf("%d descriptors open with 20 allocations, %d before", n, before)
	}
	for _, p := range ps[:10] {
		if err := d.Free(p); err != nil {
			t.Fatal(err)
		}
	}
	if n := countFDs(t); n != before+10 {
		t.Fatalf("%d descriptors open after freeing 10 of 20, want %d", n, before+10)
	}
	d.Close()
	if n := countFDs(t); n != before {
		t.Fatalf("%d descriptors open after Close, want %d", n, before)
	}
}

// committed returns the bytes of device memory at p committed so far: the
// blocks its memory file holds (fstat), reserved by fallocate or touched.
func committed(t *testing.T, d *device.Device, p device.Ptr) int64 {
	t.Helper()
	fd, _, err := d.Share(p, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// mallocLazy allocates size bytes of d with MallocLazy and returns them with
// their bytes; they are freed when the test ends.
func mallocLazy(t *testing.T, d *device.Device, size int64) (device.Ptr, []byte) {
	t.Helper()
	p, err := d.MallocLazy(size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Free(p) })
	b, err := d.Bytes(p, size)
	if err != nil {
		t.Fatal(err)
	}
	return p, b
}

// peerMapping maps the size bytes of d at p a second time, as a peer process
// does (Share, then mmap of the file at its offset); the mapping and the
// descriptor go when the test ends.
func peerMapping(t *testing.T, d *device.Device, p device.Ptr, size int64) []byte {
	t.Helper()
	fd, off, err := d.Share(p, size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	m, err := unix.Mmap(fd, off, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(m) })
	return m
}

// TestMallocLazyCommitsOnTouch: MallocLazy memory holds no page until one
// is touched, then that page only, while Malloc's is all reserved at the
// call; either shared with a peer sees the same bytes.
func TestMallocLazyCommitsOnTouch(t *testing.T) {
	d := open(t, 0)
	const size = 64 << 20
	page := int64(os.Getpagesize())
	lazy, b := mallocLazy(t, d, size)
	if n := committed(t, d, lazy); n != 0 {
		t.Fatalf("MallocLazy: %d bytes committed before any touch, want 0", n)
	}
	b[3*page+5] = 7
	if n := committed(t, d, lazy); n != page {
		t.Fatalf("MallocLazy: %d bytes committed after touching one page, want %d", n, page)
	}
	if b[0] != 0 || b[size-1] != 0 {
		t.Fatal("MallocLazy memory does not read as zeros")
	}
	// A peer's mapping (Share) sees the touched byte, and its write lands.
	m := peerMapping(t, d, lazy, size)
	if m[3*page+5] != 7 {
		t.Fatal("the shared mapping does not see the touched byte")
	}
	m[size-1] = 9
	if b[size-1] != 9 {
		t.Fatal("the allocation does not see the peer's write")
	}
	// Pages touched: the one written, and the first and last, read (a
	// read of a shared mapping commits its page too) and written.
	if n := committed(t, d, lazy); n != 3*page {
		t.Fatalf("MallocLazy: %d bytes committed after three pages were touched, want %d", n, 3*page)
	}

	eager, err := d.Malloc(4 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(eager)
	if n := committed(t, d, eager); n != 4<<20 {
		t.Fatalf("Malloc: %d bytes committed, want all %d (reserved at the call)", n, 4<<20)
	}
}

// TestMemsetZeroGivesLazyPagesBack: zeroing MallocLazy memory gives its
// whole pages back (the bytes read as zeros, in a peer's mapping too) and
// keeps the bytes outside the range; Malloc's memory stays reserved.
func TestMemsetZeroGivesLazyPagesBack(t *testing.T) {
	d := open(t, 0)
	const size = 16 << 20
	page := int64(os.Getpagesize())
	lazy, b := mallocLazy(t, d, size)
	for i := range b {
		b[i] = 0xa5
	}
	if n := committed(t, d, lazy); n != size {
		t.Fatalf("%d bytes committed after writing all %d", n, size)
	}
	peer := peerMapping(t, d, lazy, size)
	const from, n = 100, size - 300
	if err := d.Memset(lazy.Add(from), n, 0); err != nil {
		t.Fatal(err)
	}
	// The partial first and last pages stay, written; the rest is given back.
	if c := committed(t, d, lazy); c != 2*page {
		t.Fatalf("%d bytes committed after zeroing all but 300 bytes; want the 2 partial pages", c)
	}
	for i, v := range b {
		want := byte(0)
		if i < from || i >= from+n {
			want = 0xa5
		}
		if v != want || peer[i] != want {
			t.Fatalf("byte %d = %#x here, %#x in the peer's mapping; want %#x", i, v, peer[i], want)
		}
	}

	eager, err := d.Malloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(eager)
	if err := d.Memset(eager, 1<<20, 0); err != nil {
		t.Fatal(err)
	}
	if c := committed(t, d, eager); c != 1<<20 {
		t.Fatalf("Malloc memory: %d bytes committed after Memset to zero; want all %d (it stays reserved)", c, 1<<20)
	}
}
