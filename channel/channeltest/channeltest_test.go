package channeltest

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/channel/inproc"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/leakcheck"
	"github.com/hcomm-dev/hcomm/internal/reduce"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// recorder is a TB that keeps a case's failures instead of failing the
// test, so that the suite's own tests can check that a case fails.
type recorder struct {
	mu       sync.Mutex
	errs     []string
	cleanups []func()
}

func (r *recorder) Helper() {}

func (r *recorder) Cleanup(f func()) {
	r.mu.Lock()
	r.cleanups = append(r.cleanups, f)
	r.mu.Unlock()
}

func (r *recorder) Logf(string, ...any) {}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
	r.mu.Unlock()
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}

// runCase runs one case of the suite on a recorder and returns its failures.
func runCase(name string, cfg Config) []string {
	r := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			for i := len(r.cleanups) - 1; i >= 0; i-- {
				r.cleanups[i]()
			}
		}()
		for _, c := range cases {
			if c.name == name {
				c.run(r, cfg)
				return
			}
		}
		r.Errorf("no case %q", name)
	}()
	<-done
	return r.errs
}

// brokenDialer is an inproc Dialer whose transports break one rule of the
// contract: wrap replaces each end's transport.
type brokenDialer struct {
	*inproc.Dialer
	wrap func(t *brokenTransport)

	mu     sync.Mutex
	locals map[int]*channel.Local // by rank: the peer's memory, for unchecked copies
}

func (d *brokenDialer) Connect(ctx context.Context, l *channel.Local, ex channel.Exchange) (*channel.Conn, error) {
	func() {
		d.mu.Lock()
		defer d.mu.Unlock() // a nil l panics here: NilArguments recovers and calls again
		d.locals[l.Rank] = l
	}()
	c, err := d.Dialer.Connect(ctx, l, ex)
	if err != nil {
		return nil, err
	}
	bt := &brokenTransport{Transport: c.Transport, d: d, peer: l.Peer, conn: c}
	d.wrap(bt)
	c.Transport = bt
	return c, nil
}

// brokenTransport is an inproc transport with some methods replaced.
type brokenTransport struct {
	channel.Transport
	d    *brokenDialer
	peer int
	conn *channel.Conn

	write        func(dst device.Ptr, src []byte) error
	readReduce   func(dst []byte, src device.Ptr, count int, dt reduce.DataType, op reduce.Op) error
	notifyRecord func(idx int) error
	read         func(dst []byte, src device.Ptr) error
	fence        func() error
	close        func() error
	writeFlagged func(dst device.Ptr, src []byte, flag uint32) error
	checks       bool // what ChecksOnReceipt says
}

// ChecksOnReceipt says what the broken transport was told to
// (channel.ReceiverChecker).
func (b *brokenTransport) ChecksOnReceipt() bool { return b.checks }

func (b *brokenTransport) WriteFlagged(stop <-chan struct{}, dst device.Ptr, src []byte, flag uint32) error {
	if b.writeFlagged != nil {
		return b.writeFlagged(dst, src, flag)
	}
	return b.Transport.(channel.FlagWriter).WriteFlagged(stop, dst, src, flag)
}

func (b *brokenTransport) WriteLine(stop <-chan struct{}, dst device.Ptr, src []byte, flag uint32) error {
	return b.Transport.(channel.FlagWriter).WriteLine(stop, dst, src, flag)
}

func (b *brokenTransport) PrepareLine(dst device.Ptr) (channel.LinePut, error) {
	return b.Transport.(channel.FlagWriter).PrepareLine(dst)
}

func (b *brokenTransport) Write(stop <-chan struct{}, dst device.Ptr, src []byte) error {
	if b.write != nil {
		return b.write(dst, src)
	}
	return b.Transport.Write(stop, dst, src)
}

func (b *brokenTransport) Read(stop <-chan struct{}, dst []byte, src device.Ptr) error {
	if b.read != nil {
		return b.read(dst, src)
	}
	return b.Transport.Read(stop, dst, src)
}

