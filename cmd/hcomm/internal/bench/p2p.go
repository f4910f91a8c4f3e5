package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/internal/spin"
)

// p2p notify indices on the benchmark's channels (with --bidir, 0 and 1 both
// carry data, alternately).
const (
	p2pData = 0 // "the write is complete in your HCCL buffer"
	p2pAck  = 1 // "I have seen it": the next write may start
	p2pTag  = "hcomm/bench-p2p"
)

func p2pPattern(src int, i int64) byte { return byte(i*31 + int64(src)*7 + 1) }

// runP2P is one rank's part of hcomm bench p2p: for every size and every
// ordered pair (src, dst) — or every unordered pair with --bidir — the pair
// runs -n iterations of a write into the peer's benchmark buffer with its
// notify record, and the peer's answering record (one round trip), while
// the other ranks wait at a barrier. Time per iteration gives the pair's bandwidth; the
// smallest size's time is its latency. With -c 1 the receiver checks every
// byte after the pair's last iteration.
func runP2P(ctx context.Context, c *hcomm.Comm, o Options, rep *report) (bool, error) {
	if n := c.Size(); n < 2 {
		return false, fmt.Errorf("p2p needs at least 2 ranks, have %d", n)
	}
	s, release, err := setupP2P(c, o)
	if err != nil {
		return false, err
	}
	defer release()
	if err := s.describe(ctx, o, rep); err != nil {
		return false, err
	}
	pairs := p2pPairs(s.n, o.Bidir)
	sizes := o.sizes()
	rep.total = len(sizes)
	var first, last []float64 // per-pair µs of the smallest and largest size
	for si, size := range sizes {
		times, wrongs, err := s.measure(ctx, o, pairs, size)
		if err != nil {
			return false, err
		}
		rep.p2pRow(o, s.n, pairs, size, times, wrongs)
		if si == 0 {
			first = times
		}
		last = times
	}
	rep.p2pMatrices(s.n, sizes[0], first, sizes[len(sizes)-1], last, o.Bidir)
	if err := rep.memory(ctx, c, 2*max(o.MaxBytes, 64)); err != nil { // the receive and source buffers
		return false, err
	}
	return rep.footer(), nil
}

// p2pRun is what one rank of hcomm bench p2p measures with: a channel to
// every other rank, the address of the peer's benchmark buffer on each, and
// a source buffer holding this rank's pattern.
type p2pRun struct {
	c       *hcomm.Comm
	dev     *device.Device
	n, me   int
	recvBuf device.Ptr // this rank's benchmark buffer, written by its peers
	src     device.Ptr // the bytes this rank writes
	chans   []*hcomm.Channel
	dsts    []device.Ptr // the peer's benchmark buffer, by rank
	// The line area after the benchmark buffer (p2pLLArea bytes at llOff):
	// two parities' data lines, then the answer line. ll is this rank's
	// view of it; nil when small sizes go as write + notify.
	llOff    int64
	ll       []byte
	recvData []byte // the pair's size of the benchmark buffer, host view: where lines are taken to
	// lines: the pair's prepared lines into the peer's line area (the two
	// parities' data lines, then the answer line); srcData is the source
	// buffer's host view.
	lines   [3]*hcomm.PreparedLine
	srcData []byte
	// tight: the host's ranks have a core each, so a wait for a line
	// polls without yielding for a while (llTight) before it yields.
	tight bool
}

// The LL protocol of the small sizes (-ll 1, the default). Over a channel
// that stores into the peer's memory itself (channel.FlagWriter: inproc,
// shm), a size of at most channel.LineData (56) bytes travels as one line
// (hcomm.PreparedLine: the data and a flag word in one cache line, the flag
// stored last), polled by the receiver in its own memory, and the answer is
// a line of no data — no notify, as NCCL's LL carries small messages: a
// hand-off is one cache line's transfer, as pingpong's is. The data lines
// alternate between two parities, since with --bidir a side may write its
// next message before the peer has taken the last; the flag is the
// iteration's number, and the area is cleared after every pair so that a
// line from another pair never passes for this one's. (Flagged words — 4
// bytes beside a 4-byte flag — carried sizes up to 4 KiB here before: from
// 64 bytes up they measured 3–60 times slower than a write and a notify.)
const p2pLLArea = 3 * channel.LineSize

