package tcp

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/notify"
)

// Defaults of Options.
const (
	// DefaultStreams is the number of sockets per channel.
	DefaultStreams = 2
	// DefaultPeerTimeout is how long a silent peer goes unnoticed at most.
	DefaultPeerTimeout = 10 * time.Second
	// DefaultHandshakeTimeout bounds one socket's handshake.
	DefaultHandshakeTimeout = 10 * time.Second
	// DefaultChunkSize is the largest frame payload a sender makes.
	DefaultChunkSize = 1 << 20
	// DefaultSocketBuffer is the kernel buffer asked for each socket where
	// the kernel grants it whole (defaultBuffer).
	DefaultSocketBuffer = 4 << 20
	// DefaultSpin is how long a waiting caller polls the channel's sockets
	// before it sleeps (Options.Spin).
	DefaultSpin = 200 * time.Microsecond
)

// maxHandshakes bounds the accepted connections still proving the secret: a
// flood of idle connections must not hold a goroutine each.
const maxHandshakes = 1024

// Options configure a Dialer. The zero value is usable: every field has a
// default.
type Options struct {
	// Addr is where the listener binds: an IP ("10.0.0.5"), or IP:port. ""
	// binds all interfaces on a port the kernel picks.
	Addr string
	// Advertise, when set, replaces the listener addresses (host:port) the
	// Dialer tells its peers to dial, in the order they should be tried.
	// Default: the bound address, or every up interface's unicast address
	// (loopback last) when bound to all interfaces.
	Advertise []string
	// Streams is the number of sockets per channel (default 2, at most 64).
	// The two ends of a channel use the smaller of their two values.
	Streams int
	// Secret, when not nil, must be proven by every connection (HMAC-SHA256
	// challenge/response both ways); it is never sent. nil still runs the
	// handshake with an empty key.
	Secret []byte
	// Logger receives refused connections and channel failures (nil: none).
	Logger *slog.Logger
	// PeerTimeout bounds how long a silent peer goes unnoticed: each end
	// sends a heartbeat when idle, and a channel that hears nothing from its
	// peer for PeerTimeout (or whose send is stuck that long) fails. Default 10 s.
	PeerTimeout time.Duration
	// HandshakeTimeout bounds an accepted connection's handshake (default 10 s).
	HandshakeTimeout time.Duration
	// ChunkSize is the largest payload of one frame this end sends (default
	// 1 MiB, at most 16 MiB); larger operations are split into chunks that
	// travel on all the channel's sockets at once.
	ChunkSize int
	// SocketBuffer is the kernel send and receive buffer asked for each
	// socket (the kernel may cap it). Negative leaves the buffers to the
	// kernel's autotuning. Default: DefaultSocketBuffer where the kernel's
	// caps (net.core.rmem_max and wmem_max) grant it whole, else
	// autotuning — a buffer asked for is capped there and turns autotuning
	// off (see defaultBuffer).
	SocketBuffer int
	// Spin is how long a caller that waits for the peer — a notify wait
	// through Poll (channel.Poller), Read, ReadReduce, Fence — reads the
	// channel's sockets itself, without blocking, with no byte read, before
	// it sleeps and leaves them to the channel's background readers
	// (default DefaultSpin; negative: never, every wait sleeps at once): the
	// bound counts from the last read that brought bytes. A polling waiter
	// keeps its processor busy that long, yielding it between looks.
	Spin time.Duration
	// Yield makes a polling caller give its processor to the host's other
	// threads (sched_yield, on linux) between looks, not only to its own
	// process's goroutines: set it when the processes polling on the host
	// outnumber its processors, so that each of them reaches the processor
	// when its peer's bytes are in.
	Yield bool
	// Tight is how long, from its start, a poll with Yield looks without
	// yielding to the host's other threads (it still yields to its own
	// process's goroutines): set it when the host has a processor for each
	// polling process, so that a message coming within it is seen a read
	// after it arrives, not a read and a sched_yield after — a system call
	// each, so a look took twice as long (hcomm bench p2p over tcp, 2
	// processes on 2 cores, medians of interleaved launches: 10.52 µs a
	// round trip against 12.03, pingpong tcpspin 7.78; BENCHMARKS.md, stop
	// 38, has the rest). A poll
	// that lasts longer, or has read part of a message (the rest comes
	// through the kernel's work on this host, which needs the processor
	// too), yields from then on, so that a process that the host's other
	// jobs keep from its processor still reaches it. Zero: every look
	// yields (with Yield).
	Tight time.Duration
	// Nap makes a Read, ReadReduce or Fence whose poll gave up (Spin) sleep
	// in naps — 50 µs doubling to 10 ms, each followed by one look at the
	// sockets — instead of only until a background reader wakes it. The
	// readers are woken by Go's network poller, which runs when a
	// processor is idle or every 10 ms: in a process whose other
	// goroutines keep its processors busy (a rank bound to one core whose
	// caller computes or issues ahead) the sleeper would see its answer
	// milliseconds late. A nap that ends late (the processor went idle, so
	// the poller runs) ends the napping. Needs Spin > 0. hcomm sets it as
	// for its notify waits: where the host holds at most two of the
	// communicator's processes a processor.
	Nap bool
	// Congestion names the congestion control algorithm of the sockets
	// whose peer is on another host, as the host lists them in
	// net.ipv4.tcp_available_congestion_control ("cubic", "bbr", "reno",
	// ...; TCP_CONGESTION, linux only). "" leaves the host's default
	// (net.ipv4.tcp_congestion_control). NewDialer refuses a name this
	// process may not give a socket — one the kernel lacks, or, without
	// CAP_NET_ADMIN, one missing from net.ipv4.tcp_allowed_congestion_control.
	Congestion string
	// LocalCongestion is Congestion for the sockets whose peer is on this
	// host (its address is a loopback address or the socket's own); ""
	// leaves the host's default. A pacing algorithm such as bbr releases
	// a socket's segments on a timer even where there is no link to
	// spare, and how fast it lets them go is its estimate of a link that
	// loopback does not have, made anew for each connection. hcomm's
	// Config.TCPCongestion chooses this for its communicators (its README
	// and BENCHMARKS.md, stop 51, have what bbr cost there).
	LocalCongestion string
}