func (b *brokenTransport) ReadReduce(stop <-chan struct{}, dst []byte, src device.Ptr, count int, dt reduce.DataType, op reduce.Op) error {
	if b.readReduce != nil {
		return b.readReduce(dst, src, count, dt, op)
	}
	return b.Transport.ReadReduce(stop, dst, src, count, dt, op)
}

func (b *brokenTransport) NotifyRecord(stop <-chan struct{}, idx int) error {
	if b.notifyRecord != nil {
		return b.notifyRecord(idx)
	}
	return b.Transport.NotifyRecord(stop, idx)
}

func (b *brokenTransport) Fence(stop <-chan struct{}) error {
	if b.fence != nil {
		return b.fence()
	}
	return b.Transport.Fence(stop)
}

func (b *brokenTransport) Close() error {
	if b.close != nil {
		return b.close()
	}
	return b.Transport.Close()
}

// peerBytes returns the peer's device memory at [p, p+n) without asking
// whether the peer registered it.
func (b *brokenTransport) peerBytes(p device.Ptr, n int) ([]byte, error) {
	b.d.mu.Lock()
	l := b.d.locals[b.peer]
	b.d.mu.Unlock()
	return l.Device.Bytes(p, int64(n))
}

func brokenConfig(wrap func(t *brokenTransport)) Config {
	return Config{Dialers: func(TB) (channel.Dialer, channel.Dialer) {
		d := &brokenDialer{Dialer: inproc.NewDialer(inproc.NewFabric()), wrap: wrap, locals: map[int]*channel.Local{}}
		return d, d
	}}
}

// TestCasesCanFail runs each case over inproc, where it passes, and over an
// inproc transport that breaks the rule the case is about, where it must
// fail.
func TestCasesCanFail(t *testing.T) {
	good := Config{Dialers: func(TB) (channel.Dialer, channel.Dialer) {
		d := inproc.NewDialer(inproc.NewFabric())
		return d, d
	}, Closes: true, Goodbye: true}
	for _, c := range []struct {
		name   string
		broken Config
		want   string // in one of the failures
	}{
		{"Connect", brokenConfig(func(t *brokenTransport) { t.conn.PeerNotifyNum-- }), "notifies"},
		{"RoundTrips", brokenConfig(func(t *brokenTransport) {
			// A read-reduce that only reads.
			t.readReduce = func(dst []byte, src device.Ptr, _ int, _ reduce.DataType, _ reduce.Op) error {
				return t.Transport.Read(nil, dst, src)
			}
		}), "read-reduce"},
		{"VisibilityAfterNotify", brokenConfig(lateWrites), "overtook a write"},
		{"Ordering", brokenConfig(heldWrites), "a Read right after a Write"},
		{"ConcurrentThreads", brokenConfig(sharedStaging), "of its region is"},
		{"RangeRefusals", brokenConfig(func(t *brokenTransport) {
			// Writes and reads that do not check what the peer registered.
			t.write = func(dst device.Ptr, src []byte) error {
				b, err := t.peerBytes(dst, len(src))
				if err == nil {
					copy(b, src)
				}
				return err
			}
			t.read = func(dst []byte, src device.Ptr) error {
				b, err := t.peerBytes(src, len(dst))
				if err == nil {
					copy(dst, b)
				}
				return err
			}
		}), "neither the call nor the Fence"},
		{"CheckedOnReceipt", brokenConfig(func(t *brokenTransport) {
			// Says its peer checks writes on receipt, and writes unchecked.
			t.checks = true
			t.write = func(dst device.Ptr, src []byte) error {
				b, err := t.peerBytes(dst, len(src))
				if err == nil {
					copy(b, src)
				}
				return err
			}
		}), "neither the call nor the Fence"},
		{"Close", func() Config {
			cfg := brokenConfig(endsNothing) // a Close that ends nothing
			cfg.Closes, cfg.LossWithin = true, 200*time.Millisecond
			return cfg
		}(), "after Close: no error"},
		{"Close", func() Config {
			cfg := brokenConfig(endsNothing)
			cfg.Goodbye, cfg.LossWithin = true, 200*time.Millisecond
			return cfg
		}(), "did not end within"},
		{"Flagged", brokenConfig(flagsFirst), "a word of another round"},
		{"NilArguments", brokenConfig(func(*brokenTransport) {}), "panicked"}, // its Connect reads the Local first
		{"PeerLoss", func() Config {
			cfg := brokenConfig(func(*brokenTransport) {})
			cfg.Lose, cfg.LossWithin = func(TB, channel.Transport) {}, 200*time.Millisecond // a loss nobody notices
			return cfg
		}(), "did not end within"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if errs := runCase(c.name, good); len(errs) != 0 {
				t.Fatalf("inproc fails the case:\n%s", strings.Join(errs, "\n"))
			}
			errs := runCase(c.name, c.broken)
			if len(errs) == 0 {
				t.Fatalf("a transport that breaks the rule passes the case")
			}
			if !strings.Contains(strings.Join(errs, "\n"), c.want) {
				t.Fatalf("the case fails, but does not say %q:\n%s", c.want, strings.Join(errs, "\n"))
			}
			t.Logf("broken transport: %s", errs[0])
		})
	}
}

