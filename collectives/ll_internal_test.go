package collectives

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
)

// Which pairs' hellos travel as lines: inproc and shm channels in
// communicators of up to helloFullMax ranks whose hello slots are mapped in
// place, by default; not tcp, not above helloFullMax ranks (the butterfly's
// hellos), not with copied device views, not with HCOMM_LL=0.
func TestFlaggedPairs(t *testing.T) {
	on := map[string]string{"HCOMM_LL": "1"}
	for _, c := range []struct {
		name string
		tr   hcommtest.Transport
		n    int
		env  map[string]string
		want bool
	}{
		{"inproc", hcommtest.Inproc, 2, on, true},
		{"shm", hcommtest.Shm, 3, on, true},
		{"tcp", hcommtest.TCP, 2, on, false},
		{"ranks=9", hcommtest.Inproc, 9, on, false},
		{"default", hcommtest.Inproc, 2, nil, true},
		{"shm default", hcommtest.Shm, 2, nil, true},
		{"HCOMM_LL=0", hcommtest.Inproc, 2, map[string]string{"HCOMM_LL": "0"}, false},
		{"copied views", hcommtest.Inproc, 2, map[string]string{"HCOMM_LL": "1", "HCOMM_DEVICE_VIEW": "copy"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			o := hcommtest.Options{Config: &hcomm.Config{BufferSize: 1 << 20}}
			o.Run(t, c.n, c.tr, func(t testing.TB, comm *hcomm.Comm) {
				v := []float32{1}
				if err := AllReduceSlice(context.Background(), comm, v, v, hcomm.Sum, nil); err != nil {
					t.Fatal(err)
				}
				if v[0] != float32(c.n) {
					t.Fatalf("all-reduce gave %v, want %d", v[0], c.n)
				}
				st, err := getState(comm)
				if err != nil {
					t.Fatal(err)
				}
				st.mu.Lock()
				defer st.mu.Unlock()
				for p := range comm.Size() {
					if p == comm.Rank() || st.chans[p] == nil {
						continue
					}
					if got := st.flagged(p); got != c.want {
						t.Errorf("rank %d: the hellos with rank %d flagged: %v, want %v", comm.Rank(), p, got, c.want)
					}
				}
			})
		})
	}
}

// A hello's line: a header that fits (no window, no counts digest, a count
// below 2^32, a root of 16 bits, up to 255 ranks) and up to lineInline bytes
// of payload pack into one line and unpack into the bytes header.encode
// writes and the payload; any other header or a longer payload does not
// pack (the line is untouched: the full form goes instead), and a full
// line unpacks as its header. A hostile line's payload length is bounded by
// the line: unpacking never reads or writes past it.
func TestPackLine(t *testing.T) {
	fits := []header{
		{kind: kAllReduce, dt: hcomm.Float32, op: hcomm.Sum, flags: flagOp, algo: AlgoOneShot, count: 4, seq: 1<<63 + 5, from: 1, size: 2},
		{kind: kBroadcast, dt: hcomm.Int8, flags: flagRoot, root: 32767, count: 1<<32 - 1, seq: 3, from: 255, size: 255},
		{kind: kReduce, dt: hcomm.Float64, op: hcomm.Max, flags: flagOp | flagRoot, root: -32768, algo: AlgoRing, seq: 9, from: 0, size: 8},
		{kind: kBarrier, seq: 1, from: 3, size: 4},
	}
	for i, h := range fits {
		for _, n := range []int{0, 1, 16, lineInline} {
			want := make([]byte, headerSize+lineInline)
			h.encode(want)
			payload := make([]byte, n)
			for k := range payload {
				payload[k] = byte(i*31 + k + 1)
			}
			copy(want[headerSize:], payload)
			var line [channel.LineData]byte
			if !packLine(line[:], want[:headerSize], payload) {
				t.Fatalf("header %d (%+v) with %d bytes did not pack", i, h, n)
			}
			got := bytes.Repeat([]byte{0xee}, headerSize+lineInline)
			copy(got[headerSize+n:], want[headerSize+n:]) // beyond the payload: not the line's
			unpackLine(got, line[:])
			if !bytes.Equal(got, want) {
				t.Fatalf("header %d, %d bytes: unpacked\n%x\nwant\n%x", i, n, got, want)
			}
		}
	}
	base := fits[0]
	var hdr [headerSize]byte
	base.encode(hdr[:])
	for _, c := range []struct {
		what string
		h    func(h *header)
		n    int
	}{
		{"a payload past the line", func(*header) {}, lineInline + 1},
		{"a window", func(h *header) { h.flags |= flagWindow; h.win = 1; h.woff = 64 }, 4},
		{"a counts digest", func(h *header) { h.extra = 77 }, 4},
		{"a count of 2^32", func(h *header) { h.count = 1 << 32 }, 4},
		{"a root past 16 bits", func(h *header) { h.root = 40000 }, 4},
		{"rank 256", func(h *header) { h.from = 256; h.size = 300 }, 4},
	} {
		h := base
		c.h(&h)
		var b [headerSize]byte
		h.encode(b[:])
		var line [channel.LineData]byte
		if packLine(line[:], b[:], make([]byte, c.n)) {
			t.Errorf("%s: packed", c.what)
		}
		if line != [channel.LineData]byte{} {
			t.Errorf("%s: the line was written", c.what)
		}
		// The full form: the header as it is.
		copy(line[:], b[:])
		got := make([]byte, headerSize+lineInline)
		unpackLine(got, line[:])
		if !bytes.Equal(got[:headerSize], b[:]) {
			t.Errorf("%s: the full line unpacked as %x, want %x", c.what, got[:headerSize], b[:])
		}
	}
	// A hostile compact line says 255 bytes of payload: lineInline are
	// taken, the slot's bytes after them untouched.
	var line [channel.LineData]byte
	if !packLine(line[:], hdr[:], []byte{1, 2, 3}) {
		t.Fatal("did not pack")
	}
	line[18] = 255
	slot := bytes.Repeat([]byte{0xee}, headerSize+lineInline+8)
	unpackLine(slot, line[:])
	if !bytes.Equal(slot[headerSize+lineInline:], bytes.Repeat([]byte{0xee}, 8)) {
		t.Errorf("a line saying 255 bytes wrote past its payload: %x", slot[headerSize+lineInline:])
	}
}

