package bootstrap

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// Client is a rank's connection to a TCP store (a Store). Calls may run
// concurrently: they are multiplexed over one connection by request id, so a
// Get that waits does not hold up the others. When the connection is lost,
// pending and later calls fail with an error wrapping ErrClosed.
type Client struct {
	conn net.Conn
	addr string
	rank int

	wmu     sync.Mutex
	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan result
	err     error // why the connection ended; guarded by mu
	byeSeen bool  // the server said goodbye; guarded by mu
	lost    bool  // the connection ended without either side's goodbye; guarded by mu
	done    chan struct{}
	closing chan struct{} // closed by Close
	wg      sync.WaitGroup
	once    sync.Once
}

type result struct {
	ok   bool
	body []byte
}

// Dial connects a rank to the store at addr, proves it knows secret and
// claims its rank of a job of claim.NRanks ranks (claim.PID and claim.Host
// default to this process's). While the store is not up yet (connection
// refused, unreachable, reset) it retries with backoff until ctx ends — ranks
// start in any order. A refused proof is not retried: the error wraps ErrAuth
// (the store serves another communicator); nor is a claim the store's job
// refuses: the error wraps ErrJobFailed and says why.
func Dial(ctx context.Context, addr string, secret Secret, claim Claim) (*Client, error) {
	return dial(ctx, addr, secret, claim, true)
}

// DialUp is Dial for a store known to be up — a peer's store whose address
// the peer published once it listened: it does not retry. A refused or
// reset connection, or one that ends before the handshake does, means the
// store's process is gone; the error then wraps ErrGone. Errors otherwise
// as Dial's.
func DialUp(ctx context.Context, addr string, secret Secret, claim Claim) (*Client, error) {
	return dial(ctx, addr, secret, claim, false)
}

func dial(ctx context.Context, addr string, secret Secret, claim Claim, retry bool) (*Client, error) {
	if claim.PID == 0 {
		claim.PID = os.Getpid()
	}
	if claim.Host == "" {
		claim.Host, _ = os.Hostname()
	}
	if len(claim.Host) > 255 {
		claim.Host = claim.Host[:255]
	}
	rank := claim.Rank
	backoff := 10 * time.Millisecond
	var last error
	for attempt := 0; ; attempt++ {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			var c *Client
			c, err = handshake(ctx, conn, addr, secret, claim)
			if err == nil {
				return c, nil
			}
			conn.Close()
			if errors.Is(err, ErrAuth) || errors.Is(err, ErrJobFailed) {
				return nil, err
			}
		}
		last = err
		if !retry && ctx.Err() == nil {
			if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
				errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) { // its process went mid-handshake
				return nil, fmt.Errorf("bootstrap: rank %d could not reach the store at %s: %v: %w", rank, addr, err, ErrGone)
			}
			return nil, fmt.Errorf("bootstrap: rank %d could not reach the store at %s: %w", rank, addr, err)
		}
		if ctx.Err() != nil || !retryable(err) {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		if ctx.Err() != nil {
			break
		}
		if backoff < 500*time.Millisecond {
			backoff *= 2
		}
	}
	what := "the store of rank 0"
	if !retry {
		what = "the store"
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("bootstrap: rank %d could not reach %s at %s (last error: %v): %w", rank, what, addr, last, ctx.Err())
	}
	return nil, fmt.Errorf("bootstrap: rank %d could not reach %s at %s: %w", rank, what, addr, last)
}

// Errors of Probe.
var (
	// ErrGone: nothing listens at the store's address — its process is
	// gone (the kernel refused the connection) or closed the store.
	ErrGone = errors.New("bootstrap: store gone")
	// ErrStuck: the store's address accepted the connection but the store
	// sent no challenge in time — its process is alive but not running
	// (stopped, frozen) or its host is overloaded past the bound.
	ErrStuck = errors.New("bootstrap: store not responding")
)

