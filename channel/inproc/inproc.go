// Package inproc is the transport between ranks of one process: a write is one
// copy into the peer's memory, a notify record sets the peer's notify directly.
//
// Ranks meet through a Fabric (one per group of communicators made together by
// InitAll). Each end of a channel publishes an Endpoint — its device, its
// registered memory and its notifies — and connects to the peer's.
package inproc

import (
	"context"
	"fmt"
	"sync"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/reduce"
	"github.com/hcomm-dev/hcomm/notify"
)

// Endpoint is what one end of a channel shows the other.
type Endpoint struct {
	Rank     int
	Device   *device.Device
	Registry *channel.Registry
	Notifies []*notify.Notify
	HCCLBuf  channel.Mem
}

// Key names one end of a channel: rank Local's end towards Remote.
type Key struct {
	Local, Remote int
	Tag           string
}

// Fabric is the meeting place of the ranks of one process. Safe for concurrent use.
type Fabric struct {
	mu   sync.Mutex
	ends map[Key]*Endpoint
	wait map[Key]chan struct{}
}

// NewFabric returns an empty fabric.
func NewFabric() *Fabric {
	return &Fabric{ends: make(map[Key]*Endpoint), wait: make(map[Key]chan struct{})}
}

func (f *Fabric) signal(k Key) chan struct{} {
	ch, ok := f.wait[k]
	if !ok {
		ch = make(chan struct{})
		f.wait[k] = ch
	}
	return ch
}

// Connect publishes local under k and waits (until ctx ends) for the peer's end
// (k with Local and Remote swapped). It returns a transport to the peer.
func (f *Fabric) Connect(ctx context.Context, k Key, local *Endpoint) (channel.Transport, *Endpoint, error) {
	f.mu.Lock()
	f.ends[k] = local
	close(f.signal(k))
	pk := Key{Local: k.Remote, Remote: k.Local, Tag: k.Tag}
	ready := f.signal(pk)
	f.mu.Unlock()
	select {
	case <-ready:
	case <-ctx.Done():
		f.mu.Lock()
		delete(f.ends, k)
		delete(f.wait, k)
		f.mu.Unlock()
		return nil, nil, fmt.Errorf("rank %d waited for rank %d to acquire its end of the channel: %w", k.Local, k.Remote, ctx.Err())
	}
	f.mu.Lock()
	peer := f.ends[pk]
	f.mu.Unlock()
	if peer == nil {
		return nil, nil, fmt.Errorf("rank %d's end of the channel to %d went away", k.Remote, k.Local)
	}
	return &Transport{peer: peer}, peer, nil
}

// Forget removes rank's ends from the fabric (on Destroy).
func (f *Fabric) Forget(rank int) {
	f.mu.Lock()
	for k := range f.ends {
		if k.Local == rank {
			delete(f.ends, k)
			delete(f.wait, k)
		}
	}
	f.mu.Unlock()
}

// Transport is the inproc transport to one peer.
type Transport struct{ peer *Endpoint }

// Name returns "inproc".
func (t *Transport) Name() string { return "inproc" }

// peerBytes is the far end's check: the range must be memory the peer
// registered, and live.
func (t *Transport) peerBytes(p device.Ptr, n int64) ([]byte, error) {
	if _, ok := t.peer.Registry.Find(p, n); !ok {
		return nil, fmt.Errorf("rank %d refuses range [%#x, +%d): not in its registered memory", t.peer.Rank, uintptr(p), n)
	}
	b, err := t.peer.Device.Bytes(p, n)
	if err != nil {
		return nil, fmt.Errorf("rank %d: %w", t.peer.Rank, err)
	}
	return b, nil
}

// Write copies src into the peer's memory at dst.
func (t *Transport) Write(_ <-chan struct{}, dst device.Ptr, src []byte) error {
	b, err := t.peerBytes(dst, int64(len(src)))
	if err != nil {
		return err
	}
	copy(b, src)
	return nil
}

// Read copies the peer's memory at src into dst.
func (t *Transport) Read(_ <-chan struct{}, dst []byte, src device.Ptr) error {
	b, err := t.peerBytes(src, int64(len(dst)))
	if err != nil {
		return err
	}
	copy(dst, b)
	return nil
}

// WriteReduce computes peer[dst] = peer[dst] op src.
func (t *Transport) WriteReduce(_ <-chan struct{}, dst device.Ptr, src []byte, count int, dt reduce.DataType, op reduce.Op) error {
	b, err := t.peerBytes(dst, int64(len(src)))
	if err != nil {
		return err
	}
	return reduce.Reduce(b, src, count, dt, op)
}

// ReadReduce computes dst = dst op peer[src].
func (t *Transport) ReadReduce(_ <-chan struct{}, dst []byte, src device.Ptr, count int, dt reduce.DataType, op reduce.Op) error {
	b, err := t.peerBytes(src, int64(len(dst)))
	if err != nil {
		return err
	}
	return reduce.Reduce(dst, b, count, dt, op)
}

// NotifyRecord sets the peer's notify idx.
func (t *Transport) NotifyRecord(_ <-chan struct{}, idx int) error {
	if idx < 0 || idx >= len(t.peer.Notifies) {
		return fmt.Errorf("rank %d has no notify %d on this channel (it has %d)", t.peer.Rank, idx, len(t.peer.Notifies))
	}
	t.peer.Notifies[idx].Set()
	return nil
}

// Fence returns at once: an inproc write is complete when it returns.
func (t *Transport) Fence(<-chan struct{}) error { return nil }

// Close does nothing: the fabric owns nothing per transport.
func (t *Transport) Close() error { return nil }