// llWords returns the offset in the line area of parity par's data line.
func llWords(par int) int64 { return int64(par) * channel.LineSize }

// llAnswer is the offset in the line area of the answer line.
const llAnswer = 2 * channel.LineSize

// setupP2P registers this rank's benchmark buffer, acquires a channel to
// every other rank, and fills the source buffer. release frees
// the buffers and the registration; on an error, setupP2P has freed them.
func setupP2P(c *hcomm.Comm, o Options) (s *p2pRun, release func(), err error) {
	n, me := c.Size(), c.Rank()
	var undo []func()
	release = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	defer func() {
		if err != nil {
			release()
		}
	}()
	// Writes land in a buffer each rank registers for the benchmark, not
	// in the HCCL buffer, which the collectives (the barriers between pairs)
	// use at the same time.
	dev := c.Device()
	dataLen := (max(o.MaxBytes, 64) + 7) &^ 7
	recvBuf, err := dev.Malloc(dataLen + p2pLLArea)
	if err != nil {
		return nil, nil, err
	}
	undo = append(undo, func() { dev.Free(recvBuf) })
	mh, err := c.CommMemReg(p2pTag, recvBuf, dataLen+p2pLLArea)
	if err != nil {
		return nil, nil, err
	}
	undo = append(undo, func() { c.CommMemDereg(mh) })
	descs := hcomm.ChannelDescInit(n - 1)
	for i, j := 0, 0; i < n; i++ {
		if i != me {
			descs[j].RemoteRank, descs[j].NotifyNum, descs[j].Tag = i, 2, p2pTag
			descs[j].Protocol = o.Protocol
			descs[j].MemHandles = []*hcomm.MemHandle{mh}
			j++
		}
	}
	chs, err := c.ChannelAcquire(hcomm.EngineCPUTS, descs)
	if err != nil {
		return nil, nil, err
	}
	s = &p2pRun{c: c, dev: dev, n: n, me: me, recvBuf: recvBuf, llOff: dataLen, chans: make([]*hcomm.Channel, n), dsts: make([]device.Ptr, n)}
	here := c.ProcessesHere()
	if here == 1 {
		here = n // every rank a goroutine of this process
	}
	s.tight = here <= c.HostProcessors()
	if v, err := dev.Map(recvBuf.Add(dataLen), p2pLLArea); err == nil && v.Mapped() && o.LL {
		s.ll = v.Bytes() // polled in place: only where the view is the memory itself
	}
	for _, ch := range chs {
		p := ch.RemoteRank()
		s.chans[p] = ch
		mems, err := c.ChannelGetRemoteMems(ch)
		if err != nil {
			return nil, nil, err
		}
		for _, m := range mems {
			if m.Tag == p2pTag && m.Size >= o.MaxBytes {
				s.dsts[p] = m.Addr
			}
		}
		if s.dsts[p] == 0 {
			return nil, nil, fmt.Errorf("rank %d's channel does not show the %d-byte buffer it registered for the benchmark", p, o.MaxBytes)
		}
	}
	src, err := dev.Malloc(max(o.MaxBytes, 64))
	if err != nil {
		return nil, nil, err
	}
	undo = append(undo, func() { dev.Free(src) })
	s.src = src
	pat := make([]byte, o.MaxBytes)
	for i := range pat {
		pat[i] = p2pPattern(me, int64(i))
	}
	if err := dev.MemcpyHtoD(src, pat); err != nil {
		return nil, nil, err
	}
	return s, release, nil
}