// Dialer makes tcp channels (channel.Dialer). It owns one listener shared by
// all its channels. Safe for concurrent use; Close stops the listener and
// waits for its goroutines, but leaves the channels it made open.
type Dialer struct {
	opts Options
	log  *slog.Logger
	ln   net.Listener
	adv  []string

	mu       sync.Mutex
	closed   bool
	pending  map[[nonceLen]byte]*accepting
	inflight map[net.Conn]struct{} // accepted, handshake running
	done     chan struct{}
	wg       sync.WaitGroup
}

// accepting is a channel whose acceptor end waits for its sockets.
type accepting struct {
	peer    int
	streams int // as the first socket announced it; 0 until then
	socks   []net.Conn
	got     int
	ready   chan struct{} // closed when every socket arrived
	taken   bool          // the sockets belong to a channel now
}

// NewDialer opens the listener described by opts and starts accepting.
func NewDialer(opts Options) (*Dialer, error) {
	if opts.Streams == 0 {
		opts.Streams = DefaultStreams
	}
	if opts.Streams < 1 || opts.Streams > maxStreams {
		return nil, fmt.Errorf("tcp: Streams %d is outside 1..%d", opts.Streams, maxStreams)
	}
	if opts.PeerTimeout <= 0 {
		opts.PeerTimeout = DefaultPeerTimeout
	}
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if opts.ChunkSize <= 0 {
		opts.ChunkSize = DefaultChunkSize
	}
	if opts.Spin == 0 {
		opts.Spin = DefaultSpin
	}
	if opts.ChunkSize > maxPayload {
		return nil, fmt.Errorf("tcp: ChunkSize %d exceeds %d", opts.ChunkSize, maxPayload)
	}
	opts.ChunkSize = (opts.ChunkSize + 7) &^ 7 // whole elements of every data type
	if opts.SocketBuffer == 0 {
		opts.SocketBuffer = defaultBuffer(readCap("/proc/sys/net/core/rmem_max"), readCap("/proc/sys/net/core/wmem_max"))
	}
	for _, cc := range []string{opts.Congestion, opts.LocalCongestion} {
		if cc == "" {
			continue
		}
		if err := CheckCongestion(cc); err != nil {
			return nil, fmt.Errorf("tcp: congestion control %q: %w", cc, err)
		}
	}
	if len(opts.Advertise) > maxAddrs {
		return nil, fmt.Errorf("tcp: %d Advertise addresses, at most %d", len(opts.Advertise), maxAddrs)
	}
	for _, a := range opts.Advertise {
		if _, _, err := net.SplitHostPort(a); err != nil || len(a) > maxAddrLen {
			return nil, fmt.Errorf("tcp: Advertise address %q is not host:port of at most %d bytes", a, maxAddrLen)
		}
	}
	addr := opts.Addr
	if addr == "" {
		addr = ":0"
	} else if _, _, err := net.SplitHostPort(addr); err != nil {
		addr = net.JoinHostPort(addr, "0")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("tcp: listen on %q: %w", addr, err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	d := &Dialer{opts: opts, log: log, ln: ln, pending: make(map[[nonceLen]byte]*accepting),
		inflight: make(map[net.Conn]struct{}), done: make(chan struct{})}
	d.adv = opts.Advertise
	if len(d.adv) == 0 {
		d.adv = advertise(ln.Addr().(*net.TCPAddr))
	}
	d.wg.Add(1)
	go d.acceptLoop()
	return d, nil
}

// advertise lists the addresses a peer may dial to reach a listener bound at a.
func advertise(a *net.TCPAddr) []string {
	port := strconv.Itoa(a.Port)
	if !a.IP.IsUnspecified() {
		return []string{net.JoinHostPort(a.IP.String(), port)}
	}
	var out, loop []string
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, ia := range addrs {
			ipn, ok := ia.(*net.IPNet)
			if !ok {
				continue
			}
			switch ip := ipn.IP; {
			case ip.IsLoopback():
				loop = append(loop, net.JoinHostPort(ip.String(), port))
			case ip.IsGlobalUnicast():
				out = append(out, net.JoinHostPort(ip.String(), port))
			}
		}
	}
	out = append(out, loop...)
	if len(out) == 0 {
		out = []string{net.JoinHostPort("127.0.0.1", port)}
	}
	if len(out) > maxAddrs {
		out = out[:maxAddrs]
	}
	return out
}

// Name returns "tcp".
func (d *Dialer) Name() string { return "tcp" }

// Addr returns the listener's address.
func (d *Dialer) Addr() net.Addr { return d.ln.Addr() }

// Close stops the listener, refuses the handshakes in progress, fails the
// Connects still waiting for sockets, and waits for the Dialer's goroutines.
// Channels already made stay open. Idempotent.
func (d *Dialer) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	close(d.done)
	for c := range d.inflight {
		c.Close()
	}
	d.mu.Unlock()
	err := d.ln.Close()
	d.wg.Wait()
	return err
}

