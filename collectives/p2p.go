package collectives

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// SendRecvType says whether a SendRecvItem sends or receives
// (HcclSendRecvType: HCCL_SEND = 0, HCCL_RECV = 1).
type SendRecvType int

const (
	SendItem SendRecvType = 0
	RecvItem SendRecvType = 1
)

// SendRecvItem is one transfer of a BatchSendRecv (HcclSendRecvItem).
type SendRecvItem struct {
	Type       SendRecvType
	Buf        device.Ptr
	Count      int64
	DataType   hcomm.DataType
	RemoteRank int
}

// Send enqueues on s the sending of count elements at buf to rank dest, which
// must call Recv with the same count and type (HcclSend). Sends and receives
// between a pair of ranks match in the order they are issued.
func Send(buf device.Ptr, count int64, dt hcomm.DataType, dest int, c *hcomm.Comm, s *device.Stream) error {
	return BatchSendRecv([]SendRecvItem{{Type: SendItem, Buf: buf, Count: count, DataType: dt, RemoteRank: dest}}, c, s)
}

// Recv enqueues on s the receiving of count elements from rank src into buf
// (HcclRecv).
func Recv(buf device.Ptr, count int64, dt hcomm.DataType, src int, c *hcomm.Comm, s *device.Stream) error {
	return BatchSendRecv([]SendRecvItem{{Type: RecvItem, Buf: buf, Count: count, DataType: dt, RemoteRank: src}}, c, s)
}