// Probe tells whether the process that serves a store at addr is there and
// responsive, without joining the store: it connects, reads the store's
// challenge and hangs up (the server takes that for a probe: no refusal is
// logged or counted). It returns nil when the challenge came within
// timeout; an error wrapping ErrGone when the connection was refused or
// reset (the address is local to the prober's network: a process that died
// leaves no listener, and its kernel refuses at once); an error wrapping
// ErrStuck when the connection was accepted (or the dial hung) but no
// challenge came within timeout; ctx's error when ctx ended first.
func Probe(ctx context.Context, addr string, timeout time.Duration) error {
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(pctx, "tcp", addr)
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return fmt.Errorf("bootstrap: probing the store at %s: %w", addr, ctx.Err())
		case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET):
			return fmt.Errorf("bootstrap: probing the store at %s: %v: %w", addr, err, ErrGone)
		case pctx.Err() != nil:
			return fmt.Errorf("bootstrap: probing the store at %s: no connection within %v: %w", addr, timeout, ErrStuck)
		}
		return fmt.Errorf("bootstrap: probing the store at %s: %w", addr, err)
	}
	defer conn.Close()
	stop := context.AfterFunc(pctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	hello := make([]byte, serverHello)
	if _, err := io.ReadFull(conn, hello); err != nil {
		switch {
		case ctx.Err() != nil:
			return fmt.Errorf("bootstrap: probing the store at %s: %w", addr, ctx.Err())
		case pctx.Err() != nil:
			return fmt.Errorf("bootstrap: probing the store at %s: connected, but no challenge within %v: %w", addr, timeout, ErrStuck)
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET):
			return fmt.Errorf("bootstrap: probing the store at %s: it hung up: %w", addr, ErrGone)
		}
		return fmt.Errorf("bootstrap: probing the store at %s: %w", addr, err)
	}
	if [4]byte(hello[0:4]) != magicServer {
		return fmt.Errorf("bootstrap: probing %s: not an hcomm bootstrap store (hello %x): %w", addr, hello[:4], ErrGone)
	}
	return nil
}

// retryable reports whether err may go away once the store's process is up.
func retryable(err error) bool {
	var dnsErr *net.DNSError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH),
		errors.Is(err, syscall.ETIMEDOUT), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.EPIPE):
		return true
	case errors.As(err, &dnsErr):
		return dnsErr.IsTemporary || dnsErr.IsNotFound // the name may appear (Kubernetes services)
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func handshake(ctx context.Context, conn net.Conn, addr string, secret Secret, claim Claim) (*Client, error) {
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	hello := make([]byte, serverHello)
	if _, err := io.ReadFull(conn, hello); err != nil {
		return nil, fmt.Errorf("bootstrap: reading the challenge of the store at %s: %w", addr, err)
	}
	if [4]byte(hello[0:4]) != magicServer || hello[4] != version {
		return nil, fmt.Errorf("bootstrap: %s is not an hcomm bootstrap store of version %d (hello %x): %w", addr, version, hello[:5], ErrAuth)
	}
	sNonce := hello[5:]
	cNonce := make([]byte, nonceLen)
	if _, err := rand.Read(cNonce); err != nil {
		return nil, err
	}
	cb := claimBytes(claim)
	msg := make([]byte, 0, clientHello+len(claim.Host))
	msg = append(msg, magicClient[:]...)
	msg = append(msg, version)
	msg = append(msg, cb[:13]...)
	msg = append(msg, cNonce...)
	msg = append(msg, clientMAC(secret, sNonce, cNonce, cb)...)
	msg = append(msg, claim.Host...)
	if _, err := conn.Write(msg); err != nil {
		return nil, fmt.Errorf("bootstrap: answering the challenge of the store at %s: %w", addr, err)
	}
	verdict := make([]byte, serverVerdict)
	if _, err := io.ReadFull(conn, verdict); err != nil {
		return nil, fmt.Errorf("bootstrap: reading the verdict of the store at %s: %w", addr, err)
	}
	reason := make([]byte, binary.BigEndian.Uint16(verdict[1+macLen:]))
	if len(reason) > maxReason {
		return nil, fmt.Errorf("bootstrap: the store at %s sent a reason of %d bytes", addr, len(reason))
	}
	if _, err := io.ReadFull(conn, reason); err != nil {
		return nil, fmt.Errorf("bootstrap: reading the verdict of the store at %s: %w", addr, err)
	}
	mac := verdict[1 : 1+macLen]
	switch verdict[0] {
	case verdictAdmitted, verdictJob:
		if !hmac.Equal(mac, serverMAC(secret, sNonce, cNonce, cb, verdict[0], string(reason))) {
			return nil, fmt.Errorf("bootstrap: the store at %s could not prove it knows the secret: %w", addr, ErrAuth)
		}
	default:
		return nil, fmt.Errorf("bootstrap: the store at %s refused rank %d's proof of the secret — it serves another communicator: "+
			"another job on this port (MASTER_PORT), or a wrong root info or HCOMM_SECRET: %w", addr, claim.Rank, ErrAuth)
	}
	if verdict[0] == verdictJob {
		return nil, fmt.Errorf("bootstrap: the store at %s refused %s: %s: %w", addr, claim, reason, ErrJobFailed)
	}
	if !stop() || ctx.Err() != nil {
		return nil, fmt.Errorf("bootstrap: handshake with the store at %s: %w", addr, context.Cause(ctx))
	}
	conn.SetDeadline(time.Time{})
	c := &Client{conn: conn, addr: addr, rank: claim.Rank, pending: make(map[uint64]chan result), done: make(chan struct{}), closing: make(chan struct{})}
	c.wg.Add(1)
	go c.read()
	return c, nil
}

