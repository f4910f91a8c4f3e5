//go:build linux

package shm

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

func TestHelloRoundTrip(t *testing.T) {
	h := &hello{HostID: "host boot 123", PID: 42, Rank: 3, Peer: 5, Listen: true, Addr: "hcomm-shm-42-abc"}
	copy(h.Secret[:], "0123456789abcdef")
	got, err := decodeHello(h.encode())
	if err != nil || !reflect.DeepEqual(got, h) {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	b := h.encode()
	for i := 0; i < len(b); i++ {
		if _, err := decodeHello(b[:i]); err == nil {
			t.Fatalf("a hello cut to %d of %d bytes decoded", i, len(b))
		}
	}
	if _, err := decodeHello(append(b, 0)); err == nil {
		t.Fatal("a hello with a trailing byte decoded")
	}
}

func TestMsgRoundTrip(t *testing.T) {
	for _, m := range []*msg{
		{Type: msgAuth, Secret: [secretLen]byte{1, 2, 3}},
		{Type: msgMems, Mems: []memEntry{{Addr: 0x1000, Size: 10, Offset: 4096, FD: 0, Tag: "hccl buffer"}, {Addr: 5, FD: noFD}}},
		{Type: msgDone, Total: 2, Notify: 3},
		{Type: msgReady},
		{Type: msgReady, Flags: readyReads},
		{Type: msgReady, Flags: readyReads | readyFiles},
		{Type: msgRefuse, Text: "no"},
		{Type: msgBye},
	} {
		nfd := 0
		if m.Type == msgMems || m.Type == msgDone {
			nfd = 1
		}
		got, err := decodeMsg(m.encode(), nfd)
		if err != nil || !reflect.DeepEqual(got, m) {
			t.Fatalf("%v: %+v, %v", m.Type, got, err)
		}
	}
	// A READY with a flag this version does not know is refused.
	if _, err := decodeMsg([]byte{byte(msgReady), 0x80}, 0); err == nil || !strings.Contains(err.Error(), "unknown flags") {
		t.Fatalf("READY with an unknown flag: %v", err)
	}
	// Descriptor counts must match what the message says.
	if _, err := decodeMsg((&msg{Type: msgReady}).encode(), 1); err == nil {
		t.Fatal("READY with a descriptor decoded")
	}
	if _, err := decodeMsg((&msg{Type: msgDone, Total: 1, Notify: 1}).encode(), 0); err == nil {
		t.Fatal("DONE with notifies but no descriptor decoded")
	}
	two := &msg{Type: msgMems, Mems: []memEntry{{Addr: 0x1000, Size: 1, FD: 0}, {Addr: 0x2000, Size: 1, FD: 0}}}
	if _, err := decodeMsg(two.encode(), 2); err == nil {
		t.Fatal("one descriptor for two ranges decoded")
	}
}

// FuzzDecodeHello: any bytes decode or fail; never a panic; what decodes
// encodes back to the same bytes. Seeds: a valid hello, a cut one, garbage.
func FuzzDecodeHello(f *testing.F) {
	h := &hello{HostID: "h", PID: 1, Rank: 0, Peer: 1, Listen: true, Addr: "a"}
	f.Add(h.encode())
	f.Add(h.encode()[:10])
	f.Add([]byte("hcshm\x02"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := decodeHello(b)
		if err != nil {
			return
		}
		if !bytes.Equal(got.encode(), b) {
			t.Fatalf("decoded hello %+v encodes to other bytes", got)
		}
	})
}

// FuzzDecodeMsg: the same for socket messages, with any descriptor count.
// Seeds: one message of each type.
func FuzzDecodeMsg(f *testing.F) {
	f.Add((&msg{Type: msgAuth}).encode(), 0)
	f.Add((&msg{Type: msgMems, Mems: []memEntry{{Addr: 0x1000, Size: 10, Offset: 4096, FD: 0, Tag: "t"}}}).encode(), 1)
	f.Add((&msg{Type: msgDone, Total: 1, Notify: 2}).encode(), 1)
	f.Add((&msg{Type: msgRefuse, Text: "why"}).encode(), 0)
	f.Add([]byte{byte(msgBye)}, 0)
	f.Add([]byte{99}, 0)
	f.Fuzz(func(t *testing.T, b []byte, nfd int) {
		m, err := decodeMsg(b, nfd)
		if err != nil {
			return
		}
		if !bytes.Equal(m.encode(), b) {
			t.Fatalf("decoded %+v encodes to other bytes", m)
		}
		for _, e := range m.Mems {
			if e.Size > 0 && int(e.FD) >= nfd {
				t.Fatalf("entry %+v names a descriptor that did not come", e)
			}
		}
	})
}
