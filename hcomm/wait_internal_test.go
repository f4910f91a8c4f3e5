package hcomm

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/notify"
)

// busyPoller is a transport whose Poll lasts its whole limit and finds
// nothing, as a tcp poll does while bytes that are not the awaited record
// keep arriving.
type busyPoller struct{ channel.Transport }

func (busyPoller) Name() string { return "busy" }

func (busyPoller) PollOnce() bool { return false }

func (busyPoller) Poll(stop <-chan struct{}, limit time.Duration, done func() bool) bool {
	select {
	case <-stop:
	case <-time.After(limit):
	}
	return false
}

// TestWaitTimeoutCountsThePoll: a notify wait's timeout covers its poll
// and its sleep together; the sleep gets what the poll left. Without the
// deduction the wait takes twice its timeout.
func TestWaitTimeoutCountsThePoll(t *testing.T) {
	comms, err := InitAll(1, &Config{BufferSize: 32 << 10, Name: "waitpoll"})
	if err != nil {
		t.Fatal(err)
	}
	c := comms[0]
	defer c.Destroy()
	n := notify.New("busy notify 0")
	ch := &Channel{comm: c, remote: 0, tr: busyPoller{}, notifies: []*notify.Notify{n}}
	const timeout = 300 * time.Millisecond
	start := time.Now()
	err = c.awaitNotify("ChannelNotifyWait", ch, 0, n, timeout, opTag{}, nil)
	took := time.Since(start)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v, want a timeout", err)
	}
	if took < timeout || took > timeout+timeout/2 {
		t.Fatalf("a wait with timeout %v took %v", timeout, took)
	}
	if !strings.Contains(err.Error(), "within 300ms") {
		t.Fatalf("the error does not name the wait's whole timeout: %v", err)
	}
}