// describe prints the report's header and which transports carry the
// benchmark's channels, gathered from every rank (a collective: every rank
// calls it).
func (s *p2pRun) describe(ctx context.Context, o Options, rep *report) error {
	n, me := s.n, s.me
	pids, hosts, err := rankInfo(ctx, s.c)
	if err != nil {
		return err
	}
	// Which transport carries each of this rank's channels, gathered on every
	// rank as a matrix of transport indices (+1; 0 = none).
	trs := []string{"inproc", "shm", "tcp"}
	tm := make([]float64, n*n)
	for p, ch := range s.chans {
		if ch == nil {
			continue
		}
		tm[me*n+p] = float64(len(trs) + 1)
		for k, name := range trs {
			if ch.Transport() == name {
				tm[me*n+p] = float64(k + 1)
			}
		}
	}
	if tm, err = sumAll(ctx, s.c, tm...); err != nil {
		return err
	}
	rep.header(pids, hosts)
	used := map[string]bool{}
	for _, v := range tm {
		if k := int(v) - 1; k >= 0 && k < len(trs) {
			used[trs[k]] = true
		} else if k == len(trs) {
			used["other"] = true
		}
	}
	var list []string
	for _, name := range append(trs, "other") {
		if used[name] {
			list = append(list, name)
		}
	}
	rep.printf("# p2p channels: protocol %v, transport %s\n", o.Protocol, strings.Join(list, ", "))
	if s.ll != nil && (used["inproc"] || used["shm"]) {
		rep.printf("# sizes up to %d bytes over inproc and shm travel as one line, the flag beside the data (LL, -ll 1)\n", channel.LineData)
	}
	rep.printf("#\n")
	return nil
}

// p2pPair is a pair the benchmark measures: a writes to b (and, with
// --bidir, b to a at the same time).
type p2pPair struct{ a, b int }

// p2pPairs lists the ordered pairs of n ranks, or the unordered ones with
// bidir, in the order every rank measures them.
func p2pPairs(n int, bidir bool) []p2pPair {
	var pairs []p2pPair
	for a := 0; a < n; a++ {
		for b := 0; b < n; b++ {
			if a != b && (!bidir || a < b) {
				pairs = append(pairs, p2pPair{a, b})
			}
		}
	}
	return pairs
}

// measure runs every pair at size, one pair at a time behind a barrier (a
// collective: every rank calls it). It returns, summed over the ranks, the
// µs per iteration of each pair (src rank by row, dst by column, n×n) and
// the number of wrong bytes the receivers found.
func (s *p2pRun) measure(ctx context.Context, o Options, pairs []p2pPair, size int64) ([]float64, float64, error) {
	n, me := s.n, s.me
	times := make([]float64, n*n)
	wrongs := 0.0
	for _, p := range pairs {
		if _, err := sumAll(ctx, s.c, 0); err != nil { // only this pair runs
			return nil, 0, err
		}
		if me != p.a && me != p.b {
			continue
		}
		us, wrong, err := s.measurePair(ctx, o, p, size)
		if err != nil {
			return nil, 0, err
		}
		if me == p.a {
			times[p.a*n+p.b] = us
		}
		wrongs += float64(wrong)
	}
	tot, err := sumAll(ctx, s.c, append(times, wrongs)...)
	if err != nil {
		return nil, 0, err
	}
	return tot[:n*n], tot[n*n], nil
}

// measurePair runs this rank's side of pair p at size: -w warm-up
// iterations, then -n timed ones. It returns the µs per timed iteration and,
// with -c 1 on a receiving rank, the bytes that arrived wrong.
//
// The transfers are the data plane's immediate calls (WriteWithNotifyNbi,
// ChannelNotifyWait; with -ll 1, for small sizes over inproc and shm, a
// PreparedLine, polled in place: llIter), made by this goroutine: a round trip costs what
// the link and the transport cost, and no hand-off to a stream's goroutine
// (a queued write, record and wait each travel through the thread's stream).
func (s *p2pRun) measurePair(ctx context.Context, o Options, p p2pPair, size int64) (float64, int64, error) {
	me := s.me
	peer := p.b
	if me == p.b {
		peer = p.a
	}
	ch, dst := s.chans[peer], s.dsts[peer]
	stop := ctx.Done()
	sender := me == p.a || o.Bidir
	var iter func() error
	if s.flagged(ch, size) {
		recvData, err := s.dev.Bytes(s.recvBuf, size)
		if err != nil {
			return 0, 0, err
		}
		s.recvData = recvData
		defer clear(s.ll) // every line of this pair taken: see p2pLLArea
		for i, off := range []int64{llWords(0), llWords(1), llAnswer} {
			l, err := hcomm.PrepareLine(ch, dst.Add(s.llOff+off))
			if err != nil {
				return 0, 0, err
			}
			s.lines[i] = l
		}
		if s.srcData, err = s.dev.Bytes(s.src, size); err != nil {
			return 0, 0, err
		}
		k := 0
		iter = func() error {
			err := s.llIter(stop, ch, k, sender, me == p.b || o.Bidir, o.Bidir)
			k++
			return err
		}
	} else {
		iter = s.notifyIter(stop, ch, dst, size, sender, o.Bidir)
	}
	for i := 0; i < o.Warmup; i++ {
		if err := iter(); err != nil {
			return 0, 0, err
		}
	}
	t0 := time.Now()
	for i := 0; i < o.Iters; i++ {
		if err := iter(); err != nil {
			return 0, 0, err
		}
	}
	us := time.Since(t0).Seconds() * 1e6 / float64(o.Iters)
	var wrong int64
	if o.Check && (me == p.b || o.Bidir) {
		from := p.a
		if me == p.a {
			from = p.b
		}
		wrong = checkP2P(s.dev, s.recvBuf, size, from, me, o)
	}
	return us, wrong, nil
}

