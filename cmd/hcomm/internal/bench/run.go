package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/hcomm-dev/hcomm/collectives"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// initFromEnv joins the other processes of a launch (a variable for tests).
var initFromEnv = hcomm.InitFromEnv

// rankVarOf names the rank variable that goes with each of hcomm.Launched's
// size variables.
var rankVarOf = map[string]string{"WORLD_SIZE": "RANK", "OMPI_COMM_WORLD_SIZE": "OMPI_COMM_WORLD_RANK", "SLURM_NTASKS": "SLURM_PROCID"}

// openComms returns the communicators of this process: -g ranks, or the one
// rank a launcher started this process as.
func openComms(o Options, cfg *hcomm.Config, getenv func(string) string, ranksSet bool) ([]*hcomm.Comm, error) {
	if v, ok := hcomm.Launched(getenv); ok && !ranksSet {
		c, err := initFromEnv(cfg)
		if err == nil {
			return []*hcomm.Comm{c}, nil
		}
		// The hint to run in one process helps only a process that no
		// launcher started as a rank (a size variable left in a shell);
		// a rank of a real launch needs the reason alone.
		if rv := rankVarOf[v]; getenv(rv) == "" {
			return nil, fmt.Errorf("%s is set but %s is not, so no launcher started this process as one rank of a launch (pass -g N to run N ranks in this process): %w", v, rv, err)
		}
		return nil, fmt.Errorf("this process is one rank of a launch (%s is set) and could not join the others: %w", v, err)
	}
	return hcomm.InitAll(o.Ranks, cfg)
}

// runRanks calls fn once per communicator, concurrently, and returns the
// first error. A failing rank aborts every communicator of this process, so
// that the others stop waiting for it.
func runRanks(ctx context.Context, comms []*hcomm.Comm, fn func(ctx context.Context, c *hcomm.Comm) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for _, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(ctx, c); err != nil {
				once.Do(func() {
					first = err
					cancel()
					for _, x := range comms {
						x.Abort()
					}
				})
			}
		}()
	}
	wg.Wait()
	return first
}

// Run runs the benchmark and writes its report (rank 0's) to stdout. It
// reports whether the run passed: no wrong value and an average busbw of at
// least o.MinBW.
func Run(o Options, stdout, stderr io.Writer, h Hooks) (bool, error) {
	if h.Getenv == nil {
		h.Getenv = os.Getenv
	}
	if h.Now == nil {
		h.Now = time.Now
	}
	if h.Environ == nil {
		h.Environ = os.Environ
	}
	o.corrupt = h.Corrupt
	start := h.Now()
	cfg := &hcomm.Config{Name: "bench"}
	stopMetrics, err := serveMetrics(o, cfg, stderr, h.Getenv, h.Scrape)
	if err != nil {
		return false, err
	}
	defer stopMetrics()
	comms, err := openComms(o, cfg, h.Getenv, o.RanksSet)
	if err != nil {
		return false, err
	}
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	rep := &report{o: o, out: stdout, nranks: comms[0].Size(), procRanks: len(comms)}
	var jf *os.File
	if o.JSONFile != "" && comms[0].Rank() == 0 {
		if jf, err = createJSON(o.JSONFile, stdout, !o.JSON && !o.CSV); err != nil {
			return false, err
		}
		defer jf.Close()
	}
	if h.Terminal != nil && h.Terminal() && !o.JSON && !o.CSV {
		rep.progress = stderr
	}
	var ok bool
	err = runRanks(withTimeout(context.Background(), o.Timeout), comms, func(ctx context.Context, c *hcomm.Comm) error {
		r := rep
		if c.Rank() != 0 {
			r = &report{o: o, out: io.Discard, nranks: c.Size(), procRanks: len(comms)} // the same figures, unprinted
		}
		var pass bool
		var err error
		if o.Coll == "p2p" {
			pass, err = runP2P(ctx, c, o, r)
		} else {
			pass, err = runColl(ctx, c, o, r, h)
		}
		if c == comms[0] {
			ok = pass
		}
		return err
	})
	if jf != nil {
		if jerr := writeJSON(jf, rep, start, h.Now(), h.Environ(), err); jerr != nil && err == nil {
			err = jerr
		}
	}
	if err != nil {
		return false, err
	}
	if o.Plot != "" && comms[0].Rank() == 0 {
		if err := writePlot(o.Plot, rep); err != nil {
			return false, err
		}
	}
	return ok, nil
}

// sumAll returns the element-wise sum of xs over all ranks (also a barrier).
func sumAll(ctx context.Context, c *hcomm.Comm, xs ...float64) ([]float64, error) {
	out := make([]float64, len(xs))
	if err := bounded(ctx, c.Rank(), "the other ranks (a barrier or a sum of the figures)", func(ctx context.Context) error {
		return collectives.AllReduceSlice(ctx, c, xs, out, hcomm.Sum, nil)
	}); err != nil {
		return nil, err
	}
	return out, nil
}