// BatchSendRecv enqueues on s every send and receive of items, in any order
// and to any peers, without deadlock whatever order the peers list theirs in:
// receives run on a second thread of the communicator, so that no send waits
// behind a receive (HcclBatchSendRecv). Items to one peer match that peer's
// items from this rank in order. A handshake with every peer involved checks
// that the bytes each side sends are the bytes the other expects.
func BatchSendRecv(items []SendRecvItem, c *hcomm.Comm, s *device.Stream) error {
	const name = "BatchSendRecv"
	if err := checkArgs(c, name, 0, hcomm.Int8, hcomm.Sum, s); err != nil {
		return err
	}
	me, n := c.Rank(), c.Size()
	sendTo, recvFrom := make([]int64, n), make([]int64, n) // bytes per peer
	sendSizes, recvSizes := make([][]int64, n), make([][]int64, n)
	for i, it := range items {
		switch {
		case it.Type != SendItem && it.Type != RecvItem:
			return collErr(c, name, hcomm.ErrPara, nil, "item %d: type %d is neither send (0) nor receive (1)", i, it.Type)
		case it.RemoteRank < 0 || it.RemoteRank >= n || it.RemoteRank == me:
			return collErr(c, name, hcomm.ErrPara, nil, "item %d: remote rank %d is outside [0, %d) or this rank", i, it.RemoteRank, n)
		case it.Count < 0 || !it.DataType.Valid():
			return collErr(c, name, hcomm.ErrPara, nil, "item %d: count %d of %v", i, it.Count, it.DataType)
		case overflows(it.Count, int64(it.DataType.Size())):
			return collErr(c, name, hcomm.ErrPara, nil, "item %d: count %d is too large: %d-byte %v overflow a 64-bit byte count", i, it.Count, it.DataType.Size(), it.DataType)
		}
		b := it.Count * int64(it.DataType.Size())
		if err := checkBuf(c, name, fmt.Sprintf("item %d", i), it.Buf, b); err != nil {
			return err
		}
		if it.Type == SendItem {
			sendTo[it.RemoteRank] += b
			sendSizes[it.RemoteRank] = append(sendSizes[it.RemoteRank], b)
		} else {
			recvFrom[it.RemoteRank] += b
			recvSizes[it.RemoteRank] = append(recvSizes[it.RemoteRank], b)
		}
	}
	if grouping(c) && recordItems(c, items, s) {
		return nil // group.go: GroupEnd issues them with the group's other sends and receives
	}
	var peers []int
	for p := 0; p < n; p++ {
		if p != me && (sendTo[p] > 0 || recvFrom[p] > 0 || hasItem(items, p)) {
			peers = append(peers, p)
		}
	}
	if len(peers) == 0 {
		return nil
	}
	st, err := lockLocal(c)
	if err != nil {
		return collErr(c, name, hcomm.ResultOf(err), err, "setting up the collectives")
	}
	defer st.mu.Unlock()
	// The hello carries, per rank, digests of the sizes of the items this
	// rank sends to it and expects from it, in order; the peer checks them
	// against its own items, so that items matched in order have the same
	// size. Whether they fit is known before any channel is set up.
	const per = 2
	if 8*per*n > int(st.lay.inline()) {
		return collErr(c, name, hcomm.ErrPara, nil, "%d ranks need %d bytes of hello, the HCCL buffer's slots hold %d", n, 8*per*n, st.lay.inline())
	}
	if err := st.connect(context.Background()); err != nil {
		return collErr(c, name, hcomm.ResultOf(err), err, "setting up the collective channels")
	}
	t, err := st.begin(s)
	if err != nil {
		return collErr(c, name, hcomm.ResultOf(err), err, "")
	}
	_, endOp := c.BeginOp(t, name, AlgoPairwise.String())
	sc := &sched{st: st, t: t, ctx: st.setupCtx(s)}
	if sc.need(peers); sc.unset { // the channels to peers met for the first time (state.go)
		endOp()
		return collErr(c, name, hcomm.ResultOf(sc.err), sc.err, "setting up the collective channels")
	}
	table := make([]int64, per*n)
	for p := 0; p < n; p++ {
		table[per*p], table[per*p+1] = int64(digest(sendSizes[p])), int64(digest(recvSizes[p]))
	}
	h := header{kind: kSendRecv, dt: hcomm.Int8, algo: AlgoPairwise}
	// The pipe pieces this call issues to and from each peer, to take back
	// when the handshake with the peer finds a mismatch (undoPipes).
	piece := st.lay.piece
	sendPieces, recvPieces := make([]uint64, n), make([]uint64, n)
	for _, it := range items {
		k := uint64(pieces(it.Count*int64(it.DataType.Size()), piece))
		if it.Type == SendItem {
			sendPieces[it.RemoteRank] += k
		} else {
			recvPieces[it.RemoteRank] += k
		}
	}
	sc.hello(h, peers, sc.countTable(table), int64(8*per*n), func(p int, payload []byte) error {
		if len(payload) < 8*per*n {
			st.undoPipes(p, sendPieces[p], recvPieces[p])
			return fmt.Errorf("rank %d's hello carries %d bytes, want %d", p, len(payload), 8*per*n)
		}
		at := func(i int) uint64 { return binary.LittleEndian.Uint64(payload[8*(per*me+i):]) }
		if at(0) != digest(recvSizes[p]) || at(1) != digest(sendSizes[p]) {
			st.undoPipes(p, sendPieces[p], recvPieces[p])
			return fmt.Errorf("rank %d's sends to rank %d do not match rank %d's receives from it (item sizes in bytes, in order: %v), or its receives do not match the sends %v",
				p, me, me, recvSizes[p], sendSizes[p])
		}
		return nil
	})
	// Receives go on the side thread, which starts after the hello.
	side, err := st.fork(s)
	if err != nil {
		sc.do(err)
	}
	rc := &sched{st: st, t: side}
	var rounds int64
	for _, it := range items {
		rounds = max(rounds, pieces(it.Count*int64(it.DataType.Size()), piece))
	}
	for q := int64(0); q < rounds && sc.ok() && rc.ok(); q++ {
		lo := q * piece
		for _, it := range items {
			b := it.Count * int64(it.DataType.Size())
			m := min(piece, b-lo)
			if m <= 0 {
				continue
			}
			if it.Type == SendItem {
				sc.pipeSend(it.RemoteRank, it.Buf.Add(lo), m)
			} else {
				slot, done := rc.pipeRecv(it.RemoteRank)
				rc.copy(it.Buf.Add(lo), slot, m)
				done()
			}
		}
	}
	if rc.err != nil {
		sc.do(rc.err)
	}
	sc.drainPipes() // the receivers' last nAcks, as every collective ends
	if sc.ok() {
		sc.do(st.join(s))
	}
	if sc.ok() {
		sc.do(endOp())
	}
	if sc.ok() {
		sc.do(st.end(s))
	}
	if sc.err != nil {
		st.err = sc.err
		return collErr(c, name, hcomm.ResultOf(sc.err), sc.err, "issuing the schedule")
	}
	return nil
}

func hasItem(items []SendRecvItem, p int) bool {
	for _, it := range items {
		if it.RemoteRank == p {
			return true
		}
	}
	return false
}
