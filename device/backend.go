package device

// backend is what a kind of accelerator must provide. The host backend below is
// the default and the only one built today; a CUDA backend (cgo, behind a build
// tag) would implement the same methods, and nothing above this package changes.
//
// Why so small: streams, events, notifies and callbacks are scheduled by this
// package for every backend (a real accelerator would map them onto its own
// queues later); what differs between backends is where memory lives and how
// bytes move.
type backend interface {
	// name is a short word for logs and errors ("host").
	name() string
	// alloc returns size bytes of device memory, zeroed, at a stable address,
	// outside the Go heap, and a file descriptor another process can map to
	// reach the same bytes (-1 when the backend cannot share). lazy asks
	// for pages committed at first touch instead of now (MallocLazy).
	alloc(size int64, host, lazy bool) (mem []byte, fd int, err error)
	// free releases memory returned by alloc, and its descriptor.
	free(mem []byte, fd int) error
	// copy moves len(src) bytes; dst and src are checked ranges of live allocations.
	copy(dst, src []byte)
	// mapped reports whether the host addresses device memory directly, so
	// that Map's views need no copy.
	mapped() bool
}

// hostBackend keeps "device" memory in shared mappings of memory files
// (hostmem_linux.go): the addresses are stable (the Go collector never moves or
// frees them), so they behave like device addresses, and the shared-memory
// transport can map the same pages into the peer's process.
type hostBackend struct{}

func (hostBackend) name() string { return "host" }

func (hostBackend) mapped() bool { return true }

func (hostBackend) alloc(size int64, _, lazy bool) ([]byte, int, error) {
	return hostAlloc(size, lazy)
}

func (hostBackend) free(mem []byte, fd int) error { return hostFree(mem, fd) }

// copy uses Go's copy(): on the machines measured it beats glibc's memcpy
// (non-temporal stores from 1 MiB up).
func (hostBackend) copy(dst, src []byte) { copy(dst, src) }
