package bootstrap

import (
	"crypto/hmac"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

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
	// Watched, when set, limits IdleTimeout to the connections whose claim
	// it accepts (a rank's store watches its ring predecessor only, whose
	// client pings it); the others may stay quiet. It runs once per
	// admitted connection.
	Watched func(Claim) bool
	// Open admits every claim that proves the secret, however many
	// connections its rank holds: a store that no job's rendezvous meets
	// in (a rank's mailbox, which a rank dials for each channel setup and
	// hangs up after, so that its next dial may arrive before the server
	// has seen the last one end). Claims are not checked against each
	// other, and Expect does not apply.
	Open bool
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
	served  atomic.Int64 // admitted handshakes and frames read from admitted connections

	mu       sync.Mutex
	conns    map[net.Conn]*srvConn
	closed   bool
	members  map[int]*member // admitted live connections by rank; guarded by mu
	nranks   int             // the job's rank count, 0 until Expect; guarded by mu
	complete bool            // every rank of the job has joined; guarded by mu
	failed   string          // why the job's rendezvous failed; guarded by mu
	wg       sync.WaitGroup
	once     sync.Once
}

// member is an admitted rank's claim and connection.
type member struct {
	Claim
	sc   *srvConn
	gone chan struct{} // closed when the connection has left
}

// rejoinGrace is how long a claim of a rank whose holder is leaving (its
// client closed and dials again: the server may not have seen the end yet)
// waits for it before it counts as a second process claiming the rank.
const rejoinGrace = 200 * time.Millisecond

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
		pending: make(chan struct{}, opts.MaxPending), conns: make(map[net.Conn]*srvConn),
		members: make(map[int]*member)}
	s.wg.Add(1)
	go s.accept()
	return s
}

// Local returns the server's store as seen from its own process: calls go
// straight to memory. Closing it does nothing; Close the Server.
func (s *Server) Local() Store { return localStore{&MemStore{s: s.store}} }

type localStore struct{ *MemStore }

func (localStore) Close() error { return nil }

// Expect tells the server the rank count of its job (rank 0 knows it): from
// then on, and for the ranks admitted before, a claim of another rank count
// fails the job. Until every rank has joined, a claim that does not fit —
// another rank count, a rank another live process holds — makes the
// rendezvous fail for every rank: the offender is refused and every admitted
// client's calls fail with the reason (ErrJobFailed), so that nobody waits
// out its timeout for a job that cannot form. Once every rank has joined, a
// newcomer is refused alone (another job on the same port, say) and the job
// goes on. Without Expect only claims of different rank counts and duplicate
// ranks among live connections are caught. Safe for concurrent use.
func (s *Server) Expect(nranks int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nranks != 0 || nranks <= 0 {
		return
	}
	s.nranks = nranks
	for _, m := range s.members {
		if m.NRanks != nranks || m.Rank >= nranks {
			s.failLocked(fmt.Sprintf("%s joined a job of %d ranks; this job has %d (WORLD_SIZE, or InitRootInfo's nRanks, differs between ranks)", m.Claim, m.NRanks, nranks))
			return
		}
	}
	s.complete = len(s.members) == nranks
}

// admitLocked decides on the claim c of a connection that proved the secret:
// "" admits it; otherwise the reason it is refused, and whether the job
// fails with it. s.mu is held.
func (s *Server) admitLocked(c Claim) (reason string, fatal bool) {
	if s.failed != "" {
		return "the job's rendezvous has failed: " + s.failed, false
	}
	held := s.members[c.Rank]
	if s.complete {
		if held != nil {
			return fmt.Sprintf("%s claims a rank of a job of %d ranks, but all %d ranks of this store's job have joined and pid %d on %s holds rank %d: is another job using this port (MASTER_PORT), or was the rank launched twice?",
				c, c.NRanks, s.nranks, held.PID, held.Host, c.Rank), false
		}
		return fmt.Sprintf("%s claims a rank of a job of %d ranks, but all %d ranks of this store's job have joined: is another job using this port (MASTER_PORT)?",
			c, c.NRanks, s.nranks), false
	}
	if s.nranks > 0 && (c.NRanks != s.nranks || c.Rank >= s.nranks) {
		return fmt.Sprintf("%s joined a job of %d ranks; this job has %d (WORLD_SIZE, or InitRootInfo's nRanks, differs between ranks)", c, c.NRanks, s.nranks), true
	}
	if s.nranks == 0 {
		for _, m := range s.members {
			if m.NRanks != c.NRanks {
				return fmt.Sprintf("ranks disagree on the rank count: %s says %d ranks, %s says %d (WORLD_SIZE, or InitRootInfo's nRanks, differs between ranks)",
					m.Claim, m.NRanks, c, c.NRanks), true
			}
		}
	}
	if held != nil {
		return fmt.Sprintf("two processes claim rank %d (pid %d on %s, pid %d on %s): give each process its own rank",
			c.Rank, held.PID, held.Host, c.PID, c.Host), true
	}
	return "", false
}

