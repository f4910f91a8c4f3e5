// Package bootstrap is the rendezvous of a communicator's ranks: a small
// key/value store (Store) that ranks use to find each other and to trade the
// messages that set up channels, in the manner of Gloo's rendezvous store.
//
// Where to start: MemStore serves ranks of one process (tests, InitAll);
// Listen starts the TCP store that rank 0 serves and Dial connects a rank to
// it. Prefix gives one user of a store a namespace of its own.
//
// Every TCP store connection proves, before its first request, that it knows
// the communicator's 128-bit secret (an HMAC-SHA256 challenge-response in both
// directions; the secret never crosses the wire). A connection that fails the
// proof is refused, logged, and has no effect on the store. It also claims a
// rank of a job of some rank count: the server checks the claims as one job
// (Server.Expect) and fails the whole rendezvous at once, with the reason,
// when they do not fit (ErrJobFailed). The wire format is in spec.md.
package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
)

// Store is a rendezvous key/value store. Keys are written once by one rank
// and read by others; Get blocks until the key exists. Safe for concurrent use.
type Store interface {
	// Set stores value under key, replacing what was there, and wakes every Get
	// waiting for key.
	Set(ctx context.Context, key string, value []byte) error
	// Get returns the value under key, waiting until some rank sets it or ctx
	// ends (the error then wraps ctx.Err()).
	Get(ctx context.Context, key string) ([]byte, error)
	// TryGet is Get's twin that does not wait: it returns the value under
	// key and true, or false when no rank has set it (yet).
	TryGet(ctx context.Context, key string) ([]byte, bool, error)
	// Add adds delta to the counter named key and returns the new value.
	// Counters are a namespace apart from Set's keys; a new counter is 0.
	Add(ctx context.Context, key string, delta int64) (int64, error)
	// Delete removes key (not a counter); deleting a missing key is no error.
	Delete(ctx context.Context, key string) error
	// Close releases the store. Pending calls fail with ErrClosed. Idempotent.
	Close() error
}

// Limits every store enforces, on both sides of the wire.
const (
	MaxKeyLen   = 4 << 10  // bytes of a key
	MaxValueLen = 16 << 20 // bytes of a value
)

// ErrClosed is returned by calls on a closed store, or a store whose
// connection to its server is lost (wrapped with the cause).
var ErrClosed = errors.New("bootstrap: store closed")

func checkKV(key string, value []byte) error {
	if key == "" || len(key) > MaxKeyLen {
		return fmt.Errorf("bootstrap: key of %d bytes is outside [1, %d]", len(key), MaxKeyLen)
	}
	if len(value) > MaxValueLen {
		return fmt.Errorf("bootstrap: value of %d bytes under %q exceeds %d", len(value), key, MaxValueLen)
	}
	return nil
}

// kv is the state of a store: values, counters and the waiters on each key.
type kv struct {
	mu       sync.Mutex
	vals     map[string][]byte
	counters map[string]int64
	waiters  map[string]chan struct{}
	closed   chan struct{}
	once     sync.Once
}

func newKV() *kv {
	return &kv{vals: make(map[string][]byte), counters: make(map[string]int64),
		waiters: make(map[string]chan struct{}), closed: make(chan struct{})}
}

func (s *kv) set(key string, value []byte) error {
	if err := checkKV(key, value); err != nil {
		return err
	}
	v := append([]byte{}, value...)
	s.mu.Lock()
	s.vals[key] = v
	w := s.waiters[key]
	delete(s.waiters, key)
	s.mu.Unlock()
	if w != nil {
		close(w)
	}
	return nil
}

// get waits until key is set, done or done2 closes, or the store closes.
func (s *kv) get(done, done2 <-chan struct{}, key string) ([]byte, bool, error) {
	if err := checkKV(key, nil); err != nil {
		return nil, false, err
	}
	for {
		s.mu.Lock()
		if v, ok := s.vals[key]; ok {
			s.mu.Unlock()
			return v, true, nil
		}
		w, ok := s.waiters[key]
		if !ok {
			w = make(chan struct{})
			s.waiters[key] = w
		}
		s.mu.Unlock()
		select {
		case <-w:
		case <-done:
			return nil, false, nil
		case <-done2:
			return nil, false, nil
		case <-s.closed:
			return nil, false, ErrClosed
		}
	}
}

