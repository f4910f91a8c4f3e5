// Package channeltest is the conformance suite of channel transports: the
// contract of channel.Transport (and channel.WriteNotifier where a transport
// has it) as tests that every transport runs, the same cases over each, as
// yamux runs one suite over pipes and over TCP. inproc, shm and tcp call Run
// from their tests with a Config that says how to make their Dialers and what
// their Close and a lost peer look like; their own tests keep what is theirs
// alone (wire format, handshakes, processes, heartbeats).
//
// Each case connects two ends in this process, rank 0 and rank 1, over the
// Config's Dialers, each with its own device: an HCCL buffer, a second range
// registered before the connect, and an allocation never registered (the
// guard a refused range must not reach). The cases:
//
//  1. Connect: each Conn describes the far end (notifies, memory, name).
//  2. RoundTrips: Write, Read, WriteReduce and ReadReduce of odd sizes at
//     unaligned offsets, both ways, checked in the peer's memory.
//  3. VisibilityAfterNotify: a wait for a record returns only once the
//     writes issued before the record are in the waiter's memory (Write then
//     NotifyRecord, and WriteWithNotify).
//  4. Ordering: a Read sees the writes issued before it; Fence returns once
//     earlier writes are applied; two writes (a write then a write-reduce, a
//     write then an overlapping write) to the same bytes land in issue order
//     with nothing between them; records arrive in the order they were made.
//  5. ConcurrentThreads: goroutines sharing a channel, each with its region
//     and notify, as a communicator's threads do.
//  6. RangeRefusals: ranges outside the peer's registered memory fail (at the
//     latest at the next Fence) and never touch the peer's memory; a notify
//     index the peer lacks fails at once and leaves the channel working.
//  7. Close: Close is idempotent; with Config.Closes later calls and waits
//     fail, with Config.Goodbye the peer's waits fail with it.
//  8. PeerLoss (with Config.Lose): a peer gone without a goodbye fails the
//     waits on its channel promptly, naming it, and every later call.
//  9. Flagged (with channel.FlagWriter): rounds of flagged words through
//     two slots, each seen whole by the receiver's poll; bad lengths,
//     addresses and ranges refused.
//  10. Line (with channel.FlagWriter): rounds of lines of every length,
//     written and prepared, each seen whole; bad ones refused.
//  11. CheckedOnReceipt (with channel.ReceiverChecker): a write into a
//     range the peer registered after the connect lands; once the peer
//     removed it, a write there is refused and stores nothing.
package channeltest

import (
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
)

// TB is what the suite needs of a test. *testing.T has it; the suite's own
// tests pass a recorder to check that each case can fail.
type TB interface {
	Helper()
	Cleanup(func())
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// Config describes the transport under test.
type Config struct {
	// Dialers returns the Dialers of rank 0 and rank 1 (one Dialer twice is
	// fine). The suite closes them when the case ends; the channels they
	// made are closed before.
	Dialers func(t TB) (d0, d1 channel.Dialer)
	// Closes says that Close ends this end of the channel: later calls and
	// waits on the end's notifies fail with channel.ErrClosed. False for a
	// transport whose Close has nothing to end (inproc).
	Closes bool
	// Goodbye says that a peer's Close reaches this end: its waits and later
	// calls fail with channel.ErrPeerClosed.
	Goodbye bool
	// Lose, when set, cuts tr's end of its channel as its process's death
	// would: nothing more goes in or out and no goodbye reaches the peer,
	// whose waits and later calls must fail with channel.ErrPeerLost. nil
	// skips the PeerLoss case.
	Lose func(t TB, tr channel.Transport)
	// LossWithin bounds how long a wait may take to fail once the peer is
	// gone or closed (default 5 s).
	LossWithin time.Duration
}

func (c Config) lossWithin() time.Duration {
	if c.LossWithin > 0 {
		return c.LossWithin
	}
	return 5 * time.Second
}

// Run runs every case of the suite over the transport cfg describes, each
// as a subtest.
func Run(t *testing.T, cfg Config) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(t, cfg) })
	}
}

var cases = []struct {
	name string
	run  func(TB, Config)
}{
	{"Connect", testConnect},
	{"RoundTrips", testRoundTrips},
	{"VisibilityAfterNotify", testVisibility},
	{"Ordering", testOrdering},
	{"ConcurrentThreads", testConcurrent},
	{"RangeRefusals", testRangeRefusals},
	{"Close", testClose},
	{"PeerLoss", testPeerLoss},
	{"Flagged", testFlagged},
	{"Line", testLine},
	{"CheckedOnReceipt", testCheckedOnReceipt},
	{"NilArguments", testNilArguments},
}
