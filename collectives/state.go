package collectives

import (
	"fmt"
	"sync"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// Notify indices on every collective channel. Each signal kind alternates
// between two indices so that a rank can be one exchange ahead of its peer
// without two records of one index collapsing (a notify is a flag, not a
// counter).
const (
	nData     = 0 // + slot: "piece written into your ring slot"
	nAck      = 2 // + slot: "ring slot consumed, you may write it again"
	nOne      = 4 // + parity: one-shot exchange (data, or a broadcast's ack)
	notifyNum = 6
	chanTag   = "hcomm/collectives"
)

// layout is how a rank's HCCL buffer is cut up; every rank computes the same.
type layout struct {
	oneSlot  int64 // bytes of one one-shot slot (0: no one-shot)
	oneArea  int64 // n * 2 one-shot slots
	ringOff  int64 // start of the two ring slots
	ringSlot int64 // bytes of one ring slot
	pieceMax int64 // bytes moved per ring piece
	bufSize  int64
}

// oneShotMax bounds the one-shot algorithms: above it the ring's pipelining wins.
const oneShotMax = 64 << 10

// ringPieceMax is the piece of the ring pipeline: small enough to stay in cache
// between the write and the reduce, big enough to amortise the hand-offs.
const ringPieceMax = 512 << 10

func newLayout(n int, bufSize int64) (layout, error) {
	l := layout{bufSize: bufSize}
	slot := (bufSize / 4) / int64(2*n)
	slot = slot &^ 63
	if slot > oneShotMax {
		slot = oneShotMax
	}
	if slot >= 64 {
		l.oneSlot = slot
		l.oneArea = slot * int64(2*n)
	}
	l.ringOff = (l.oneArea + 4095) &^ 4095
	l.ringSlot = ((bufSize - l.ringOff) / 2) &^ 63
	if l.ringSlot < 64 {
		return l, fmt.Errorf("HCCL buffer of %d bytes is too small for %d ranks: the collectives need at least %d", bufSize, n, l.ringOff+128)
	}
	l.pieceMax = l.ringSlot
	if l.pieceMax > ringPieceMax {
		l.pieceMax = ringPieceMax
	}
	return l, nil
}

func (l layout) oneSlotOff(from int, parity uint64) int64 {
	return (int64(from)*2 + int64(parity)) * l.oneSlot
}

func (l layout) ringSlotOff(k uint64) int64 { return l.ringOff + int64(k)*l.ringSlot }

// state is what a communicator's collectives remember between calls.
type state struct {
	mu      sync.Mutex
	comm    *hcomm.Comm
	lay     layout
	buf     device.Ptr
	chans   []*hcomm.Channel // by peer rank; nil for self
	peerBuf []device.Ptr     // peers' HCCL buffers
	threads map[*device.Stream]*hcomm.Thread

	pairSeq   []uint64 // one-shot exchanges with each peer so far
	ringSent  uint64   // ring pieces written to the right neighbour
	ringRecvd uint64   // ring pieces received from the left neighbour

	last       *device.Event // the previous collective's completion
	lastStream *device.Stream

	own      *device.Stream // the stream of the host-slice layer
	staging  device.Ptr     // the host-slice layer's device copy of the data
	stagingN int64
	err      error
}

type stateKey struct{}

func getState(c *hcomm.Comm) (*state, error) {
	if err := c.Check(); err != nil {
		return nil, err
	}
	st, _ := c.Value(stateKey{}, func() any { return &state{comm: c} }).(*state)
	if st == nil {
		return nil, fmt.Errorf("communicator is destroyed")
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.err != nil {
		return nil, st.err
	}
	if st.chans != nil || c.Size() == 1 {
		if st.threads == nil {
			st.init1()
		}
		return st, nil
	}
	st.err = st.setup()
	return st, st.err
}

func (st *state) init1() {
	c := st.comm
	st.threads = make(map[*device.Stream]*hcomm.Thread)
	st.pairSeq = make([]uint64, c.Size())
	buf, size, _ := c.GetHcclBuffer()
	st.buf = buf
	st.lay, _ = newLayout(c.Size(), size)
}

// setup acquires a channel to every peer (collective: every rank calls it at
// its first collective).
func (st *state) setup() error {
	c := st.comm
	st.init1()
	if _, err := newLayout(c.Size(), st.lay.bufSize); err != nil {
		return err
	}
	descs := hcomm.ChannelDescInit(c.Size() - 1)
	for i, j := 0, 0; i < c.Size(); i++ {
		if i == c.Rank() {
			continue
		}
		descs[j].RemoteRank = i
		descs[j].NotifyNum = notifyNum
		descs[j].Tag = chanTag
		j++
	}
	chs, err := c.ChannelAcquire(hcomm.EngineCPUTS, descs)
	if err != nil {
		return err
	}
	st.chans = make([]*hcomm.Channel, c.Size())
	st.peerBuf = make([]device.Ptr, c.Size())
	for _, ch := range chs {
		st.chans[ch.RemoteRank()] = ch
		p, size, err := c.ChannelGetHcclBuffer(ch)
		if err != nil {
			return err
		}
		if size != st.lay.bufSize {
			return fmt.Errorf("rank %d's HCCL buffer is %d bytes, this rank's %d: every rank must use the same HCCL_BUFFSIZE", ch.RemoteRank(), size, st.lay.bufSize)
		}
		st.peerBuf[ch.RemoteRank()] = p
	}
	return nil
}

// Close releases the host-slice layer's resources (called by Comm.Destroy).
func (st *state) Close() error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.own != nil {
		st.own.Destroy()
		st.own = nil
	}
	if st.last != nil {
		st.last.Destroy()
	}
	return nil
}

// thread returns the thread wrapping s, creating it on first use, and orders
// this collective after the previous one when that ran on another stream.
func (st *state) begin(s *device.Stream) (*hcomm.Thread, error) {
	t, ok := st.threads[s]
	if !ok {
		var err error
		t, err = st.comm.ThreadAcquireWithStream(hcomm.EngineCPUTS, s, 0)
		if err != nil {
			return nil, err
		}
		st.threads[s] = t
	}
	if st.last != nil && st.lastStream != s {
		if err := s.WaitEvent(st.last); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// end records the collective's completion on s.
func (st *state) end(s *device.Stream) error {
	if st.last == nil {
		e, err := st.comm.Device().CreateEventWithFlags(device.EventDisableTiming)
		if err != nil {
			return err
		}
		st.last = e
	}
	st.lastStream = s
	return st.last.Record(s)
}