// rankInfo gathers every rank's pid and host name (each rank fills its slot
// of a zero vector; a sum gathers them).
func rankInfo(ctx context.Context, c *hcomm.Comm) ([]int, []string, error) {
	const hostLen = 64
	n := c.Size()
	pids := make([]float64, n)
	pids[c.Rank()] = float64(os.Getpid())
	host, _ := os.Hostname()
	hb := make([]uint8, n*hostLen)
	copy(hb[c.Rank()*hostLen:(c.Rank()+1)*hostLen-1], host)
	if err := bounded(ctx, c.Rank(), "the other ranks' pids and host names", func(ctx context.Context) error {
		if err := collectives.AllReduceSlice(ctx, c, pids, pids, hcomm.Sum, nil); err != nil {
			return err
		}
		return collectives.AllReduceSlice(ctx, c, hb, hb, hcomm.Sum, nil)
	}); err != nil {
		return nil, nil, err
	}
	ps := make([]int, n)
	hs := make([]string, n)
	for r := range ps {
		ps[r] = int(pids[r])
		b := hb[r*hostLen : (r+1)*hostLen]
		for i, x := range b {
			if x == 0 {
				b = b[:i]
				break
			}
		}
		hs[r] = string(b)
	}
	return ps, hs, nil
}

// runColl is one rank's part of a collective benchmark. Every rank computes
// every row's figures (times and wrong counts are summed across ranks), so
// every rank knows whether the run passed; only rank 0's rep prints.
func runColl(ctx context.Context, c *hcomm.Comm, o Options, rep *report, h Hooks) (bool, error) {
	cl, err := lookupColl(o.Coll)
	if err != nil {
		return false, err
	}
	n, me := c.Size(), c.Rank()
	if cl.rooted && (o.Root < 0 || o.Root >= n) {
		return false, fmt.Errorf("-r %d: the root must be a rank in [0, %d)", o.Root, n)
	}
	sizes := o.sizes()
	maxSend, maxRecv, _ := cl.counts(o.MaxBytes, 1, n) // 1-byte elements: the most bytes
	maxRecv = max(maxRecv, maxSend)                    // in place, one buffer holds both
	dev := c.Device()
	s, err := dev.CreateStream()
	if err != nil {
		return false, err
	}
	defer s.Destroy()
	sendP, err := dev.Malloc(max(maxSend, 64))
	if err != nil {
		return false, fmt.Errorf("allocating %d bytes for the send buffer: %w", maxSend, err)
	}
	defer dev.Free(sendP)
	recvP, err := dev.Malloc(max(maxRecv, 64))
	if err != nil {
		return false, fmt.Errorf("allocating %d bytes for the receive buffer: %w", maxRecv, err)
	}
	defer dev.Free(recvP)
	if o.Register {
		for _, b := range []struct {
			p device.Ptr
			n int64
		}{{sendP, max(maxSend, 64)}, {recvP, max(maxRecv, 64)}} {
			w, err := collectives.RegisterWindow(c, b.p, b.n)
			if err != nil {
				return false, fmt.Errorf("-R 1: %w", err)
			}
			defer w.Deregister()
		}
	}
	var hostIn, hostOut []byte
	if o.Check {
		hostIn = make([]byte, max(maxSend, maxRecv))
		hostOut = make([]byte, maxRecv)
	}
	pids, hosts, err := rankInfo(ctx, c)
	if err != nil {
		return false, err
	}
	rep.header(pids, hosts)
	ops := o.Ops
	if !cl.reduces {
		ops = ops[:1]
	}
	rep.total = len(o.DataTypes) * len(ops) * len(sizes)
	sync := func() error { return syncStream(ctx, me, s) }
	var timer *iterTimer
	if o.PerIter {
		if timer, err = newIterTimer(dev, o.Iters); err != nil {
			return false, err
		}
		defer timer.destroy()
	}
	if err := rep.memory(ctx, c, max(maxSend, 64)+max(maxRecv, 64)); err != nil {
		return false, err
	}
	// Before any size is timed, -w calls at the largest size and then at
	// the smallest, as nccl-tests' TimeTest warms up: the first size timed
	// would otherwise carry the launch's start too (channels set up on first
	// use, buffers first touched, processes not yet run in): 2 tcp
	// processes, 16 B all-reduce as a launch's first size (-w 20) 8.2–24 µs
	// without this, 4.7–5.5 with it (BENCHMARKS.md, stop 32).
	if o.Warmup > 0 && len(sizes) > 0 {
		dt, op := o.DataTypes[0], ops[0]
		es := int64(dt.Size())
		for _, size := range []int64{sizes[len(sizes)-1], sizes[0]} {
			sc, rc, _ := cl.counts(size, int(es), n)
			send, recv := sendP, recvP
			if cl.inPlaceOnly {
				so, ro := cl.inPlace(me, sc, rc)
				send, recv = recvP.Add(so*es), recvP.Add(ro*es)
			}
			for i := 0; i < o.Warmup; i++ {
				if err := cl.run(c, s, send, recv, sc, rc, dt, op, o.Root); err != nil {
					return false, err
				}
			}
		}
		if err := sync(); err != nil {
			return false, err
		}
	}
	for _, dt := range o.DataTypes {
		es := int64(dt.Size())
		for _, op := range ops {
			want := folder(dt, op)
			for _, size := range sizes {
				sc, rc, printed := cl.counts(size, int(es), n)
				row := Row{Coll: cl.name, Size: printed, Count: printed / es, Type: typeNames[dt], RedOp: "none", Root: -1}
				if cl.reduces {
					row.RedOp = op.String()
				}
				if cl.rooted {
					row.Root = o.Root
				}
				for _, inPlace := range []bool{false, true} {
					if !inPlace && cl.inPlaceOnly {
						row.Out = &Result{NA: true}
						continue
					}
					if inPlace && cl.outOfPlaceOnly {
						row.In = &Result{NA: true}
						continue
					}
					send, recv := sendP, recvP
					if inPlace {
						so, ro := cl.inPlace(me, sc, rc)
						send, recv = recvP.Add(so*es), recvP.Add(ro*es)
					}
					call := func() error { return cl.run(c, s, send, recv, sc, rc, dt, op, o.Root) }
					if h.Stall != nil {
						h.Stall(ctx, me)
					}
					for i := 0; i < o.Warmup; i++ {
						if err := call(); err != nil {
							return false, err
						}
					}
					if err := sync(); err != nil {
						return false, err
					}
					if _, err := sumAll(ctx, c, 0); err != nil { // barrier
						return false, err
					}
					t0 := time.Now()
					for i := 0; i < o.Iters; i++ {
						if err := timer.mark(s, i); err != nil {
							return false, err
						}
						if err := call(); err != nil {
							return false, err
						}
					}
					if err := timer.mark(s, o.Iters); err != nil {
						return false, err
					}
					if err := sync(); err != nil {
						return false, err
					}
					elapsed := time.Since(t0).Seconds()
					var iters *IterStats
					if timer != nil {
						mine, err := timer.times()
						if err != nil {
							return false, err
						}
						if iters, err = gatherIterStats(ctx, c, mine, o.PerIterSkip, rep.nprocs() > 1); err != nil {
							return false, err
						}
					}
					wrong := int64(-1)
					if o.Check {
						if wrong, err = checkOnce(c, dev, s, cl, call, sync, h, inPlace, send, recv, sc, rc, dt, o.Root, want, hostIn, hostOut); err != nil {
							return false, err
						}
					}
					tot, err := sumAll(ctx, c, elapsed, float64(max(wrong, 0)))
					if err != nil {
						return false, err
					}
					sec := tot[0] / float64(n) / float64(o.Iters)
					res := &Result{TimeUs: sec * 1e6, Wrong: -1, Iter: iters}
					if sec > 0 {
						res.AlgBW = float64(printed) / sec / 1e9
						res.BusBW = res.AlgBW * cl.factor(n)
					}
					if o.Check {
						res.Wrong = int64(tot[1])
					}
					if inPlace {
						row.In = res
					} else {
						row.Out = res
					}
				}
				rep.row(row)
			}
		}
	}
	return rep.footer(), nil
}

