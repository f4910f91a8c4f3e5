package hcomm_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/hcomm"
)

// longSetupCfg bounds setup by a connect timeout far longer than any test
// waits: a call that returns promptly was ended by its context or Abort, not
// by HCCL_CONNECT_TIMEOUT.
func longSetupCfg() *hcomm.Config {
	c := testCfg()
	c.ConnectTimeout = 60 * time.Second
	return c
}

// prompt is how long a setup may take to return once its context ends or
// the communicator is aborted (loaded machine included).
const prompt = 5 * time.Second

// endedBy runs call, which must block until ctx ends or something else ends
// it, and returns its error; it fails the test when call takes longer than
// prompt after start.
func endedBy(t *testing.T, what string, call func() error) error {
	t.Helper()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- call() }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatalf("%s: returned nil, want an error", what)
		}
		t.Logf("%s: returned after %v: %v", what, time.Since(start).Round(time.Millisecond), err)
		return err
	case <-time.After(prompt):
		t.Fatalf("%s: still blocked after %v (the connect timeout is %v)", what, prompt, longSetupCfg().ConnectTimeout)
		return nil
	}
}

// wantCanceled checks err is an *Error of op that matches context.Canceled
// and is not a timeout.
func wantCanceled(t *testing.T, op string, err error) {
	t.Helper()
	var he *hcomm.Error
	if !errors.As(err, &he) || he.Op != op {
		t.Fatalf("%v: want an *hcomm.Error of %s", err, op)
	}
	if !errors.Is(err, context.Canceled) || he.Code != hcomm.ErrUnavail || he.Timeout() {
		t.Errorf("%v (code %v, Timeout %v): want context.Canceled, ErrUnavail, not a timeout", err, he.Code, he.Timeout())
	}
}

// wantDeadline checks err is an *Error of op that is a timeout and matches
// context.DeadlineExceeded.
func wantDeadline(t *testing.T, op string, err error) {
	t.Helper()
	var he *hcomm.Error
	if !errors.As(err, &he) || he.Op != op {
		t.Fatalf("%v: want an *hcomm.Error of %s", err, op)
	}
	if !errors.Is(err, context.DeadlineExceeded) || !he.Timeout() || he.Code != hcomm.ErrTimeout {
		t.Errorf("%v (code %v, Timeout %v): want context.DeadlineExceeded, ErrTimeout, Timeout() true", err, he.Code, he.Timeout())
	}
}

func cancelAfter(d time.Duration) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(d, cancel)
	return ctx
}

// ChannelAcquireContext to a peer that never calls ends with its context,
// not after HCCL_CONNECT_TIMEOUT; the communicator stays usable, and the
// two ends then meet although only one made the failed setups.
func TestChannelAcquireContext(t *testing.T) {
	for _, tr := range hcomm.Transports() {
		t.Run(tr, func(t *testing.T) { testChannelAcquireContext(t, tr) })
	}
}

