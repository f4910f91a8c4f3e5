//go:build amd64 || arm64

package spin

// Pause tells the processor that this thread is in a spin-wait loop (PAUSE
// on amd64, YIELD on arm64), as C's spin loops and pingpong's say between
// two looks. A core that loads a line in a tight loop keeps asking for it
// while the peer's store waits for the line; pausing between looks lets
// the store through. It never gives up the processor.
//
// Where it pays is measured, not assumed: 2 processes handing a line back
// and forth (bench p2p over shm, 8 bytes, its poll pausing) took
// 0.136–0.139 µs a round trip against 0.148–0.166 without (AMD EPYC VM,
// 2026-11-30, interleaved; pingpong shm 112–148 ns); the lane's polls of
// a 16-byte all-reduce got slower with it (2 ranks in one process
// 0.325–0.373 against 0.279–0.298 µs), so they do not pause.
func Pause()
