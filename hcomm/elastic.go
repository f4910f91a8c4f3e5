package hcomm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/hcomm-dev/hcomm/internal/bootstrap"
	"github.com/hcomm-dev/hcomm/internal/elastic"
)

// ErrJobEnded is wrapped by Membership.AwaitToken's error when the elastic
// job ended (its rank 0 called End, or every member has exited) before this
// newcomer was admitted: the newcomer has nothing to join and may exit
// successfully.
var ErrJobEnded = errors.New("the elastic job ended before this newcomer was admitted")

// Membership is a process's side of the membership store that
// `hcomm run --elastic` serves: how the ranks of a running job learn that
// replacements are waiting, and how a replacement gets its join token. The
// protocol (the launch package's doc has it whole):
//
//  1. The launcher starts n processes as usual (InitFromEnv) and replaces a
//     process that dies, up to --max-restarts times, with one that has
//     HCOMM_ELASTIC_JOIN=1: Newcomer reports it. The newcomer calls
//     AwaitToken, which registers it and waits.
//  2. Between steps, rank 0 of the job asks Pending, and tells the other
//     ranks the count (a Broadcast: the members must agree). When it is
//     positive, rank 0 makes a token (GrowToken), every member calls Grow,
//     and rank 0 calls Admit, which hands the newcomers the token and their
//     ranks, in the order they registered; each then calls JoinContext.
//  3. At the end, rank 0 calls End: a newcomer still waiting learns the job
//     is over (ErrJobEnded).
//
// Nothing but rank 0 reads or writes the counters, so the members need no
// agreement beyond step 2's broadcast; the counters live in the store, so
// the rank 0 of a shrunk communicator carries on where the lost one stopped.
// Methods are safe for concurrent use; Close ends the calls in progress.
type Membership struct {
	cli      *bootstrap.Client
	slot     int
	newcomer bool
}

// ElasticFromEnv connects to the membership store of `hcomm run --elastic`
// (HCOMM_ELASTIC_ADDR, HCOMM_ELASTIC_SLOT, HCOMM_ELASTIC_SLOTS,
// HCOMM_SECRET). It returns nil, nil when the process was not started so
// (HCOMM_ELASTIC_ADDR unset). Bounded by ctx; errors name the variable
// that is wrong, or the store that could not be reached.
func ElasticFromEnv(ctx context.Context) (*Membership, error) {
	const op = "ElasticFromEnv"
	if ctx == nil {
		return nil, noRankErr(op, "", ErrPara, nil, "nil context")
	}
	addr := os.Getenv(elastic.EnvAddr)
	if addr == "" {
		return nil, nil
	}
	num := func(name string) (int, error) {
		v, err := strconv.Atoi(os.Getenv(name))
		if err != nil || v < 0 {
			return 0, noRankErr(op, "", ErrPara, nil, "%s=%q is not a non-negative integer", name, os.Getenv(name))
		}
		return v, nil
	}
	slot, err := num(elastic.EnvSlot)
	if err != nil {
		return nil, err
	}
	slots, err := num(elastic.EnvSlots)
	if err != nil {
		return nil, err
	}
	if slot >= slots {
		return nil, noRankErr(op, "", ErrPara, nil, "%s=%d is not below %s=%d", elastic.EnvSlot, slot, elastic.EnvSlots, slots)
	}
	sec := os.Getenv("HCOMM_SECRET")
	if sec == "" {
		return nil, noRankErr(op, "", ErrPara, nil, "HCOMM_SECRET is not set: the membership store's secret derives from it")
	}
	cli, err := bootstrap.Dial(ctx, addr, elastic.Secret(sec), bootstrap.Claim{Rank: slot, NRanks: slots})
	if err != nil {
		code, err := ended(ctx, ErrTCPConnect, err)
		return nil, noRankErr(op, "", code, err, "reaching the launcher's membership store at %s", addr)
	}
	return &Membership{cli: cli, slot: slot, newcomer: os.Getenv(elastic.EnvJoin) == "1"}, nil
}

// Newcomer reports whether the launcher started this process as a
// replacement: it joins the running job with AwaitToken and JoinContext
// instead of InitFromEnv.
func (m *Membership) Newcomer() bool { return m.newcomer }

// Slot returns the process's slot: a number the launcher gives each process
// it starts, unique over the job's life (ranks change as the job shrinks
// and grows; slots do not).
func (m *Membership) Slot() int { return m.slot }

// err is the error of op that the store's call failed with.
func (m *Membership) err(ctx context.Context, op string, err error, format string, args ...any) error {
	code, err := ended(ctx, ErrTCPConnect, err)
	return noRankErr("Membership."+op, "", code, err, format, args...)
}

// Pending returns how many newcomers wait to be admitted. Rank 0 of the job
// calls it between steps and shares the answer with the members.
func (m *Membership) Pending(ctx context.Context) (int, error) {
	if ctx == nil {
		return 0, noRankErr("Membership.Pending", "", ErrPara, nil, "nil context")
	}
	joins, err := m.cli.Add(ctx, elastic.KeyJoins, 0)
	if err != nil {
		return 0, m.err(ctx, "Pending", err, "")
	}
	adm, err := m.cli.Add(ctx, elastic.KeyAdmitted, 0)
	if err != nil {
		return 0, m.err(ctx, "Pending", err, "")
	}
	return int(joins - adm), nil
}

