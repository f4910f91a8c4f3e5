package bootstrap

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Secret is the 128-bit secret every connection to a TCP store must prove it
// knows. The zero Secret is a valid (if guessable) key.
type Secret [16]byte

// NewSecret returns a random secret.
func NewSecret() (Secret, error) {
	var s Secret
	if _, err := rand.Read(s[:]); err != nil {
		return s, fmt.Errorf("bootstrap: random secret: %w", err)
	}
	return s, nil
}

// DeriveSecret turns any string shared by the ranks (HCOMM_SECRET, a rank
// table's contents) into a Secret: the first 16 bytes of its SHA-256.
func DeriveSecret(s string) Secret {
	h := sha256.Sum256([]byte("hcomm/bootstrap/secret\x00" + s))
	var out Secret
	copy(out[:], h[:])
	return out
}

// String returns the secret as 32 lowercase hex digits.
func (s Secret) String() string { return hex.EncodeToString(s[:]) }

// ErrAuth is wrapped by Dial's error when the server refused this client's
// proof of the secret, or the server could not prove it knows the secret.
var ErrAuth = errors.New("bootstrap: secret proof refused")

// Wire constants (spec.md).
const (
	version       = 1
	nonceLen      = 32
	macLen        = sha256.Size
	serverHello   = 4 + 1 + nonceLen
	clientHello   = 4 + 1 + 4 + nonceLen + macLen
	serverVerdict = 1 + macLen
	headerLen     = 4 + 1 + 8
	maxBody       = MaxKeyLen + MaxValueLen + 16

	opSet    = 1
	opGet    = 2
	opAdd    = 3
	opDel    = 4
	opCancel = 5
	opBye    = 6
	opPing   = 7
	opOK     = 0x81
	opErr    = 0x82
)

var (
	magicServer = [4]byte{'H', 'C', 'B', 'S'}
	magicClient = [4]byte{'H', 'C', 'B', 'C'}
)

func clientMAC(s Secret, sNonce, cNonce []byte, rank int32) []byte {
	m := hmac.New(sha256.New, s[:])
	m.Write([]byte("hcomm/bootstrap/client\x00"))
	m.Write(sNonce)
	m.Write(cNonce)
	binary.Write(m, binary.BigEndian, rank)
	return m.Sum(nil)
}

func serverMAC(s Secret, sNonce, cNonce []byte, rank int32) []byte {
	m := hmac.New(sha256.New, s[:])
	m.Write([]byte("hcomm/bootstrap/server\x00"))
	m.Write(cNonce)
	m.Write(sNonce)
	binary.Write(m, binary.BigEndian, rank)
	return m.Sum(nil)
}

// header is a frame header: body length, op, request id (spec.md).
type header [headerLen]byte

func (h *header) bodyLen() uint32 { return binary.BigEndian.Uint32(h[0:4]) }
func (h *header) op() byte        { return h[4] }
func (h *header) id() uint64      { return binary.BigEndian.Uint64(h[5:13]) }

func frame(op byte, id uint64, body ...[]byte) []byte {
	n := 0
	for _, b := range body {
		n += len(b)
	}
	out := make([]byte, headerLen, headerLen+n)
	binary.BigEndian.PutUint32(out[0:4], uint32(n))
	out[4] = op
	binary.BigEndian.PutUint64(out[5:13], id)
	for _, b := range body {
		out = append(out, b...)
	}
	return out
}

// readFrame reads one frame; a body longer than maxBody is an error.
func readFrame(r io.Reader) (header, []byte, error) {
	var h header
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return h, nil, err
	}
	if h.bodyLen() > maxBody {
		return h, nil, fmt.Errorf("frame body of %d bytes exceeds %d", h.bodyLen(), maxBody)
	}
	body := make([]byte, h.bodyLen())
	if _, err := io.ReadFull(r, body); err != nil {
		return h, nil, err
	}
	return h, body, nil
}

