package hcommtest

import (
	"bytes"
	"fmt"
	"os"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// leakWait is how long the leak check waits for what a Destroy let go of
// (goroutines on their way out, descriptors closed by them).
var leakWait = 5 * time.Second

// Descriptors and mappings are the process's, not a group's: they are
// compared before and after a group only while no other group is alive
// (parallel tests, or New's ranks open while a Run runs, step aside).
var (
	groupsMu   sync.Mutex
	groupsLive int
	groupGen   int // bumped whenever a group starts
)

// snapshot is what a group's leak check compares with.
type snapshot struct {
	fds  map[string]string // descriptor → what it is, for the kinds hcomm opens
	maps map[string]bool   // inodes of memfd mappings
	gen  int
	done bool
}

func takeSnapshot() *snapshot {
	groupsMu.Lock()
	groupsLive++
	groupGen++
	alone := groupsLive == 1
	gen := groupGen
	groupsMu.Unlock()
	s := &snapshot{gen: gen}
	if alone {
		s.fds, s.maps = openFDs(), memfdMaps()
	}
	return s
}

// release ends s's group; it reports whether s saw no other group, so that
// its descriptors and mappings can be compared.
func (s *snapshot) release() bool {
	groupsMu.Lock()
	defer groupsMu.Unlock()
	if s.done {
		return false
	}
	s.done = true
	groupsLive--
	return s.fds != nil && groupGen == s.gen && groupsLive == 0
}

// checkLeaks waits up to leakWait for the goroutines carrying label to end,
// and (when no other group ran meanwhile) for the descriptors and memfd
// mappings opened since s to close; it describes what is left, "" if
// nothing.
func checkLeaks(label string, s *snapshot) string {
	compare := s.release()
	deadline := time.Now().Add(leakWait)
	for {
		var out []string
		if g := labelledGoroutines(label); g != "" {
			out = append(out, "goroutines started under the ranks outlive them:\n"+g)
		}
		if compare {
			if fds := newFDs(s.fds); len(fds) > 0 {
				out = append(out, "descriptors opened under the ranks outlive them: "+strings.Join(fds, ", "))
			}
			if ms := newMaps(s.maps); len(ms) > 0 {
				out = append(out, "memfd mappings (device memory, shm notifies) made under the ranks outlive them: inodes "+strings.Join(ms, ", "))
			}
		}
		if len(out) == 0 {
			return ""
		}
		if time.Now().After(deadline) {
			return "leak: " + strings.Join(out, "\n")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// labelledGoroutines is the goroutine profile's records of the goroutines
// carrying label ("" if none).
func labelledGoroutines(label string) string {
	var buf bytes.Buffer
	pprof.Lookup("goroutine").WriteTo(&buf, 1)
	want := strconv.Quote(labelKey) + ":" + strconv.Quote(label)
	var out []string
	for _, rec := range strings.Split(buf.String(), "\n\n") {
		if strings.Contains(rec, "# labels: ") && strings.Contains(rec, want) {
			out = append(out, rec)
		}
	}
	return strings.Join(out, "\n\n")
}

// openFDs lists this process's descriptors of the kinds hcomm opens:
// sockets, memfds, pipes and anonymous inodes other than the Go runtime's
// own (its network poller's epoll and eventfd, made once per process).
func openFDs() map[string]string {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return map[string]string{}
	}
	out := make(map[string]string, len(ents))
	for _, e := range ents {
		link, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil {
			continue
		}
		switch {
		case link == "anon_inode:[eventpoll]", link == "anon_inode:[eventfd]", link == "anon_inode:[pidfd]":
		case strings.HasPrefix(link, "socket:"), strings.HasPrefix(link, "/memfd:"), strings.HasPrefix(link, "anon_inode:"):
			out[e.Name()] = link
		}
	}
	return out
}

func newFDs(before map[string]string) []string {
	var out []string
	for fd, link := range openFDs() {
		if before[fd] != link {
			out = append(out, fmt.Sprintf("fd %s (%s)", fd, link))
		}
	}
	sort.Strings(out)
	return out
}

// memfdMaps is the set of inodes of memfd files mapped into this process.
func memfdMaps() map[string]bool {
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return map[string]bool{}
	}
	out := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 6 && strings.HasPrefix(f[5], "/memfd:") {
			out[f[4]] = true
		}
	}
	return out
}

func newMaps(before map[string]bool) []string {
	var out []string
	for ino := range memfdMaps() {
		if !before[ino] {
			out = append(out, ino)
		}
	}
	sort.Strings(out)
	return out
}