// lookup returns the value under key without waiting.
func (s *kv) lookup(key string) ([]byte, bool, error) {
	if err := checkKV(key, nil); err != nil {
		return nil, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.vals[key]
	return v, ok, nil
}

func (s *kv) add(key string, delta int64) (int64, error) {
	if err := checkKV(key, nil); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counters[key] += delta
	return s.counters[key], nil
}

func (s *kv) del(key string) error {
	if err := checkKV(key, nil); err != nil {
		return err
	}
	s.mu.Lock()
	delete(s.vals, key)
	s.mu.Unlock()
	return nil
}

func (s *kv) close() { s.once.Do(func() { close(s.closed) }) }

func (s *kv) isClosed() bool {
	select {
	case <-s.closed:
		return true
	default:
		return false
	}
}

// MemStore is a Store in this process's memory, for ranks that are
// goroutines of one process. The zero value is not usable; use NewMemStore.
type MemStore struct{ s *kv }

// NewMemStore returns an empty in-memory store.
func NewMemStore() *MemStore { return &MemStore{s: newKV()} }

// Set implements Store.
func (m *MemStore) Set(_ context.Context, key string, value []byte) error {
	if m.s.isClosed() {
		return ErrClosed
	}
	return m.s.set(key, value)
}

// Get implements Store.
func (m *MemStore) Get(ctx context.Context, key string) ([]byte, error) {
	if m.s.isClosed() {
		return nil, ErrClosed
	}
	v, ok, err := m.s.get(ctx.Done(), nil, key)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("bootstrap: waiting for key %q: %w", key, ctx.Err())
	}
	return append([]byte{}, v...), nil
}

// TryGet implements Store.
func (m *MemStore) TryGet(_ context.Context, key string) ([]byte, bool, error) {
	if m.s.isClosed() {
		return nil, false, ErrClosed
	}
	v, ok, err := m.s.lookup(key)
	if !ok || err != nil {
		return nil, false, err
	}
	return append([]byte{}, v...), true, nil
}

// Add implements Store.
func (m *MemStore) Add(_ context.Context, key string, delta int64) (int64, error) {
	if m.s.isClosed() {
		return 0, ErrClosed
	}
	return m.s.add(key, delta)
}

// Delete implements Store.
func (m *MemStore) Delete(_ context.Context, key string) error {
	if m.s.isClosed() {
		return ErrClosed
	}
	return m.s.del(key)
}

// Close wakes every pending Get with ErrClosed. Idempotent.
func (m *MemStore) Close() error {
	m.s.close()
	return nil
}

// Prefix returns a view of s in which every key is prefix + "/" + key (Gloo's
// PrefixStore). Closing the view does nothing: s stays its owner's to close.
func Prefix(s Store, prefix string) Store {
	if p, ok := s.(*prefixStore); ok {
		return &prefixStore{s: p.s, prefix: p.prefix + prefix + "/"}
	}
	return &prefixStore{s: s, prefix: prefix + "/"}
}

type prefixStore struct {
	s      Store
	prefix string
}

func (p *prefixStore) Set(ctx context.Context, key string, value []byte) error {
	return p.s.Set(ctx, p.prefix+key, value)
}

func (p *prefixStore) Get(ctx context.Context, key string) ([]byte, error) {
	return p.s.Get(ctx, p.prefix+key)
}

func (p *prefixStore) TryGet(ctx context.Context, key string) ([]byte, bool, error) {
	return p.s.TryGet(ctx, p.prefix+key)
}

func (p *prefixStore) Add(ctx context.Context, key string, delta int64) (int64, error) {
	return p.s.Add(ctx, p.prefix+key, delta)
}

func (p *prefixStore) Delete(ctx context.Context, key string) error {
	return p.s.Delete(ctx, p.prefix+key)
}

func (p *prefixStore) Close() error { return nil }

// Barrier returns once n callers have called it with the same name, or ctx
// ends. Each caller must use a name it has not used before on s.
func Barrier(ctx context.Context, s Store, name string, n int) error {
	k := "barrier/" + name
	v, err := s.Add(ctx, k, 1)
	if err != nil {
		return err
	}
	if v > int64(n) {
		return fmt.Errorf("bootstrap: barrier %q reached by %d callers; expected %d", name, v, n)
	}
	if v == int64(n) {
		return s.Set(ctx, k+"/done", []byte{1})
	}
	_, err = s.Get(ctx, k+"/done")
	return err
}

// Exchange sends mine under key+"/"+me and returns what peer sent under
// key+"/"+peer: one round of a symmetric rendezvous between two parties. The
// peer's key is deleted once read (each key has exactly one reader), so a
// store that carries many exchanges does not grow.
func Exchange(ctx context.Context, s Store, key, me, peer string, mine []byte) ([]byte, error) {
	if strings.Contains(me, "/") || strings.Contains(peer, "/") {
		return nil, fmt.Errorf("bootstrap: exchange party names %q, %q must not contain '/'", me, peer)
	}
	if err := s.Set(ctx, key+"/"+me, mine); err != nil {
		return nil, err
	}
	v, err := s.Get(ctx, key+"/"+peer)
	if err != nil {
		return nil, err
	}
	if err := s.Delete(ctx, key+"/"+peer); err != nil {
		return nil, err
	}
	return v, nil
}