// encodeSet and decodeSet: u32 key length, key, value.
func encodeSet(key string, value []byte) []byte {
	b := make([]byte, 4, 4+len(key)+len(value))
	binary.BigEndian.PutUint32(b, uint32(len(key)))
	b = append(b, key...)
	return append(b, value...)
}

func decodeSet(body []byte) (string, []byte, error) {
	if len(body) < 4 {
		return "", nil, fmt.Errorf("set body of %d bytes is shorter than its key length", len(body))
	}
	n := binary.BigEndian.Uint32(body)
	if uint64(n) > uint64(len(body)-4) {
		return "", nil, fmt.Errorf("set key length %d exceeds the body's %d bytes", n, len(body)-4)
	}
	return string(body[4 : 4+n]), body[4+n:], nil
}

// decodeAdd: i64 delta, key.
func decodeAdd(body []byte) (string, int64, error) {
	if len(body) < 8 {
		return "", 0, fmt.Errorf("add body of %d bytes is shorter than its delta", len(body))
	}
	return string(body[8:]), int64(binary.BigEndian.Uint64(body)), nil
}

// ServerOptions tune a Server. The zero value is usable.
type ServerOptions struct {
	// Logger receives refused connections (Warn) and protocol errors; nil
	// means none (a library does not write to slog's default logger unasked).
	Logger *slog.Logger
	// HandshakeTimeout bounds a new connection's proof of the secret
	// (default 10 s): a connection that says nothing is closed after it.
	HandshakeTimeout time.Duration
	// MaxPending bounds connections still in their handshake (default 256);
	// more are closed at once and logged.
	MaxPending int
	// OnLost, when set, is called (from the connection's goroutine) when an
	// authenticated connection ends without its client's goodbye (Close sends
	// one) while the server is not closing: the rank's process died or its
	// network went away. local is the server's own store.
	OnLost func(local Store, rank int, reason string)
	// IdleTimeout, when positive, drops (and reports lost) an admitted
	// connection that sends nothing for that long: clients that call
	// KeepAlive with a shorter interval are never idle while they live.
	IdleTimeout time.Duration
}

// Server is the TCP store that rank 0 serves. Safe for concurrent use; Close
// stops every goroutine it started and closes every connection.
type Server struct {
	ln      net.Listener
	secret  Secret
	opts    ServerOptions
	log     *slog.Logger
	store   *kv
	pending chan struct{}
	refused atomic.Int64

	mu     sync.Mutex
	conns  map[net.Conn]*srvConn
	closed bool
	wg     sync.WaitGroup
	once   sync.Once
}

// Listen starts a store on addr ("host:port"; port 0 picks one) that admits
// the connections proving they know secret.
func Listen(addr string, secret Secret, opts ServerOptions) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("bootstrap: listen on %s: %w", addr, err)
	}
	return Serve(ln, secret, opts), nil
}

// Serve is Listen over a listener the caller made; the Server owns ln.
func Serve(ln net.Listener, secret Secret, opts ServerOptions) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = 10 * time.Second
	}
	if opts.MaxPending <= 0 {
		opts.MaxPending = 256
	}
	s := &Server{ln: ln, secret: secret, opts: opts, log: opts.Logger, store: newKV(),
		pending: make(chan struct{}, opts.MaxPending), conns: make(map[net.Conn]*srvConn)}
	s.wg.Add(1)
	go s.accept()
	return s
}

// Local returns the server's store as seen from its own process: calls go
// straight to memory. Closing it does nothing; Close the Server.
func (s *Server) Local() Store { return localStore{&MemStore{s: s.store}} }

type localStore struct{ *MemStore }

func (localStore) Close() error { return nil }

// Addr returns the address the store listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Refused returns how many connections were refused (bad proof, bad hello,
// too many pending handshakes).
func (s *Server) Refused() int64 { return s.refused.Load() }