// endsNothing makes Close do nothing: the closed end keeps working and the
// peer never learns of it.
func endsNothing(t *brokenTransport) { t.close = func() error { return nil } }

// lateWrites makes Write return before its bytes land: they are copied a
// 20 ms later, while NotifyRecord takes effect at once.
func lateWrites(t *brokenTransport) {
	var wg sync.WaitGroup
	t.write = func(dst device.Ptr, src []byte) error {
		b, err := t.peerBytes(dst, len(src))
		if err != nil {
			return err
		}
		p := append([]byte(nil), src...)
		wg.Add(1)
		time.AfterFunc(20*time.Millisecond, func() {
			defer wg.Done()
			copy(b, p)
		})
		return nil
	}
	t.close = func() error {
		wg.Wait()
		return t.Transport.Close()
	}
}

// flagsFirst makes flagged writes land flags before data: the words are
// stored with the flag and zero data, the data 20 ms later.
func flagsFirst(t *brokenTransport) {
	var wg sync.WaitGroup
	t.writeFlagged = func(dst device.Ptr, src []byte, flag uint32) error {
		b, err := t.peerBytes(dst, 2*len(src))
		if err != nil {
			return err
		}
		channel.PutFlagged(b, make([]byte, len(src)), flag)
		p := append([]byte(nil), src...)
		wg.Add(1)
		time.AfterFunc(20*time.Millisecond, func() {
			defer wg.Done()
			channel.PutFlagged(b, p, flag)
		})
		return nil
	}
	t.close = func() error {
		wg.Wait()
		return t.Transport.Close()
	}
}

// heldWrites keeps writes until the next NotifyRecord or Fence: a record
// still follows the writes before it, but a Read does not see them.
func heldWrites(t *brokenTransport) {
	var held []func()
	flush := func() {
		for _, f := range held {
			f()
		}
		held = nil
	}
	t.write = func(dst device.Ptr, src []byte) error {
		b, err := t.peerBytes(dst, len(src))
		if err != nil {
			return err
		}
		p := append([]byte(nil), src...)
		held = append(held, func() { copy(b, p) })
		return nil
	}
	t.notifyRecord = func(idx int) error {
		flush()
		return t.Transport.NotifyRecord(nil, idx)
	}
	t.fence = func() error {
		flush()
		return nil
	}
}

// sharedStaging stages every write in one buffer shared by the callers,
// locked for the copy in and the copy out but not in between: concurrent
// writes overwrite each other's staged bytes.
func sharedStaging(t *brokenTransport) {
	var mu sync.Mutex
	var stage []byte
	t.write = func(dst device.Ptr, src []byte) error {
		b, err := t.peerBytes(dst, len(src))
		if err != nil {
			return err
		}
		mu.Lock()
		stage = append(stage[:0], src...)
		mu.Unlock()
		time.Sleep(time.Millisecond)
		mu.Lock()
		copy(b, stage)
		mu.Unlock()
		return nil
	}
}
