package hcomm_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/hcomm"
)

// transitions records what a state callback is told.
type transitions struct {
	mu  sync.Mutex
	got []string
	ch  chan string
}

func newTransitions() *transitions { return &transitions{ch: make(chan string, 16)} }

func (tr *transitions) cb(c *hcomm.Comm, from, to hcomm.CommStatus) {
	s := fmt.Sprintf("%v->%v", from, to)
	tr.mu.Lock()
	tr.got = append(tr.got, s)
	tr.mu.Unlock()
	tr.ch <- s
}

func (tr *transitions) want(t *testing.T, s string) {
	t.Helper()
	select {
	case got := <-tr.ch:
		if got != s {
			t.Fatalf("callback told %s, want %s", got, s)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("callback not told %s", s)
	}
}

// TestCommStatusAbortAndDestroy: a communicator is Ready; Abort makes it
// Error and Destroy Destroyed, each told to the callback in order, the last
// before Destroy returns; a communicator that is Error stays Error.
func TestCommStatusAbortAndDestroy(t *testing.T) {
	comms, err := hcomm.InitAll(2, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer comms[1].Destroy()
	c := comms[0]
	if s := c.GetStatus(); s != hcomm.StatusReady {
		t.Fatalf("fresh communicator: %v, want READY", s)
	}
	tr := newTransitions()
	unreg, err := c.RegCommStateCallback(tr.cb)
	if err != nil {
		t.Fatal(err)
	}
	defer unreg()
	c.Abort()
	if s := c.GetStatus(); s != hcomm.StatusError {
		t.Fatalf("after Abort: %v, want ERROR", s)
	}
	tr.want(t, "READY->ERROR")
	c.Abort() // no second transition
	c.Destroy()
	select {
	case s := <-tr.ch:
		if s != "ERROR->INVALID" {
			t.Fatalf("Destroy told %s, want ERROR->INVALID", s)
		}
	default:
		t.Fatal("Destroy returned before its transition was told")
	}
	if s := c.GetStatus(); s != hcomm.StatusDestroyed {
		t.Fatalf("after Destroy: %v, want INVALID", s)
	}
	if _, err := c.RegCommStateCallback(tr.cb); !errors.Is(err, hcomm.ErrUnavail) {
		t.Fatalf("RegCommStateCallback after Destroy: %v, want ErrUnavail", err)
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if got := strings.Join(tr.got, " "); got != "READY->ERROR ERROR->INVALID" {
		t.Fatalf("transitions %q", got)
	}
}

// TestCommStatusAsyncError: a wait that times out on a thread is the
// communicator's asynchronous error, and the communicator goes to Error,
// told to the callback without anyone polling.
func TestCommStatusAsyncError(t *testing.T) {
	comms, err := hcomm.InitAll(2, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	tr := newTransitions()
	if _, err := comms[0].RegCommStateCallback(tr.cb); err != nil {
		t.Fatal(err)
	}
	chs := make([]*hcomm.Channel, 2)
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := hcomm.ChannelDescInit(1)
			d[0].RemoteRank = 1 - r
			d[0].NotifyNum = 1
			got, err := c.ChannelAcquire(hcomm.EngineCPUTS, d)
			if err != nil {
				t.Error(err)
				return
			}
			chs[r] = got[0]
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	ts, err := comms[0].ThreadAcquire(hcomm.EngineCPUTS, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := hcomm.ChannelNotifyWaitOnThread(ts[0], chs[0], 0, 20*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := ts[0].Stream().Synchronize(t.Context()); err == nil {
		t.Fatal("a wait nobody records succeeded")
	}
	tr.want(t, "READY->ERROR")
	if s := comms[0].GetStatus(); s != hcomm.StatusError {
		t.Fatalf("after an asynchronous error: %v, want ERROR", s)
	}
}

// TestCommStatusSuspendResume drives the transitions Suspend and Resume
// make through setState, and checks that Error is not left but for
// Destroyed.
func TestCommStatusSuspendResume(t *testing.T) {
	comms, err := hcomm.InitAll(1, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := comms[0]
	tr := newTransitions()
	var second []string
	var mu sync.Mutex
	if _, err := c.RegCommStateCallback(tr.cb); err != nil {
		t.Fatal(err)
	}
	unreg, err := c.RegCommStateCallback(func(_ *hcomm.Comm, from, to hcomm.CommStatus) {
		mu.Lock()
		second = append(second, to.String())
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		to   hcomm.CommStatus
		ok   bool
		want string
	}{
		{hcomm.StatusSuspending, true, "READY->SUSPENDING"},
		{hcomm.StatusSuspending, false, ""},
		{hcomm.StatusReady, true, "SUSPENDING->READY"},
		{hcomm.StatusError, true, "READY->ERROR"},
		{hcomm.StatusReady, false, ""},
		{hcomm.StatusSuspending, false, ""},
	} {
		if ok := hcomm.SetState(c, step.to); ok != step.ok {
			t.Fatalf("setState(%v) = %v, want %v", step.to, ok, step.ok)
		}
		if step.ok {
			tr.want(t, step.want)
		}
		if step.to == hcomm.StatusError {
			unreg() // the second callback hears no more
		}
	}
	c.Destroy()
	tr.want(t, "ERROR->INVALID")
	mu.Lock()
	defer mu.Unlock()
	if got := strings.Join(second, " "); got != "SUSPENDING READY ERROR" {
		t.Fatalf("unregistered callback heard %q", got)
	}
	if hcomm.StatusSuspending.String() != "SUSPENDING" || hcomm.StatusDestroyed != 254 {
		t.Fatal("HCCL's names and values")
	}
}

// TestCommGetHandleWithName: a communicator is found by name while it
// lives; the ranks of an InitAll share a name, so the name alone is
// ambiguous and CommGetHandleWithRank picks one.
func TestCommGetHandleWithName(t *testing.T) {
	comms, err := hcomm.InitAll(2, &hcomm.Config{Name: "names-test"})
	if err != nil {
		t.Fatal(err)
	}
	one, err := hcomm.InitAll(1, &hcomm.Config{Name: "names-test-one"})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := hcomm.CommGetHandleWithName("names-test-one"); err != nil || got != one[0] {
		t.Fatalf("CommGetHandleWithName = %v, %v", got, err)
	}
	if one[0].GetCommName() != "names-test-one" {
		t.Fatalf("GetCommName = %q", one[0].GetCommName())
	}
	_, err = hcomm.CommGetHandleWithName("names-test")
	if !errors.Is(err, hcomm.ErrPara) || !strings.Contains(err.Error(), "ranks 0, 1") {
		t.Fatalf("ambiguous name: %v", err)
	}
	if got, err := hcomm.CommGetHandleWithRank("names-test", 1); err != nil || got != comms[1] {
		t.Fatalf("CommGetHandleWithRank = %v, %v", got, err)
	}
	one[0].Destroy()
	if _, err := hcomm.CommGetHandleWithName("names-test-one"); !errors.Is(err, hcomm.ErrNotFound) {
		t.Fatalf("after Destroy: %v, want ErrNotFound", err)
	}
	comms[0].Destroy()
	if got, err := hcomm.CommGetHandleWithName("names-test"); err != nil || got != comms[1] {
		t.Fatalf("one rank left: %v, %v", got, err)
	}
	comms[1].Destroy()
	if _, err := hcomm.CommGetHandleWithRank("names-test", 1); !errors.Is(err, hcomm.ErrNotFound) {
		t.Fatalf("after Destroy: %v, want ErrNotFound", err)
	}
}

func TestGetErrorString(t *testing.T) {
	for r, want := range map[hcomm.Result]string{
		hcomm.Success: "no error", hcomm.ErrPara: "parameter error", hcomm.ErrNotSupport: "not support feature",
		hcomm.ErrTimeout: "timeout", hcomm.ErrRemote: "error cqe", hcomm.ErrAgain: "try again",
		hcomm.ErrNetwork: "call network api fail", 1041: "unknow error", -1: "unknow error",
	} {
		if got := hcomm.GetErrorString(r); got != want {
			t.Errorf("GetErrorString(%d) = %q, want %q", r, got, want)
		}
	}
}

func TestCommConfigCapability(t *testing.T) {
	if hcomm.CommConfigInit() != (hcomm.Config{}) {
		t.Fatal("CommConfigInit is not the unset Config")
	}
	if got := hcomm.GetCommConfigCapability(); got != hcomm.ConfigOpExpansionMode {
		t.Fatalf("GetCommConfigCapability = %d, want %d", got, hcomm.ConfigOpExpansionMode)
	}
	for _, k := range []hcomm.CommConfigCapability{hcomm.ConfigBufferSize, hcomm.ConfigDeterministic, hcomm.ConfigCommName, hcomm.ConfigSupportInitByEnv, hcomm.ConfigExecTimeout} {
		if !k.Supported() {
			t.Errorf("%d not supported", k)
		}
	}
	if hcomm.ConfigAlgo.Supported() || hcomm.ConfigBufferName != 11 {
		t.Fatal("HCCL's values")
	}
}

// TestCommStatusRevoke: a revoked communicator is in Error on every rank,
// told to the callbacks.
func TestCommStatusRevoke(t *testing.T) {
	comms, err := hcomm.InitAll(2, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	trs := []*transitions{newTransitions(), newTransitions()}
	for i, c := range comms {
		if _, err := c.RegCommStateCallback(trs[i].cb); err != nil {
			t.Fatal(err)
		}
	}
	if err := comms[0].Revoke(); err != nil {
		t.Fatal(err)
	}
	for i := range comms {
		trs[i].want(t, "READY->ERROR")
	}
}

// TestCommStatusSuspend: Suspend and Resume move the communicator between
// Ready and Suspending, told to the callback.
func TestCommStatusSuspend(t *testing.T) {
	comms, err := hcomm.InitAll(2, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	c := comms[0]
	tr := newTransitions()
	if _, err := c.RegCommStateCallback(tr.cb); err != nil {
		t.Fatal(err)
	}
	if err := c.Suspend(); err != nil {
		t.Fatal(err)
	}
	tr.want(t, "READY->SUSPENDING")
	if s := c.GetStatus(); s != hcomm.StatusSuspending {
		t.Fatalf("suspended: %v", s)
	}
	if err := c.Resume(); err != nil {
		t.Fatal(err)
	}
	tr.want(t, "SUSPENDING->READY")
	if s := c.GetStatus(); s != hcomm.StatusReady {
		t.Fatalf("resumed: %v", s)
	}
}
