//go:build linux

package notify_test

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/notify"
)

// twoMappings maps one page of a memory file twice, as two processes would:
// the same word has a different address in each mapping.
func twoMappings(t *testing.T) (a, b []byte) {
	t.Helper()
	fd, err := unix.MemfdCreate("notify-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, 4096); err != nil {
		t.Fatal(err)
	}
	a, err = unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	b, err = unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(a); unix.Munmap(b) })
	return a, b
}

func word(m []byte, off int) *uint32 { return (*uint32)(unsafe.Pointer(&m[off])) }

// TestSharedWakesAcrossMappings: the waiter sleeps on one mapping, the record
// comes through the other (the shared futex finds it by the page).
func TestSharedWakesAcrossMappings(t *testing.T) {
	a, b := twoMappings(t)
	s, _ := setup(t)
	n := notify.NewShared("shared notify 0", word(a, 64))
	if !n.Shared() {
		t.Fatal("Shared() = false")
	}
	n.Wait(s, 10*time.Second)
	time.Sleep(20 * time.Millisecond) // past the spin: the wait sleeps on the futex
	start := time.Now()
	notify.Signal(word(b, 64))
	if err := s.SynchronizeWithTimeout(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the sleeping wait took %v to see the record", d)
	}
	if n.IsSet() || *word(b, 64)&1 != 0 {
		t.Fatal("the wait did not reset the word")
	}
	if *word(a, 0) != 0 || *word(a, 128) != 0 {
		t.Fatal("a notify touched its neighbours' words")
	}
}

