package collectives

import (
	"context"
	"testing"

	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
)

// Which pairs' hellos travel as flagged words: inproc and shm channels in
// communicators of up to helloFullMax ranks whose hello slots are mapped in
// place; not tcp, not above helloFullMax ranks (the butterfly's hellos),
// not with copied device views, not without HCOMM_LL=1 (the default).
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
		{"default", hcommtest.Inproc, 2, nil, false},
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
