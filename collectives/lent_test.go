package collectives_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/channel/shm"
	simch "github.com/hcomm-dev/hcomm/channel/sim"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
)

// TestLentOverTCP: over tcp the selector's all-to-all (pairwise above the
// one-shot's size), the AlltoAllV (each peer's displacement from its hello)
// and the all-gather (direct, from above a hello's size up to lentMax)
// write each rank's block straight into its peers' receive buffers
// (lent.go); in one process the all-to-all's lent writes are copies into the
// peers' receive buffers. Results exact against the reference, in place and out,
// with blocks just above the inline size, odd, and larger than a pipe
// piece, 2 to 4 ranks, calls of the lent and the staged forms (forced ring,
// blocks past lentMax) back to back on the same communicators; the lent
// writes are counted, and every loan is taken back once the streams are
// done.
func TestLentOverTCP(t *testing.T) {
	for _, tc := range []struct {
		tr hcommtest.Transport
		n  int
	}{{hcommtest.TCP, 2}, {hcommtest.TCP, 3}, {hcommtest.TCP, 4}, {hcommtest.Inproc, 3}} {
		n := tc.n
		t.Run(fmt.Sprintf("%v/ranks=%d", tc.tr, n), func(t *testing.T) {
			comms := hcommtest.Options{Config: &hcomm.Config{BufferSize: 256 << 10}}.New(t, n, tc.tr)
			before, open0 := collectives.LentWrites() // loans of failed calls in other tests stay open until their communicators go
			inline := collectives.InlineBytes(comms[0])
			for _, dt := range []hcomm.DataType{hcomm.Float32, hcomm.Int8, hcomm.Float64} {
				if raceEnabled && dt == hcomm.Float64 {
					continue // 74 s under the race detector with it; make test runs it without
				}
				es := int64(dt.Size())
				for _, count := range []int64{inline/es + 1, 4099, 40000, (600 << 10) / es} {
					m := matrixCase{dt: dt, op: hcomm.Sum, count: count, inline: 1 << 40}
					testAlltoAll(t, comms, m, collectives.AlgoAuto)
					testAllGather(t, comms, m, collectives.AlgoAuto, false)
					testAllGather(t, comms, m, collectives.AlgoAuto, true)
					testAllGather(t, comms, m, collectives.AlgoRing, false)
					testAlltoAll(t, comms, m, collectives.AlgoPairwise)
					v, _ := collectives.LentWrites()
					vr := collectives.LentReads() // in process, small blocks are read (inprocPullMax)
					testVCollectives(t, comms, m) // AlltoAllV: blocks of 0 to 1.5 counts, gaps between them
					if w, _ := collectives.LentWrites(); w == v && collectives.LentReads() == vr {
						t.Fatalf("%v: no lent write or read in the AlltoAllV", m)
					}
				}
			}
			after, open := collectives.LentWrites()
			if after == before {
				t.Fatal("no lent write ran: the all-to-all and all-gather were all staged")
			}
			if open != open0 {
				t.Fatalf("%d loans still registered after every stream is done", open-open0)
			}
		})
	}
}

