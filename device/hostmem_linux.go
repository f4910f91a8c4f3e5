package device

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Host device memory on Linux: every allocation is its own anonymous memory
// file (memfd_create), sized, reserved (fallocate), sealed and mapped
// MAP_SHARED. Its descriptor stays open while the allocation lives, so Share
// can hand the same pages to another process.
//
// Why a file per allocation and not one big arena: Free must give the memory
// back to the system, and a peer that maps one allocation must not be able to
// reach the allocations beside it.
//
// Why fallocate: a page of a memory file that cannot be had when it is first
// touched kills the process (SIGBUS or the OOM killer), in this process or in
// the peer that mapped it. Reserving at Malloc turns that into an
// ErrMemoryAllocation error, here, naming the size.
//
// Why sealed (shrink, grow, seal): a peer maps the file trusting its size; a
// file that could shrink under the mapping would make an access fault. The
// seals are checked by the receiving side before it maps.
//
// Why MallocLazy skips fallocate: memory that is large and used only in part
// (the HCCL buffer: 400 MB a rank by default, of which the collectives touch
// the slots of the peers they talk to) would commit all of it at init, so
// that n ranks on a host hold n × 400 MB before their first collective. A
// memfd's pages that are not reserved are allocated at first touch (shmem
// fault), charged then to the toucher's memory cgroup; a file with no size
// limit of its own (a memfd's) never fails a fault with SIGBUS for lack of
// space, so what MallocLazy gives up is only the early error: memory that
// cannot be had at a touch is the OOM killer's, as for any page a process
// touches.
//
// Why not /dev/shm files: a memfd has no name in any file system, so nothing
// is left behind when a process dies, and /dev/shm's size limit does not apply
// to it. What limits it is RAM plus swap and the memory cgroup of the process.

// reserveCheckMin is the size from which Malloc compares the request with the
// memory the process may still use before it reserves: below it, a failure of
// fallocate is reported as it comes.
const reserveCheckMin = 16 << 20

// memfdFlags are the flags memfd_create accepts here: MFD_NOEXEC_SEAL where
// the kernel knows it (6.3 on), else plain sealing.
var memfdFlags atomic.Int64

func init() { memfdFlags.Store(unix.MFD_CLOEXEC | unix.MFD_NOEXEC_SEAL) }

func memfd() (int, error) {
	for {
		fl := int(memfdFlags.Load())
		fd, err := unix.MemfdCreate("hcomm-device-memory", fl)
		if err == unix.EINVAL && fl&unix.MFD_NOEXEC_SEAL != 0 {
			memfdFlags.Store(unix.MFD_CLOEXEC | unix.MFD_ALLOW_SEALING)
			continue
		}
		return fd, err
	}
}

// hostAlloc makes one allocation of size bytes, reserved now unless lazy.
func hostAlloc(size int64, lazy bool) (mem []byte, fd int, err error) {
	if size >= reserveCheckMin {
		if err := checkAvailable(size); err != nil {
			return nil, -1, err
		}
	}
	f, err := memfd()
	if err != nil {
		if err == unix.EMFILE || err == unix.ENFILE {
			var lim unix.Rlimit
			_ = unix.Getrlimit(unix.RLIMIT_NOFILE, &lim)
			return nil, -1, fmt.Errorf("memfd_create: %w: every device allocation holds one file descriptor and this process may have %d; raise the limit (ulimit -n) or make fewer, larger allocations", err, lim.Cur)
		}
		return nil, -1, fmt.Errorf("memfd_create: %w", err)
	}
	fd = f
	defer func() {
		if err != nil {
			unix.Close(f) // not fd: a failing return has set it to -1
		}
	}()
	if err = unix.Ftruncate(fd, size); err != nil {
		return nil, -1, fmt.Errorf("sizing the memory file to %d bytes: %w", size, err)
	}
	if !lazy { // MallocLazy's pages come at first touch
		if err = fallocate(fd, size); err != nil {
			if err == unix.ENOSPC || err == unix.ENOMEM {
				return nil, -1, fmt.Errorf("reserving %s: %w; %s", bytesText(size), err, limitAdvice(availableText()))
			}
			return nil, -1, fmt.Errorf("reserving %s: %w", bytesText(size), err)
		}
	}
	if _, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return nil, -1, fmt.Errorf("sealing the memory file: %w", err)
	}
	mem, err = unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, -1, fmt.Errorf("mapping %s: %w", bytesText(size), err)
	}
	return mem, fd, nil
}

// fallocateChunk is how much fallocate reserves per call. A signal (the
// profiler's, say) makes a memory file's fallocate give up with EINTR and
// drop what that call reserved; in chunks, a retry repeats only one chunk, so
// a large reservation always makes progress.
const fallocateChunk = 16 << 20