func (c *Client) read() {
	defer c.wg.Done()
	var err error
	for {
		var h header
		var body []byte
		h, body, err = readFrame(c.conn)
		if err != nil {
			break
		}
		if h.op() == opBye {
			c.mu.Lock()
			c.byeSeen = true
			c.mu.Unlock()
			continue
		}
		if h.op() == opAbort {
			c.mu.Lock()
			if c.err == nil {
				c.err = fmt.Errorf("bootstrap: the store at %s failed the job's rendezvous: %s: %w", c.addr, body, ErrJobFailed)
			}
			c.mu.Unlock()
			break
		}
		if h.op() != opOK && h.op() != opErr {
			err = fmt.Errorf("unknown reply op %#x", h.op())
			break
		}
		c.mu.Lock()
		ch := c.pending[h.id()]
		delete(c.pending, h.id())
		c.mu.Unlock()
		if ch != nil {
			ch <- result{ok: h.op() == opOK, body: body}
		}
	}
	c.mu.Lock()
	if c.err == nil { // not closed by this side
		if c.byeSeen {
			c.err = fmt.Errorf("bootstrap: the store at %s closed: %w", c.addr, ErrClosed)
		} else {
			c.lost = true
			c.err = fmt.Errorf("bootstrap: connection to the store at %s lost: %v: %w", c.addr, err, ErrClosed)
		}
	}
	c.mu.Unlock()
	close(c.done)
	c.conn.Close()
}

func (c *Client) call(ctx context.Context, op byte, body ...[]byte) ([]byte, error) {
	ch := make(chan result, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, err
	}
	c.nextID++
	id := c.nextID
	c.pending[id] = ch
	c.mu.Unlock()
	forget := func() {
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
	}
	dl, _ := ctx.Deadline()
	if err := c.send(dl, frame(op, id, body...)); err != nil {
		forget()
		if errors.Is(err, ErrClosed) {
			// The write found the connection broken (or a concurrent
			// write's failure closed it): the reader ends at once and says
			// why — the store's goodbye or its loss — which names the
			// cause better than the write's "use of closed connection".
			// The wait is bounded all the same: a second, or the call's
			// context.
			t := time.NewTimer(time.Second)
			select {
			case <-c.done:
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
		}
		c.mu.Lock()
		if c.err != nil { // the connection ended first (an ABORT, Close): say why
			err = c.err
		}
		c.mu.Unlock()
		return nil, err
	}
	select {
	case r := <-ch:
		if !r.ok {
			return nil, fmt.Errorf("bootstrap: store at %s: %s", c.addr, r.body)
		}
		return r.body, nil
	case <-c.done:
		forget()
		c.mu.Lock()
		err := c.err
		c.mu.Unlock()
		return nil, err
	case <-ctx.Done():
		forget()
		if op == opGet {
			c.send(time.Now().Add(time.Second), frame(opCancel, id))
		}
		return nil, ctx.Err()
	}
}

// send writes one frame; dl (zero: none) bounds the write. A write that
// ends before its first byte (dl passed: the caller's context ended while
// it waited its turn) leaves the connection as it was; one that wrote part
// of the frame closes it, which would otherwise desynchronise the stream.
func (c *Client) send(dl time.Time, b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if !dl.IsZero() && !time.Now().Before(dl) {
		return fmt.Errorf("bootstrap: writing to the store at %s: %w", c.addr, os.ErrDeadlineExceeded)
	}
	c.conn.SetWriteDeadline(dl)
	if n, err := c.conn.Write(b); err != nil {
		if n == 0 && errors.Is(err, os.ErrDeadlineExceeded) {
			return fmt.Errorf("bootstrap: writing to the store at %s: %w", c.addr, err)
		}
		c.conn.Close()
		return fmt.Errorf("bootstrap: writing to the store at %s: %w (%w)", c.addr, err, ErrClosed)
	}
	return nil
}

// Set implements Store.
func (c *Client) Set(ctx context.Context, key string, value []byte) error {
	if err := checkKV(key, value); err != nil {
		return err
	}
	_, err := c.call(ctx, opSet, encodeSet(key, value))
	return err
}

// Get implements Store.
func (c *Client) Get(ctx context.Context, key string) ([]byte, error) {
	if err := checkKV(key, nil); err != nil {
		return nil, err
	}
	v, err := c.call(ctx, opGet, []byte(key))
	if err != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("bootstrap: waiting for key %q: %w", key, ctx.Err())
	}
	return v, err
}