// TestLentPipesOverTCP: over tcp the broadcast's tree and ring send each
// piece straight to its place in the receivers' buffers (lent pipes), and
// each receiver forwards it from there: exact against the root's data, from
// the first and the last root, with counts just above the inline size, odd,
// of one pipe piece and around it, and of many pieces, in a 1-, 4- and
// 8-byte type, 2 to 4 ranks, the tree, the ring and the selector's choice
// back to back on one set of communicators (the pipes' counters carry from
// call to call), beside staged calls of the same pipes (the ring
// all-reduce) and the tree all-reduce, whose reduce half goes staged and
// its broadcast half lent, out of place and in place; pieces are counted,
// and every loan is taken back once the streams are done. With a buffer whose slot is larger than netPiece,
// the network's pieces (odd ends too).
func TestLentPipesOverTCP(t *testing.T) {
	for _, n := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			comms := hcommtest.Options{Config: &hcomm.Config{BufferSize: 256 << 10}}.New(t, n, hcommtest.TCP)
			_, open0 := collectives.LentWrites()
			before := collectives.LentPipes()
			inline := collectives.InlineBytes(comms[0])
			piece := collectives.PieceBytes(comms[0])
			for _, dt := range []hcomm.DataType{hcomm.Int8, hcomm.Float32, hcomm.Float64} {
				es := int64(dt.Size())
				for _, count := range []int64{inline/es + 1, 4099, piece/es - 1, piece / es, piece/es + 1, (5*piece + 24) / es} {
					for _, root := range []int{0, n - 1} {
						m := matrixCase{dt: dt, op: hcomm.Sum, count: count, root: root, inline: 1 << 40}
						for _, algo := range []collectives.Algorithm{collectives.AlgoTree, collectives.AlgoRing, collectives.AlgoAuto} {
							broadcastRaw(t, comms, m, algo)
						}
						allReduceRaw(t, comms, m, collectives.AlgoRing, false)
						allReduceRaw(t, comms, m, collectives.AlgoTree, root == 0)
					}
				}
			}
			// A buffer whose slot is as large as the network's piece or
			// larger: pieces of netPiece (netPiece2, the largest slot,
			// between 2 ranks), and odd ends.
			big := hcommtest.Options{Config: &hcomm.Config{BufferSize: 8 << 20}}.New(t, n, hcommtest.TCP)
			np := netPieceOf(n)
			if p := collectives.PieceBytes(big[0]); p < np {
				t.Fatalf("an 8 MiB buffer's slot is %d bytes, less than the network's piece %d", p, np)
			}
			for _, m := range []matrixCase{
				{dt: hcomm.Int8, op: hcomm.Sum, count: 2*np + 7, root: n - 1, inline: 1 << 40},
				{dt: hcomm.Float64, op: hcomm.Sum, count: (4*np + 24) / 8, root: 0, inline: 1 << 40},
			} {
				for _, algo := range []collectives.Algorithm{collectives.AlgoTree, collectives.AlgoRing, collectives.AlgoAuto} {
					broadcastRaw(t, big, m, algo)
				}
			}
			if collectives.LentPipes() == before {
				t.Fatal("no piece went by a lent pipe: the broadcasts were all staged")
			}
			if _, open := collectives.LentWrites(); open != open0 {
				t.Fatalf("%d loans still registered after every stream is done", open-open0)
			}
		})
	}
}

// TestLentPipesAcknowledgeWhatTheSenderWaitsFor: a lent pipe's receiver
// acknowledges a piece only when the call has a piece a window further on
// (LentWindow: 2 pieces where some host is crowded, 8 where none is; the
// sender waits for that acknowledgement before writing it), never the
// call's last window of pieces, whose notifies the next call's handshake
// frees: over tcp, 2 and 3 ranks, crowded and not (HCOMM_CROWDED), the
// tree and the ring, calls of 1 to 11 pieces back to back in an order that
// mixes them (a call of many pieces after one of few and the other way),
// each exact and acknowledged (n−1)·max(0, pieces−window) times.
// Acknowledging every piece and draining the last ones, as before, fails
// the count, and so does a window that is not the one the ranks agree on.
// netPieceOf is the pipes' piece over tcp among n ranks, where the slot
// allows it.
func netPieceOf(n int) int64 {
	if n == 2 {
		return collectives.NetPiece2
	}
	return collectives.NetPiece
}

func TestLentPipesAcknowledgeWhatTheSenderWaitsFor(t *testing.T) {
	for _, tc := range []struct {
		n       int
		crowded string
		window  int64
	}{{2, "1", 2}, {3, "1", 2}, {2, "0", 8}, {3, "0", 8}} {
		t.Run(fmt.Sprintf("ranks=%d/crowded=%s", tc.n, tc.crowded), func(t *testing.T) {
			t.Setenv("HCOMM_CROWDED", tc.crowded)
			n := tc.n
			comms := hcommtest.Options{Config: &hcomm.Config{BufferSize: 8 << 20}}.New(t, n, hcommtest.TCP)
			np := netPieceOf(n)
			if p := collectives.PieceBytes(comms[0]); p < np {
				t.Fatalf("an 8 MiB buffer's slot is %d bytes, less than the network's piece %d", p, np)
			}
			if w := collectives.LentWindow(comms[0]); w != tc.window {
				t.Fatalf("HCOMM_CROWDED=%s: the lent pipes' window is %d pieces, want %d", tc.crowded, w, tc.window)
			}
			sent := collectives.LentPipes()
			for _, pieces := range []int64{3, 1, 9, 2, 4, 11, 5, 1, 6} {
				for _, algo := range []collectives.Algorithm{collectives.AlgoRing, collectives.AlgoTree} {
					m := matrixCase{dt: hcomm.Int8, op: hcomm.Sum, count: pieces*np - 5, root: int(pieces) % n, inline: 1 << 40}
					before := collectives.LentAcks()
					broadcastRaw(t, comms, m, algo)
					want := int64(n-1) * max(0, pieces-tc.window)
					if got := collectives.LentAcks() - before; got != want {
						t.Fatalf("%v broadcast of %d pieces over %d ranks: %d acknowledgements, want %d", algo, pieces, n, got, want)
					}
				}
			}
			if collectives.LentPipes() == sent {
				t.Fatal("no piece went by a lent pipe: the broadcasts were all staged")
			}
		})
	}
}