// failLocked records why the job failed and tells every admitted client.
// s.mu is held.
func (s *Server) failLocked(reason string) {
	if s.failed != "" {
		return
	}
	s.failed = reason
	s.log.Warn("hcomm bootstrap: the job's rendezvous failed", "store", s.ln.Addr().String(), "reason", reason)
	for c, sc := range s.conns {
		sc.wmu.Lock()
		if sc.admitted {
			c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			if _, err := c.Write(frame(opAbort, 0, []byte(reason))); err != nil {
				c.Close()
			}
		}
		sc.wmu.Unlock()
	}
}

// Failed returns why the job's rendezvous failed ("" while it has not).
func (s *Server) Failed() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed
}

// Addr returns the address the store listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Refused returns how many connections were refused (bad proof, bad hello,
// too many pending handshakes).
func (s *Server) Refused() int64 { return s.refused.Load() }

// Conns returns how many connections the server holds (admitted or in
// their handshake). Safe for concurrent use.
func (s *Server) Conns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// Served returns how many messages the store has served: every admitted
// handshake and every frame an admitted connection sent (requests, pings,
// cancellations, goodbyes). It is the load a job puts on rank 0 (spec.md
// counts it per init). Safe for concurrent use.
func (s *Server) Served() int64 { return s.served.Load() }

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

// handshake runs the server's side of the proof and the job's check of the
// claim; it returns the admitted client's claim.
func (s *Server) handshake(c net.Conn, sc *srvConn) (Claim, bool) {
	defer func() { <-s.pending }()
	c.SetDeadline(time.Now().Add(s.opts.HandshakeTimeout))
	defer c.SetDeadline(time.Time{})
	hello := make([]byte, 0, serverHello)
	hello = append(hello, magicServer[:]...)
	hello = append(hello, version)
	sNonce := make([]byte, nonceLen)
	if _, err := rand.Read(sNonce); err != nil {
		s.log.Error("hcomm bootstrap: random nonce", "err", err)
		return Claim{}, false
	}
	hello = append(hello, sNonce...)
	if _, err := c.Write(hello); err != nil {
		s.refuse(c, "could not send the challenge", "err", err)
		return Claim{}, false
	}
	ch := make([]byte, clientHello)
	if n, err := io.ReadFull(c, ch[:5]); err != nil {
		if n == 0 && errors.Is(err, io.EOF) {
			return Claim{}, false // a Probe: it hangs up once it has the challenge
		}
		s.refuse(c, "no answer to the challenge", "err", err)
		return Claim{}, false
	}
	if [4]byte(ch[0:4]) != magicClient || ch[4] != version {
		s.refuse(c, "not an hcomm bootstrap client of this version", "hello", fmt.Sprintf("%x", ch[:5]))
		if [4]byte(ch[0:4]) == magicClient {
			c.Write(verdictBytes(verdictRefused, nil, fmt.Sprintf("the store speaks version %d of the bootstrap protocol, the client %d", version, ch[4])))
		}
		return Claim{}, false
	}
	if _, err := io.ReadFull(c, ch[5:]); err != nil {
		s.refuse(c, "no answer to the challenge", "err", err)
		return Claim{}, false
	}
	host := make([]byte, ch[17])
	if _, err := io.ReadFull(c, host); err != nil {
		s.refuse(c, "no answer to the challenge", "err", err)
		return Claim{}, false
	}
	cl := Claim{Rank: int(int32(binary.BigEndian.Uint32(ch[5:9]))), NRanks: int(int32(binary.BigEndian.Uint32(ch[9:13]))),
		PID: int(binary.BigEndian.Uint32(ch[13:17])), Host: string(host)}
	claim := ch[5 : 5+13]
	claim = append(claim[:13:13], host...)
	cNonce := ch[18 : 18+nonceLen]
	mac := ch[18+nonceLen:]
	if !hmac.Equal(mac, clientMAC(s.secret, sNonce, cNonce, claim)) {
		s.refuse(c, "wrong secret (HMAC proof does not match)", "claimed_rank", cl.Rank, "pid", cl.PID, "host", cl.Host)
		c.Write(verdictBytes(verdictRefused, nil, "this store serves another communicator"))
		return Claim{}, false
	}
	if cl.Rank < 0 || cl.NRanks <= 0 || cl.Rank >= cl.NRanks {
		reason := clipReason(fmt.Sprintf("%s of %d ranks is no rank", cl, cl.NRanks))
		s.refuse(c, reason)
		c.Write(verdictBytes(verdictJob, serverMAC(s.secret, sNonce, cNonce, claim, verdictJob, reason), reason))
		return Claim{}, false
	}
	if s.opts.Open {
		sc.wmu.Lock()
		sc.admitted = true
		_, err := c.Write(verdictBytes(verdictAdmitted, serverMAC(s.secret, sNonce, cNonce, claim, verdictAdmitted, ""), ""))
		sc.wmu.Unlock()
		return cl, err == nil
	}
	s.mu.Lock()
	reason, fatal := s.admitLocked(cl)
	if held := s.members[cl.Rank]; reason != "" && held != nil && !s.complete && s.failed == "" {
		s.mu.Unlock()
		select {
		case <-held.gone:
		case <-time.After(rejoinGrace):
		}
		s.mu.Lock()
		reason, fatal = s.admitLocked(cl)
	}
	if reason == "" {
		s.members[cl.Rank] = &member{Claim: cl, sc: sc, gone: make(chan struct{})}
		s.complete = s.nranks > 0 && len(s.members) == s.nranks
		sc.wmu.Lock()
		sc.admitted = true
		_, err := c.Write(verdictBytes(verdictAdmitted, serverMAC(s.secret, sNonce, cNonce, claim, verdictAdmitted, ""), ""))
		sc.wmu.Unlock()
		s.mu.Unlock()
		if err != nil {
			s.leave(cl.Rank, sc)
			return Claim{}, false
		}
		return cl, true
	}
	if fatal {
		s.failLocked(reason)
	}
	s.mu.Unlock()
	s.refuse(c, reason)
	reason = clipReason(reason)
	c.Write(verdictBytes(verdictJob, serverMAC(s.secret, sNonce, cNonce, claim, verdictJob, reason), reason))
	return Claim{}, false
}