// Admit hands tok to the first n waiting newcomers, n being the token's
// newcomer count (GrowToken's argument, which Pending gave): newcomer i, in
// the order they registered, gets rank tok.Members+i. Rank 0 calls it once
// it has made tok, before or while the members call Grow (the newcomers
// must join for Grow to return). Errors: fewer newcomers registered than
// the token has room for (ErrPara), or the store's.
func (m *Membership) Admit(ctx context.Context, tok JoinToken) error {
	if ctx == nil {
		return noRankErr("Membership.Admit", "", ErrPara, nil, "nil context")
	}
	joins, err := m.cli.Add(ctx, elastic.KeyJoins, 0)
	if err != nil {
		return m.err(ctx, "Admit", err, "")
	}
	adm, err := m.cli.Add(ctx, elastic.KeyAdmitted, 0)
	if err != nil {
		return m.err(ctx, "Admit", err, "")
	}
	first, n := tok.Newcomers()
	if int64(n) > joins-adm {
		return noRankErr("Membership.Admit", "", ErrPara, nil, "the token has room for %d newcomers; %d wait", n, joins-adm)
	}
	for i := range n {
		seq := adm + 1 + int64(i)
		b, err := m.cli.Get(ctx, elastic.JoinKey(seq))
		if err != nil {
			return m.err(ctx, "Admit", err, "reading newcomer %d's slot", seq)
		}
		slot, err := strconv.Atoi(string(b))
		if err != nil {
			return noRankErr("Membership.Admit", "", ErrInternal, nil, "newcomer %d's slot %q is malformed", seq, b)
		}
		if err := m.cli.Set(ctx, elastic.MemberKey(slot), []byte("1")); err != nil {
			return m.err(ctx, "Admit", err, "")
		}
		if err := m.cli.Set(ctx, elastic.TokenKey(seq), []byte(strconv.Itoa(first+i)+" "+tok.String())); err != nil {
			return m.err(ctx, "Admit", err, "")
		}
	}
	if _, err := m.cli.Add(ctx, elastic.KeyAdmitted, int64(n)); err != nil {
		return m.err(ctx, "Admit", err, "")
	}
	return nil
}

// AwaitToken registers this newcomer and waits, bounded by ctx, until rank
// 0 admits it: it returns the token and the rank to pass to JoinContext.
// When the job ends first it returns an error wrapping ErrJobEnded. Call it
// once.
func (m *Membership) AwaitToken(ctx context.Context) (JoinToken, int, error) {
	const op = "AwaitToken"
	if ctx == nil {
		return JoinToken{}, -1, noRankErr("Membership."+op, "", ErrPara, nil, "nil context")
	}
	seq, err := m.cli.Add(ctx, elastic.KeyJoins, 1)
	if err != nil {
		return JoinToken{}, -1, m.err(ctx, op, err, "")
	}
	if err := m.cli.Set(ctx, elastic.JoinKey(seq), []byte(strconv.Itoa(m.slot))); err != nil {
		return JoinToken{}, -1, m.err(ctx, op, err, "")
	}
	// End sets KeyEnded before it reads the count of newcomers: one that
	// registered after that read sees KeyEnded here.
	if _, ok, err := m.cli.TryGet(ctx, elastic.KeyEnded); err == nil && ok {
		return JoinToken{}, -1, noRankErr("Membership."+op, "", ErrUnavail, ErrJobEnded, "")
	}
	b, err := m.cli.Get(ctx, elastic.TokenKey(seq))
	if err != nil {
		if ctx.Err() == nil && (m.cli.Lost() || errors.Is(err, bootstrap.ErrClosed)) {
			err = fmt.Errorf("%w (the launcher closed its store: %v)", ErrJobEnded, err)
		}
		code, err := ended(ctx, ErrUnavail, err)
		return JoinToken{}, -1, noRankErr("Membership."+op, "", code, err, "")
	}
	if string(b) == elastic.Ended {
		return JoinToken{}, -1, noRankErr("Membership."+op, "", ErrUnavail, ErrJobEnded, "")
	}
	rs, ts, _ := strings.Cut(string(b), " ")
	rank, err := strconv.Atoi(rs)
	if err != nil {
		return JoinToken{}, -1, noRankErr("Membership."+op, "", ErrInternal, nil, "the admission %q is malformed", b)
	}
	tok, err := ParseJoinToken(ts)
	if err != nil {
		return JoinToken{}, -1, noRankErr("Membership."+op, "", ErrInternal, err, "")
	}
	return tok, rank, nil
}

// End tells the newcomers still waiting, and those that come later, that the
// job is over (their AwaitToken returns ErrJobEnded). Rank 0 calls it when
// the job's work is done.
func (m *Membership) End(ctx context.Context) error {
	if ctx == nil {
		return noRankErr("Membership.End", "", ErrPara, nil, "nil context")
	}
	if err := m.cli.Set(ctx, elastic.KeyEnded, []byte("1")); err != nil {
		return m.err(ctx, "End", err, "")
	}
	joins, err := m.cli.Add(ctx, elastic.KeyJoins, 0)
	if err != nil {
		return m.err(ctx, "End", err, "")
	}
	adm, err := m.cli.Add(ctx, elastic.KeyAdmitted, 0)
	if err != nil {
		return m.err(ctx, "End", err, "")
	}
	for seq := adm + 1; seq <= joins; seq++ {
		if err := m.cli.Set(ctx, elastic.TokenKey(seq), []byte(elastic.Ended)); err != nil {
			return m.err(ctx, "End", err, "")
		}
	}
	return nil
}

// Close disconnects from the store, ending the calls in progress.
// Idempotent.
func (m *Membership) Close() error {
	if m == nil {
		return nil
	}
	return m.cli.Close()
}
