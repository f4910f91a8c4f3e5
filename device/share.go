package device

// Share returns a file descriptor for the memory behind [p, p+n) and the
// offset of p in that file, so that another process can map the same bytes
// (aclrtMemExportToShareableHandle's role): the shared-memory transport sends
// the descriptor over a unix socket (SCM_RIGHTS) and the peer maps it
// MAP_SHARED at the page below offset.
//
// The range must lie inside one live allocation of d. The descriptor is a
// close-on-exec duplicate that the caller owns and closes; the mapping a peer
// makes from it stays valid after Free (the pages live until the last
// mapping goes) but no longer aliases anything of this process's.
//
// On Linux the file is a memfd sealed against shrinking and growing
// (F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_SEAL) and reserved in full, so a peer
// that checks the seals and the size can map it without risking a fault.
// Errors: ErrInvalidValue for a range outside the live allocations,
// ErrFeatureNotSupported where the backend cannot share.
// Safe for concurrent use.
func (d *Device) Share(p Ptr, n int64) (fd int, offset int64, err error) {
	const op = "Share"
	if err := d.check(op); err != nil {
		return -1, 0, err
	}
	r, err := resolve(op, d, -1, "range", p, n)
	if err != nil {
		return -1, 0, err
	}
	if r.a == nil {
		return -1, 0, newErr(op, d.id, -1, ErrInvalidValue, "range is a nil address")
	}
	if r.a.dev != d {
		return -1, 0, newErr(op, d.id, -1, ErrInvalidHandle, "range [%#x, +%d) belongs to another device context", uintptr(p), n)
	}
	if !pin(r) {
		return -1, 0, newErr(op, d.id, -1, ErrInvalidValue, "range [%#x, +%d) was freed", uintptr(p), n)
	}
	defer unpin(r)
	if r.a.fd < 0 {
		return -1, 0, newErr(op, d.id, -1, ErrFeatureNotSupported, "the %s backend's memory cannot be shared with other processes on this system", d.be.name())
	}
	dup, err := dupShared(r.a.fd)
	if err != nil {
		return -1, 0, &Error{Op: op, Device: d.id, Stream: -1, Code: ErrInternal, Msg: "duplicating the memory file descriptor", Err: err}
	}
	return dup, int64(p - r.a.base), nil
}

// FileRef says where a range of device memory lies in its memory file: the
// descriptor of this process that holds the file, the file's inode number,
// and the range's offset in the file. With it, a process allowed to open
// this one's descriptors (/proc/<pid>/fd/<FD>, the ptrace access check) can
// map the same bytes without this process sending the descriptor, and can
// tell by the inode that a file it mapped before is the same one (a
// descriptor number is reused once its allocation is freed; the inode of a
// file it still maps is not).
type FileRef struct {
	FD  int
	Ino uint64
	Off int64
}

// FileOf returns the FileRef of [p, p+n), which must lie inside one live
// allocation of d. The descriptor stays this process's (do not close it)
// and names the file only while the allocation is live. Errors are
// Share's. Safe for concurrent use.
func (d *Device) FileOf(p Ptr, n int64) (FileRef, error) {
	const op = "FileOf"
	if err := d.check(op); err != nil {
		return FileRef{}, err
	}
	r, err := resolve(op, d, -1, "range", p, n)
	if err != nil {
		return FileRef{}, err
	}
	if r.a == nil {
		return FileRef{}, newErr(op, d.id, -1, ErrInvalidValue, "range is a nil address")
	}
	if r.a.dev != d {
		return FileRef{}, newErr(op, d.id, -1, ErrInvalidHandle, "range [%#x, +%d) belongs to another device context", uintptr(p), n)
	}
	if r.a.fd < 0 {
		return FileRef{}, newErr(op, d.id, -1, ErrFeatureNotSupported, "the %s backend's memory has no file on this system", d.be.name())
	}
	ino := r.a.ino.Load()
	if ino == 0 {
		if !pin(r) {
			return FileRef{}, newErr(op, d.id, -1, ErrInvalidValue, "range [%#x, +%d) was freed", uintptr(p), n)
		}
		ino, err = fileIno(r.a.fd)
		unpin(r)
		if err != nil {
			return FileRef{}, &Error{Op: op, Device: d.id, Stream: -1, Code: ErrInternal, Msg: "reading the memory file's inode", Err: err}
		}
		r.a.ino.Store(ino)
	}
	return FileRef{FD: r.a.fd, Ino: ino, Off: int64(p - r.a.base)}, nil
}