// leave forgets rank's connection sc when it ends: a rank that joins again
// (a retried dial) is no duplicate.
func (s *Server) leave(rank int, sc *srvConn) {
	s.mu.Lock()
	if m := s.members[rank]; m != nil && m.sc == sc {
		delete(s.members, rank)
		close(m.gone)
	}
	s.mu.Unlock()
}

func (s *Server) serve(c net.Conn, sc *srvConn) {
	defer s.wg.Done()
	defer s.untrack(c)
	cl, ok := s.handshake(c, sc)
	if !ok {
		return
	}
	s.served.Add(1)
	rank := cl.Rank
	defer s.leave(rank, sc)
	idle := s.opts.IdleTimeout
	if s.opts.Watched != nil && !s.opts.Watched(cl) {
		idle = 0
	}
	s.log.Debug("hcomm bootstrap: rank connected", "store", s.ln.Addr().String(), "rank", rank, "pid", cl.PID, "host", cl.Host, "remote", c.RemoteAddr().String())
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
		if !bye && s.opts.OnLost != nil && !s.store.isClosed() && s.Failed() == "" {
			s.log.Warn("hcomm bootstrap: rank lost: its connection ended without a goodbye",
				"store", s.ln.Addr().String(), "rank", rank, "err", why)
			reason := fmt.Sprintf("it is gone: its bootstrap connection ended without a goodbye (%v)", why)
			if ne, ok := why.(net.Error); ok && ne.Timeout() {
				reason = fmt.Sprintf("it is not responding (alive but stuck?): nothing on its bootstrap connection for %v", idle)
			}
			s.opts.OnLost(s.Local(), rank, reason)
		}
	}()
	var wdead atomic.Bool // a reply failed: the client reset the connection
	reply := func(id uint64, op byte, body []byte) {
		wmu.Lock()
		defer wmu.Unlock()
		if wdead.Load() {
			return
		}
		c.SetWriteDeadline(time.Now().Add(30 * time.Second)) // a client that stops reading is dropped
		if _, err := c.Write(frame(op, id, body)); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				c.Close()
				return
			}
			// The client reset the connection: it closed with answers
			// unread (a Get it abandoned, say). Read on what it sent
			// before — its goodbye, when it closed on purpose — rather than
			// take it for lost; the reset ends the reads, the deadline
			// bounds them.
			wdead.Store(true)
			c.SetReadDeadline(time.Now().Add(time.Second))
		}
	}
	fail := func(id uint64, err error) { reply(id, opErr, []byte(err.Error())) }
	for {
		if idle > 0 && !wdead.Load() {
			c.SetReadDeadline(time.Now().Add(idle))
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
			if ne, ok := err.(net.Error); ok && ne.Timeout() && !wdead.Load() {
				// Dropped for its silence: say goodbye, so that a client
				// that is merely slow does not take the end for this
				// store's loss (the server reports it lost; OnLost).
				wmu.Lock()
				c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
				c.Write(frame(opBye, 0))
				wmu.Unlock()
			}
			return
		}
		s.served.Add(1)
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
		case opTryGet:
			v, ok, err := s.store.lookup(string(body))
			if err != nil {
				fail(id, err)
				continue
			}
			if !ok {
				reply(id, opOK, []byte{0})
				continue
			}
			reply(id, opOK, append([]byte{1}, v...))
		case opDel:
			if err := s.store.del(string(body)); err != nil {
				fail(id, err)
				continue
			}
			reply(id, opOK, nil)
		case opBye:
			bye = true
			s.leave(rank, sc) // before the connection ends: the rank may dial again at once
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