// TestLentPipesSenderDestroysAtOnce: no acknowledgement is left for a
// lent pipe's receiver to record once its sender's call is over, so the
// root may destroy its communicator as soon as its stream is done: over
// tcp, 2 ranks, a broadcast of 5 pieces whose root destroys right after
// its synchronize (its call ends with the last piece written, the
// receiver perhaps still reading the last two, which nothing acknowledges)
// — the receiver's broadcast completes with the root's data and no error,
// five times.
func TestLentPipesSenderDestroysAtOnce(t *testing.T) {
	const size = 5*collectives.NetPiece2 - 3
	for round := range 5 {
		comms := hcommtest.Options{Config: &hcomm.Config{BufferSize: 8 << 20}}.New(t, 2, hcommtest.TCP)
		want := make([]byte, size)
		for i := range want {
			want[i] = byte(i*7 + round)
		}
		got := make([]byte, size)
		run(t, comms, func(c *hcomm.Comm) error {
			r := c.Rank()
			s, err := c.Device().CreateStream()
			if err != nil {
				return err
			}
			defer s.Destroy()
			buf, err := c.Device().Malloc(size)
			if err != nil {
				return err
			}
			if r == 0 {
				if err := c.Device().MemcpyHtoD(buf, want); err != nil {
					return err
				}
			}
			if err := collectives.Broadcast(buf, size, hcomm.Int8, 0, c, s, &collectives.Options{Algorithm: collectives.AlgoRing}); err != nil {
				return fmt.Errorf("round %d: rank %d: %w", round, r, err)
			}
			if err := s.SynchronizeWithTimeout(30 * time.Second); err != nil {
				return fmt.Errorf("round %d: rank %d: %w", round, r, err)
			}
			if r == 0 {
				return c.Destroy()
			}
			return c.Device().MemcpyDtoH(got, buf)
		})
		if !bytes.Equal(got, want) {
			t.Fatalf("round %d: the receiver's buffer differs from the root's", round)
		}
	}
}

// TestLentInProcessAnySize: between the ranks of one process the
// all-gather and the all-to-all write every block straight into the peers'
// receive buffers at any size, streamed past the cache (the lent copy was
// bounded at 4 MiB before it streamed): blocks and inputs of 4 MiB and 7
// elements more, 2 and 3 ranks, out of place and in place, exact
// against the reference; the lent writes are counted, and every loan is
// taken back.
func TestLentInProcessAnySize(t *testing.T) {
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			comms := hcommtest.Options{Config: &hcomm.Config{BufferSize: 1 << 20}}.New(t, n, hcommtest.Inproc)
			_, open0 := collectives.LentWrites()
			for _, dt := range []hcomm.DataType{hcomm.Float64} { // the fewest elements for the bytes: the reference is slow under -race
				m := matrixCase{dt: dt, op: hcomm.Sum, count: (4<<20)/int64(dt.Size()) + 7, inline: 1 << 40}
				for _, f := range []func(){
					func() { testAllGather(t, comms, m, collectives.AlgoAuto, false) },
					func() { testAllGather(t, comms, m, collectives.AlgoAuto, true) },
					func() { testAlltoAll(t, comms, m, collectives.AlgoAuto) },
				} {
					w0, _ := collectives.LentWrites()
					f()
					if w, _ := collectives.LentWrites(); w == w0 {
						t.Fatalf("%v: staged, not lent", m)
					}
				}
			}
			if _, open := collectives.LentWrites(); open != open0 {
				t.Fatalf("%d loans still registered after every stream is done", open-open0)
			}
		})
	}
}

// TestAlltoAllOverlapRefused: an all-to-all whose send and receive buffers
// overlap fails at once with ErrPara naming both ranges (there is no
// in-place form: a peer's block, written into the receive buffer or read
// from the send buffer by the peer itself, may meet bytes not yet sent).
func TestAlltoAllOverlapRefused(t *testing.T) {
	comms := hcommtest.New(t, 2, hcommtest.Inproc)
	errs := make([]error, 2)
	for r, c := range comms {
		dev := c.Device()
		p, err := dev.Malloc(64)
		if err != nil {
			t.Fatal(err)
		}
		defer dev.Free(p)
		s, err := dev.CreateStream()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Destroy()
		errs[r] = collectives.AlltoAll(p, 4, hcomm.Float32, p.Add(16), 4, hcomm.Float32, c, s, nil)
		cs, ds := []int64{2, 2}, []int64{0, 2}
		if err := collectives.AlltoAllV(p, cs, ds, hcomm.Float32, p, cs, ds, hcomm.Float32, c, s, nil); !errors.Is(err, hcomm.ErrPara) || !strings.Contains(err.Error(), "overlap") {
			t.Errorf("rank %d: AlltoAllV in place: %v, want ErrPara saying the buffers overlap", r, err)
		}
	}
	for r, err := range errs {
		if !errors.Is(err, hcomm.ErrPara) || !strings.Contains(err.Error(), "overlap") {
			t.Errorf("rank %d: AlltoAll with overlapping buffers: %v, want ErrPara saying they overlap", r, err)
		}
	}
}

