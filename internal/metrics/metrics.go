// Package metrics holds hcomm's Prometheus collectors. A library takes a
// prometheus.Registerer (nil = no metrics) and never registers globally: New
// registers the collectors of one rank on the Registerer it is given, and a
// second New on the same Registerer for the same rank (another communicator
// of the same process) shares the collectors already there.
//
// Series, every label from a small fixed set:
//
//	hcomm_transport_bytes_total{rank,transport,direction}  counter   bytes moved by one-sided writes and reads
//	hcomm_notify_wait_seconds{rank,transport}              histogram channel notify waits, from start to signal
//	hcomm_collective_duration_seconds{rank,op,algorithm}   histogram a collective's time on its stream
//	hcomm_errors_total{rank,code}                          counter   failed data-plane tasks, by HcclResult name
//
// rank is the communicator's rank, a constant label of every series: the
// ranks of one process share a registry, and the ranks of a job scraped by one
// Prometheus are told apart without relabelling. transport is inproc, shm, tcp
// or other; direction is write or read; op is a collective's name in lower
// case; algorithm is the schedule's name; code is an HcclResult name such as
// "timeout". hcomm_errors_total has its series for the codes New is given
// from the start, at zero, so that a rate or an alert sees them before the
// first failure; hcomm_transport_bytes_total has both directions' series of
// a transport from the setup of the rank's first channel over it (hcomm
// finds them once a channel, BytesOf, and counts with one atomic add).
package metrics

import (
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Directions of hcomm_transport_bytes_total.
const (
	Write = "write"
	Read  = "read"
)

// Set is the collectors of one Registerer. A nil *Set records nothing, so
// callers need no checks. Safe for concurrent use.
type Set struct {
	bytes  *prometheus.CounterVec
	waits  *prometheus.HistogramVec
	colls  *prometheus.HistogramVec
	errors *prometheus.CounterVec
	// series holds the series the data path has used, by seriesKey: a
	// look-up of two strings where WithLabelValues hashes, validates and
	// (the op and algorithm) lower-cases its labels on every call: 8 % of
	// the processor in a profile of 16-byte all-reduces in one process.
	// The label sets are few, so the map stays small; it is
	// replaced whole when a series is added (under seriesMu), so that a
	// look-up is an atomic load and a map read, without a lock or an
	// allocation.
	series   atomic.Pointer[map[seriesKey]any]
	seriesMu sync.Mutex
}

// seriesKey names a series of the Set's vectors: the vector and its labels
// as the caller gave them.
type seriesKey struct {
	vec  uint8
	a, b string
}

// The vectors of seriesKey.
const (
	vecBytes = iota
	vecWaits
	vecColls
)

// lookup returns the series k names, making it with mk the first time.
func (s *Set) lookup(k seriesKey, mk func() any) any {
	if m := s.series.Load(); m != nil {
		if v, ok := (*m)[k]; ok {
			return v
		}
	}
	s.seriesMu.Lock()
	defer s.seriesMu.Unlock()
	old := s.series.Load()
	if old != nil {
		if v, ok := (*old)[k]; ok {
			return v
		}
	}
	next := make(map[seriesKey]any, 1+len(ptrMap(old)))
	for key, v := range ptrMap(old) {
		next[key] = v
	}
	v := mk()
	next[k] = v
	s.series.Store(&next)
	return v
}

func ptrMap(m *map[seriesKey]any) map[seriesKey]any {
	if m == nil {
		return nil
	}
	return *m
}

// counter returns the bytes_total series of (transport, dir).
func (s *Set) counter(transport, dir string) prometheus.Counter {
	return s.lookup(seriesKey{vecBytes, transport, dir}, func() any {
		return s.bytes.WithLabelValues(Transport(transport), dir)
	}).(prometheus.Counter)
}

// observer returns the series of histogram vector vec for labels a, b
// (b unused by the waits).
func (s *Set) observer(vec uint8, a, b string) prometheus.Observer {
	return s.lookup(seriesKey{vec, a, b}, func() any {
		if vec == vecWaits {
			return s.waits.WithLabelValues(Transport(a))
		}
		return s.colls.WithLabelValues(strings.ToLower(a), strings.ToLower(b))
	}).(prometheus.Observer)
}

// latencyBuckets span 1 µs to about a minute, ×4 apart.
var latencyBuckets = prometheus.ExponentialBuckets(1e-6, 4, 14)

// New registers the collectors of rank on reg, every series labelled with
// rank, or finds those a previous New for the same rank put there; the
// errors_total series of errorCodes start at zero. A nil reg gives a nil Set.
func New(reg prometheus.Registerer, rank int, errorCodes ...string) (*Set, error) {
	if reg == nil {
		return nil, nil
	}
	reg = prometheus.WrapRegistererWith(prometheus.Labels{"rank": strconv.Itoa(rank)}, reg)
	s := &Set{
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "hcomm", Name: "transport_bytes_total",
			Help: "Bytes moved by one-sided writes and reads (write-reduce and read-reduce included), by transport and direction.",
		}, []string{"transport", "direction"}),
		waits: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "hcomm", Name: "notify_wait_seconds",
			Help:    "Time a channel notify wait spent from its start on the stream until the peer's record arrived (or it failed).",
			Buckets: latencyBuckets,
		}, []string{"transport"}),
		colls: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "hcomm", Name: "collective_duration_seconds",
			Help:    "Time a collective took on its stream, from its first task starting to its last finishing, by op and algorithm.",
			Buckets: latencyBuckets,
		}, []string{"op", "algorithm"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "hcomm", Name: "errors_total",
			Help: "Data-plane tasks that failed, by HcclResult name.",
		}, []string{"code"}),
	}
	var err error
	if s.bytes, err = register(reg, s.bytes); err != nil {
		return nil, err
	}
	if s.waits, err = register(reg, s.waits); err != nil {
		return nil, err
	}
	if s.colls, err = register(reg, s.colls); err != nil {
		return nil, err
	}
	if s.errors, err = register(reg, s.errors); err != nil {
		return nil, err
	}
	for _, code := range errorCodes {
		s.errors.WithLabelValues(code)
	}
	return s, nil
}