// TryGet implements Store.
func (c *Client) TryGet(ctx context.Context, key string) ([]byte, bool, error) {
	if err := checkKV(key, nil); err != nil {
		return nil, false, err
	}
	v, err := c.call(ctx, opTryGet, []byte(key))
	if err != nil {
		return nil, false, err
	}
	if len(v) == 0 || v[0] > 1 {
		return nil, false, fmt.Errorf("bootstrap: store at %s answered try-get with a malformed reply", c.addr)
	}
	if v[0] == 0 {
		return nil, false, nil
	}
	return v[1:], true, nil
}

// Add implements Store.
func (c *Client) Add(ctx context.Context, key string, delta int64) (int64, error) {
	if err := checkKV(key, nil); err != nil {
		return 0, err
	}
	v, err := c.call(ctx, opAdd, binary.BigEndian.AppendUint64(nil, uint64(delta)), []byte(key))
	if err != nil {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("bootstrap: store at %s answered add with %d bytes", c.addr, len(v))
	}
	return int64(binary.BigEndian.Uint64(v)), nil
}

// Delete implements Store.
func (c *Client) Delete(ctx context.Context, key string) error {
	if err := checkKV(key, nil); err != nil {
		return err
	}
	_, err := c.call(ctx, opDel, []byte(key))
	return err
}

// KeepAlive makes the client ping the server every interval until it
// closes, so that a server with an IdleTimeout longer than interval can tell
// a live but quiet rank from a lost one. Call it at most once.
func (c *Client) KeepAlive(interval time.Duration) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-c.done:
				return
			case <-c.closing:
				return
			case <-t.C:
				// A ping that could not start within the interval (a
				// starved process) is skipped; a failed one ends the client.
				if err := c.send(time.Now().Add(interval), frame(opPing, 0)); errors.Is(err, ErrClosed) {
					return
				}
			}
		}
	}()
}

// Lost reports whether the connection ended without a goodbye from either
// side — the server's process died, or the network between failed — rather
// than by Close or the server's own Close. Meaningful once Done is closed.
func (c *Client) Lost() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lost
}

// Err returns why the connection ended (it wraps ErrClosed, or
// ErrJobFailed when the store failed the job's rendezvous), or nil while it
// lives. Safe for concurrent use.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Done is closed when the connection to the store ends (Close, or the store
// went away).
func (c *Client) Done() <-chan struct{} { return c.done }

// Close says goodbye to the store (so that the server does not report this
// rank lost), closes the connection and waits for the reader. Idempotent.
func (c *Client) Close() error {
	c.once.Do(func() {
		c.mu.Lock()
		alive := c.err == nil
		if alive {
			c.err = fmt.Errorf("bootstrap: rank %d's client of the store at %s: %w", c.rank, c.addr, ErrClosed)
		}
		c.mu.Unlock()
		close(c.closing)
		if alive {
			c.send(time.Now().Add(time.Second), frame(opBye, 0))
		}
		c.conn.Close()
	})
	c.wg.Wait()
	return nil
}
