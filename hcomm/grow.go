package hcomm

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/hcomm-dev/hcomm/internal/bootstrap"
)

// Growing a communicator (ncclCommGrow, NCCL 2.27+). New processes join a
// running communicator of m ranks; the result is a new communicator of m+n
// ranks in which the members keep their ranks 0..m-1 and the newcomers take
// m..m+n-1. The caller's duties, in order:
//
//  1. Rank 0 of the communicator calls GrowToken(n): it starts the grown
//     communicator's bootstrap store and returns a JoinToken.
//  2. The token reaches the other members and the newcomers (its String is
//     the form to send; it holds the store's secret, so send it only to
//     them). Under `hcomm run --elastic`, Membership.Admit hands it to the
//     newcomers the launcher started.
//  3. Every member calls Grow with the token, every newcomer JoinContext
//     with the token and its rank, within the token's lifetime (the
//     members' Config.ConnectTimeout from GrowToken). Each returns the new
//     communicator once all m+n ranks have joined.
//
// The old communicator is left as it was: the members destroy it when they
// no longer need it (after the grown one is made, or before, once nothing
// is pending on it). Nothing is carried over but the ranks: the grown
// communicator has its own HCCL buffer, channels and per-communicator state
// (Value), so the data a newcomer needs (weights, optimizer state) is the
// program's to send, a Broadcast on the grown communicator.

// JoinToken is what a process needs to join a grown communicator: the
// address of its bootstrap store and its secret (RootInfo), the member
// count m and the grown size m+n, and when the store stops waiting. It is a
// value: send String() and parse it back with ParseJoinToken. Strangers
// cannot forge one: the store admits only connections that prove the
// secret.
type JoinToken struct {
	Root    RootInfo
	Members int       // m: the ranks of the communicator that grows
	Size    int       // m+n: the ranks of the grown communicator
	Expires time.Time // after this the store has stopped; Grow and JoinContext refuse the token
}

const joinTokenScheme = "hcomm-join1://"

// String encodes t as
// "hcomm-join1://<32 hex digits of secret>@<host:port>/<m>/<m+n>/<expiry, Unix ms>".
// The string holds the secret.
func (t JoinToken) String() string {
	return joinTokenScheme + strings.TrimPrefix(t.Root.String(), rootInfoScheme) + "/" +
		strconv.Itoa(t.Members) + "/" + strconv.Itoa(t.Size) + "/" + strconv.FormatInt(t.Expires.UnixMilli(), 10)
}

// Newcomers returns the ranks the token has room for: m..m+n-1.
func (t JoinToken) Newcomers() (first, n int) { return t.Members, t.Size - t.Members }

