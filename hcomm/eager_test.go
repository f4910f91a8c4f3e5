package hcomm_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/hcomm"
)

// An eager thread (Thread.SetEager) runs the calls that cannot block in the
// calling goroutine while its stream is idle, and polls a wait there
// first. Over mapped memory (inproc, shm) a write, a record and a wait
// whose record is in are done when the call returns, with nothing left
// on the stream; over tcp they are queued as before; a local copy is done
// at once on every transport. A wait whose record is not in yet returns
// after the poll, queued, and ends when the record comes — issued by the
// same goroutine after it, which a wait that blocked the caller would
// never let happen.
func TestEagerThread(t *testing.T) {
	for _, tr := range hcomm.Transports() {
		t.Run(tr, func(t *testing.T) {
			p := pairOn(t, tr)
			quick := tr != hcomm.TransportTCP
			const n = 3001
			for r := 0; r < 2; r++ {
				p.th[r].SetEager(time.Millisecond, 1<<20)
			}
			remote := remoteBuf(t, p, 0)
			idle := func(r int) bool { return p.th[r].Stream().Pending() == 0 }

			fill(t, p.comms[0], p.buf[0], n, 0x3C)
			fill(t, p.comms[1], p.buf[1], n, 0)
			if err := hcomm.WriteWithNotifyOnThread(p.th[0], p.ch[0], remote, p.buf[0], n, 1); err != nil {
				t.Fatal(err)
			}
			if quick && (!idle(0) || !bytes.Equal(read(t, p.comms[1], p.buf[1], n), filled(n, 0x3C))) {
				t.Fatal("an eager write over mapped memory was not done when the call returned")
			}
			if err := p.sync(t, 0); err != nil {
				t.Fatal(err)
			}
			// The record is in: the wait takes it in the caller.
			if err := hcomm.ChannelNotifyWaitOnThread(p.th[1], p.ch[1], 1, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			if quick && !idle(1) {
				t.Fatal("an eager wait whose record was in left a task on the stream")
			}
			if err := p.sync(t, 1); err != nil {
				t.Fatal(err)
			}

			// A local copy, done at once on every transport.
			dst := p.buf[1] + n
			if err := hcomm.LocalCopyOnThread(p.th[1], dst, p.buf[1], n); err != nil {
				t.Fatal(err)
			}
			if !idle(1) || !bytes.Equal(read(t, p.comms[1], dst, n), filled(n, 0x3C)) {
				t.Fatal("an eager local copy was not done when the call returned")
			}

			// The wait comes before its record, both from this goroutine.
			start := time.Now()
			if err := hcomm.ChannelNotifyWaitOnThread(p.th[1], p.ch[1], 2, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("an eager wait held its caller %v", d)
			}
			if idle(1) {
				t.Fatal("a wait whose record is not in left nothing on the stream")
			}
			if err := hcomm.ChannelNotifyRecordOnThread(p.th[0], p.ch[0], 2); err != nil {
				t.Fatal(err)
			}
			if err := p.sync(t, 1); err != nil {
				t.Fatalf("the queued wait: %v", err)
			}
			if err := p.sync(t, 0); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// An eager wait's poll in the caller ends when the stream is aborted, not
// only at its bound: with the bound at 20 s, a wait whose record never
// comes returns within moments of the Abort, and the stream reports the
// abort.
func TestEagerWaitEndsOnAbort(t *testing.T) {
	for _, tr := range []string{hcomm.TransportInproc, hcomm.TransportShm} {
		t.Run(tr, func(t *testing.T) {
			p := pairOn(t, tr)
			p.th[1].SetEager(20*time.Second, 1<<20)
			s := p.th[1].Stream()
			go func() {
				time.Sleep(50 * time.Millisecond)
				s.Abort()
			}()
			start := time.Now()
			if err := hcomm.ChannelNotifyWaitOnThread(p.th[1], p.ch[1], 2, 30*time.Second); err != nil {
				t.Fatal(err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("the eager wait returned %v after it started; the abort at 50 ms must end its poll", d)
			}
			if err := s.SynchronizeWithTimeout(10 * time.Second); err == nil {
				t.Fatal("the aborted stream reports no failure")
			}
		})
	}
}
