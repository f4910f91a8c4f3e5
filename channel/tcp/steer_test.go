package tcp

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
)

// writeFrameBytes returns a WRITE of data at addr as the transport sends one
// on a channel of one socket: no ordering vector, padded (dataPad).
func writeFrameBytes(addr uint64, data []byte) []byte {
	pad := dataPad(0, len(data))
	h := make(header, headerLen)
	h.encode(frameWrite, 0, 0, uint32(pad+len(data)), 0, addr, 0)
	h[3] = byte(pad)
	b := append([]byte(h), make([]byte, pad)...)
	return append(b, data...)
}

// notifyFrameBytes returns the NOTIFY of idx whose ordering vector counts
// frames frames sent before it on the one socket.
func notifyFrameBytes(idx, frames uint64) []byte {
	h := make(header, headerLen)
	h.encode(frameNotify, 0, 0, 8, idx, 0, 0)
	v := make([]byte, 8)
	for i := 0; i < 8; i++ {
		v[7-i] = byte(frames >> (8 * i))
	}
	return append([]byte(h), v...)
}

// steerCase is a raw peer and rank 1's end of its channel, with a write of
// n bytes at rank 1's buffer + off to steer, keep of them kept, the rest
// going to a second range of rank 1's memory (to).
type steerCase struct {
	rp     *rawPeer
	c      *conn
	mem    []byte // rank 1's registered buffer
	to     []byte
	at     device.Ptr
	n      int
	keep   int
	data   []byte
	frames uint64 // frames the raw peer sent
}

func newSteerCase(t *testing.T, n, keep int) *steerCase {
	rp := connectRaw(t, Options{})
	p, err := rp.r1.dev.Malloc(int64(n - keep))
	if err != nil {
		t.Fatal(err)
	}
	to, err := rp.r1.dev.Bytes(p, int64(n-keep))
	if err != nil {
		t.Fatal(err)
	}
	sc := &steerCase{rp: rp, c: rp.c1.Transport.(*conn), mem: rp.r1.bytes(t), to: to, at: rp.r1.buf.Addr + 512, n: n, keep: keep}
	clear(sc.mem)
	clear(sc.to)
	sc.data = make([]byte, n)
	fill(sc.data, uint64(n))
	return sc
}

// send writes frames to rank 1 in one system call, counting them.
func (sc *steerCase) send(t *testing.T, frames ...[]byte) {
	t.Helper()
	if _, err := sc.rp.nc.Write(bytes.Join(frames, nil)); err != nil {
		t.Fatal(err)
	}
	sc.frames += uint64(len(frames))
}

// wait waits for rank 1's notify 1.
func (sc *steerCase) wait(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := sc.rp.c1.Notifies[1].WaitNow(ctx); err != nil {
		t.Fatal(err)
	}
}

func (sc *steerCase) arm(t *testing.T) channel.Steered {
	t.Helper()
	s, ok := sc.c.Steer(sc.at, int64(sc.n), int64(sc.keep), sc.to)
	if !ok {
		t.Fatal("Steer refused a valid steer")
	}
	return s
}

// check checks that the write's first keep bytes are at at and the rest in
// to, or, when !steered, all of them at at.
func (sc *steerCase) check(t *testing.T, steered bool) {
	t.Helper()
	off := int(sc.at - sc.rp.r1.buf.Addr)
	got := sc.mem[off : off+sc.n]
	if !steered {
		if !bytes.Equal(got, sc.data) {
			t.Error("an unsteered write's bytes are not where it was addressed")
		}
		return // to may hold a guess's bytes (Steerer.Steer)
	}
	if !bytes.Equal(got[:sc.keep], sc.data[:sc.keep]) {
		t.Error("a steered write's kept bytes are not where it was addressed")
	}
	if !bytes.Equal(got[sc.keep:], make([]byte, sc.n-sc.keep)) {
		t.Error("a steered write stored its payload where it was addressed too")
	}
	if !bytes.Equal(sc.to, sc.data[sc.keep:]) {
		t.Error("a steered write's payload is not in the steer's memory")
	}
}

