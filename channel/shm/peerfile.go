//go:build linux

package shm

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/hcomm-dev/hcomm/channel"
)

// Reading lent memory through the peer's memory file.
//
// The kernel's copy (process_vm_readv) is one system call and a pinning of
// the peer's pages per call, and it copies with plain stores: at the sizes
// where a copy leaves the cache it runs at about half the rate of a
// streaming copy here (64 MiB: 5.5 GB/s against 9–10). When the peer says
// where the lent range lies in its memory file (channel.PeerFile, from
// device.FileOf: device memory of the host backend is a memfd), this end
// opens the file through the peer's descriptor (/proc/<pid>/fd/<fd>, the
// same ptrace access check as process_vm_readv), checks that it is the file
// the inode names, a regular file sealed against shrinking (so that no
// page of the mapping can disappear under a read: no SIGBUS), maps it
// read-only, and copies from the mapping with a streaming copy. The mapping
// is kept for the next call (an application moves the same buffers call
// after call), keyed by the inode: a descriptor number is reused once the
// peer frees its allocation, the inode of a file this end still maps is not.
//
// Writing lent memory (WritePeer: the peer lends its receive buffer and this
// end streams its data into it) goes the same way, through a mapping that is
// writable: the descriptor opened for reading and writing. A file first
// mapped for reading is mapped again, writable, the first time it is written,
// and the read-only mapping dropped once its reads are done.
//
// The cache is bounded (peerFilesMax files, peerFilesBytes bytes): a file
// mapped here keeps the peer's freed memory alive until it is evicted (least
// recently used first) or the channel closes. A mapping in use by a read is
// unmapped only when the read is done. When the peer's descriptors cannot
// be opened (another user, a ptrace policy, no /proc), the transport stops
// trying and reads through the kernel's copy.

const (
	peerFilesMax   = 8
	peerFilesBytes = 8 << 30
	// peerFileMin is the least a read takes through a mapped file; below,
	// the kernel's copy. A mapped read is a copy and no system call: from
	// 16 KiB to 1 MiB it measured as fast as the kernel's copy or faster
	// (4 processes, 1 MiB all-gather 131–189 µs against 261–279 with the
	// kernel's; broadcast 121–125 against 143–159), and at 4 KiB, the
	// least the collectives read (their pairReadMin), the kernel's copy is
	// a system call that costs more than the copy: 2 processes, broadcast
	// of 4 KiB 2.28–2.31 µs through the kernel against 0.40–0.41 mapped,
	// all-to-all of 4 KiB blocks 2.39–2.46 against 0.60–0.65 (stop 47; it
	// was 8 KiB, and those calls took the kernel's copy).
	peerFileMin = 4 << 10
)

// peerFiles is the cache of the peer's memory files mapped here.
type peerFiles struct {
	mu    sync.Mutex
	off   bool        // the peer's descriptors cannot be opened: never again
	noRW  bool        // they open only for reading: no writable mapping, ever
	files []*peerFile // least recently used first
	bytes int64
}

// peerFile is one mapped file of the peer's.
type peerFile struct {
	ino  uint64
	m    []byte
	rw   bool // mapped writable
	refs int  // reads and writes copying from or into m
	dead bool // evicted: unmap when refs is 0
}

// fileBytes returns the n bytes at f.Off of the peer's file f, mapped here
// (writable when write is set), and the entry to release when the copy is
// done; nil when the file cannot be used (the caller falls back to the
// kernel's copy).
func (t *Transport) fileBytes(f channel.PeerFile, n int, write bool) ([]byte, *peerFile) {
	c := &t.files
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.off || write && c.noRW || f.FD < 0 || f.Off < 0 {
		return nil, nil
	}
	for i, e := range c.files {
		if e.ino != f.Ino {
			continue
		}
		if f.Off > int64(len(e.m))-int64(n) {
			return nil, nil
		}
		if write && !e.rw {
			// Mapped for reading: map it again, writable, in its place.
			c.files = slices.Delete(c.files, i, i+1)
			c.bytes -= int64(len(e.m))
			c.drop(e)
			break
		}
		c.files = append(slices.Delete(c.files, i, i+1), e)
		e.refs++
		return e.m[f.Off : f.Off+int64(n)], e
	}
	m, err := t.mapPeerFile(f, write)
	if err != nil {
		if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
			if write {
				c.noRW = true
			} else {
				c.off = true
			}
		}
		return nil, nil
	}
	if f.Off > int64(len(m))-int64(n) {
		unix.Munmap(m)
		return nil, nil
	}
	e := &peerFile{ino: f.Ino, m: m, rw: write, refs: 1}
	c.files = append(c.files, e)
	c.bytes += int64(len(m))
	for len(c.files) > peerFilesMax || c.bytes > peerFilesBytes {
		old := c.files[0]
		c.files = c.files[1:]
		c.bytes -= int64(len(old.m))
		c.drop(old)
	}
	return m[f.Off : f.Off+int64(n)], e
}

// drop retires e, out of the cache's list: unmapped now if no copy uses
// it, else by the last one's release. c.mu is held.
func (c *peerFiles) drop(e *peerFile) {
	e.dead = true
	if e.refs == 0 {
		unix.Munmap(e.m)
	}
}

// releaseFile ends a read's or a write's use of e.
func (t *Transport) releaseFile(e *peerFile) {
	t.files.mu.Lock()
	defer t.files.mu.Unlock()
	e.refs--
	if e.dead && e.refs == 0 {
		unix.Munmap(e.m)
	}
}

// mapPeerFile opens the peer's descriptor f.FD and maps its file read-only
// (writable when write is set), after checking that it is the file f.Ino
// names, a regular file, sealed against shrinking. The caller holds
// t.files.mu.
func (t *Transport) mapPeerFile(f channel.PeerFile, write bool) ([]byte, error) {
	mode, prot := unix.O_RDONLY, unix.PROT_READ
	if write {
		mode, prot = unix.O_RDWR, unix.PROT_READ|unix.PROT_WRITE
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/fd/%d", t.peerPID, f.FD), mode|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	switch {
	case st.Ino != f.Ino:
		return nil, fmt.Errorf("descriptor %d of pid %d is inode %d, not %d", f.FD, t.peerPID, st.Ino, f.Ino)
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return nil, fmt.Errorf("descriptor %d of pid %d is not a regular file", f.FD, t.peerPID)
	case st.Size <= 0 || st.Size > peerFilesBytes:
		return nil, fmt.Errorf("descriptor %d of pid %d has %d bytes (the cache holds files of up to %d)", f.FD, t.peerPID, st.Size, int64(peerFilesBytes))
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, err
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return nil, fmt.Errorf("descriptor %d of pid %d is not sealed against shrinking", f.FD, t.peerPID)
	}
	return unix.Mmap(fd, 0, int(st.Size), prot, unix.MAP_SHARED)
}

// dropFiles unmaps every cached file; reads in flight are done (Close
// holds mu for writing).
func (t *Transport) dropFiles() {
	c := &t.files
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.files {
		c.drop(e)
	}
	c.files, c.bytes = nil, 0
}
