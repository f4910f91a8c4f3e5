//go:build linux

package shm

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/notify"
)

// HostID identifies the host, and the namespaces, this process runs in: the
// host name, the kernel's boot id (/proc/sys/kernel/random/boot_id) and the
// network and pid namespaces. Two processes can reach each other through
// this transport exactly when their HostIDs are equal: the abstract unix
// socket needs the same network namespace, the peer check the same pid
// namespace. hcomm compares HostIDs (carried by its bootstrap) before it
// picks shm for a channel; Connect checks them again. Safe for concurrent use.
func HostID() string { return hostID() }

var hostID = sync.OnceValue(func() string {
	name, _ := os.Hostname()
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		// Without a boot id, the pid of this process keeps the id unique:
		// nobody else will match it and shm is never chosen wrongly.
		boot = []byte(fmt.Sprintf("unknown-boot-pid-%d", os.Getpid()))
	}
	netns, _ := os.Readlink("/proc/self/ns/net")
	pidns, _ := os.Readlink("/proc/self/ns/pid")
	return fmt.Sprintf("%s boot %s %s %s", name, strings.TrimSpace(string(boot)), netns, pidns)
})

// Options configure a Dialer. The zero value is the default.
type Options struct {
	// Populate maps the peer's memory with its page tables filled in at
	// connect (MAP_POPULATE) instead of one page fault at the first touch of
	// each page: connect takes longer (about 15 ms per 256 MiB here), the
	// first pass over the peer's buffer does not. It also commits every
	// page of the peer's memory, which MallocLazy memory (the peer's HCCL
	// buffer) would otherwise commit only as it is touched.
	Populate bool
	// NoPeerReads makes this end's channels say at connect that they
	// cannot read the peer's memory through the kernel, so that no pair of
	// theirs does (Transport.ReadsPeer false on both ends) and what would
	// go that way is staged through the HCCL buffers.
	NoPeerReads bool
}

// Dialer makes shared-memory channels to ranks in other processes of this
// host. It holds no listener between connects: each Connect listens on a
// fresh socket of its own (when its rank is the lower of the two) until the
// peer has connected. Safe for concurrent use; the zero value is not usable,
// use NewDialer.
type Dialer struct {
	opts Options
	// tamper, when set (by tests only), edits this end's description before
	// it is sent: how the tests play a peer that lies.
	tamper func(mine []memEntry)

	mu     sync.Mutex
	closed bool
}

// NewDialer returns a Dialer. It fails where the system lacks what the
// transport needs (memfd, abstract unix sockets: Linux).
func NewDialer(opts Options) (*Dialer, error) {
	return &Dialer{opts: opts}, nil
}

// Name returns "shm".
func (d *Dialer) Name() string { return "shm" }

// Close makes later Connects fail with channel.ErrClosed. Channels already made are
// closed separately. Idempotent.
func (d *Dialer) Close() error {
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	return nil
}

// ctxConn applies ctx to c's I/O until the returned func is called: once
// ctx is done (deadline or cancel), blocked and later I/O fails at once. (Not
// c.SetDeadline(ctx's deadline): the I/O could then fail a moment before
// ctx.Err() says why.)
func ctxConn(ctx context.Context, c interface{ SetDeadline(time.Time) error }) func() {
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	return func() {
		stop()
		c.SetDeadline(time.Time{})
	}
}