// notifyIter returns one iteration of a pair as a write with a notify and,
// one way, the peer's answering record.
func (s *p2pRun) notifyIter(stop <-chan struct{}, ch *hcomm.Channel, dst device.Ptr, size int64, sender, bidir bool) func() error {
	k := 0
	return func() error {
		// Both ways at once, each side's next record may come
		// before the peer consumed the last one: alternate two
		// notifies (a notify is a flag, not a counter).
		data := p2pData
		if bidir {
			data = k % 2
		}
		k++
		if sender {
			if err := hcomm.WriteWithNotifyNbi(stop, ch, dst, s.src, size, data); err != nil {
				return err
			}
		}
		if bidir {
			return hcomm.ChannelNotifyWait(stop, ch, data, 0)
		}
		if sender {
			return hcomm.ChannelNotifyWait(stop, ch, p2pAck, 0)
		}
		if err := hcomm.ChannelNotifyWait(stop, ch, p2pData, 0); err != nil {
			return err
		}
		return hcomm.ChannelNotifyRecord(stop, ch, p2pAck)
	}
}

// flagged reports whether size travels as a line on ch (p2pLLArea).
func (s *p2pRun) flagged(ch *hcomm.Channel, size int64) bool {
	return s.ll != nil && size > 0 && size <= channel.LineData && ch.Flagged()
}

// llIter is iteration k of a pair in lines: the sender's line into the
// peer's area (parity k%2), the receiver's wait for it, and, one way, its
// answering line.
func (s *p2pRun) llIter(stop <-chan struct{}, ch *hcomm.Channel, k int, sender, receiver, bidir bool) error {
	flag, par := uint32(k+1), k%2
	if sender {
		if err := s.lines[par].Put(s.srcData, flag); err != nil {
			return err
		}
	}
	if receiver {
		l := s.ll[llWords(par) : llWords(par)+channel.LineSize]
		if err := llWait(stop, ch, s.c.Config().ExecTimeout, s.tight, func() bool { return channel.TakeLine(s.recvData, l, flag) }); err != nil {
			return err
		}
		if bidir {
			return nil
		}
		return s.lines[2].Put(nil, flag)
	}
	l := s.ll[llAnswer : llAnswer+channel.LineSize]
	return llWait(stop, ch, s.c.Config().ExecTimeout, s.tight, func() bool { return channel.TakeLine(nil, l, flag) })
}

// llWait polls take until it reports true: tightly (for up to llTight
// when tight, the ranks of the host having a core each), then yielding the
// processor between looks, and now and then looking whether stop has
// closed (the run's context: -T, an error elsewhere), the channel's peer is
// gone (its notifies broken) or the communicator's execution timeout
// (HCCL_EXEC_TIMEOUT, as a notify wait's) has passed, any of which ends
// the wait.
func llWait(stop <-chan struct{}, ch *hcomm.Channel, exec time.Duration, tight bool, take func() bool) error {
	start := time.Now()
	for i := 0; tight; i++ {
		if take() {
			return nil
		}
		spin.Pause() // as pingpong's loop: the peer's store gets the line sooner
		if i&255 == 255 && time.Since(start) >= llTight {
			break
		}
	}
	for {
		if spin.UntilYield(time.Millisecond, take) {
			return nil
		}
		select {
		case <-stop:
			return fmt.Errorf("p2p: waiting for rank %d's flagged words: stopped", ch.RemoteRank())
		default:
		}
		if _, err := hcomm.ChannelNotifyTryWait(ch, p2pAck); err != nil {
			return err
		}
		if exec > 0 && time.Since(start) > exec {
			return fmt.Errorf("p2p: rank %d's flagged words did not come within the execution timeout %v", ch.RemoteRank(), exec)
		}
	}
}

