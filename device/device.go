package device

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// MaxDevices bounds device ids: Open accepts 0 <= id < MaxDevices.
const MaxDevices = 1024

// Device is an open context on one card (aclrtSetDevice / cuCtxCreate). It owns
// the streams created on it and the memory allocated through it.
//
// Several contexts may be open on one id at once; they share nothing, like two
// CUDA contexts on one GPU. A handle of one context (stream, event, memory)
// used with another is an ErrInvalidHandle error.
//
// All methods are safe for concurrent use. Close is idempotent.
type Device struct {
	id        int
	be        backend
	copyViews bool // Map copies instead of mapping (view.go)

	mu      sync.Mutex
	closed  bool
	gone    atomic.Bool // closed, for the lock-free check of every call
	streams map[*Stream]struct{}
	defS    *Stream
	nalloc  int

	exc atomic.Pointer[func(*ExceptionInfo)]
	obs atomic.Pointer[observers] // ObserveTasks (observe.go)
}

var (
	nextStreamID atomic.Int64
	nextThreadID atomic.Uint32
)

// Open opens a context on device id with the default (host) backend.
func Open(id int) (*Device, error) {
	if id < 0 || id >= MaxDevices {
		return nil, newErr("Open", id, -1, ErrInvalidDeviceID, "device id %d is outside [0, %d)", id, MaxDevices)
	}
	be := hostBackend{}
	return &Device{id: id, be: be, copyViews: !be.mapped() || copyViewsFromEnv(), streams: make(map[*Stream]struct{})}, nil
}

// ID returns the device id given to Open.
func (d *Device) ID() int { return d.id }

// Backend names the backend that runs the device ("host").
func (d *Device) Backend() string { return d.be.name() }

func (d *Device) check(op string) error {
	if d == nil {
		return newErr(op, -1, -1, ErrInvalidHandle, "nil device")
	}
	if d.gone.Load() {
		return newErr(op, d.id, -1, ErrInvalidHandle, "device is closed")
	}
	return nil
}

// Close aborts the work still queued on the device's streams (a task that is
// waiting fails with ErrDeviceTaskAbort), waits for every stream's goroutine to
// end, and frees the device's memory. Later calls on the device or its handles
// return ErrInvalidHandle. Close is idempotent.
func (d *Device) Close() error {
	if d == nil {
		return newErr("Close", -1, -1, ErrInvalidHandle, "nil device")
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.gone.Store(true)
	streams := make([]*Stream, 0, len(d.streams))
	for s := range d.streams {
		streams = append(streams, s)
	}
	d.mu.Unlock()
	for _, s := range streams {
		s.abort(ErrDeviceTaskAbort, "device closed")
		s.destroy()
	}
	for {
		a := allocs.removeDevice(d)
		if a == nil {
			break
		}
		_ = a.release(d.be)
	}
	return nil
}

// CreateStream creates a stream on d (aclrtCreateStream). Its tasks run in
// order on a goroutine of their own until Destroy.
func (d *Device) CreateStream() (*Stream, error) {
	if err := d.check("CreateStream"); err != nil {
		return nil, err
	}
	s := newStream(d)
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		s.destroy()
		return nil, newErr("CreateStream", d.id, -1, ErrInvalidHandle, "device is closed")
	}
	d.streams[s] = struct{}{}
	d.mu.Unlock()
	return s, nil
}

// DefaultStream returns the device's default stream (ACL's NULL stream),
// creating it on first use. It is destroyed by Close; Destroy on it is a no-op.
func (d *Device) DefaultStream() (*Stream, error) {
	if err := d.check("DefaultStream"); err != nil {
		return nil, err
	}
	d.mu.Lock()
	if d.defS == nil && !d.closed {
		s := newStream(d)
		s.isDefault = true
		d.defS = s
		d.streams[s] = struct{}{}
	}
	s := d.defS
	d.mu.Unlock()
	if s == nil {
		return nil, newErr("DefaultStream", d.id, -1, ErrInvalidHandle, "device is closed")
	}
	return s, nil
}

// Synchronize blocks until every task queued on the device's streams before
// the call is complete, or ctx is done (aclrtSynchronizeDevice). It returns the
// first stream error it meets (and clears it on that stream, as Stream's
// Synchronize does), or ErrStreamSyncTimeout (which matches
// context.DeadlineExceeded) when ctx expires first.
func (d *Device) Synchronize(ctx context.Context) error {
	if err := d.check("Synchronize"); err != nil {
		return err
	}
	if ctx == nil {
		return newErr("Synchronize", d.id, -1, ErrInvalidValue, "nil context")
	}
	d.mu.Lock()
	streams := make([]*Stream, 0, len(d.streams))
	for s := range d.streams {
		streams = append(streams, s)
	}
	d.mu.Unlock()
	var first error
	for _, s := range streams {
		if err := s.Synchronize(ctx); err != nil && first == nil {
			first = err
			if ctx.Err() != nil {
				break
			}
		}
	}
	return first
}

// SynchronizeWithTimeout is Synchronize with ACL's timeout convention
// (aclrtSynchronizeDeviceWithTimeout): a negative timeout waits forever, zero
// polls once.
func (d *Device) SynchronizeWithTimeout(timeout time.Duration) error {
	ctx, cancel := timeoutContext(timeout)
	defer cancel()
	return d.Synchronize(ctx)
}

// timeoutContext maps ACL's timeout convention onto a context.
func timeoutContext(timeout time.Duration) (context.Context, context.CancelFunc) {
	if timeout < 0 {
		return context.WithCancel(context.Background())
	}
	return context.WithTimeout(context.Background(), timeout)
}

func (d *Device) forget(s *Stream) {
	d.mu.Lock()
	delete(d.streams, s)
	d.mu.Unlock()
}