func (d *Dialer) acceptLoop() {
	defer d.wg.Done()
	for {
		c, err := d.ln.Accept()
		if err != nil {
			select {
			case <-d.done:
				return
			default:
			}
			d.log.Warn("tcp: accept failed", "listener", d.ln.Addr().String(), "err", err)
			select {
			case <-d.done:
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		d.mu.Lock()
		if d.closed {
			d.mu.Unlock()
			c.Close()
			return
		}
		if len(d.inflight) >= maxHandshakes {
			d.mu.Unlock()
			d.log.Warn("tcp: refused connection: too many handshakes in progress", "listener", d.ln.Addr().String(), "remote", c.RemoteAddr().String(), "limit", maxHandshakes)
			c.Close()
			continue
		}
		d.inflight[c] = struct{}{}
		d.wg.Add(1)
		d.mu.Unlock()
		go d.handshake(c)
	}
}

// handshake runs the acceptor's side of the socket handshake and hands the
// socket to the Connect waiting for it, or refuses it.
func (d *Dialer) handshake(c net.Conn) {
	defer d.wg.Done()
	err := d.acceptSocket(c)
	d.mu.Lock()
	delete(d.inflight, c)
	d.mu.Unlock()
	if err != nil {
		d.log.Warn("tcp: refused connection", "listener", d.ln.Addr().String(), "remote", c.RemoteAddr().String(), "err", err)
		c.Close()
	}
}

func (d *Dialer) acceptSocket(c net.Conn) error {
	c.SetDeadline(time.Now().Add(d.opts.HandshakeTimeout))
	ch := make([]byte, challengeSize)
	copy(ch, helloMagic)
	ch[len(helloMagic)] = protoVersion
	rand.Read(ch[len(helloMagic)+1:])
	if _, err := c.Write(ch); err != nil {
		return fmt.Errorf("sending challenge: %w", err)
	}
	buf := make([]byte, proofSize)
	if _, err := io.ReadFull(c, buf); err != nil {
		return fmt.Errorf("reading proof: %w", err)
	}
	p, err := parseProof(buf)
	if err != nil {
		return err
	}
	if !hmac.Equal(p.mac[:], dialMAC(d.opts.Secret, ch[len(helloMagic)+1:], p)) {
		c.Write([]byte{1})
		return fmt.Errorf("rank %d's proof of the secret is wrong (socket %d)", p.rank, p.index)
	}
	if p.streams < 1 || p.streams > maxStreams || p.index >= p.streams {
		c.Write([]byte{1})
		return fmt.Errorf("rank %d announces socket %d of %d", p.rank, p.index, p.streams)
	}
	// Claim the slot before answering, so that a dialer told "yes" is in.
	d.mu.Lock()
	a := d.pending[p.nonce]
	switch {
	case a == nil:
		err = fmt.Errorf("rank %d dials a channel this rank does not expect (socket %d)", p.rank, p.index)
	case a.peer != p.rank:
		err = fmt.Errorf("rank %d dials the channel that waits for rank %d", p.rank, a.peer)
	case a.streams != 0 && a.streams != p.streams:
		err = fmt.Errorf("rank %d announces %d sockets, earlier %d", p.rank, p.streams, a.streams)
	case a.streams != 0 && a.socks[p.index] != nil:
		err = fmt.Errorf("rank %d sends socket %d twice", p.rank, p.index)
	}
	if err != nil {
		d.mu.Unlock()
		c.Write([]byte{1})
		return err
	}
	if a.streams == 0 {
		a.streams = p.streams
		a.socks = make([]net.Conn, p.streams)
	}
	a.socks[p.index] = c
	d.mu.Unlock()
	v := append([]byte{0}, acceptMAC(d.opts.Secret, p)...)
	_, err = c.Write(v)
	c.SetDeadline(time.Time{})
	d.mu.Lock()
	if err != nil {
		if a.socks[p.index] == c {
			a.socks[p.index] = nil
		}
		d.mu.Unlock()
		return fmt.Errorf("answering rank %d: %w", p.rank, err)
	}
	a.got++
	if a.got == a.streams {
		close(a.ready)
	}
	d.mu.Unlock()
	return nil
}

// Connect sets up this end of the channel described by local (see
// channel.Dialer). The lower rank dials the sockets, the higher accepts them.
// Safe for concurrent use: many channels may connect at once.
func (d *Dialer) Connect(ctx context.Context, local *channel.Local, ex channel.Exchange) (*channel.Conn, error) {
	if ctx == nil || local == nil {
		return nil, &Error{Op: "Connect", Rank: -1, Peer: -1, Msg: "nil context or local end"}
	}
	fail := func(err error, format string, args ...any) (*channel.Conn, error) {
		return nil, &Error{Op: "Connect", Rank: local.Rank, Peer: local.Peer, Msg: fmt.Sprintf(format, args...), Err: err}
	}
	if local.Rank == local.Peer {
		return fail(nil, "a channel to itself is not a tcp channel")
	}
	if local.Device == nil || local.Registry == nil {
		return fail(nil, "local end has no device or no registry")
	}
	if local.NotifyNum < 0 {
		return fail(nil, "NotifyNum %d is negative", local.NotifyNum)
	}
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return fail(channel.ErrClosed, "dialer is closed")
	}
	if ex == nil {
		return fail(nil, "nil exchange")
	}
	me := &hello{rank: local.Rank, streams: d.opts.Streams, notifyNum: local.NotifyNum, addrs: d.adv}
	rand.Read(me.nonce[:])
	me.mems = []channel.Mem{local.HCCLBuf}
	for _, m := range local.Registry.List() {
		if m.Addr != local.HCCLBuf.Addr {
			me.mems = append(me.mems, m)
		}
	}
	if len(me.mems) > maxMems {
		return fail(nil, "%d registered memory ranges, more than the %d a hello carries", len(me.mems), maxMems)
	}
	for i := range me.mems {
		if len(me.mems[i].Tag) > maxTagLen {
			me.mems[i].Tag = me.mems[i].Tag[:maxTagLen]
		}
	}
	dialing := local.Rank < local.Peer
	var a *accepting
	if !dialing {
		a = &accepting{peer: local.Peer, ready: make(chan struct{})}
		d.mu.Lock()
		d.pending[me.nonce] = a
		d.mu.Unlock()
		defer func() { // the sockets go to the channel, or are closed
			d.mu.Lock()
			delete(d.pending, me.nonce)
			if !a.taken {
				for _, c := range a.socks {
					if c != nil {
						c.Close()
					}
				}
			}
			d.mu.Unlock()
		}()
	}
	theirsB, err := ex(ctx, me.marshal())
	if err != nil {
		return fail(err, "exchange with rank %d", local.Peer)
	}
	peer, err := parseHello(theirsB)
	if err != nil {
		return fail(channel.ErrRefused, "rank %d's hello: %v", local.Peer, err)
	}
	if peer.rank != local.Peer {
		return fail(channel.ErrRefused, "the hello comes from rank %d, not from rank %d", peer.rank, local.Peer)
	}
	streams := min(d.opts.Streams, peer.streams)
	var socks []net.Conn
	if dialing {
		socks, err = d.dialAll(ctx, local, peer, streams)
		if err != nil {
			return fail(err, "dialing rank %d at %v", local.Peer, peer.addrs)
		}
	} else {
		socks, err = d.acceptAll(ctx, a, me.nonce, streams)
		if err != nil {
			return fail(err, "waiting for rank %d to dial %d sockets", local.Peer, streams)
		}
	}
	for _, s := range socks {
		if err := tune(s, d.opts); err != nil {
			for _, s := range socks {
				s.Close()
			}
			return fail(err, "socket to rank %d", local.Peer)
		}
	}
	notifies := make([]*notify.Notify, local.NotifyNum)
	name := local.Name
	if name == "" {
		name = fmt.Sprintf("rank %d tcp channel to rank %d", local.Rank, local.Peer)
	}
	for i := range notifies {
		notifies[i] = notify.New(fmt.Sprintf("%s notify %d", name, i))
		// Records arrive through the network poller: a wait sleeps at
		// once rather than spin (see notify.SetSpin). Measured: 64 MiB
		// all-reduce, 2 processes, 1.9 → 2.3 GB/s median of five.
		notifies[i].SetSpin(0)
	}
	t := newConn(d, local, name, notifies, peer.notifyNum, socks)
	return &channel.Conn{Transport: t, Notifies: notifies, PeerNotifyNum: peer.notifyNum, RemoteMems: peer.mems}, nil
}

// defaultBuffer is the socket buffer a Dialer asks for by default, given
// the kernel's caps on what a socket may ask for (net.core.rmem_max and
// wmem_max; 0 when unknown): DefaultSocketBuffer where both grant it whole,
// else -1, autotuning. A buffer asked for beyond a cap is cut to twice the
// cap (the stock 212992 gives 416 KiB) and stops the kernel growing it, and
// 1 MiB pieces then wait for room: with the stock caps, over tcp loopback
// (stop 31, µs, asked 4 MiB against autotuning, medians of three to five
// launches): 2 processes 1 MiB broadcast 345 against 319 (130–136 in two
// launches of five), all-reduce 508 against 454; 4 processes 1 MiB
// broadcast 741 against 485, 64 MiB all-reduce 104 against 81 ms — but the
// 4-process 1 MiB all-gather 384 against 513. With caps of 4 MiB (this
// project's VM), the 4 MiB asked for beats autotuning: 2 processes 1 MiB
// broadcast 131 against 311, 64 MiB all-reduce 23.7 against 26.1 ms, 4
// processes 1 MiB all-gather 380 against 463.
func defaultBuffer(rmemMax, wmemMax int) int {
	if rmemMax >= DefaultSocketBuffer && wmemMax >= DefaultSocketBuffer {
		return DefaultSocketBuffer
	}
	return -1
}

// readCap reads a number from a /proc/sys file; 0 when it cannot.
func readCap(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// tune sets a channel's socket up: no Nagle delay, the buffers, keepalives
// and the congestion control Options give it.
func tune(c net.Conn, o Options) error {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil
	}
	tc.SetNoDelay(true)
	if o.SocketBuffer > 0 {
		tc.SetReadBuffer(o.SocketBuffer)
		tc.SetWriteBuffer(o.SocketBuffer)
	}
	idle := max(o.PeerTimeout/2, time.Second)
	tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: idle, Interval: idle / 3, Count: 3})
	cc := o.Congestion
	if sameHost(tc) {
		cc = o.LocalCongestion
	}
	if cc == "" {
		return nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = setCongestion(int(fd), cc) }); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("congestion control %q: %w", cc, serr)
	}
	return nil
}