// register registers c, or returns the equal collector already registered.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if old, ok := are.ExistingCollector.(C); ok {
			return old, nil
		}
	}
	return c, err
}

// Transport maps a transport's name to the label's fixed set.
func Transport(name string) string {
	switch name {
	case "inproc", "shm", "tcp":
		return name
	}
	return "other"
}

// AddBytes counts n bytes moved over transport in direction dir.
func (s *Set) AddBytes(transport, dir string, n int64) {
	if s == nil || n <= 0 {
		return
	}
	s.counter(transport, dir).Add(float64(n))
}

// Bytes is one series of hcomm_transport_bytes_total, found once (BytesOf)
// by a caller that counts into it often — a channel, whose transport is
// fixed — so that a count is one atomic add and no lookup. The zero Bytes
// counts nothing.
type Bytes struct{ c prometheus.Counter }

// BytesOf returns the series of transport and direction dir; a nil Set
// gives the zero Bytes.
func (s *Set) BytesOf(transport, dir string) Bytes {
	if s == nil {
		return Bytes{}
	}
	return Bytes{s.counter(transport, dir)}
}

// Add counts n bytes (none when n <= 0 or b is the zero Bytes).
func (b Bytes) Add(n int64) {
	if b.c != nil && n > 0 {
		b.c.Add(float64(n))
	}
}

// ObserveWait records one notify wait over transport.
func (s *Set) ObserveWait(transport string, d time.Duration) {
	if s == nil {
		return
	}
	s.observer(vecWaits, transport, "").Observe(d.Seconds())
}

// ObserveCollective records one collective's duration.
func (s *Set) ObserveCollective(op, algo string, d time.Duration) {
	if s == nil {
		return
	}
	s.observer(vecColls, op, algo).Observe(d.Seconds())
}

// CountError counts one failure with the HcclResult name code.
func (s *Set) CountError(code string) {
	if s == nil {
		return
	}
	s.errors.WithLabelValues(code).Inc()
}