// fallocate reserves [0, size).
func fallocate(fd int, size int64) error {
	for off := int64(0); off < size; off += fallocateChunk {
		n := min(fallocateChunk, size-off)
		for {
			err := unix.Fallocate(fd, 0, off, n)
			if err == nil {
				break
			}
			if err != unix.EINTR {
				return err
			}
		}
	}
	return nil
}

// discard gives the bytes [off, off+n) of the memory file fd back to the
// system (both page-aligned): they read as zeros, in every mapping, and are
// committed again at their next touch. It reports false when the kernel
// would not; nothing changed then.
func discard(fd int, off, n int64) bool {
	return unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n) == nil
}

func hostFree(mem []byte, fd int) error {
	err := unix.Munmap(mem)
	if fd >= 0 {
		if cerr := unix.Close(fd); err == nil {
			err = cerr
		}
	}
	return err
}

// dupShared returns a close-on-exec duplicate of fd.
// fileIno returns the inode number of the file behind fd.
func fileIno(fd int) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

func dupShared(fd int) (int, error) {
	return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
}

// limitAdvice explains what bounds device memory and how to change it.
func limitAdvice(avail string) string {
	return "device memory is memfd shared memory, so the size of /dev/shm does not apply; it counts against RAM plus swap and the memory cgroup limit of the process (" +
		avail + "); free memory, raise the cgroup limit (memory.max; docker run --memory; Kubernetes resources.limits.memory), or ask for less (HCCL_BUFFSIZE: the HCCL buffer is twice it)"
}

// checkAvailable refuses a request larger than the memory the process may
// still use, before fallocate would push the system into the OOM killer.
func checkAvailable(size int64) error {
	avail, _ := available()
	if avail >= 0 && size > avail {
		return fmt.Errorf("reserving %s would exceed the memory this process may still use: %s", bytesText(size), limitAdvice(availableText()))
	}
	return nil
}

// available returns how many bytes the process may still allocate (-1 when
// unknown) and a description of where the figure comes from.
func available() (int64, string) {
	best := int64(-1)
	var parts []string
	if avail, swap, ok := meminfo(); ok {
		best = avail + swap
		parts = append(parts, "MemAvailable "+bytesText(avail)+" + SwapFree "+bytesText(swap)+" in /proc/meminfo")
	}
	if limit, usage, where, ok := cgroupMemory(); ok {
		left := max(limit-usage, 0)
		if best < 0 || left < best {
			best = left
		}
		parts = append(parts, "cgroup limit "+bytesText(limit)+", usage "+bytesText(usage)+" ("+where+")")
	}
	return best, strings.Join(parts, "; ")
}

func availableText() string {
	avail, how := available()
	if avail < 0 {
		return "the available memory could not be read"
	}
	return bytesText(avail) + " available: " + how
}

func meminfo() (avail, swap int64, ok bool) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, 0, false
	}
	var gotAvail bool
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		v, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "MemAvailable:":
			avail, gotAvail = v<<10, true
		case "SwapFree:":
			swap = v << 10
		}
	}
	return avail, swap, gotAvail
}

// cgroupMemory reads the memory limit and usage of the process's cgroup
// (v2, else v1). ok is false when there is no limit or it cannot be read.
func cgroupMemory() (limit, usage int64, where string, ok bool) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return 0, 0, "", false
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		var dirs []string
		var limFile, useFile string
		switch {
		case f[0] == "0" && f[1] == "":
			dirs = []string{"/sys/fs/cgroup" + f[2], "/sys/fs/cgroup"}
			limFile, useFile = "memory.max", "memory.current"
		case hasController(f[1], "memory"):
			dirs = []string{"/sys/fs/cgroup/memory" + f[2], "/sys/fs/cgroup/memory"}
			limFile, useFile = "memory.limit_in_bytes", "memory.usage_in_bytes"
		default:
			continue
		}
		for _, d := range dirs {
			l, err1 := readInt(d + "/" + limFile)
			u, err2 := readInt(d + "/" + useFile)
			if err1 != nil || err2 != nil {
				continue
			}
			if l <= 0 || l >= 1<<62 {
				break // no limit here
			}
			return l, u, d + "/" + limFile, true
		}
	}
	return 0, 0, "", false
}

func hasController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

var errNoLimit = errors.New("no limit")

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, errNoLimit
	}
	return strconv.ParseInt(s, 10, 64)
}

// bytesText writes n exactly and, when large, in a binary unit too.
func bytesText(n int64) string {
	s := strconv.FormatInt(n, 10) + " bytes"
	switch {
	case n >= 10<<30:
		s += " (" + strconv.FormatInt(n>>30, 10) + " GiB)"
	case n >= 10<<20:
		s += " (" + strconv.FormatInt(n>>20, 10) + " MiB)"
	}
	return s
}