// Connect sets up this end of the channel local describes, with the peer
// that calls Connect with the same Exchange. In order: it shares its memory
// (local.HCCLBuf, then every range of local.Registry, each as a memfd
// descriptor from device.Share) and makes a page for its notifies; trades a
// hello with the peer through ex (host id, pid, ranks, socket name, secret);
// the lower rank listens on a fresh abstract unix socket and the higher one
// dials it and proves the secret (the listener also checks the caller's pid);
// the ends send each other their memory and notify page descriptors
// (SCM_RIGHTS), check them, map them, and confirm. It returns when both ends
// are connected, or with an error when ctx ends first or either end refuses.
// Errors name both ranks and wrap ErrOtherHost, channel.ErrRefused, channel.ErrPeerLost or
// ctx's error.
func (d *Dialer) Connect(ctx context.Context, local *channel.Local, ex channel.Exchange) (*channel.Conn, error) {
	if ctx == nil || local == nil || ex == nil {
		return nil, errors.New("shm connect: nil context, local or exchange")
	}
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("shm connect rank %d -> rank %d: %w", local.Rank, local.Peer, channel.ErrClosed)
	}
	c := &connecting{d: d, local: local, name: local.Name}
	if c.name == "" {
		c.name = fmt.Sprintf("rank %d channel to rank %d", local.Rank, local.Peer)
	}
	conn, err := c.run(ctx, ex)
	if err != nil {
		c.cleanup()
		if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
			err = fmt.Errorf("%w (%w)", err, cerr)
		}
		return nil, err
	}
	return conn, nil
}

// connecting is the state of one Connect.
type connecting struct {
	d     *Dialer
	local *channel.Local
	name  string

	// mine is this end's description, mineFDs the descriptor of each entry
	// (-1 for none); prepErr why the description could not be made.
	mine    []memEntry
	mineFDs []int
	prepErr error
	t       *Transport // filled as the connect goes
	ln      *net.UnixListener
	sock    *net.UnixConn
}

func (c *connecting) errf(format string, args ...any) error {
	return fmt.Errorf("shm connect %s (rank %d -> rank %d): %w", c.name, c.local.Rank, c.local.Peer, fmt.Errorf(format, args...))
}

// closeMine closes the descriptors of this end's description.
func (c *connecting) closeMine() {
	for _, fd := range c.mineFDs {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	c.mineFDs = nil
	if c.t != nil {
		c.t.closeOwnFD()
	}
}

// cleanup releases what a failed connect holds.
func (c *connecting) cleanup() {
	c.closeMine()
	if c.ln != nil {
		c.ln.Close()
	}
	if c.sock != nil {
		c.sock.Close()
	}
	if c.t != nil {
		c.t.release(channel.ErrClosed)
	}
}

func (c *connecting) run(ctx context.Context, ex channel.Exchange) (*channel.Conn, error) {
	l := c.local
	if l.Rank == l.Peer || l.Rank < 0 || l.Peer < 0 {
		return nil, c.errf("ranks %d and %d cannot make a channel", l.Rank, l.Peer)
	}
	if l.NotifyNum < 0 || l.NotifyNum > maxNotifies {
		return nil, c.errf("notify count %d is outside [0, %d]", l.NotifyNum, maxNotifies)
	}
	c.t = &Transport{name: c.name, rank: l.Rank, peer: l.Peer, populate: c.d.opts.Populate, watchDone: make(chan struct{})}
	close(c.t.watchDone) // no watcher yet; replaced when one starts
	if err := c.t.makeNotifies(l.NotifyNum); err != nil {
		return nil, c.errf("notify page: %w", err)
	}
	c.prepare()
	if c.d.tamper != nil {
		c.d.tamper(c.mine)
	}

	me := &hello{HostID: HostID(), PID: int32(os.Getpid()), Rank: int32(l.Rank), Peer: int32(l.Peer), Listen: l.Rank < l.Peer}
	if me.Listen {
		if _, err := rand.Read(me.Secret[:]); err != nil {
			return nil, c.errf("secret: %w", err)
		}
		var rnd [12]byte
		rand.Read(rnd[:])
		me.Addr = fmt.Sprintf("hcomm-shm-%d-%s", os.Getpid(), hex.EncodeToString(rnd[:]))
		ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: "@" + me.Addr, Net: "unixpacket"})
		if err != nil {
			return nil, c.errf("listening on abstract socket %q: %w", me.Addr, err)
		}
		c.ln = ln
	}
	theirs, err := ex(ctx, me.encode())
	if err != nil {
		return nil, c.errf("exchange with rank %d: %w", l.Peer, err)
	}
	peer, err := decodeHello(theirs)
	if err != nil {
		return nil, c.errf("rank %d's hello: %w: %w", l.Peer, err, channel.ErrRefused)
	}
	switch {
	case peer.HostID != me.HostID:
		return nil, c.errf("rank %d runs on host %q, this rank on %q: %w", l.Peer, peer.HostID, me.HostID, ErrOtherHost)
	case int(peer.Rank) != l.Peer || int(peer.Peer) != l.Rank:
		return nil, c.errf("the hello came from rank %d for rank %d: %w", peer.Rank, peer.Peer, channel.ErrRefused)
	case peer.Listen == me.Listen:
		return nil, c.errf("both ends want to listen or both to dial: %w", channel.ErrRefused)
	}
	c.t.peerPID = int(peer.PID)
	if c.t.peerPID == os.Getpid() {
		// Both ends in this process: the recorder of this end's notifies
		// is one of its goroutines, so waits yield to them.
		for _, n := range c.t.notifies {
			n.SetLocal(true)
		}
	}

	if me.Listen {
		err = c.accept(ctx, me.Secret, int(peer.PID))
		c.ln.Close()
		c.ln = nil
	} else {
		err = c.dial(ctx, peer)
	}
	if err != nil {
		return nil, err
	}
	c.t.conn = c.sock

	undo := ctxConn(ctx, c.sock)
	err = c.trade(me.Listen)
	undo()
	if err != nil {
		return nil, err
	}
	c.closeMine()
	t := c.t
	c.t, c.sock = nil, nil // the transport owns them now
	conn := &channel.Conn{Transport: t, Notifies: append([]*notify.Notify(nil), t.notifies...),
		PeerNotifyNum: t.peerNotify, RemoteMems: t.remoteMems()}
	t.startWatch() // after remoteMems: a goodbye may come at once, and unmaps them
	return conn, nil
}

