package channel

import (
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// TestLinePublishesItsData ping-pongs rounds through two lines between two
// goroutines: each line's data is the round number in every byte, and a
// reader that sees a round's flag must see all of that round's data — the
// release store of the flag word (storeRelease) publishes the plain stores
// before it.
func TestLinePublishesItsData(t *testing.T) {
	raw, rounds := crossCores(t)
	ab, ba := raw[:LineSize], raw[LineSize:2*LineSize] // one per direction
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

// TestFenceOrdersLineBeforeLoad is the store-buffer litmus test of the wake
// protocol (package collectives, ll.go): in each round one side stores a
// line and then, after Fence, loads a flagged word; the other stores the
// flagged word and then, after Fence, loads the line. At least one of them must see the
// other's store — were both loads done before either store was visible, a
// sleeper would never be woken. Without the Fence the processor's store
// buffer lets both miss (on the development VM, a few rounds in ten
// thousand: 5 of 20000).
func TestFenceOrdersLineBeforeLoad(t *testing.T) {
	spinSink = 0
	raw, rounds := crossCores(t)
	line, word := raw[:LineSize], raw[2*LineSize:2*LineSize+8]
	// start is the round both sides may begin, done the round the word's
	// side has finished; lineSaw and wordSaw what each side's load saw.
	var start, done atomic.Uint32
	lineSaw := make([]bool, rounds+1)
	wordSaw := make([]bool, rounds+1)
	var src [LineData]byte
	var ww, got [4]byte
	finished := make(chan struct{})
	go func() { // the word's side
		defer close(finished)
		for r := 1; r <= rounds; r++ {
			for start.Load() < uint32(r) {
			}
			PutFlagged(word, ww[:], uint32(r))
			Fence()
			wordSaw[r] = TakeLine(nil, line, uint32(r))
			done.Store(uint32(r))
		}
	}()
	for r := 1; r <= rounds; r++ {
		start.Store(uint32(r))
		// The word's side sees start a cache line's transfer later: a
		// delay that varies from round to round lines the two stores up
		// now and then.
		for i := 0; i < (r*37)%400; i++ {
			spinSink += i
		}
		PutLine(line, src[:], uint32(r))
		Fence()
		lineSaw[r] = TakeFlagged(got[:], word, uint32(r))
		for done.Load() < uint32(r) {
		}
	}
	<-finished
	missed := 0
	for r := 1; r <= rounds; r++ {
		if !lineSaw[r] && !wordSaw[r] {
			missed++
		}
	}
	if missed > 0 {
		t.Fatalf("in %d of %d rounds neither side saw the other's store: a sleeper would not have been woken", missed, rounds)
	}
}

// spinSink keeps TestFenceOrdersLineBeforeLoad's delay loop from being
// optimised away.
var spinSink int

// crossCores skips a test of two goroutines racing through memory unless
// they can run on two processors at once, and returns a page mapped
// outside the Go heap, as a device's memory is (the race detector, which
// does not see the hardware's ordering, watches only the heap), and the
// rounds to run.
func crossCores(t *testing.T) ([]byte, int) {
	if runtime.NumCPU() < 2 || runtime.GOMAXPROCS(0) < 2 {
		t.Skip("needs two processors for the stores to cross caches")
	}
	raw, err := syscall.Mmap(-1, 0, 4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Skipf("mmap: %v", err)
	}
	t.Cleanup(func() { syscall.Munmap(raw) })
	if testing.Short() {
		return raw, 20000
	}
	return raw, 200000
}

// BenchmarkFence is a line stored with PutLine, with and without a Fence
// after it, on one core: the difference is what one locked instruction
// costs on the machine (the small collectives' lane executes seven a call:
// BENCHMARKS.md, stop 40).
func BenchmarkFence(b *testing.B) {
	words := make([]uint64, LineSize/8) // 8-byte aligned, as PutLine needs
	line := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), LineSize)
	var src [LineData]byte
	for _, fence := range []bool{false, true} {
		name := "PutLine"
		if fence {
			name = "PutLine+Fence"
		}
		b.Run(name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				PutLine(line, src[:], uint32(i)+1)
				if fence {
					Fence()
				}
			}
		})
	}
}