// TestSharedWriteThenRecordVisible: many rounds of "write the round number,
// record" through one mapping; the waiter, on the other, must see the
// number of the round it waited for, never an older one.
func TestSharedWriteThenRecordVisible(t *testing.T) {
	a, b := twoMappings(t)
	ping := notify.NewShared("ping", word(a, 0))
	pong := notify.NewShared("pong", word(b, 64))
	const rounds = 3000
	data := word(b, 256)
	errc := make(chan error, 1)
	go func() {
		for i := uint32(1); i <= rounds; i++ {
			atomic.StoreUint32((*uint32)(unsafe.Pointer(&b[512])), 0) // unrelated traffic
			*data = i                                                 // a plain write, then the record
			notify.Signal(word(b, 0))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := pong.WaitNow(ctx)
			cancel()
			if err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	for i := uint32(1); i <= rounds; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := ping.WaitNow(ctx)
		cancel()
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if got := *word(a, 256); got != i {
			t.Fatalf("round %d: the waiter read %d", i, got)
		}
		notify.Signal(word(a, 64))
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func TestSharedRecordsCollapseAndTimeout(t *testing.T) {
	a, b := twoMappings(t)
	s, _ := setup(t)
	n := notify.NewShared("n", word(a, 0))
	notify.Signal(word(b, 0))
	notify.Signal(word(b, 0))
	n.Wait(s, time.Second)
	if err := s.SynchronizeWithTimeout(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	n.Wait(s, 30*time.Millisecond)
	err := s.SynchronizeWithTimeout(5 * time.Second)
	if !errors.Is(err, device.ErrWaitTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want a timeout: records must not count", err)
	}
	if d := time.Since(start); d < 30*time.Millisecond || d > 3*time.Second {
		t.Fatalf("timeout after %v, want about 30ms", d)
	}
	n.Set()
	if !n.IsSet() || !n.TryReset() || n.IsSet() {
		t.Fatal("Set / IsSet / TryReset disagree")
	}
	n.Set()
	n.Reset()
	if n.IsSet() {
		t.Fatal("Reset left the notify set")
	}
}

func TestSharedAbortAndBreakWakeASleepingWait(t *testing.T) {
	a, _ := twoMappings(t)
	s, _ := setup(t)
	n := notify.NewShared("n", word(a, 0))
	n.Wait(s, 0) // forever
	time.Sleep(20 * time.Millisecond)
	start := time.Now()
	s.Abort()
	if err := s.SynchronizeWithTimeout(5 * time.Second); !errors.Is(err, device.ErrStreamAbort) {
		t.Fatalf("err = %v, want stream abort", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("abort took %v to end the wait", d)
	}

	_, s2 := setup(t)
	n.Wait(s2, time.Minute)
	time.Sleep(20 * time.Millisecond)
	lost := errors.New("rank 7 is lost")
	start = time.Now()
	n.Break(lost)
	if err := s2.SynchronizeWithTimeout(5 * time.Second); !errors.Is(err, lost) {
		t.Fatalf("err = %v, want %q", err, lost)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Break took %v to end the wait", d)
	}
	if err := n.WaitNow(context.Background()); !errors.Is(err, lost) {
		t.Fatalf("later wait: %v", err)
	}
	n.Set() // recorded before the loss: still consumed
	if err := n.WaitNow(context.Background()); err != nil {
		t.Fatalf("wait on a recorded, broken notify: %v", err)
	}
}

// TestDetachLetsTheWordGo: Detach ends the pending wait without waiting
// for it, and once the calls in progress have ended the notify never
// touches its word again: a value left there does not read as a record and
// is not changed, and after the word is unmapped (a touch would crash the
// test) every call still fails as the detached notify's.
func TestDetachLetsTheWordGo(t *testing.T) {
	fd, _ := unix.MemfdCreate("detach", unix.MFD_CLOEXEC)
	unix.Ftruncate(fd, 4096)
	m, err := unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	n := notify.NewShared("n", word(m, 0))
	s, _ := setup(t)
	n.Wait(s, time.Minute)
	time.Sleep(20 * time.Millisecond) // asleep on the futex
	closed := errors.New("channel closed")
	n.Detach(closed)
	n.Detach(closed)
	if err := s.SynchronizeWithTimeout(5 * time.Second); !errors.Is(err, closed) {
		t.Fatalf("pending wait: %v", err)
	}
	const left = 0x5a5a0001 // "set", with other bits: a detached notify must ignore it
	atomic.StoreUint32(word(m, 0), left)
	n.Set()
	n.Reset()
	if n.IsSet() || n.TryReset() {
		t.Fatal("a detached notify reads as set")
	}
	if err := n.WaitNow(context.Background()); !errors.Is(err, closed) {
		t.Fatalf("wait after Detach: %v", err)
	}
	if v := atomic.LoadUint32(word(m, 0)); v != left {
		t.Fatalf("the detached notify changed its word to %#x", v)
	}
	if err := unix.Munmap(m); err != nil {
		t.Fatal(err)
	}
	n.Set()
	if n.IsSet() || n.TryReset() {
		t.Fatal("a detached notify reads as set")
	}
	if err := n.WaitNow(context.Background()); !errors.Is(err, closed) {
		t.Fatalf("wait after unmapping: %v", err)
	}
}

// BenchmarkSharedHandoff: ping-pong between two goroutines over shared words
// (the cross-process figure is channel/shm's BenchmarkPingPong).
func BenchmarkSharedHandoff(b *testing.B) {
	fd, _ := unix.MemfdCreate("bench", unix.MFD_CLOEXEC)
	unix.Ftruncate(fd, 4096)
	m, _ := unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	unix.Close(fd)
	defer unix.Munmap(m)
	ping, pong := notify.NewShared("ping", word(m, 0)), notify.NewShared("pong", word(m, 64))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < b.N; i++ {
			if ping.WaitNow(context.Background()) != nil {
				return
			}
			notify.Signal(word(m, 64))
		}
	}()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		notify.Signal(word(m, 0))
		if err := pong.WaitNow(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	<-done
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2/1000, "µs/handoff")
}

// BenchmarkSharedPingPongInProcess: two goroutines of one process hand a
// token back and forth through two shared notifies, on one processor
// (GOMAXPROCS=1), as two ranks of one process over shm do. With SetLocal a
// wait yields to the other goroutine on every poll; without it, it yields
// the core to other processes and only every 64th poll to its goroutines
// (the policy for a recorder in another process), which here is the slow
// path: compare the two sub-benchmarks.
func BenchmarkSharedPingPongInProcess(b *testing.B) {
	for _, local := range []bool{true, false} {
		b.Run(map[bool]string{true: "SetLocal", false: "other-process-policy"}[local], func(b *testing.B) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
			fd, err := unix.MemfdCreate("notify-bench", unix.MFD_CLOEXEC)
			if err != nil {
				b.Fatal(err)
			}
			defer unix.Close(fd)
			if err := unix.Ftruncate(fd, 4096); err != nil {
				b.Fatal(err)
			}
			m, err := unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			if err != nil {
				b.Fatal(err)
			}
			defer unix.Munmap(m)
			ping, pong := notify.NewShared("ping", word(m, 0)), notify.NewShared("pong", word(m, 64))
			ping.SetLocal(local)
			pong.SetLocal(local)
			done := make(chan error, 1)
			go func() {
				for i := 0; i < b.N; i++ {
					if err := ping.Await(nil, 10*time.Second); err != nil {
						done <- err
						return
					}
					notify.Signal(word(m, 64))
				}
				done <- nil
			}()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				notify.Signal(word(m, 0))
				if err := pong.Await(nil, 10*time.Second); err != nil {
					b.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			ping.Detach(nil)
			pong.Detach(nil)
		})
	}
}