// prepare describes this end's memory: the HCCL buffer first, then every
// other registered range. A failure is kept in prepErr and sent to the peer
// as a refusal once the socket is up, so that both ends learn why.
func (c *connecting) prepare() {
	l := c.local
	mems := []channel.Mem{l.HCCLBuf}
	if l.Registry != nil {
		for _, m := range l.Registry.List() {
			if m.Addr != l.HCCLBuf.Addr || m.Size != l.HCCLBuf.Size {
				mems = append(mems, m)
			}
		}
	}
	if len(mems) > maxMems {
		c.prepErr = fmt.Errorf("%d registered ranges, at most %d can be shared", len(mems), maxMems)
		return
	}
	for i, m := range mems {
		if len(m.Tag) > 255 {
			m.Tag = m.Tag[:255]
		}
		e := memEntry{Addr: uint64(m.Addr), Size: uint64(m.Size), FD: noFD, Tag: m.Tag}
		fd := -1
		if m.Size < 0 {
			c.prepErr = fmt.Errorf("registered range %d [%#x, %+d) has a negative size", i, uintptr(m.Addr), m.Size)
			return
		}
		if m.Size > 0 {
			if l.Device == nil {
				c.prepErr = errors.New("no device to share memory from")
				return
			}
			f, off, err := l.Device.Share(m.Addr, m.Size)
			if err != nil {
				c.prepErr = fmt.Errorf("sharing registered range %d (%q): %w", i, m.Tag, err)
				return
			}
			fd, e.FD, e.Offset = f, 0, uint64(off)
		}
		c.mine = append(c.mine, e)
		c.mineFDs = append(c.mineFDs, fd)
	}
}

