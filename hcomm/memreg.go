package hcomm

import (
	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/device"
)

// MemHandle is memory registered with CommMemReg.
type MemHandle struct {
	comm *Comm
	mem  channel.Mem
}

// Mem returns the registered range.
func (h *MemHandle) Mem() channel.Mem { return h.mem }

// CommMemReg registers device memory so that peers may read and write it
// through channels (HcclCommMemReg). A channel acquired afterwards reaches
// it: the peer finds it in ChannelGetRemoteMems, and the data plane accepts
// ranges inside it. hcomm trades all of a rank's registered memory when a
// channel is acquired, so ChannelDesc.MemHandles need not name it. A channel
// acquired before does not reach it: remote ranges are checked against what
// the peer had registered when the channel was acquired.
func (c *Comm) CommMemReg(tag string, p device.Ptr, size int64) (*MemHandle, error) {
	const op = "CommMemReg"
	if err := c.usable(op); err != nil {
		return nil, err
	}
	if len(tag) > 255 {
		return nil, c.errorf(op, -1, ErrPara, nil, "tag is %d bytes; at most 255", len(tag))
	}
	if _, err := c.dev.Bytes(p, size); err != nil || size <= 0 {
		return nil, c.errorf(op, -1, ErrPara, err, "range [%#x, +%d) is not live device memory of this rank", uintptr(p), size)
	}
	m := channel.Mem{Tag: tag, Addr: p, Size: size}
	c.registry.Add(m)
	return &MemHandle{comm: c, mem: m}, nil
}

// CommMemDereg undoes CommMemReg. Peers must have stopped using the memory.
func (c *Comm) CommMemDereg(h *MemHandle) error {
	if h == nil || h.comm != c {
		return c.errorf("CommMemDereg", -1, ErrPtr, nil, "handle does not belong to this communicator")
	}
	if !c.registry.Remove(h.mem.Addr, h.mem.Tag) {
		return c.errorf("CommMemDereg", -1, ErrNotFound, nil, "range [%#x, +%d) is not registered", uintptr(h.mem.Addr), h.mem.Size)
	}
	return nil
}

// GetHcclBufferCleared is GetHcclBuffer with the buffer zeroed first
// (HcclGetHcclBufferCleared). It clears the whole buffer, now, in the
// calling goroutine, by giving its pages back (device.Memset of MallocLazy
// memory): a cleared buffer holds no memory until it is touched again, and
// clearing it costs no write of 2 × HCCL_BUFFSIZE bytes. The caller makes
// sure no peer writes into it meanwhile
// (before the channels' first handshake, or between collectives), and that
// no work queued on this rank's threads still uses it.
func (c *Comm) GetHcclBufferCleared() (device.Ptr, int64, error) {
	const op = "GetHcclBufferCleared"
	if err := c.usable(op); err != nil {
		return 0, 0, err
	}
	if err := c.dev.Memset(c.buf, c.bufSize, 0); err != nil {
		return 0, 0, c.errorf(op, -1, ErrRuntime, err, "clearing the HCCL buffer")
	}
	return c.buf, c.bufSize, nil
}
