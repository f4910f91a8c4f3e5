//go:build linux

package notify

import (
	"errors"
	"testing"
	"time"
)

// A peer that records and then closes its end (Signal, then the transport's
// Break on its goodbye) between a wait's look at the word and its look at
// the broken state leaves a record the wait still consumes: the wait
// succeeds. (It failed as broken with the record in the word, which made a
// rank that destroyed its communicator right after its collective fail the
// peer waiting for its last acknowledgement.)
func TestSharedRecordBeforeBreakIsConsumed(t *testing.T) {
	var w uint32
	n := NewShared("record-then-break", &w)
	once := true
	afterLook = func() {
		if once {
			once = false
			Signal(&w)
			n.Break(errors.New("peer closed"))
		}
	}
	defer func() { afterLook = nil }()
	if err := n.Await(nil, 10*time.Second); err != nil {
		t.Fatalf("the wait failed with the record in the word: %v", err)
	}
}