// Close stops the store: it closes the listener and every connection and
// waits for the goroutines. Idempotent.
func (s *Server) Close() error {
	s.once.Do(func() {
		s.store.close() // first: connections ending now are not lost ranks
		s.mu.Lock()
		s.closed = true
		for c, sc := range s.conns {
			// Tell the admitted ranks that the store closes on purpose, so
			// that they do not take its end for rank 0's loss.
			sc.wmu.Lock()
			if sc.admitted {
				c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
				c.Write(frame(opBye, 0))
			}
			sc.wmu.Unlock()
			c.Close()
		}
		s.mu.Unlock()
		s.ln.Close()
	})
	s.wg.Wait()
	return nil
}

// srvConn is the server's state of one connection.
type srvConn struct {
	wmu      sync.Mutex // serialises writes
	admitted bool       // passed the handshake; guarded by wmu
}

func (s *Server) track(c net.Conn) *srvConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	sc := &srvConn{}
	s.conns[c] = sc
	return sc
}

func (s *Server) untrack(c net.Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	c.Close()
}

func (s *Server) accept() {
	defer s.wg.Done()
	backoff := 5 * time.Millisecond
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || s.store.isClosed() {
				return
			}
			s.log.Warn("hcomm bootstrap: accept failed", "addr", s.ln.Addr().String(), "err", err)
			select {
			case <-time.After(backoff):
			case <-s.store.closed:
				return
			}
			if backoff < time.Second {
				backoff *= 2
			}
			continue
		}
		backoff = 5 * time.Millisecond
		select {
		case s.pending <- struct{}{}:
		default:
			s.refused.Add(1)
			s.log.Warn("hcomm bootstrap: refused connection: too many pending handshakes",
				"store", s.ln.Addr().String(), "remote", c.RemoteAddr().String(), "max", s.opts.MaxPending)
			c.Close()
			continue
		}
		sc := s.track(c)
		if sc == nil {
			<-s.pending
			c.Close()
			return
		}
		s.wg.Add(1)
		go s.serve(c, sc)
	}
}

func (s *Server) refuse(c net.Conn, reason string, args ...any) {
	s.refused.Add(1)
	s.log.Warn("hcomm bootstrap: refused connection: "+reason,
		append([]any{"store", s.ln.Addr().String(), "remote", c.RemoteAddr().String()}, args...)...)
}

// handshake runs the server's side of the proof; it returns the client's rank.
func (s *Server) handshake(c net.Conn) (int32, bool) {
	defer func() { <-s.pending }()
	c.SetDeadline(time.Now().Add(s.opts.HandshakeTimeout))
	defer c.SetDeadline(time.Time{})
	hello := make([]byte, 0, serverHello)
	hello = append(hello, magicServer[:]...)
	hello = append(hello, version)
	sNonce := make([]byte, nonceLen)
	if _, err := rand.Read(sNonce); err != nil {
		s.log.Error("hcomm bootstrap: random nonce", "err", err)
		return 0, false
	}
	hello = append(hello, sNonce...)
	if _, err := c.Write(hello); err != nil {
		s.refuse(c, "could not send the challenge", "err", err)
		return 0, false
	}
	ch := make([]byte, clientHello)
	if _, err := io.ReadFull(c, ch); err != nil {
		s.refuse(c, "no answer to the challenge", "err", err)
		return 0, false
	}
	if [4]byte(ch[0:4]) != magicClient || ch[4] != version {
		s.refuse(c, "not an hcomm bootstrap client of this version", "hello", fmt.Sprintf("%x", ch[:5]))
		return 0, false
	}
	rank := int32(binary.BigEndian.Uint32(ch[5:9]))
	cNonce := ch[9 : 9+nonceLen]
	mac := ch[9+nonceLen:]
	if !hmac.Equal(mac, clientMAC(s.secret, sNonce, cNonce, rank)) {
		s.refuse(c, "wrong secret (HMAC proof does not match)", "claimed_rank", rank)
		c.Write(make([]byte, serverVerdict)) // verdict 0: refused
		return 0, false
	}
	verdict := append([]byte{1}, serverMAC(s.secret, sNonce, cNonce, rank)...)
	if _, err := c.Write(verdict); err != nil {
		return 0, false
	}
	return rank, true
}

