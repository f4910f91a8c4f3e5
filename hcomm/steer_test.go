package hcomm_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/hcomm"
)

// TestChannelSteer: over tcp a steered write's bytes past keep land in the
// steer's memory and End reports it; over inproc and shm, whose peer
// stores itself, nothing is armed and the write lands where it was
// addressed. Bad arguments are ErrPara errors; a zero Steer, or one ended
// already, ends as unused.
func TestChannelSteer(t *testing.T) {
	const n, keep = 64 + 8<<10, 64
	for _, tr := range hcomm.Transports() {
		t.Run(tr, func(t *testing.T) {
			p := newPair(t, &hcomm.Config{BufferSize: 32 << 10, Name: "steer", Transport: tr})
			remote, _, err := p.comms[0].ChannelGetHcclBuffer(p.ch[0])
			if err != nil {
				t.Fatal(err)
			}
			src := make([]byte, n)
			for i := range src {
				src[i] = byte(i*13 + i/512)
			}
			if err := p.comms[0].Device().MemcpyHtoD(p.buf[0], src); err != nil {
				t.Fatal(err)
			}
			dev1 := p.comms[1].Device()
			to, err := dev1.Malloc(n - keep)
			if err != nil {
				t.Fatal(err)
			}
			defer dev1.Free(to)
			fill(t, p.comms[1], p.buf[1].Add(8<<10), n, 0)
			fill(t, p.comms[1], to, n-keep, 0)
			s, armed, err := hcomm.ChannelSteer(p.ch[1], p.buf[1].Add(8<<10), n, keep, to)
			if err != nil {
				t.Fatal(err)
			}
			if want := tr == hcomm.TransportTCP; armed != want {
				t.Fatalf("armed %v, want %v", armed, want)
			}
			if err := hcomm.WriteWithNotifyNbi(nil, p.ch[0], remote.Add(8<<10), p.buf[0], n, 2); err != nil {
				t.Fatal(err)
			}
			if err := hcomm.ChannelNotifyWait(nil, p.ch[1], 2, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			at := read(t, p.comms[1], p.buf[1].Add(8<<10), n)
			switch r := s.End(); {
			case armed && r != hcomm.SteerLanded:
				t.Fatalf("End = %v, want landed", r)
			case armed:
				if !bytes.Equal(at[:keep], src[:keep]) || !bytes.Equal(read(t, p.comms[1], to, n-keep), src[keep:]) {
					t.Fatal("a steered write's bytes are not where the steer put them")
				}
			case r != hcomm.SteerUnused:
				t.Fatalf("End of an unarmed steer = %v", r)
			default:
				if !bytes.Equal(at, src) {
					t.Fatal("the write's bytes are not where it was addressed")
				}
			}
			if r := s.End(); r != hcomm.SteerUnused {
				t.Fatalf("a second End = %v, want unused", r)
			}
			var zero hcomm.Steer
			if r := zero.End(); r != hcomm.SteerUnused {
				t.Fatalf("a zero Steer's End = %v", r)
			}
			for _, c := range []struct {
				name    string
				n, keep int64
				to      uint64
			}{{"keep past the write", n, n, uint64(to)}, {"negative keep", n, -1, uint64(to)}, {"empty write", 0, 0, uint64(to)}, {"to outside the device's memory", n, keep, 8}} {
				_, armed, err := hcomm.ChannelSteer(p.ch[1], p.buf[1].Add(8<<10), c.n, c.keep, to.Add(int64(c.to)-int64(to)))
				if armed || !errors.Is(err, hcomm.ErrPara) {
					t.Errorf("%s: armed %v, error %v; want an ErrPara error", c.name, armed, err)
				}
			}
		})
	}
}