// TestAllGatherGatherPieces: between processes of a host (shm) the direct
// all-gather publishes its input in gather slots twice the pipeline's piece
// (gatherPiece): inputs of one, two and a half, and 13 elements more than
// three slots, and an odd number of bytes more than one, out of place and
// in place, 3 ranks, exact against the reference, calls of the ring in
// between on the same communicators; and the direct broadcast of 8 gather
// pieces and more.
func TestAllGatherGatherPieces(t *testing.T) {
	comms := hcommtest.Options{Config: &hcomm.Config{BufferSize: 8 << 20}}.New(t, 3, hcommtest.Shm)
	const gpiece = 1 << 20 // 2 × 512 KiB: the 8 MiB buffer has room (TestLayoutGatherPiece)
	for _, tc := range []struct {
		dt    hcomm.DataType
		bytes int64
	}{{hcomm.Float64, gpiece}, {hcomm.Float64, 5 * gpiece / 2}, {hcomm.Float64, 3*gpiece + 8*13}, {hcomm.Int8, gpiece + 13}} {
		m := matrixCase{dt: tc.dt, op: hcomm.Sum, count: tc.bytes / int64(tc.dt.Size()), inline: 1 << 40}
		testAllGather(t, comms, m, collectives.AlgoDirect, false)
		testAllGather(t, comms, m, collectives.AlgoRing, false)
		testAllGather(t, comms, m, collectives.AlgoDirect, true)
	}
}

// TestLentReadsOverShm: between processes of one host (shm), a pair whose
// ends may read each other's memory through the kernel reads the peer's
// block for it straight from the peer's send buffer (lent.go, readLent):
// the all-to-all, AlltoAllV, direct all-gather (in place and out) and
// direct broadcast (roots first and last) at and above readMin (between
// 2 ranks pairReadMin), exact against the reference, with 2 to 4 ranks,
// blocks just below, at and above it, odd ones, and calls of the staged
// forms (ring all-gather and broadcast, blocks below it) back to back with
// them; the reads are counted. With
// HCOMM_SHM_CMA_DISABLE's Config field no pair reads and the results are the
// same.
func TestLentReadsOverShm(t *testing.T) {
	cases := []struct {
		n   int
		off bool
	}{{2, false}, {3, false}, {4, false}, {3, true}}
	dts := []hcomm.DataType{hcomm.Float32, hcomm.Int8, hcomm.Float64}
	if raceEnabled { // about tenfold slower: the shapes that differ
		cases = cases[1:2]
		dts = []hcomm.DataType{hcomm.Int8, hcomm.Float64}
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("ranks=%d/cmaoff=%v", tc.n, tc.off), func(t *testing.T) {
			comms := hcommtest.Options{Config: &hcomm.Config{BufferSize: 256 << 10, ShmCMADisable: tc.off}}.New(t, tc.n, hcommtest.Shm)
			reads := func() int64 { return collectives.LentReads() }
			before := reads()
			min := int64(collectives.ReadMin)
			if tc.n == 2 {
				min = collectives.PairReadMin // readLeast
			}
			for _, dt := range dts {
				es := int64(dt.Size())
				counts := []int64{min/es - 1, min / es, min/es + 3, (600 << 10) / es}
				if raceEnabled && es == 1 {
					counts = counts[:3]
				}
				for _, count := range counts {
					m := matrixCase{dt: dt, op: hcomm.Sum, count: count, inline: 1 << 40}
					r0 := reads()
					testAlltoAll(t, comms, m, collectives.AlgoAuto)
					testAllGather(t, comms, m, collectives.AlgoRing, false)
					testAlltoAll(t, comms, m, collectives.AlgoPairwise)
					testAllGather(t, comms, m, collectives.AlgoDirect, false)
					testAllGather(t, comms, m, collectives.AlgoDirect, true)
					testAllGather(t, comms, m, collectives.AlgoAuto, false)
					for _, root := range []int{0, tc.n - 1} {
						m := m
						m.root = root
						broadcastRaw(t, comms, m, collectives.AlgoDirect)
						broadcastRaw(t, comms, m, collectives.AlgoRing)
					}
					r1 := reads()
					switch read := r1 > r0; {
					case tc.off && read:
						t.Fatalf("%v: %d lent reads with CMA off", m, r1-r0)
					case !tc.off && count*es >= min && !read:
						t.Fatalf("%v: %d-byte blocks were not read lent", m, count*es)
					case count*es < min && read:
						t.Fatalf("%v: %d-byte blocks (below %d) were read lent", m, count*es, min)
					}
					testVCollectives(t, comms, m) // AlltoAllV: blocks of 0 to 1.5 counts, gaps between them
				}
			}
			if !tc.off && reads() == before {
				t.Fatal("no lent read ran")
			}
		})
	}
}