// sameLine: a peer's compact line of the same call from rank from matches
// this rank's; one byte changed anywhere in the packed header — or the
// sender not the one expected, or a full line — does not.
func TestSameLine(t *testing.T) {
	h := header{kind: kAllReduce, dt: hcomm.Float32, op: hcomm.Sum, flags: flagOp, algo: AlgoOneShot, count: 4, seq: 99, from: 0, size: 3}
	var mine, theirs [channel.LineData]byte
	if !packHeader(mine[:], h, make([]byte, 16)) {
		t.Fatal("did not pack")
	}
	h.from = 2
	if !packHeader(theirs[:], h, []byte("sixteen bytes!!!")) {
		t.Fatal("did not pack")
	}
	if !sameLine(mine[:], theirs[:], 2) {
		t.Fatal("the same call from rank 2 does not match")
	}
	if sameLine(mine[:], theirs[:], 1) {
		t.Error("a line from rank 2 passes for rank 1's")
	}
	for i := 0; i < lineHeader; i++ {
		if i == 6 {
			continue
		}
		other := theirs
		other[i] ^= 0x10
		if sameLine(mine[:], other[:], 2) {
			t.Errorf("byte %d changed: still the same call", i)
		}
	}
	var full [channel.LineData]byte
	h.encode(full[:])
	if sameLine(mine[:], full[:], 2) {
		t.Error("a full line passes for a compact one")
	}
}

// The lane's inline poll: HCOMM_HELLO_POLL's bound when set, helloPoll by
// default; with more processes here than cores (envHelloPoll's -1 when
// unset) it looks once — unless the hellos are lines, whose poll yields the
// core between looks (laneYieldPoll); HCOMM_HELLO_POLL=off looks once
// whatever the hellos; the host-slice layer polls for slicePoll.
func TestLanePoll(t *testing.T) {
	for _, c := range []struct {
		name    string
		poll    time.Duration
		set, ll bool
		slices  bool
		want    time.Duration
	}{
		{"default", 0, false, true, false, helloPoll},
		{"set", 20 * time.Microsecond, true, true, false, 20 * time.Microsecond},
		{"oversubscribed, lines", -1, false, true, false, laneYieldPoll},
		{"oversubscribed, notifies", -1, false, false, false, 0},
		{"off", -1, true, true, false, 0},
		{"slices", -1, true, true, true, slicePoll},
	} {
		st := &state{helloPoll: c.poll, pollSet: c.set, ll: c.ll}
		if got := st.lanePoll(c.slices); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
