package collectives_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
)

// TestSymWin: HCCL's symmetric-window calls. A window registered by every
// rank is found again from a pointer inside it; the peer's pointer is this
// process's address of the peer's bytes over inproc, and ErrNotSupport over
// shm and tcp; a deregistered window is neither found nor pointed into.
func TestSymWin(t *testing.T) {
	const size = 4096
	pattern := func(r int) []byte {
		b := make([]byte, size)
		for i := range b {
			b[i] = byte(i*7 + r*13)
		}
		return b
	}
	for _, tr := range []hcommtest.Transport{hcommtest.Inproc, hcommtest.Shm, hcommtest.TCP} {
		t.Run(tr.String(), func(t *testing.T) {
			comms := hcommtest.New(t, 2, tr)
			wins := make([]*collectives.Window, 2)
			bufs := make([]device.Ptr, 2)
			run(t, comms, func(c *hcomm.Comm) error {
				p, err := c.Device().Malloc(size)
				if err != nil {
					return err
				}
				bufs[c.Rank()] = p
				if err := c.Device().MemcpyHtoD(p, pattern(c.Rank())); err != nil {
					return err
				}
				wins[c.Rank()], err = collectives.CommSymWinRegister(c, p, size)
				return err
			})
			defer func() {
				for r, c := range comms {
					c.Device().Free(bufs[r])
				}
			}()
			c := comms[0]
			w, off, err := collectives.CommSymWinGet(c, bufs[0].Add(100), 50)
			if err != nil || w != wins[0] || off != 100 {
				t.Fatalf("CommSymWinGet = %v, %d, %v", w, off, err)
			}
			if _, _, err := collectives.CommSymWinGet(c, bufs[0].Add(size-10), 50); !errors.Is(err, hcomm.ErrNotFound) {
				t.Fatalf("a range past the window: %v, want ErrNotFound", err)
			}
			if p, err := collectives.SymWinGetPeerPointer(w, 8, 0); err != nil || p != bufs[0].Add(8) {
				t.Fatalf("own pointer = %#x, %v", uintptr(p), err)
			}
			p, err := collectives.SymWinGetPeerPointer(w, 8, 1)
			if tr == hcommtest.Inproc {
				if err != nil {
					t.Fatal(err)
				}
				// The peer's bytes, copied device to device into this
				// rank's memory (an inter-device copy), then read.
				local, err := c.Device().Malloc(size)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Device().Free(local)
				if err := c.Device().Memcpy(local, p, size-8, device.MemcpyDeviceToDevice); err != nil {
					t.Fatal(err)
				}
				got := make([]byte, size-8)
				if err := c.Device().MemcpyDtoH(got, local); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, pattern(1)[8:]) {
					t.Fatal("the peer pointer does not hold the peer's window")
				}
			} else if !errors.Is(err, hcomm.ErrNotSupport) {
				t.Fatalf("over %v: %v, want ErrNotSupport", tr, err)
			}
			if _, err := collectives.SymWinGetPeerPointer(w, size, 1); !errors.Is(err, hcomm.ErrPara) {
				t.Fatalf("offset past the window: %v", err)
			}
			if _, err := collectives.SymWinGetPeerPointer(w, 0, 2); !errors.Is(err, hcomm.ErrPara) {
				t.Fatalf("peer outside: %v", err)
			}
			for _, w := range wins {
				if err := collectives.CommSymWinDeregister(w); err != nil {
					t.Fatal(err)
				}
			}
			if _, _, err := collectives.CommSymWinGet(c, bufs[0], 1); !errors.Is(err, hcomm.ErrNotFound) {
				t.Fatalf("after deregistering: %v, want ErrNotFound", err)
			}
			if _, err := collectives.SymWinGetPeerPointer(w, 0, 1); !errors.Is(err, hcomm.ErrUnavail) {
				t.Fatalf("after deregistering: %v, want ErrUnavail", err)
			}
			if err := collectives.CommSymWinDeregister(nil); !errors.Is(err, hcomm.ErrPtr) {
				t.Fatalf("nil window: %v", err)
			}
		})
	}
}
