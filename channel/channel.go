// Package channel defines a channel: one rank's connection to one remote rank
// (HCCL's ChannelHandle). A channel knows the memory the peer registered (its
// HCCL buffer first), holds the local notifies the peer records into, and moves
// bytes through a Transport. Transports live in subpackages (inproc today).
//
// The checks a channel makes are the contract of the data plane: every remote
// range is checked against the peer's registered memory before the transport
// is asked to touch it, and the transport's far end checks again against what it
// registered itself, so a bad address never reaches a peer's memory.
package channel

import (
	"fmt"
	"sync"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/reduce"
	"github.com/hcomm-dev/hcomm/notify"
)

// Mem is a registered range of device memory (HCCL's CommMem): the HCCL
// buffer, or memory registered with HcclCommMemReg.
type Mem struct {
	Tag  string
	Addr device.Ptr
	Size int64
}

// Contains reports whether [p, p+n) lies inside m.
func (m Mem) Contains(p device.Ptr, n int64) bool {
	return n >= 0 && p >= m.Addr && int64(p-m.Addr) <= m.Size && n <= m.Size-int64(p-m.Addr)
}

// Registry is a rank's set of registered memory, read by its peers' channels.
// Safe for concurrent use.
type Registry struct {
	mu   sync.RWMutex
	mems []Mem
}

// Add registers m.
func (r *Registry) Add(m Mem) {
	r.mu.Lock()
	r.mems = append(r.mems, m)
	r.mu.Unlock()
}

// Remove unregisters the range that starts at addr with tag; it reports
// whether there was one.
func (r *Registry) Remove(addr device.Ptr, tag string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, m := range r.mems {
		if m.Addr == addr && m.Tag == tag {
			r.mems = append(r.mems[:i], r.mems[i+1:]...)
			return true
		}
	}
	return false
}

// Find returns the registered range holding [p, p+n).
func (r *Registry) Find(p device.Ptr, n int64) (Mem, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, m := range r.mems {
		if m.Contains(p, n) {
			return m, true
		}
	}
	return Mem{}, false
}

// List returns a copy of the registered ranges.
func (r *Registry) List() []Mem {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return append([]Mem(nil), r.mems...)
}

// Transport moves bytes and signals to one peer. Methods run inside stream
// tasks, in the order the tasks run; they block until the operation is done at
// the far end as far as ordering requires: a NotifyRecord issued after a Write
// is seen by the peer only after the written bytes are visible there.
// stop closes when the task must give up (abort).
type Transport interface {
	// Name is the transport's name ("inproc").
	Name() string
	// Write copies src into the peer's memory at dst.
	Write(stop <-chan struct{}, dst device.Ptr, src []byte) error
	// Read copies the peer's memory at src into dst.
	Read(stop <-chan struct{}, dst []byte, src device.Ptr) error
	// WriteReduce computes peer[dst] = peer[dst] op src over count elements.
	WriteReduce(stop <-chan struct{}, dst device.Ptr, src []byte, count int, dt reduce.DataType, op reduce.Op) error
	// ReadReduce computes dst = dst op peer[src] over count elements.
	ReadReduce(stop <-chan struct{}, dst []byte, src device.Ptr, count int, dt reduce.DataType, op reduce.Op) error
	// NotifyRecord records the peer's notify idx on its end of the channel.
	NotifyRecord(stop <-chan struct{}, idx int) error
	// Fence returns once every earlier operation is complete at the peer.
	Fence(stop <-chan struct{}) error
	// Close releases the transport. Idempotent.
	Close() error
}

// WriteNotifier is implemented by a transport that sends a write and the
// notify record that follows it together, more cheaply than Write and then
// NotifyRecord (tcp: in one system call). The data plane uses it for
// WriteWithNotify when the transport has it; the guarantee is the same: the
// bytes are visible to the peer once its wait for the record returns.
type WriteNotifier interface {
	WriteWithNotify(stop <-chan struct{}, dst device.Ptr, src []byte, idx int) error
}

// Channel is one end of a connection between two ranks. Safe for concurrent use.
type Channel struct {
	Local, Remote int
	Protocol      int32
	Name          string // "comm X rank 0 -> 1 (HCCS)" for errors

	notifies   []*notify.Notify // local: the peer records, we wait
	peerNotify int              // how many notifies the peer's end has
	remoteMems []Mem            // the peer's registered memory at acquire time
	tr         Transport
}

// New assembles a channel. remoteMems[0] must be the peer's HCCL buffer.
func New(name string, local, remote int, protocol int32, notifies []*notify.Notify, peerNotifyNum int, remoteMems []Mem, tr Transport) *Channel {
	return &Channel{Local: local, Remote: remote, Protocol: protocol, Name: name, notifies: notifies,
		peerNotify: peerNotifyNum, remoteMems: remoteMems, tr: tr}
}

// Transport returns the channel's transport.
func (c *Channel) Transport() Transport { return c.tr }

// NotifyNum returns the number of local notifies (the wait index space).
func (c *Channel) NotifyNum() int { return len(c.notifies) }

// PeerNotifyNum returns the number of the peer's notifies (the record index space).
func (c *Channel) PeerNotifyNum() int { return c.peerNotify }

// Notify returns local notify idx.
func (c *Channel) Notify(idx int) (*notify.Notify, error) {
	if idx < 0 || idx >= len(c.notifies) {
		return nil, fmt.Errorf("local notify index %d is outside [0, %d)", idx, len(c.notifies))
	}
	return c.notifies[idx], nil
}

// RemoteMems returns the peer's registered memory known to this channel; the
// first is the peer's HCCL buffer.
func (c *Channel) RemoteMems() []Mem { return append([]Mem(nil), c.remoteMems...) }

// CheckRemote checks [p, p+n) against the peer's registered memory known at
// acquire time and, for transports that can ask, its current registrations.
func (c *Channel) CheckRemote(p device.Ptr, n int64, live *Registry) error {
	for _, m := range c.remoteMems {
		if m.Contains(p, n) {
			return nil
		}
	}
	if live != nil {
		if _, ok := live.Find(p, n); ok {
			return nil
		}
	}
	return fmt.Errorf("remote range [%#x, +%d) is outside the memory rank %d registered (HCCL buffer [%#x, +%d) and %d other ranges)",
		uintptr(p), n, c.Remote, uintptr(c.remoteMems[0].Addr), c.remoteMems[0].Size, len(c.remoteMems)-1)
}

// Close closes the transport.
func (c *Channel) Close() error { return c.tr.Close() }