// ParseJoinToken parses what JoinToken.String returns, as strictly as
// ParseRootInfo: the scheme, the secret and address, and three decimal
// numbers with 1 <= m < m+n <= MaxRanks.
func ParseJoinToken(s string) (JoinToken, error) {
	bad := func(why string, err error) (JoinToken, error) {
		q := s
		if len(q) > 100 {
			q = q[:100] + "…"
		}
		return JoinToken{}, noRankErr("ParseJoinToken", "", ErrPara, err, "join token %q: %s (want %s<secret>@host:port/<m>/<m+n>/<expiry>)", q, why, joinTokenScheme)
	}
	rest, ok := strings.CutPrefix(s, joinTokenScheme)
	if !ok {
		return bad("no "+joinTokenScheme+" prefix", nil)
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 4 {
		return bad("not four '/'-separated fields", nil)
	}
	root, err := ParseRootInfo(rootInfoScheme + parts[0])
	if err != nil {
		return bad("the store's address or secret is malformed", err)
	}
	num := func(f string) (int64, bool) {
		v, err := strconv.ParseInt(f, 10, 64)
		return v, err == nil && strconv.FormatInt(v, 10) == f
	}
	m, ok1 := num(parts[1])
	size, ok2 := num(parts[2])
	exp, ok3 := num(parts[3])
	if !ok1 || !ok2 || !ok3 {
		return bad("the sizes and the expiry are not decimal numbers", nil)
	}
	if m < 1 || size <= m || size > MaxRanks {
		return bad(fmt.Sprintf("sizes %d/%d: want 1 <= m < m+n <= %d", m, size, MaxRanks), nil)
	}
	return JoinToken{Root: root, Members: int(m), Size: int(size), Expires: time.UnixMilli(exp)}, nil
}

// GrowToken starts the bootstrap store of a communicator grown from c by n
// newcomers and returns its token (ncclCommGetUniqueId before
// ncclCommGrow). Call it on rank 0 of c only (the store lives in rank 0's
// process, which serves it until its grown communicator is destroyed).
// The store listens as GetRootInfo's does; it stops by itself when no Grow
// of rank 0 claimed it within c's ConnectTimeout, which is also the token's
// expiry. Safe for concurrent use. Errors: c not usable, a rank other than
// 0, n outside [1, MaxRanks-Size()], no interface to listen on.
func (c *Comm) GrowToken(n int) (JoinToken, error) {
	const op = "GrowToken"
	if err := c.usable(op); err != nil {
		return JoinToken{}, err
	}
	if c.rank != 0 {
		return JoinToken{}, c.errorf(op, -1, ErrPara, nil, "called on rank %d: rank 0 makes the token (it serves the grown communicator's store) and hands it to the others", c.rank)
	}
	if n < 1 || n > MaxRanks-c.size {
		return JoinToken{}, c.errorf(op, -1, ErrPara, nil, "newcomer count %d is outside [1, %d]", n, MaxRanks-c.size)
	}
	cfg := c.cfg
	start := time.Now()
	root, err := GetRootInfo(&cfg)
	if err != nil {
		e := err.(*Error)
		e.Op, e.Rank = op, c.rank
		return JoinToken{}, e
	}
	c.log(slog.LevelInfo, "grow token made", "newcomers", n, "store", root.Addr)
	return JoinToken{Root: root, Members: c.size, Size: c.size + n, Expires: start.Add(c.cfg.ConnectTimeout)}, nil
}

// Grow makes the communicator grown from c with tok (ncclCommGrow on an
// existing rank). Every rank of c calls it with the same token; the
// newcomers call JoinContext. This rank keeps its rank in the grown
// communicator. cfg may be nil: c's configuration. Grow blocks until every
// rank of the grown communicator has joined, bounded by ctx, the token's
// expiry and cfg's ConnectTimeout; on rank 0 it takes over the store
// GrowToken started in this process. c is not changed and stays usable.
//
// Errors: c not usable; a token for another member count (ErrPara); an
// expired token (ErrTimeout); rank 0 of c in a process that did not make
// the token; and InitRootInfo's (a context that ends: ErrUnavail or
// ErrTimeout matching ctx's error).
func (c *Comm) Grow(ctx context.Context, tok JoinToken, cfg *Config) (*Comm, error) {
	const op = "Grow"
	if err := c.usable(op); err != nil {
		return nil, err
	}
	if ctx == nil {
		return nil, c.errorf(op, -1, ErrPara, nil, "nil context")
	}
	if tok.Members != c.size || tok.Size <= c.size {
		return nil, c.errorf(op, -1, ErrPara, nil, "the token grows a communicator of %d ranks to %d; this one has %d", tok.Members, tok.Size, c.size)
	}
	if c.rank == 0 && !pendingRoot0(tok.Root.Secret) {
		return nil, c.errorf(op, -1, ErrPara, nil, "rank 0 has no store for this token: GrowToken was not called in this process, or its store has stopped (expired at %v)", tok.Expires.Format(time.RFC3339))
	}
	if cfg == nil {
		x := c.cfg
		cfg = &x
	}
	gc, err := joinToken(ctx, op, tok, c.rank, cfg)
	if err == nil {
		c.log(slog.LevelInfo, "grown", "size", gc.size)
	}
	return gc, err
}

// JoinContext joins a grown communicator as the newcomer of rank rank
// (ncclCommGrow on a new rank): rank must be one of the token's newcomer
// ranks (Newcomers), distinct among the newcomers. It blocks as Grow does,
// bounded by ctx, the token's expiry and cfg's ConnectTimeout; cfg may be
// nil (the environment's defaults, as InitRootInfo's). Errors: a rank that
// is not a newcomer's (ErrPara), an expired token (ErrTimeout), and
// InitRootInfo's.
func JoinContext(ctx context.Context, tok JoinToken, rank int, cfg *Config) (*Comm, error) {
	const op = "Join"
	if ctx == nil {
		return nil, &Error{Op: op, Rank: rank, Peer: -1, Code: ErrPara, Msg: "nil context"}
	}
	if first, n := tok.Newcomers(); rank < first || rank >= first+n {
		return nil, noRankErr(op, "", ErrPara, nil, "rank %d is not a newcomer's rank: the token has room for ranks [%d, %d)", rank, first, first+n)
	}
	return joinToken(ctx, op, tok, rank, cfg)
}

// pendingRoot0 says whether this process holds the unclaimed store of secret.
func pendingRoot0(secret [16]byte) bool {
	pendingMu.Lock()
	defer pendingMu.Unlock()
	_, ok := pendingRoots[secret]
	return ok
}

// joinToken joins rank of tok's communicator, bounded by tok's expiry too.
func joinToken(ctx context.Context, op string, tok JoinToken, rank int, cfg *Config) (*Comm, error) {
	c, err := resolveAll(cfg)
	if err != nil {
		return nil, &Error{Op: op, Comm: c.Name, Rank: rank, Peer: -1, Code: ErrPara, Err: err}
	}
	if _, err := ParseJoinToken(tok.String()); err != nil {
		return nil, &Error{Op: op, Comm: c.Name, Rank: rank, Peer: -1, Code: ErrPara, Err: err}
	}
	if !tok.Expires.After(time.Now()) {
		return nil, &Error{Op: op, Comm: c.Name, Rank: rank, Peer: -1, Code: ErrTimeout, Err: context.DeadlineExceeded,
			Msg: fmt.Sprintf("the join token expired at %v", tok.Expires.Format(time.RFC3339))}
	}
	ctx, cancel := context.WithDeadline(ctx, tok.Expires)
	defer cancel()
	return join(ctx, op, c, joinSpec{nRanks: tok.Size, rank: rank, localRank: -1, addr: tok.Root.Addr,
		listen: tok.Root.Addr, secret: bootstrap.Secret(tok.Root.Secret)})
}
