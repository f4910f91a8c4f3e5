package hcomm_test

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/hcomm"
)

// TestBootInitTimes prints, for BENCHMARKS.md, how long HCOMM_BOOT_RANKS
// (default 4, 16, 64) ranks of this process take to join through rank 0's
// TCP store, init only. It runs only with HCOMM_BOOT_TIMES=1.
func TestBootInitTimes(t *testing.T) {
	if os.Getenv("HCOMM_BOOT_TIMES") == "" {
		t.Skip("set HCOMM_BOOT_TIMES=1 to measure init times")
	}
	sizes := []int{4, 16, 64}
	if v, _ := strconv.Atoi(os.Getenv("HCOMM_BOOT_RANKS")); v >= 1 {
		sizes = []int{v}
	}
	cfg := &hcomm.Config{Name: "boottimes", Transport: hcomm.TransportTCP, BufferSize: 64 << 10, ConnectTimeout: 60 * time.Second}
	for _, n := range sizes {
		root, err := hcomm.GetRootInfo(cfg)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		initRanks(t, n, func(r int) (*hcomm.Comm, error) { return hcomm.InitRootInfo(n, root, r, cfg) })
		t.Logf("BOOT-TIMES ranks=%d init=%v", n, time.Since(start).Round(time.Microsecond))
		root.Close()
	}
}