// accept waits for the peer's dial, refusing strangers: a connection must
// come from pid and prove secret.
func (c *connecting) accept(ctx context.Context, secret [secretLen]byte, pid int) error {
	undo := ctxConn(ctx, c.ln)
	defer undo()
	for {
		s, err := c.ln.AcceptUnix()
		if err != nil {
			return c.errf("waiting for rank %d (pid %d) to connect: %w", c.local.Peer, pid, err)
		}
		if err := c.checkCaller(ctx, s, secret, pid); err != nil {
			s.Close()
			if ctx.Err() != nil {
				return c.errf("rank %d (pid %d) did not prove itself: %w (%w)", c.local.Peer, pid, err, ctx.Err())
			}
			continue // a stranger: keep waiting for the peer
		}
		c.sock = s
		return nil
	}
}

func (c *connecting) checkCaller(ctx context.Context, s *net.UnixConn, secret [secretLen]byte, pid int) error {
	if cp, err := peerPID(s); err != nil || cp != pid {
		return fmt.Errorf("caller is pid %d (%v), want %d", cp, err, pid)
	}
	undo := ctxConn(ctx, s)
	defer undo()
	if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > 10*time.Second {
		s.SetReadDeadline(time.Now().Add(10 * time.Second))
	}
	m, err := recvMsg(s)
	if err != nil {
		return err
	}
	if m.Type != msgAuth || subtle.ConstantTimeCompare(m.Secret[:], secret[:]) != 1 {
		return errors.New("wrong secret")
	}
	return nil
}

func (c *connecting) dial(ctx context.Context, peer *hello) error {
	var nd net.Dialer
	conn, err := nd.DialContext(ctx, "unixpacket", "@"+peer.Addr)
	if err != nil {
		return c.errf("dialing rank %d (pid %d) at abstract socket %q: %w", c.local.Peer, peer.PID, peer.Addr, err)
	}
	s := conn.(*net.UnixConn)
	c.sock = s
	if cp, err := peerPID(s); err != nil || cp != int(peer.PID) {
		return c.errf("the socket rank %d named belongs to pid %d (%v), not to pid %d: %w", c.local.Peer, cp, err, peer.PID, channel.ErrRefused)
	}
	undo := ctxConn(ctx, s)
	defer undo()
	if err := sendMsg(s, &msg{Type: msgAuth, Secret: peer.Secret}, nil); err != nil {
		return c.errf("authenticating to rank %d: %w", c.local.Peer, err)
	}
	return nil
}

// peerPID returns the pid of the process at the other end of s.
func peerPID(s *net.UnixConn) (int, error) {
	rc, err := s.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, cerr
	}
	return int(cred.Pid), nil
}

// trade swaps descriptions over the connected socket, in turns so that
// neither end blocks on a full socket buffer:
//
//	listener: MEMS... DONE            (or REFUSE)
//	dialer:   MEMS... DONE  READY     (or REFUSE at any point)
//	listener: READY                   (or REFUSE)
func (c *connecting) trade(listener bool) error {
	if listener {
		if err := c.sendMine(); err != nil {
			return err
		}
		if err := c.recvTheirs(); err != nil {
			return err
		}
		theirs, err := c.recvVerdict()
		if err != nil {
			return err
		}
		mine := c.probeReads()
		c.t.setReads(mine, theirs)
		return c.send(&msg{Type: msgReady, Flags: mine}, nil)
	}
	if err := c.recvTheirs(); err != nil {
		return err
	}
	if err := c.sendMine(); err != nil {
		return err
	}
	mine := c.probeReads()
	if err := c.send(&msg{Type: msgReady, Flags: mine}, nil); err != nil {
		return err
	}
	theirs, err := c.recvVerdict()
	c.t.setReads(mine, theirs)
	return err
}

// probeCMA: whether probeReads tries process_vm_readv (a test turns it off
// on one end, as a ptrace policy would).
var probeCMA = true