// TestLentReadsConfigMismatch: a rank whose HCOMM_SHM_CMA_DISABLE differs
// from its peers' stages an all-gather that they read lent; the header's
// flagLent tells them apart, and the call fails on every rank with
// ErrMismatch naming the lent buffers, instead of waiting on data that
// never comes.
func TestLentReadsConfigMismatch(t *testing.T) {
	if shm.HostID() == "" {
		t.Skip("no shared-memory transport on this system")
	}
	const n = 3
	base := hcomm.Config{Transport: hcomm.TransportShm, BufferSize: 1 << 20, ExecTimeout: time.Minute}
	root, err := hcomm.GetRootInfo(&base)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	comms := hcommtest.InitRanks(t, n, func(r int) (*hcomm.Comm, error) {
		c := base
		c.ShmCMADisable = r == 1
		return hcomm.InitRootInfo(n, root, r, &c)
	})
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	const count = 64 << 10 // float32: 256 KiB a rank, above readMin and the inline size
	run(t, comms, func(c *hcomm.Comm) error {
		s, err := c.Device().CreateStream()
		if err != nil {
			return err
		}
		defer s.Destroy()
		send, _ := c.Device().Malloc(4 * count)
		recv, _ := c.Device().Malloc(4 * count * n)
		defer c.Device().Free(send)
		defer c.Device().Free(recv)
		if err := collectives.AllGather(send, recv, count, hcomm.Float32, c, s, &collectives.Options{Algorithm: collectives.AlgoDirect}); err != nil {
			return err
		}
		err = s.SynchronizeWithTimeout(time.Minute)
		if !errors.Is(err, collectives.ErrMismatch) || !strings.Contains(err.Error(), "lent buffers") {
			return fmt.Errorf("rank %d: %v, want a mismatch naming the lent buffers", c.Rank(), err)
		}
		return nil
	})
}

// TestReadsInProcess: between ranks of one process the direct broadcast's
// receivers read the root's buffer straight into theirs from pairReadMin on,
// and the direct all-gather's and pairwise all-to-all's receivers read
// their peers' inputs and blocks below inprocPullMax
// (inproc reads lent memory; forced, at any size below it); above, the
// senders write. Exact against the reference with roots first and last, in
// place and out, sizes around pairReadMin and readMin and past a streamed
// copy's; no broadcast below pairReadMin is read lent.
func TestReadsInProcess(t *testing.T) {
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			comms := hcommtest.Options{Config: &hcomm.Config{BufferSize: 256 << 10}}.New(t, n, hcommtest.Inproc)
			for _, count := range []int64{collectives.PairReadMin - 1, collectives.PairReadMin, collectives.ReadMin - 1, collectives.ReadMin, collectives.InprocPullMax - 1, collectives.InprocPullMax, 1<<20 + 3} {
				for _, root := range []int{0, n - 1} {
					m := matrixCase{dt: hcomm.Int8, op: hcomm.Sum, count: count, root: root, inline: 1 << 40}
					r0 := collectives.LentReads()
					broadcastRaw(t, comms, m, collectives.AlgoAuto)
					broadcastRaw(t, comms, m, collectives.AlgoDirect)
					read := collectives.LentReads() > r0
					if read != (count >= collectives.PairReadMin) {
						t.Fatalf("broadcast %v: read lent %v, want %v", m, read, count >= collectives.PairReadMin)
					}
				}
				m := matrixCase{dt: hcomm.Int8, op: hcomm.Sum, count: count, inline: 1 << 40}
				want := count < collectives.InprocPullMax // read at any size below it: a copy
				r0 := collectives.LentReads()
				testAllGather(t, comms, m, collectives.AlgoDirect, false)
				testAllGather(t, comms, m, collectives.AlgoDirect, true)
				if read := collectives.LentReads() > r0; read != want {
					t.Fatalf("all-gather %v: read lent %v, want %v", m, read, want)
				}
				r0 = collectives.LentReads()
				testAlltoAll(t, comms, m, collectives.AlgoPairwise)
				if read := collectives.LentReads() > r0; read != want {
					t.Fatalf("all-to-all %v: read lent %v, want %v", m, read, want)
				}
			}
		})
	}
}