func (s *Server) serve(c net.Conn, sc *srvConn) {
	defer s.wg.Done()
	defer s.untrack(c)
	rank, ok := s.handshake(c)
	if !ok {
		return
	}
	sc.wmu.Lock()
	sc.admitted = true
	sc.wmu.Unlock()
	s.log.Debug("hcomm bootstrap: rank connected", "store", s.ln.Addr().String(), "rank", rank, "remote", c.RemoteAddr().String())
	var (
		wmu     = &sc.wmu
		reqs    sync.WaitGroup
		cmu     sync.Mutex
		cancels = make(map[uint64]chan struct{})
		done    = make(chan struct{})
		bye     bool
		why     error
	)
	defer func() {
		close(done)
		c.Close() // unblocks writers
		reqs.Wait()
		if !bye && s.opts.OnLost != nil && !s.store.isClosed() {
			s.log.Warn("hcomm bootstrap: rank lost: its connection ended without a goodbye",
				"store", s.ln.Addr().String(), "rank", rank, "err", why)
			s.opts.OnLost(s.Local(), int(rank), fmt.Sprintf("its bootstrap connection to rank 0 ended without a goodbye (%v)", why))
		}
	}()
	reply := func(id uint64, op byte, body []byte) {
		wmu.Lock()
		defer wmu.Unlock()
		c.SetWriteDeadline(time.Now().Add(30 * time.Second)) // a client that stops reading is dropped
		if _, err := c.Write(frame(op, id, body)); err != nil {
			c.Close()
		}
	}
	fail := func(id uint64, err error) { reply(id, opErr, []byte(err.Error())) }
	for {
		if s.opts.IdleTimeout > 0 {
			c.SetReadDeadline(time.Now().Add(s.opts.IdleTimeout))
		}
		h, body, err := readFrame(c)
		if err != nil {
			why = err
			if bye {
				return
			}
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.log.Warn("hcomm bootstrap: dropping connection", "store", s.ln.Addr().String(), "rank", rank, "err", err)
			}
			return
		}
		id := h.id()
		switch h.op() {
		case opSet:
			k, v, err := decodeSet(body)
			if err == nil {
				err = s.store.set(k, v)
			}
			if err != nil {
				fail(id, err)
				continue
			}
			reply(id, opOK, nil)
		case opGet:
			key := string(body)
			cancel := make(chan struct{})
			cmu.Lock()
			if _, dup := cancels[id]; dup {
				cmu.Unlock()
				fail(id, fmt.Errorf("request id %d is already pending", id))
				continue
			}
			cancels[id] = cancel
			cmu.Unlock()
			reqs.Add(1)
			go func() {
				defer reqs.Done()
				defer func() {
					cmu.Lock()
					delete(cancels, id)
					cmu.Unlock()
				}()
				v, ok, err := s.store.get(cancel, done, key)
				switch {
				case errors.Is(err, ErrClosed):
					// the server is closing: the client sees the connection end
				case err != nil:
					fail(id, err)
				case ok:
					reply(id, opOK, v)
				default:
					fail(id, errors.New("get cancelled"))
				}
			}()
		case opAdd:
			k, d, err := decodeAdd(body)
			var v int64
			if err == nil {
				v, err = s.store.add(k, d)
			}
			if err != nil {
				fail(id, err)
				continue
			}
			reply(id, opOK, binary.BigEndian.AppendUint64(nil, uint64(v)))
		case opDel:
			if err := s.store.del(string(body)); err != nil {
				fail(id, err)
				continue
			}
			reply(id, opOK, nil)
		case opBye:
			bye = true
		case opPing:
		case opCancel:
			cmu.Lock()
			if ch, ok := cancels[id]; ok {
				delete(cancels, id)
				close(ch)
			}
			cmu.Unlock()
		default:
			s.log.Warn("hcomm bootstrap: dropping connection: unknown op", "store", s.ln.Addr().String(), "rank", rank, "op", h.op())
			return
		}
	}
}