func testChannelAcquireContext(t *testing.T, transport string) {
	cfg := longSetupCfg()
	cfg.Transport = transport
	comms, err := hcomm.InitAll(2, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	desc := func(peer int) []hcomm.ChannelDesc {
		d := hcomm.ChannelDescInit(1)
		d[0].RemoteRank, d[0].NotifyNum = peer, 1
		return d
	}
	err = endedBy(t, "cancelled acquire", func() error {
		_, err := comms[0].ChannelAcquireContext(cancelAfter(100*time.Millisecond), hcomm.EngineCPUTS, desc(1))
		return err
	})
	wantCanceled(t, "ChannelAcquire", err)

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err = endedBy(t, "acquire past its deadline", func() error {
		_, err := comms[0].ChannelAcquireContext(ctx, hcomm.EngineCPUTS, desc(1))
		return err
	})
	wantDeadline(t, "ChannelAcquire", err)

	if err := comms[0].Check(); err != nil {
		t.Errorf("after cancelled acquires: %v, want a usable communicator", err)
	}

	// Both ends now: rank 0 gave up two setups that rank 1 never made, and
	// rank 1 starts over past them instead of waiting in the first.
	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := make(chan error, 2)
	for r, c := range comms {
		go func() {
			_, err := c.ChannelAcquireContext(ctx, hcomm.EngineCPUTS, desc(1-r))
			errs <- err
		}()
	}
	for range comms {
		if err := <-errs; err != nil {
			t.Errorf("acquire on both ends after rank 0's cancelled ones: %v", err)
		}
	}
}

// Abort ends a ChannelAcquire that waits for a peer that never comes (the
// context-less form included), with an error wrapping ErrAborted.
func TestAbortEndsChannelAcquire(t *testing.T) {
	comms, err := hcomm.InitAll(2, longSetupCfg())
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	d := hcomm.ChannelDescInit(1)
	d[0].RemoteRank = 1
	time.AfterFunc(100*time.Millisecond, func() { comms[0].Abort() })
	err = endedBy(t, "acquire then Abort", func() error {
		_, err := comms[0].ChannelAcquire(hcomm.EngineCPUTS, d)
		return err
	})
	if !errors.Is(err, hcomm.ErrAborted) || !errors.Is(err, hcomm.ErrUnavail) {
		t.Errorf("%v: want ErrAborted, ErrUnavail", err)
	}
}

// Destroy, too, ends a ChannelAcquire that waits for its peer.
func TestDestroyEndsChannelAcquire(t *testing.T) {
	comms, err := hcomm.InitAll(2, longSetupCfg())
	if err != nil {
		t.Fatal(err)
	}
	defer comms[1].Destroy()
	d := hcomm.ChannelDescInit(1)
	d[0].RemoteRank = 1
	time.AfterFunc(100*time.Millisecond, func() { comms[0].Destroy() })
	err = endedBy(t, "acquire then Destroy", func() error {
		_, err := comms[0].ChannelAcquire(hcomm.EngineCPUTS, d)
		return err
	})
	if !errors.Is(err, hcomm.ErrUnavail) || !strings.Contains(err.Error(), "destroyed") {
		t.Errorf("%v: want ErrUnavail, destroyed", err)
	}
}

// SplitContext where the other rank never calls Split ends with its context.
func TestSplitContext(t *testing.T) {
	comms, err := hcomm.InitAll(2, longSetupCfg())
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	err = endedBy(t, "cancelled split", func() error {
		_, err := comms[0].SplitContext(cancelAfter(100*time.Millisecond), 0, 0, nil)
		return err
	})
	wantCanceled(t, "Split", err)
	time.AfterFunc(100*time.Millisecond, func() { comms[0].Abort() })
	err = endedBy(t, "split then Abort", func() error {
		_, err := comms[0].Split(0, 0, nil)
		return err
	})
	if !errors.Is(err, hcomm.ErrAborted) {
		t.Errorf("%v: want ErrAborted", err)
	}
}

// InitRootInfoContext: rank 0 waiting for a rank that never comes, and a
// rank waiting for a rank 0 that never starts, end with their contexts.
func TestInitRootInfoContext(t *testing.T) {
	root, err := hcomm.GetRootInfo(longSetupCfg())
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	err = endedBy(t, "rank 0 alone, cancelled", func() error {
		c, err := hcomm.InitRootInfoContext(cancelAfter(100*time.Millisecond), 2, root, 0, longSetupCfg())
		if c != nil {
			c.Destroy()
		}
		return err
	})
	wantCanceled(t, "InitRootInfo", err)

	nobody := hcomm.RootInfo{Addr: "127.0.0.1:" + strconv.Itoa(freePort(t)), Secret: root.Secret}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err = endedBy(t, "rank 1 with no store, deadline", func() error {
		_, err := hcomm.InitRootInfoContext(ctx, 2, nobody, 1, longSetupCfg())
		return err
	})
	wantDeadline(t, "InitRootInfo", err)
}

// InitClusterInfoContext and InitFromEnvContext share InitRootInfoContext's
// rendezvous: a rank whose rank 0 never starts ends with its context.
func TestInitClusterInfoAndFromEnvContext(t *testing.T) {
	table := `{"status":"completed","version":"1.0","server_count":"1","server_list":[
 {"server_id":"127.0.0.1","device":[{"device_id":"0","device_ip":"192.168.1.8","rank_id":"0"},{"device_id":"1","device_ip":"192.168.1.9","rank_id":"1"}]}]}`
	path := filepath.Join(t.TempDir(), "rank_table.json")
	if err := os.WriteFile(path, []byte(table), 0o600); err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(freePort(t))
	t.Setenv("HCOMM_ROOT_PORT", port)
	err := endedBy(t, "InitClusterInfoContext rank 1, cancelled", func() error {
		_, err := hcomm.InitClusterInfoContext(cancelAfter(100*time.Millisecond), path, 1, longSetupCfg())
		return err
	})
	wantCanceled(t, "InitClusterInfo", err)

	t.Setenv("RANK", "1")
	t.Setenv("WORLD_SIZE", "2")
	t.Setenv("MASTER_ADDR", "127.0.0.1")
	t.Setenv("MASTER_PORT", port)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err = endedBy(t, "InitFromEnvContext rank 1, deadline", func() error {
		_, err := hcomm.InitFromEnvContext(ctx, longSetupCfg())
		return err
	})
	wantDeadline(t, "InitFromEnv", err)
}

// Timeout is true for ErrTimeout and for an error a deadline ended, false
// otherwise.
func TestErrorTimeout(t *testing.T) {
	for _, c := range []struct {
		err  *hcomm.Error
		want bool
	}{
		{&hcomm.Error{Code: hcomm.ErrTimeout}, true},
		{&hcomm.Error{Code: hcomm.ErrUnavail, Err: context.DeadlineExceeded}, true},
		{&hcomm.Error{Code: hcomm.ErrUnavail, Err: context.Canceled}, false},
		{&hcomm.Error{Code: hcomm.ErrPara}, false},
	} {
		if got := c.err.Timeout(); got != c.want {
			t.Errorf("%v: Timeout() = %v, want %v", c.err, got, c.want)
		}
	}
}

// An error that knows no rank (a nil handle, a communicator not made yet)
// says so by leaving rank and peer out, not by printing -1.
func TestErrorWithoutRank(t *testing.T) {
	var c *hcomm.Comm
	err := c.Abort()
	if got, want := err.Error(), "hcomm: Abort: pointer error (HcclResult 2): nil communicator"; got != want {
		t.Errorf("nil communicator: %q, want %q", got, want)
	}
	_, err = hcomm.InitAll(0, &hcomm.Config{Name: "x"})
	if got, want := err.Error(), "hcomm x: InitAll: parameter error (HcclResult 1): rank count 0"; !strings.HasPrefix(got, want) {
		t.Errorf("InitAll(0): %q, want it to start with %q", got, want)
	}
}
