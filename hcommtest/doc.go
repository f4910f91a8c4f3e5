// Package hcommtest runs N ranks of hcomm for tests, examples and
// benchmarks: each rank a goroutine over any transport (inproc, shm, tcp), or
// each rank a process re-executed from the test binary, in the way
// net/http/httptest serves HTTP tests and Gloo's test/base_test.h runs every
// algorithm over every transport, one thread per rank.
//
// Where to start: Run starts n ranks, calls a function on every rank at once,
// and cleans up.
//
//	func TestAllReduce(t *testing.T) {
//		for _, tr := range hcommtest.Transports() {
//			t.Run(tr.String(), func(t *testing.T) {
//				hcommtest.Run(t, 4, tr, func(t testing.TB, c *hcomm.Comm) {
//					recv := make([]float32, 3)
//					send := []float32{1, 2, float32(c.Rank())}
//					if err := collectives.AllReduceSlice(context.Background(), c, send, recv, hcomm.Sum, nil); err != nil {
//						t.Fatal(err)
//					}
//					…
//				})
//			})
//		}
//	}
//
// What Run does for the test:
//
//  1. makes the n communicators with the channels forced onto the transport
//     (Config.Transport), or, for a Processes transport, starts n copies of
//     the test binary, each running only this test, which join through
//     InitFromEnv with the launcher variables set (RANK, WORLD_SIZE,
//     MASTER_ADDR, MASTER_PORT, HCOMM_SECRET);
//  2. calls the function on every rank concurrently, each with a testing.TB
//     whose messages start with "rank r:" and whose Fatal and FailNow end
//     only that rank; the first rank that fails (or panics) aborts every
//     communicator, so that ranks waiting for it return instead of hanging;
//  3. bounds the whole by Options.Timeout: ranks still running then are
//     named, every goroutine's stack is logged (a process rank is sent
//     SIGQUIT, which makes the Go runtime print its goroutines), and the
//     communicators are aborted;
//  4. destroys every communicator once every rank has returned (a rank
//     process waits for the others, as ranks as goroutines do, so that rank
//     0's bootstrap store serves the channel setups of ranks still running),
//     and fails the test if a goroutine started
//     under the ranks, a socket or memfd descriptor, or a memfd mapping
//     (device memory, shm notifies) outlives them.
//
// Tests that run many cases on the same ranks make them once with New
// (destroyed and checked when the test ends) and call Each per case; Each
// also runs the ranks of sub-communicators. Go is Each for code without a
// testing.TB (examples, tools): it returns the failures as an error.
// Tests of an init itself (hcomm.InitRootInfo, InitClusterInfo, Grow) make
// their ranks with InitRanks, which calls the test's init on every rank at
// once.
//
// Ranks as processes: the child process runs the test from its start up to
// Run, so the code before Run must take the same path in every process (no
// randomness, no state from earlier tests), and the code after Run does not
// run in the children (Run ends the child's test). A test makes at most one
// Processes Run: put each in its own subtest. Only a *testing.T can run
// ranks as processes. Options.Env changes a rank process's variables, to
// test a launcher's (mpirun's, srun's) instead of torchrun's.
//
// The package imports testing; library code must not import it.
package hcommtest