// sameHost says whether c's peer is on this host: its address is a
// loopback address or c's own.
func sameHost(c net.Conn) bool {
	l, ok := c.LocalAddr().(*net.TCPAddr)
	r, ok2 := c.RemoteAddr().(*net.TCPAddr)
	return ok && ok2 && (r.IP.IsLoopback() || r.IP.Equal(l.IP))
}

// acceptAll waits until the peer dialed every socket of the channel.
func (d *Dialer) acceptAll(ctx context.Context, a *accepting, nonce [nonceLen]byte, streams int) ([]net.Conn, error) {
	select {
	case <-a.ready:
	case <-ctx.Done():
		return nil, ctx.Err() // Connect's cleanup closes what arrived
	case <-d.done:
		return nil, channel.ErrClosed
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.pending, nonce)
	if len(a.socks) != streams {
		return nil, fmt.Errorf("%w: the peer dialed %d sockets, the hellos agreed on %d", channel.ErrRefused, len(a.socks), streams)
	}
	a.taken = true
	return a.socks, nil
}

// dialAll dials the channel's sockets and proves the secret on each.
func (d *Dialer) dialAll(ctx context.Context, local *channel.Local, peer *hello, streams int) ([]net.Conn, error) {
	socks := make([]net.Conn, 0, streams)
	closeAll := func() {
		for _, c := range socks {
			c.Close()
		}
	}
	addrs := peer.addrs
	for i := 0; i < streams; i++ {
		var lastErr error
		var c net.Conn
		for j, a := range addrs {
			c, lastErr = d.dialOne(ctx, a, local.Rank, peer.nonce, i, streams)
			if lastErr == nil {
				if j > 0 { // the rest of the sockets go where this one went
					addrs = []string{a}
				}
				break
			}
			if ctx.Err() != nil || errors.Is(lastErr, channel.ErrRefused) {
				break
			}
		}
		if lastErr != nil {
			closeAll()
			return nil, lastErr
		}
		socks = append(socks, c)
	}
	return socks, nil
}