// checkOnce fills the inputs with the rank's pattern (and out-of-place
// outputs with a poison value), runs one call, and counts this rank's wrong
// output elements.
func checkOnce(c *hcomm.Comm, dev *device.Device, s *device.Stream, cl *coll, call, sync func() error, h Hooks,
	inPlace bool, send, recv device.Ptr, sc, rc int64, dt hcomm.DataType, root int, fold func([]value) value, hostIn, hostOut []byte) (int64, error) {
	es := int64(dt.Size())
	me, n := c.Rank(), c.Size()
	if !inPlace && rc > 0 {
		if err := dev.Memset(recv, rc*es, 0xA5); err != nil {
			return 0, err
		}
	}
	if sc > 0 {
		fill(hostIn[:sc*es], dt, me, sc)
		if err := dev.MemcpyHtoD(send, hostIn[:sc*es]); err != nil {
			return 0, err
		}
	}
	if err := call(); err != nil {
		return 0, err
	}
	if err := sync(); err != nil {
		return 0, err
	}
	out := hostOut[:rc*es]
	if rc > 0 {
		if err := dev.MemcpyDtoH(out, recv); err != nil {
			return 0, err
		}
	}
	if h.Corrupt != nil {
		h.Corrupt(me, inPlace, out)
	}
	if cl.onlyRoot && me != root {
		return 0, nil // only the root's output is defined
	}
	in := func(r int, j int64) value { return input(dt, r, j) }
	return countWrong(out, dt, rc, func(i int64) value { return cl.expect(me, n, i, root, sc, in, fold) }), nil
}