// TestLentWithCheckOff: with the handshake's check off (HCOMM_COLL_CHECK=0,
// for measuring its cost) the hellos that carry a loan's buffer addresses
// are still read, so the lent all-gather, all-to-all, broadcast and direct
// all-reduce move their data exactly, in one process, between shm ranks and over tcp.
// Before, the check's skip skipped the addresses too, and every lent read
// or write failed ("has no send buffer address").
func TestLentWithCheckOff(t *testing.T) {
	t.Setenv("HCOMM_COLL_CHECK", "0")
	for _, tr := range []hcommtest.Transport{hcommtest.Inproc, hcommtest.Shm, hcommtest.TCP} {
		t.Run(tr.String(), func(t *testing.T) {
			comms := hcommtest.Options{Config: &hcomm.Config{BufferSize: 1 << 20}}.New(t, 2, tr)
			w0, _ := collectives.LentWrites()
			r0 := collectives.LentReads()
			for _, count := range []int64{(40 << 10) / 4, 40001} {
				m := matrixCase{dt: hcomm.Float32, op: hcomm.Sum, count: count, inline: 1 << 40}
				testAllGather(t, comms, m, collectives.AlgoAuto, false)
				testAllGather(t, comms, m, collectives.AlgoAuto, true)
				testAlltoAll(t, comms, m, collectives.AlgoPairwise)
				broadcastCase[float32](t, comms, int(count), 1, collectives.AlgoDirect)
				allReduceRaw(t, comms, m, collectives.AlgoDirect, false) // the ring over tcp
			}
			if w, _ := collectives.LentWrites(); w == w0 && collectives.LentReads() == r0 {
				t.Fatal("no lent write or read ran")
			}
		})
	}
}

// TestAllReduceHDLentOverTCP: between 2 ranks over tcp the halving-doubling
// all-reduce sends its all-gather half by lent pipes, each rank's reduced
// half straight into the other's recv — every piece of both halves, the
// two halves differing by an element across a piece's edge (1 piece one
// way, 2 the other), calls of 1 to 7 pieces back to back, in and out of
// place — exact, with exactly the acknowledgements the senders wait for.
// It fails when the gather half goes through the inboxes.
func TestAllReduceHDLentOverTCP(t *testing.T) {
	comms := hcommtest.Options{Config: &hcomm.Config{BufferSize: 8 << 20}}.New(t, 2, hcommtest.TCP)
	const per = 4096
	defer collectives.SetPieceOverride(per)()
	halfPieces := func(b int64) int64 { return (b + per - 1) / per }
	for _, count := range []int64{2*per + 1, per, 14*per - 3, 1, 11 * per / 2, 2 * per} {
		for _, inPlace := range []bool{false, true} {
			sent, acks := collectives.LentPipes(), collectives.LentAcks()
			allReduceRaw(t, comms, matrixCase{dt: hcomm.Int8, op: hcomm.Sum, count: count}, collectives.AlgoHD, inPlace)
			p0, p1 := halfPieces(count/2), halfPieces(count-count/2) // rank 0 keeps the lower half
			if got := collectives.LentPipes() - sent; got != p0+p1 {
				t.Fatalf("count %d in-place=%v: %d pieces went by lent pipes, want %d (%d and %d)", count, inPlace, got, p0+p1, p0, p1)
			}
			if got, want := collectives.LentAcks()-acks, max(0, p0-collectives.LentWindow(comms[0]))+max(0, p1-collectives.LentWindow(comms[0])); got != want {
				t.Fatalf("count %d in-place=%v: %d acknowledgements, want %d", count, inPlace, got, want)
			}
		}
	}
}