func (d *Dialer) dialOne(ctx context.Context, addr string, rank int, nonce [nonceLen]byte, index, streams int) (net.Conn, error) {
	var nd net.Dialer
	dctx, cancel := context.WithTimeout(ctx, d.opts.HandshakeTimeout)
	defer cancel()
	c, err := nd.DialContext(dctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(dctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	if err := d.proveSocket(c, rank, nonce, index, streams); err != nil {
		c.Close()
		return nil, fmt.Errorf("socket %d to %s: %w", index, addr, err)
	}
	if !stop() { // the deadline fired: the socket may be unusable
		c.Close()
		return nil, fmt.Errorf("socket %d to %s: %w", index, addr, dctx.Err())
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

func (d *Dialer) proveSocket(c net.Conn, rank int, nonce [nonceLen]byte, index, streams int) error {
	ch := make([]byte, challengeSize)
	if _, err := io.ReadFull(c, ch); err != nil {
		return fmt.Errorf("reading the challenge: %w", err)
	}
	if string(ch[:len(helloMagic)]) != helloMagic || ch[len(helloMagic)] != protoVersion {
		return fmt.Errorf("%w: the listener is not an hcomm tcp transport of version %d", channel.ErrRefused, protoVersion)
	}
	p := &proof{nonce: nonce, index: index, streams: streams, rank: rank}
	rand.Read(p.challenge[:])
	copy(p.mac[:], dialMAC(d.opts.Secret, ch[len(helloMagic)+1:], p))
	if _, err := c.Write(p.marshal()); err != nil {
		return fmt.Errorf("sending the proof: %w", err)
	}
	v := make([]byte, verdictSize)
	if _, err := io.ReadFull(c, v[:1]); err != nil {
		return fmt.Errorf("reading the verdict: %w", err)
	}
	if v[0] != 0 {
		return fmt.Errorf("%w: the peer refused the socket (wrong secret, or a channel it does not expect)", channel.ErrRefused)
	}
	if _, err := io.ReadFull(c, v[1:]); err != nil {
		return fmt.Errorf("reading the verdict: %w", err)
	}
	if !hmac.Equal(v[1:], acceptMAC(d.opts.Secret, p)) {
		return fmt.Errorf("%w: the listener does not know the secret", channel.ErrRefused)
	}
	return nil
}
