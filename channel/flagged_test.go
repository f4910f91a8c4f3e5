package channel

import (
	"runtime"
	"syscall"
	"testing"
	"time"
)

// TestLinePublishesItsData ping-pongs rounds through two lines between two
// goroutines: each line's data is the round number in every byte, and a
// reader that sees a round's flag must see all of that round's data — the
// release store of the flag word (storeRelease) publishes the plain stores
// before it.
func TestLinePublishesItsData(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("needs two processors for the lines to cross caches")
	}
	rounds := 200000
	if testing.Short() {
		rounds = 20000
	}
	// Two lines, one per direction, in memory mapped outside the Go heap
	// as a device's is (the race detector, which does not see the
	// hardware's ordering, watches only the heap).
	raw, err := syscall.Mmap(-1, 0, 4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Skipf("mmap: %v", err)
	}
	defer syscall.Munmap(raw)
	ab, ba := raw[:LineSize], raw[LineSize:2*LineSize]
	fill := func(b []byte, r int) {
		for i := range b {
			b[i] = byte(r)
		}
	}
	check := func(who string, b []byte, r int) string {
		for _, v := range b {
			if v != byte(r) {
				return who + ": a line's data lagged its flag"
			}
		}
		return ""
	}
	errc := make(chan string, 1)
	go func() { // b: takes round r from ab, answers it on ba
		var src, got [LineData]byte
		deadline := time.Now().Add(time.Minute)
		for r := 1; r <= rounds; r++ {
			for !TakeLine(got[:], ab, uint32(r)) {
				if time.Now().After(deadline) {
					errc <- "b: no line"
					return
				}
			}
			if e := check("b", got[:], r); e != "" {
				errc <- e
				return
			}
			fill(src[:], r)
			PutLine(ba, src[:], uint32(r))
		}
		errc <- ""
	}()
	var src, got [LineData]byte
	deadline := time.Now().Add(time.Minute)
	for r := 1; r <= rounds; r++ {
		fill(src[:], r)
		PutLine(ab, src[:], uint32(r))
		for !TakeLine(got[:], ba, uint32(r)) {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: no answer within a minute", r)
			}
		}
		if e := check("a", got[:], r); e != "" {
			t.Fatalf("round %d: %s", r, e)
		}
	}
	if e := <-errc; e != "" {
		t.Fatal(e)
	}
}