// probeReads says how this end can read the peer's memory, as READY's
// flags: through the kernel (process_vm_readv of one word of the peer's
// HCCL buffer, whose description has been mapped: readyReads), and by
// opening the peer's descriptors (its /proc/<pid>/fd: readyFiles). Nothing
// with Options.NoPeerReads.
func (c *connecting) probeReads() uint8 {
	if c.d.opts.NoPeerReads || len(c.t.mems) == 0 || c.t.mems[0].mem.Size < 8 {
		return 0
	}
	var f uint8
	var w [8]byte
	if probeCMA {
		if n, err := readPeer(c.t.peerPID, w[:], uintptr(c.t.mems[0].mem.Addr)); err == nil && n == len(w) {
			f |= readyReads
		}
	}
	if fd, err := unix.Open(fmt.Sprintf("/proc/%d/fd", c.t.peerPID), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err == nil {
		unix.Close(fd)
		f |= readyFiles
	}
	return f
}

func (c *connecting) send(m *msg, fds []int) error {
	if err := sendMsg(c.sock, m, fds); err != nil {
		return c.errf("sending %v to rank %d: %w", m.Type, c.local.Peer, err)
	}
	return nil
}

// refuse tells the peer why this end gives up and returns the error for
// this end (wrapping reason and channel.ErrRefused). It then reads (and drops) what
// the peer had already sent until the peer, having read the refusal, closes
// its end: closing a socket with unread messages would reset the peer's
// connection before it reads why.
func (c *connecting) refuse(reason error) error {
	err := c.errf("%w: %w", reason, channel.ErrRefused)
	if sendMsg(c.sock, &msg{Type: msgRefuse, Text: reason.Error()}, nil) == nil {
		c.sock.CloseWrite()
		c.sock.SetReadDeadline(time.Now().Add(2 * time.Second))
		for {
			_, fds, rerr := recvMsgFDs(c.sock)
			closeFDs(fds)
			if rerr != nil {
				break
			}
		}
	}
	return err
}

func (c *connecting) sendMine() error {
	if c.prepErr != nil {
		return c.refuse(fmt.Errorf("rank %d cannot share its memory: %w", c.local.Rank, c.prepErr))
	}
	for i := 0; i < len(c.mine); i += memsPerMsg {
		batch := append([]memEntry(nil), c.mine[i:min(i+memsPerMsg, len(c.mine))]...)
		var fds []int
		for x := range batch {
			if fd := c.mineFDs[i+x]; fd >= 0 {
				batch[x].FD = uint16(len(fds)) // descriptor indices count within the message
				fds = append(fds, fd)
			}
		}
		if err := c.send(&msg{Type: msgMems, Mems: batch}, fds); err != nil {
			return err
		}
	}
	var fds []int
	if c.t.ownFD >= 0 {
		fds = []int{c.t.ownFD}
	}
	return c.send(&msg{Type: msgDone, Total: uint32(len(c.mine)), Notify: uint32(len(c.t.notifies))}, fds)
}

// recvTheirs reads the peer's description and maps it; on a bad one it
// refuses (telling the peer why) and fails.
func (c *connecting) recvTheirs() error {
	var ents []memEntry
	for {
		m, fds, err := recvMsgFDs(c.sock)
		if err != nil {
			return c.refuse(fmt.Errorf("reading rank %d's memory description: %w", c.local.Peer, err))
		}
		switch m.Type {
		case msgRefuse:
			return c.errf("rank %d refused this end: %s: %w", c.local.Peer, m.Text, channel.ErrRefused)
		case msgMems:
			if len(ents)+len(m.Mems) > maxMems {
				closeFDs(fds)
				return c.refuse(fmt.Errorf("rank %d describes more than %d ranges", c.local.Peer, maxMems))
			}
			for _, e := range m.Mems {
				if err := c.t.mapMem(e, fds, len(ents)); err != nil {
					closeFDs(fds)
					return c.refuse(fmt.Errorf("rank %d's range %d (%q, [%#x, +%d) at file offset %d): %w",
						c.local.Peer, len(ents), e.Tag, e.Addr, e.Size, e.Offset, err))
				}
				ents = append(ents, e)
			}
			closeFDs(fds)
		case msgDone:
			err := error(nil)
			switch {
			case int(m.Total) != len(ents):
				err = fmt.Errorf("DONE counts %d ranges, %d came", m.Total, len(ents))
			case len(ents) == 0:
				err = errors.New("no HCCL buffer described")
			default:
				if m.Notify > 0 {
					err = c.t.mapPeerNotifies(fds[0], int(m.Notify))
				}
			}
			closeFDs(fds)
			if err != nil {
				return c.refuse(fmt.Errorf("rank %d's description: %w", c.local.Peer, err))
			}
			c.t.peerNotify = int(m.Notify)
			return nil
		default:
			closeFDs(fds)
			return c.refuse(fmt.Errorf("rank %d sent %v during the description", c.local.Peer, m.Type))
		}
	}
}

// recvVerdict reads the peer's READY or REFUSE; a READY says how the peer
// can read this end's memory (probeReads).
func (c *connecting) recvVerdict() (flags uint8, err error) {
	m, fds, err := recvMsgFDs(c.sock)
	closeFDs(fds)
	switch {
	case err != nil:
		return 0, c.errf("waiting for rank %d to accept this end's description: %w", c.local.Peer, err)
	case m.Type == msgRefuse:
		return 0, c.errf("rank %d refused this end: %s: %w", c.local.Peer, m.Text, channel.ErrRefused)
	case m.Type != msgReady:
		return 0, c.refuse(fmt.Errorf("rank %d sent %v instead of READY", c.local.Peer, m.Type))
	}
	return m.Flags, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// sendMsg sends m with fds attached.
func sendMsg(s *net.UnixConn, m *msg, fds []int) error {
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	_, _, err := s.WriteMsgUnix(m.encode(), oob, nil)
	return err
}

// recvMsg reads a message that must carry no descriptors.
func recvMsg(s *net.UnixConn) (*msg, error) {
	m, fds, err := recvMsgFDs(s)
	if err != nil {
		return nil, err
	}
	if len(fds) > 0 {
		closeFDs(fds)
		return nil, fmt.Errorf("%v message came with %d descriptors", m.Type, len(fds))
	}
	return m, nil
}

// recvMsgFDs reads one message and the descriptors that came with it (which
// the caller closes). The descriptors arrive close-on-exec (the net package
// reads with MSG_CMSG_CLOEXEC).
func recvMsgFDs(s *net.UnixConn) (*msg, []int, error) {
	buf := make([]byte, maxMsg+1)
	oob := make([]byte, unix.CmsgSpace(4*(memsPerMsg+1)))
	n, oobn, flags, _, err := s.ReadMsgUnix(buf, oob)
	fds, perr := parseRights(oob[:oobn])
	if err != nil {
		closeFDs(fds)
		return nil, nil, err
	}
	if n == 0 {
		closeFDs(fds)
		return nil, nil, io.EOF
	}
	if perr != nil {
		closeFDs(fds)
		return nil, nil, perr
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		closeFDs(fds)
		return nil, nil, fmt.Errorf("message truncated (more than %d bytes or %d descriptors)", maxMsg, memsPerMsg+1)
	}
	m, err := decodeMsg(buf[:n], len(fds))
	if err != nil {
		closeFDs(fds)
		return nil, nil, err
	}
	return m, fds, nil
}

// parseRights returns every descriptor in a control message, so that none is
// leaked even when the message is refused.
func parseRights(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	cms, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("control message: %w", err)
	}
	var fds []int
	var bad error
	for _, cm := range cms {
		if cm.Header.Level != unix.SOL_SOCKET || cm.Header.Type != unix.SCM_RIGHTS {
			bad = fmt.Errorf("unexpected control message level %d type %d", cm.Header.Level, cm.Header.Type)
			continue
		}
		got, err := unix.ParseUnixRights(&cm)
		if err != nil {
			bad = err
			continue
		}
		fds = append(fds, got...)
	}
	return fds, bad
}
