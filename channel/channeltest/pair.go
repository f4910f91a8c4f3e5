package channeltest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
)

// This file holds what every case stands on: two ends with their memory,
// connected over the Config's Dialers, and the checks of bytes and errors.

const (
	bufSize   = 4 << 20  // each end's HCCL buffer
	extraSize = 64 << 10 // the range registered after it
	guardSize = 4 << 10  // the allocation never registered
	notifyNum = 4
	waitLimit = 30 * time.Second // bounds every wait of a case
)

// end is one rank's side of a channel.
type end struct {
	rank  int
	dev   *device.Device
	reg   *channel.Registry
	buf   channel.Mem // HCCL buffer
	extra channel.Mem // registered before the connect
	guard device.Ptr  // never registered
	conn  *channel.Conn
}

func (e *end) tr() channel.Transport { return e.conn.Transport }

// mem returns the bytes of [p, p+n) of the end's device.
func (e *end) mem(t TB, p device.Ptr, n int64) []byte {
	t.Helper()
	b, err := e.dev.Bytes(p, n)
	if err != nil {
		t.Fatalf("rank %d: %v", e.rank, err)
	}
	return b
}

func (e *end) bufBytes(t TB) []byte   { return e.mem(t, e.buf.Addr, e.buf.Size) }
func (e *end) extraBytes(t TB) []byte { return e.mem(t, e.extra.Addr, e.extra.Size) }
func (e *end) guardBytes(t TB) []byte { return e.mem(t, e.guard, guardSize) }

// newEnd opens rank's device and allocates its memory; p closes the device.
func newEnd(t TB, p *pair, rank int) *end {
	t.Helper()
	dev, err := device.Open(rank)
	if err != nil {
		t.Fatalf("rank %d: %v", rank, err)
	}
	p.closers = append(p.closers, func() { dev.Close() })
	e := &end{rank: rank, dev: dev, reg: &channel.Registry{}}
	alloc := func(n int64) device.Ptr {
		p, err := dev.Malloc(n)
		if err != nil {
			t.Fatalf("rank %d: %v", rank, err)
		}
		return p
	}
	e.buf = channel.Mem{Tag: "hccl buffer", Addr: alloc(bufSize), Size: bufSize}
	e.extra = channel.Mem{Tag: "extra", Addr: alloc(extraSize), Size: extraSize}
	e.guard = alloc(guardSize)
	e.reg.Add(e.buf)
	e.reg.Add(e.extra)
	return e
}

func (e *end) local(peer int) *channel.Local {
	return &channel.Local{Comm: "channeltest", Rank: e.rank, Peer: peer, Device: e.dev, Registry: e.reg,
		HCCLBuf: e.buf, NotifyNum: notifyNum, Name: fmt.Sprintf("channeltest rank %d channel to rank %d", e.rank, peer)}
}

// wait waits for notify idx of e within waitLimit.
func (e *end) wait(ctx context.Context, idx int) error {
	ctx, cancel := context.WithTimeout(ctx, waitLimit)
	defer cancel()
	return e.conn.Notifies[idx].WaitNow(ctx)
}

// pair is a connected channel: ends[0] is rank 0's, ends[1] rank 1's.
type pair struct {
	ends [2]*end
	name string // the Dialers' transport name

	closeOnce sync.Once
	closers   []func() // run in reverse order by close
}

// close closes the channel's ends, then the Dialers and the devices.
// Idempotent; the case's cleanup calls it too.
func (p *pair) close() {
	p.closeOnce.Do(func() {
		for i := len(p.closers) - 1; i >= 0; i-- {
			p.closers[i]()
		}
	})
}

// exchangePair returns the two ends of an Exchange carried by Go channels.
func exchangePair() (channel.Exchange, channel.Exchange) {
	ab, ba := make(chan []byte, 1), make(chan []byte, 1)
	mk := func(out, in chan []byte) channel.Exchange {
		return func(ctx context.Context, mine []byte) ([]byte, error) {
			select {
			case out <- mine:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			select {
			case theirs := <-in:
				return theirs, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	return mk(ab, ba), mk(ba, ab)
}

// connect makes two ends and connects them over cfg's Dialers. p.close,
// or the end of the case, closes the channel's ends, then the Dialers and
// the devices.
func connect(t TB, cfg Config) *pair {
	t.Helper()
	p := &pair{}
	t.Cleanup(p.close)
	p.ends = [2]*end{newEnd(t, p, 0), newEnd(t, p, 1)}
	d0, d1 := cfg.Dialers(t)
	p.name = d0.Name()
	p.closers = append(p.closers, func() {
		d0.Close()
		d1.Close()
	})
	ex0, ex1 := exchangePair()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	var err1 error
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.ends[1].conn, err1 = d1.Connect(ctx, p.ends[1].local(0), ex1)
	}()
	var err0 error
	p.ends[0].conn, err0 = d0.Connect(ctx, p.ends[0].local(1), ex0)
	<-done
	p.closers = append(p.closers, func() {
		for _, e := range p.ends {
			if e.conn != nil {
				e.conn.Transport.Close()
			}
		}
	})
	if err0 != nil || err1 != nil {
		t.Fatalf("connect: rank 0: %v; rank 1: %v", err0, err1)
	}
	return p
}

// fill fills b with seed's pseudo-random bytes: a block of 4093 (a prime:
// no chunk size of a transport is a multiple of it, so a misplaced chunk
// shows) repeated, doubled by copy so that large buffers fill fast.
func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 7))
	k := min(len(b), 4093)
	for i := range b[:k] {
		b[i] = byte(r.Uint32())
	}
	for k < len(b) {
		k += copy(b[k:], b[:k])
	}
}

// setAll sets every byte of b to v (by doubling copies: fast under the race
// detector too).
func setAll(b []byte, v byte) {
	if len(b) == 0 {
		return
	}
	b[0] = v
	for k := 1; k < len(b); k *= 2 {
		copy(b[k:], b[:k])
	}
}

// firstDiff returns the index of the first byte where got and want differ.
func firstDiff(got, want []byte) int {
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			return i
		}
	}
	return min(len(got), len(want))
}

// sameBytes fails t when got differs from want, naming what and where.
func sameBytes(t TB, what string, got, want []byte) bool {
	t.Helper()
	if bytes.Equal(got, want) {
		return true
	}
	i := firstDiff(got, want)
	t.Errorf("%s: %d bytes differ, the first at %d (got %#02x, want %#02x)", what, diffCount(got, want), i, at(got, i), at(want, i))
	return false
}

func diffCount(a, b []byte) int {
	n := 0
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			n++
		}
	}
	return n + max(len(a), len(b)) - min(len(a), len(b))
}

func at(b []byte, i int) int {
	if i < len(b) {
		return int(b[i])
	}
	return -1
}

// wantErr fails t unless err wraps sentinel.
func wantErr(t TB, what string, err, sentinel error) {
	t.Helper()
	switch {
	case err == nil:
		t.Errorf("%s: no error", what)
	case !errors.Is(err, sentinel):
		t.Errorf("%s: %v, want an error wrapping %q", what, err, sentinel)
	}
}