// llTight bounds llWait's poll without yields. A waiter that yields (a
// system call, 0.3 µs here) between looks answers a line a yield late, and
// when both ends of a ping-pong yield each round trip pays two: 2 shm
// processes on 2 cores measured 0.29–0.36 µs in most launches and 0.6–1.5
// in some (pingpong shm 0.24–0.32), the slow ones both ends yielding.
const llTight = 50 * time.Microsecond

// p2pRow reports one size: the pairs' mean time and its bandwidth, and the
// wrong bytes with -c 1.
func (r *report) p2pRow(o Options, n int, pairs []p2pPair, size int64, times []float64, wrongs float64) {
	avg := 0.0
	for _, p := range pairs {
		avg += times[p.a*n+p.b]
	}
	avg /= float64(len(pairs))
	res := &Result{TimeUs: avg, Wrong: -1}
	moved := float64(size)
	if o.Bidir {
		moved *= 2
	}
	if avg > 0 {
		res.AlgBW = moved / (avg * 1e-6) / 1e9
		res.BusBW = res.AlgBW
	}
	if o.Check {
		res.Wrong = int64(wrongs)
	}
	r.row(Row{Coll: "p2p", Size: size, Count: size, Type: "uint8", RedOp: "none", Root: -1, Out: res, In: &Result{NA: true}})
}

// checkP2P counts the bytes of this rank's benchmark buffer that differ from
// what rank from wrote.
func checkP2P(dev *device.Device, buf device.Ptr, size int64, from, me int, o Options) int64 {
	got := make([]byte, size)
	if err := dev.MemcpyDtoH(got, buf); err != nil {
		return size
	}
	if o.corrupt != nil {
		o.corrupt(me, false, got)
	}
	var wrong int64
	for i, b := range got {
		if b != p2pPattern(from, int64(i)) {
			wrong++
		}
	}
	return wrong
}

// p2pMatrices prints the per-pair latency (smallest size) and bandwidth
// (largest size) as matrices, source rank by row, destination by column.
func (r *report) p2pMatrices(n int, small int64, first []float64, big int64, last []float64, bidir bool) {
	if r.o.JSON || r.o.CSV {
		r.matrices = append(r.matrices, Matrix{What: "time_us", Size: small, Values: square(n, first)},
			Matrix{What: "bandwidth_gbps", Size: big, Values: square(n, bw(last, big, bidir))})
		return
	}
	dir := "unidirectional"
	if bidir {
		dir = "bidirectional (both ways at once, bytes of both directions counted)"
	}
	r.printf("#\n# p2p %s: round trip of a %d-byte write and its answer (us), src rank by row, dst by column\n", dir, small)
	r.matrix(n, first, func(v float64) string { return fmt.Sprintf("%9.2f", v) })
	r.printf("#\n# p2p %s: bandwidth of %d-byte writes (GB/s), src rank by row, dst by column\n", dir, big)
	r.matrix(n, bw(last, big, bidir), func(v float64) string { return fmt.Sprintf("%9.2f", v) })
	r.printf("#\n")
}

func bw(us []float64, size int64, bidir bool) []float64 {
	out := make([]float64, len(us))
	for i, t := range us {
		if t > 0 {
			out[i] = float64(size) / (t * 1e-6) / 1e9
			if bidir {
				out[i] *= 2
			}
		}
	}
	return out
}

func square(n int, v []float64) [][]float64 {
	out := make([][]float64, n)
	for i := range out {
		out[i] = v[i*n : (i+1)*n]
	}
	return out
}

func (r *report) matrix(n int, v []float64, f func(float64) string) {
	r.printf("# %7s", "src\\dst")
	for j := 0; j < n; j++ {
		r.printf(" %9d", j)
	}
	r.printf("\n")
	for i := 0; i < n; i++ {
		r.printf("# %7d", i)
		for j := 0; j < n; j++ {
			if v[i*n+j] == 0 {
				r.printf(" %9s", "-")
				continue
			}
			r.printf(" %s", f(v[i*n+j]))
		}
		r.printf("\n")
	}
}
