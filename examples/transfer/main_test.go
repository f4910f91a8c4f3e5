package main

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
	"github.com/hcomm-dev/hcomm/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

func TestTransferArrivesIntact(t *testing.T) {
	var out bytes.Buffer
	res, err := Run(Options{Ranks: 3, Size: 3<<20 + 5, Chunk: 1 << 20, Iters: 2}, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if len(res.GBps) != 4 || res.Best <= 0 || res.Mean <= 0 || res.Mean > res.Best {
		t.Errorf("result %+v: want 4 transfers (2 receivers x 2 iterations)", res)
	}
	for _, s := range []string{"iteration 2 to rank 2", "arrived intact"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("output lacks %q:\n%s", s, out.String())
		}
	}
}

// A byte changed on the way is caught by the receiver's checksum, and the
// sender does not wait for it forever.
func TestDamageIsCaught(t *testing.T) {
	o := Options{Ranks: 2, Size: 1 << 20, Chunk: 256 << 10, Iters: 1, Corrupt: func(b []byte) { b[12345] ^= 1 }}
	_, err := Run(o, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "arrived damaged") {
		t.Fatalf("err = %v, want the checksum to catch the damage", err)
	}
}

func TestBadOptions(t *testing.T) {
	if _, err := Run(Options{Ranks: 1, Size: 10, Chunk: 10, Iters: 1}, &bytes.Buffer{}); err == nil {
		t.Error("one rank was accepted")
	}
	for _, s := range []string{"0", "-1K", "1.5M", "x"} {
		if _, err := parseSize(s); err == nil {
			t.Errorf("parseSize(%q) succeeded", s)
		}
	}
	if n, err := parseSize("64M"); err != nil || n != 64<<20 {
		t.Errorf("parseSize(64M) = %d, %v", n, err)
	}
}

// The transfers arrive intact over every transport, ranks as goroutines and
// as processes joined as under a launcher.
func TestTransferEveryTransport(t *testing.T) {
	o := Options{Size: 1<<20 + 3, Chunk: 256 << 10, Iters: 2}
	for _, tr := range hcommtest.Transports() {
		t.Run(tr.String(), func(t *testing.T) {
			if tr.Processes && testing.Short() {
				t.Skip("-short: no processes")
			}
			hcommtest.Options{Config: &hcomm.Config{Name: "transfer", BufferSize: 1 << 20}}.Run(t, 3, tr, func(t testing.TB, c *hcomm.Comm) {
				var out bytes.Buffer
				var w io.Writer = io.Discard
				if c.Rank() == 0 {
					w = &out
				}
				res, err := rank(c, o, w)
				if err != nil {
					t.Fatalf("%v\n%s", err, out.String())
				}
				if c.Rank() != 0 {
					return
				}
				if len(res.GBps) != 4 || res.Best <= 0 || !strings.Contains(out.String(), "iteration 2 to rank 2") || !strings.Contains(out.String(), "arrived intact") {
					t.Errorf("result %+v: want 4 transfers (2 receivers x 2 iterations); output:\n%s", res, out.String())
				}
			})
		})
	}
}
