// Package elastic is the membership protocol between `hcomm run --elastic`
// and the ranks it starts: the names of the variables the launcher sets, the
// secret of its membership store, and the store's keys. The launcher serves
// the store (internal/bootstrap, on 127.0.0.1); hcomm's Membership is the
// ranks' side. The protocol itself is written down in the launch package's
// doc (cmd/hcomm/internal/launch).
package elastic

import (
	"strconv"

	"github.com/hcomm-dev/hcomm/internal/bootstrap"
)

// The variables `hcomm run --elastic` sets for every process it starts.
const (
	EnvAddr  = "HCOMM_ELASTIC_ADDR"  // host:port of the launcher's membership store
	EnvSlot  = "HCOMM_ELASTIC_SLOT"  // this process's slot: unique over the job's life, 0..slots-1
	EnvSlots = "HCOMM_ELASTIC_SLOTS" // how many processes the job may start: n + max restarts
	EnvJoin  = "HCOMM_ELASTIC_JOIN"  // "1" in a replacement: join the running job (Grow) instead of starting it
)

// Secret is the membership store's secret, derived from the job's
// HCOMM_SECRET (so a rank's communicator secret and the store's differ).
func Secret(jobSecret string) bootstrap.Secret {
	return bootstrap.DeriveSecret("hcomm/elastic\x00" + jobSecret)
}

// The store's keys.
const (
	KeyJoins    = "joins"    // counter: newcomers that have asked to join, each taking the next number
	KeyAdmitted = "admitted" // counter: newcomers rank 0 has handed a token (they are admitted in order)
	KeyEnded    = "ended"    // set by rank 0 when the job is over: no more admissions
)

// JoinKey holds the slot of newcomer seq (1-based).
func JoinKey(seq int64) string { return "join/" + strconv.FormatInt(seq, 10) }

// TokenKey holds what newcomer seq receives: "<rank> <join token>", or
// Ended.
func TokenKey(seq int64) string { return "token/" + strconv.FormatInt(seq, 10) }

// MemberKey is set for a replacement's slot once rank 0 has admitted it: the
// launcher then counts it among the job's members.
func MemberKey(slot int) string { return "member/" + strconv.Itoa(slot) }

// Ended is TokenKey's value for a newcomer the job ended before admitting.
const Ended = "ended"