// viaBuffer reports whether the steered write's payload passed through the
// socket's read buffer (the engine's copy) rather than straight into the
// steer's memory (a guess that hit).
func (sc *steerCase) viaBuffer() bool {
	s := sc.c.socks[0]
	s.rtok.Lock()
	defer s.rtok.Unlock()
	return bytes.Contains(s.rx.buf, sc.data[sc.keep:sc.keep+4096])
}

// A write armed for lands past keep in the steer's memory, read into it
// by the guessing read (readSteered) or, behind another frame in the same
// read, by the engine's copy (take); a write that came before the steer,
// or of another length, lands where it was addressed.
func TestSteer(t *testing.T) {
	const n, keep = 64 + 20<<10, 64
	t.Run("alone", func(t *testing.T) {
		sc := newSteerCase(t, n, keep)
		s := sc.arm(t)
		sc.send(t, writeFrameBytes(uint64(sc.at), sc.data))
		sc.send(t, notifyFrameBytes(1, sc.frames))
		sc.wait(t)
		if r := s.End(); r != channel.SteerLanded {
			t.Fatalf("End = %v, want landed", r)
		}
		sc.check(t, true)
		if sc.viaBuffer() {
			t.Error("the payload went through the read buffer: the guessing read missed a write it should have hit")
		}
	})
	t.Run("behind another frame", func(t *testing.T) {
		sc := newSteerCase(t, n, keep)
		s := sc.arm(t)
		other := writeFrameBytes(uint64(sc.rp.r1.buf.Addr)+40000, []byte("another frame first"))
		sc.send(t, other, writeFrameBytes(uint64(sc.at), sc.data), notifyFrameBytes(1, sc.frames+2))
		sc.wait(t)
		if r := s.End(); r != channel.SteerLanded {
			t.Fatalf("End = %v, want landed", r)
		}
		sc.check(t, true)
		if !sc.viaBuffer() {
			t.Error("the payload did not go through the read buffer: this test does not test the engine's copy")
		}
		if string(sc.mem[40000:40019]) != "another frame first" {
			t.Errorf("the frame before the steered write holds %q", sc.mem[40000:40019])
		}
	})
	t.Run("a guess that misses", func(t *testing.T) {
		// A long write elsewhere first, alone in the socket: the read
		// guessing the steered write puts its bytes into the steer's
		// memory, and must move them back.
		sc := newSteerCase(t, n, keep)
		s := sc.arm(t)
		long := make([]byte, 30<<10)
		fill(long, 7)
		sc.send(t, writeFrameBytes(uint64(sc.rp.r1.buf.Addr)+30000, long), notifyFrameBytes(1, sc.frames+1))
		sc.wait(t)
		if !bytes.Equal(sc.mem[30000:30000+len(long)], long) {
			t.Fatal("a write read by a guess that missed is not where it was addressed")
		}
		sc.send(t, writeFrameBytes(uint64(sc.at), sc.data), notifyFrameBytes(1, sc.frames+1))
		sc.wait(t)
		if r := s.End(); r != channel.SteerLanded {
			t.Fatalf("End = %v, want landed", r)
		}
		sc.check(t, true)
	})
	t.Run("arrived before", func(t *testing.T) {
		sc := newSteerCase(t, n, keep)
		sc.send(t, writeFrameBytes(uint64(sc.at), sc.data), notifyFrameBytes(1, sc.frames+1))
		sc.wait(t)
		s := sc.arm(t)
		if r := s.End(); r != channel.SteerUnused {
			t.Fatalf("End = %v, want unused", r)
		}
		sc.check(t, false)
	})
	t.Run("another length", func(t *testing.T) {
		sc := newSteerCase(t, n, keep)
		s := sc.arm(t)
		sc.data = sc.data[:n-8]
		sc.n = n - 8
		sc.send(t, writeFrameBytes(uint64(sc.at), sc.data), notifyFrameBytes(1, sc.frames+1))
		sc.wait(t)
		if r := s.End(); r != channel.SteerUnused {
			t.Fatalf("End = %v, want unused", r)
		}
		sc.check(t, false)
	})
}