// TestLentPipesOverSim: the simulator's network takes lent writes as tcp
// does (hcomm.Comm.TakesLentTo), so the schedules it times are tcp's: a
// 2-rank broadcast, halving-doubling all-reduce and tree all-reduce (its
// broadcast half) over the sim transport send their pieces by lent pipes,
// exact. Before, the simulator timed the
// staged forms that tcp no longer runs.
func TestLentPipesOverSim(t *testing.T) {
	w, err := simch.NewWorld(simch.Profile{Intra: simch.Level{AlphaUs: 1, BetaNsPerByte: 0.1}, Hosts: 1, RanksPerHost: 2})
	if err != nil {
		t.Fatal(err)
	}
	comms, err := hcomm.InitAllOver(w.Dialers(), nil, &hcomm.Config{BufferSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	if !comms[0].TakesLentTo(1) {
		t.Fatal("the sim transport's channels do not take lent writes")
	}
	const per = 4096
	defer collectives.SetPieceOverride(per)()
	m := matrixCase{dt: hcomm.Int8, op: hcomm.Sum, count: 5*per + 3, root: 1, inline: 1 << 40}
	sent := collectives.LentPipes()
	broadcastRaw(t, comms, m, collectives.AlgoTree)
	if got := collectives.LentPipes() - sent; got != 6 {
		t.Fatalf("the broadcast of 6 pieces sent %d by lent pipes, want 6", got)
	}
	sent = collectives.LentPipes()
	allReduceRaw(t, comms, m, collectives.AlgoHD, false)
	if got, want := collectives.LentPipes()-sent, int64(3+3); got != want {
		t.Fatalf("the all-reduce's all-gather half sent %d pieces by lent pipes, want %d", got, want)
	}
	for _, inPlace := range []bool{false, true} {
		sent = collectives.LentPipes()
		allReduceRaw(t, comms, m, collectives.AlgoTree, inPlace)
		if got := collectives.LentPipes() - sent; got != 6 {
			t.Fatalf("in-place=%v: the tree all-reduce's broadcast half sent %d of its 6 pieces by lent pipes, want 6", inPlace, got)
		}
	}
}

// TestAllReduceHDLentPeerGone: a 2-rank all-reduce over tcp whose peer goes
// away in the all-gather half, its lent pipes: rank 1 aborts and destroys
// its communicator once more lent pieces than a window went (one of them
// needed its acknowledgement), and rank 0, waiting for rank 1's pieces or
// their acknowledgements, fails within seconds — not at its 10-minute
// HCCL_EXEC_TIMEOUT — with an error that names rank 1 (peerGone).
func TestAllReduceHDLentPeerGone(t *testing.T) {
	const per = 4096
	defer collectives.SetPieceOverride(per)()
	comms := hcommtest.Options{Config: &hcomm.Config{BufferSize: 1 << 20, ExecTimeout: 10 * time.Minute}}.New(t, 2, hcommtest.TCP)
	const count = 2 * 400 * per // 400 pieces a half
	lentPeerGone(t, comms, collectives.AlgoHD, count, 2*count/per)
}

// TestAllReduceTreeLentPeerGone: the tree all-reduce over tcp whose child
// goes away in the broadcast half, its lent pipes: rank 1 aborts and
// destroys its communicator once the root's lent pieces have begun, and
// the root, waiting for rank 1's acknowledgements, fails within seconds —
// not at its 10-minute HCCL_EXEC_TIMEOUT — with an error that names rank 1.
func TestAllReduceTreeLentPeerGone(t *testing.T) {
	const per = 4096
	defer collectives.SetPieceOverride(per)()
	comms := hcommtest.Options{Config: &hcomm.Config{BufferSize: 1 << 20, ExecTimeout: 10 * time.Minute}}.New(t, 2, hcommtest.TCP)
	const count = 2000 * per // 2000 pieces up the tree and 2000 down
	lentPeerGone(t, comms, collectives.AlgoTree, count, count/per)
}

// lentPeerGone runs an in-place all-reduce of count int8s by algo between
// the 2 tcp ranks of comms whose rank 1 leaves (peerGone) once more lent
// pieces than a window have gone, and checks that it left in the middle:
// some pieces went by lent pipes (none: the lent half is staged), and not
// all but the last of the call's pieces lent pieces (rank 1 left too late).
func lentPeerGone(t *testing.T, comms []*hcomm.Comm, algo collectives.Algorithm, count, lentPieces int64) {
	t.Helper()
	before := collectives.LentPipes()
	var window atomic.Int64
	window.Store(1 << 62)
	begun := func() bool { return collectives.LentPipes()-before > window.Load()+1 }
	peerGone(t, comms, "all-reduce", true, begun, count, 1, func(c *hcomm.Comm, s *device.Stream, send, _ device.Ptr, small bool) error {
		if small {
			err := collectives.AllReduce(send, send, 1, hcomm.Int8, hcomm.Sum, c, s, nil)
			window.Store(collectives.LentWindow(c))
			return err
		}
		return collectives.AllReduce(send, send, count, hcomm.Int8, hcomm.Sum, c, s, &collectives.Options{Algorithm: algo})
	})
	switch n := collectives.LentPipes() - before; {
	case n <= window.Load()+1:
		t.Errorf("%d pieces went by lent pipes: the lent half is staged", n)
	case n >= lentPieces-2:
		t.Errorf("%d of %d pieces were sent before rank 1 could leave", n, lentPieces)
	}
}

// TestAllGatherPushOverShm: between processes of a host (shm pairs that
// read lent memory), the direct all-gather whose output is at least
// shmPushMin (lowered here) pushes: every rank writes its input into every
// peer's output through the peer's memory file, a piece to every peer
// before the next. Exact against the reference with 2 to 4 ranks, in place
// and out, outputs just below, at and above the threshold and of many
// pieces, odd counts, in a 1-, 4- and 8-byte type, beside calls of the
// ring, the selector's choice and the AllGatherV back to back on the same
// communicators; also pair by pair (the form where some pair cannot push).
// The pushes are counted: none below the threshold, none with
// HCOMM_SHM_CMA_DISABLE's Config field, some at and above it otherwise.
func TestAllGatherPushOverShm(t *testing.T) {
	const pushMin = 96 << 10
	defer collectives.SetShmPushMin(pushMin)()
	cases := []struct {
		n     int
		off   bool
		pairs bool
	}{{2, false, false}, {3, false, false}, {4, false, false}, {4, false, true}, {3, true, false}}
	dts := []hcomm.DataType{hcomm.Int8, hcomm.Float32, hcomm.Float64}
	if raceEnabled {
		cases = []struct {
			n     int
			off   bool
			pairs bool
		}{{3, false, false}, {3, false, true}}
		dts = []hcomm.DataType{hcomm.Float32}
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("ranks=%d/cmaoff=%v/pairbypair=%v", tc.n, tc.off, tc.pairs), func(t *testing.T) {
			if tc.pairs {
				defer collectives.PushPairByPair()()
			}
			comms := hcommtest.Options{Config: &hcomm.Config{BufferSize: 256 << 10, ShmCMADisable: tc.off}}.New(t, tc.n, hcommtest.Shm)
			n := int64(tc.n)
			for _, dt := range dts {
				es := int64(dt.Size())
				at := (pushMin + n*es - 1) / (n * es) // the least count whose output is pushed
				for _, count := range []int64{at - 1, at, at + 3, (1<<20+4093)/es + 1} {
					m := matrixCase{dt: dt, op: hcomm.Sum, count: count, inline: 1 << 40}
					p0 := collectives.LentPushes()
					testAllGather(t, comms, m, collectives.AlgoDirect, false)
					testAllGather(t, comms, m, collectives.AlgoDirect, true)
					testAllGather(t, comms, m, collectives.AlgoRing, false)
					testAllGather(t, comms, m, collectives.AlgoAuto, false)
					pushed := collectives.LentPushes() > p0
					if want := !tc.off && n*count*es >= pushMin; pushed != want {
						t.Fatalf("%v (output %d bytes, threshold %d): pushed %v, want %v", m, n*count*es, pushMin, pushed, want)
					}
					testVCollectives(t, comms, m) // AllGatherV among them: uneven inputs, one output size for all
				}
			}
		})
	}
}

// TestAllGatherPushPeerGone: a pushing all-gather whose peer goes away —
// before its hello, or aborting once the pushes have begun — fails on the
// rank left within seconds, not at its 10-minute HCCL_EXEC_TIMEOUT, with an
// error naming the peer.
func TestAllGatherPushPeerGone(t *testing.T) {
	defer collectives.SetShmPushMin(1 << 20)()
	for _, mid := range []bool{false, true} {
		t.Run(fmt.Sprintf("mid=%v", mid), func(t *testing.T) {
			comms := hcommtest.Options{Config: &hcomm.Config{BufferSize: 1 << 20, ExecTimeout: 10 * time.Minute}}.New(t, 2, hcommtest.Shm)
			const count = 8 << 20 // 32 MiB of float32 a rank: 128 pieces
			p0 := collectives.LentPushes()
			peerGone(t, comms, "all-gather", mid, func() bool { return collectives.LentPushes() != p0 }, 4*count, 2*4*count,
				func(c *hcomm.Comm, s *device.Stream, send, recv device.Ptr, small bool) error {
					if small {
						return collectives.AllGather(send, recv, 1, hcomm.Float32, c, s, nil)
					}
					return collectives.AllGather(send, recv, count, hcomm.Float32, c, s, &collectives.Options{Algorithm: collectives.AlgoDirect})
				})
		})
	}
}
