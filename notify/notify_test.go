package notify_test

import (
	"context"
	"errors"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/leakcheck"
	"github.com/hcomm-dev/hcomm/notify"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

func setup(t *testing.T) (*device.Stream, *device.Stream) {
	t.Helper()
	d, err := device.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	a, _ := d.CreateStream()
	b, _ := d.CreateStream()
	return a, b
}

func TestRecordThenWaitOrdersTwoStreams(t *testing.T) {
	a, b := setup(t)
	n := notify.New("test notify 0")
	var produced atomic.Bool
	var sawProduced atomic.Bool
	// b waits first: the record comes later, from a.
	n.Wait(b, 5*time.Second)
	b.Launch("consume", func(<-chan struct{}) error { sawProduced.Store(produced.Load()); return nil })
	a.Launch("produce", func(<-chan struct{}) error { time.Sleep(5 * time.Millisecond); produced.Store(true); return nil })
	n.Record(a)
	if err := b.SynchronizeWithTimeout(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if !sawProduced.Load() {
		t.Fatal("task after the wait ran before the task before the record")
	}
	if n.IsSet() {
		t.Fatal("wait did not reset the notify")
	}
}

func TestWaitTimesOutNamingTheNotify(t *testing.T) {
	a, _ := setup(t)
	n := notify.New("rank 3 peer 1 notify 2")
	infos := make(chan *device.ExceptionInfo, 1)
	a.Device().SetExceptionInfoCallback(func(i *device.ExceptionInfo) { infos <- i })
	n.Wait(a, 20*time.Millisecond)
	start := time.Now()
	err := a.SynchronizeWithTimeout(10 * time.Second)
	if !errors.Is(err, device.ErrWaitTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want a wait timeout", err)
	}
	if !strings.Contains(err.Error(), "rank 3 peer 1 notify 2") {
		t.Fatalf("error %q does not name the notify", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatal("timeout took too long")
	}
	select {
	case i := <-infos:
		if i.ErrorCode != uint32(device.ErrWaitTimeout) {
			t.Fatalf("exception code %d", i.ErrorCode)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no exception report for the timed-out wait")
	}
}

func TestRecordsCollapseAndWaitResets(t *testing.T) {
	a, b := setup(t)
	n := notify.New("n")
	n.Record(a)
	n.Record(a)
	a.SynchronizeWithTimeout(5 * time.Second)
	n.Wait(b, time.Second)
	if err := b.SynchronizeWithTimeout(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	n.Wait(b, 20*time.Millisecond) // the second record collapsed into the first
	if err := b.SynchronizeWithTimeout(5 * time.Second); !errors.Is(err, device.ErrWaitTimeout) {
		t.Fatalf("err = %v, want timeout: records must not count", err)
	}
}

func TestAbortUnblocksWait(t *testing.T) {
	a, _ := setup(t)
	n := notify.New("n")
	n.Wait(a, 0) // forever
	time.Sleep(5 * time.Millisecond)
	a.Abort()
	if err := a.SynchronizeWithTimeout(5 * time.Second); !errors.Is(err, device.ErrStreamAbort) {
		t.Fatalf("err = %v, want stream abort", err)
	}
}

func TestWaitNow(t *testing.T) {
	n := notify.New("n")
	go func() { time.Sleep(time.Millisecond); n.Set() }()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := n.WaitNow(ctx); err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel2()
	if err := n.WaitNow(ctx2); !errors.Is(err, device.ErrWaitTimeout) {
		t.Fatalf("err = %v", err)
	}
}

// BenchmarkNotifyHandoff measures one notify record on one stream seen by a
// wait on another: the ping-pong round trip divided by two.
func BenchmarkNotifyHandoff(b *testing.B) {
	d, _ := device.Open(0)
	defer d.Close()
	s1, _ := d.CreateStream()
	s2, _ := d.CreateStream()
	ping, pong := notify.New("ping"), notify.New("pong")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ping.Record(s1)
		pong.Wait(s1, 0)
		ping.Wait(s2, 0)
		pong.Record(s2)
	}
	s1.SynchronizeWithTimeout(-1)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2/1000, "µs/handoff")
}

func TestBreakFailsPendingAndLaterWaits(t *testing.T) {
	dev, err := device.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	s, _ := dev.CreateStream()
	defer s.Destroy()
	n := notify.New("peer notify")
	if err := n.Wait(s, time.Minute); err != nil {
		t.Fatal(err)
	}
	lost := errors.New("rank 3 is lost")
	time.Sleep(10 * time.Millisecond) // let the wait go to sleep
	start := time.Now()
	n.Break(lost)
	err = s.SynchronizeWithTimeout(-1)
	if !errors.Is(err, lost) || time.Since(start) > 10*time.Second {
		t.Fatalf("pending wait after Break: %v after %v; want an error wrapping %q at once", err, time.Since(start), lost)
	}
	if err := n.WaitNow(context.Background()); !errors.Is(err, lost) {
		t.Fatalf("later wait: %v, want %q", err, lost)
	}
	n.Set() // a record that arrived before the loss is still consumed
	if err := n.WaitNow(context.Background()); err != nil {
		t.Fatalf("wait on a recorded, broken notify: %v", err)
	}
	if n.Broken() != lost {
		t.Fatalf("Broken() = %v", n.Broken())
	}
}

// A notify with SetSpin(0) sleeps at once and is woken by a record from a
// goroutine that the network poller runs (a tcp reader), with GOMAXPROCS=1
// as under hcomm run; it still times out.
func TestSetSpinZeroWaitsForAPollerRecord(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Skipf("no loopback: %v", err)
	}
	defer ln.Close()
	dial, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer dial.Close()
	acc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer acc.Close()
	n := notify.New("polled")
	n.SetSpin(0)
	const rounds = 200
	go func() { // the reader: each byte that arrives records the notify
		b := make([]byte, 1)
		for i := 0; i < rounds; i++ {
			if _, err := acc.Read(b); err != nil {
				return
			}
			n.Set()
		}
	}()
	for i := 0; i < rounds; i++ {
		if _, err := dial.Write([]byte{1}); err != nil {
			t.Fatal(err)
		}
		if err := n.Await(nil, 10*time.Second); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
	}
	if err := n.Await(nil, 10*time.Millisecond); !errors.Is(err, device.ErrWaitTimeout) {
		t.Fatalf("unrecorded wait: %v, want a timeout", err)
	}
}

// TryResetFunc is TryReset, made once: handing it to a poll allocates
// nothing.
func TestTryResetFuncAllocatesNothing(t *testing.T) {
	for _, n := range []*notify.Notify{notify.New("plain"), notify.NewShared("shared", new(uint32))} {
		f := n.TryResetFunc()
		if f == nil {
			t.Fatalf("%s: no TryResetFunc", n.Name())
		}
		if f() {
			t.Fatalf("%s: TryResetFunc took a record nobody made", n.Name())
		}
		n.Set()
		if !f() || f() {
			t.Fatalf("%s: TryResetFunc does not take a record once", n.Name())
		}
		var sink func() bool
		if a := testing.AllocsPerRun(100, func() { sink = n.TryResetFunc() }); a != 0 {
			t.Fatalf("%s: TryResetFunc allocates %v times", n.Name(), a)
		}
		_ = sink
	}
}