// A steer given up on while its write is half in reports cut, and what
// arrives of the write after End stays out of the steer's memory; the
// slot is free again once the write is over.
func TestSteerEndWhileHalfIn(t *testing.T) {
	const n, keep = 64 + 32<<10, 64
	sc := newSteerCase(t, n, keep)
	s := sc.arm(t)
	frame := writeFrameBytes(uint64(sc.at), sc.data)
	half := len(frame) - 16<<10
	sc.send(t, frame[:half])
	deadline := time.Now().Add(5 * time.Second)
	for sc.to[len(sc.to)-16<<10-1] == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond) // until the first half is in
	}
	if r := s.End(); r != channel.SteerCut {
		t.Fatalf("End = %v, want cut", r)
	}
	if _, err := sc.rp.nc.Write(frame[half:]); err != nil {
		t.Fatal(err)
	}
	sc.send(t, notifyFrameBytes(1, 1))
	sc.wait(t)
	if tail := sc.to[len(sc.to)-16<<10:]; !bytes.Equal(tail, make([]byte, len(tail))) {
		t.Fatal("bytes of the write reached the steer's memory after End")
	}
	for i := 0; i < maxSteers; i++ {
		s, ok := sc.c.Steer(sc.at, int64(n), int64(keep), sc.to)
		if !ok {
			t.Fatalf("steer %d refused: the cut steer's slot was not freed", i)
		}
		defer s.End()
	}
}

// A steer whose socket fails with its write half in reports cut.
func TestSteerCutBySocket(t *testing.T) {
	const n, keep = 64 + 32<<10, 64
	sc := newSteerCase(t, n, keep)
	s := sc.arm(t)
	frame := writeFrameBytes(uint64(sc.at), sc.data)
	sc.send(t, frame[:len(frame)/2])
	deadline := time.Now().Add(5 * time.Second)
	for sc.to[0] == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	sc.rp.nc.Close()
	for sc.c.failure() == nil && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	for s.(*steer).state.Load() == steerTaken && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond) // the reader's abandon
	}
	if r := s.End(); r != channel.SteerCut {
		t.Fatalf("End = %v, want cut", r)
	}
}

// Steer refuses what it cannot do — a range outside the registered memory,
// a keep outside the write, a to of the wrong length, a full table — and
// a slot comes back once its steer is ended.
func TestSteerRefuses(t *testing.T) {
	sc := newSteerCase(t, 64+8<<10, 64)
	c := sc.c
	for _, bad := range []struct {
		name    string
		at      device.Ptr
		n, keep int64
		to      []byte
	}{
		{"outside the registered memory", sc.rp.r1.buf.Addr + 1<<16 - 100, 64 + 8<<10, 64, sc.to},
		{"keep past the write", sc.at, 64 + 8<<10, 64 + 8<<10, nil},
		{"negative keep", sc.at, 64 + 8<<10, -1, sc.to},
		{"to of the wrong length", sc.at, 64 + 8<<10, 64, sc.to[1:]},
	} {
		if _, ok := c.Steer(bad.at, bad.n, bad.keep, bad.to); ok {
			t.Errorf("%s: armed", bad.name)
		}
	}
	var all []channel.Steered
	for i := 0; i < maxSteers; i++ {
		s, ok := c.Steer(sc.at, int64(sc.n), int64(sc.keep), sc.to)
		if !ok {
			t.Fatalf("steer %d of %d refused", i, maxSteers)
		}
		all = append(all, s)
	}
	if _, ok := c.Steer(sc.at, int64(sc.n), int64(sc.keep), sc.to); ok {
		t.Fatal("a steer past the table's size was armed")
	}
	if r := all[0].End(); r != channel.SteerUnused {
		t.Fatalf("End = %v, want unused", r)
	}
	if c.nsteer.Load() != maxSteers-1 {
		t.Fatalf("%d steers counted armed, want %d", c.nsteer.Load(), maxSteers-1)
	}
	s, ok := c.Steer(sc.at, int64(sc.n), int64(sc.keep), sc.to)
	if !ok {
		t.Fatal("an ended steer's slot was not freed")
	}
	s.End()
	for _, s := range all[1:] {
		s.End()
	}
	if c.nsteer.Load() != 0 {
		t.Fatalf("%d steers counted armed after all ended", c.nsteer.Load())
	}
}
