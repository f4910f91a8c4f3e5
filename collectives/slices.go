package collectives

import (
	"context"
	"reflect"
	"unsafe"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// Float16 is an IEEE 754 half-precision number held in its bits, so that the
// host-slice layer can carry HCCL_DATA_TYPE_FP16.
type Float16 uint16

// BFloat16 is a bfloat16 number held in its bits (HCCL_DATA_TYPE_BFP16).
type BFloat16 uint16

// Number is an element type of the host-slice layer.
type Number interface {
	~int8 | ~int16 | ~int32 | ~int64 | ~uint8 | ~uint16 | ~uint32 | ~uint64 | ~float32 | ~float64
}

// DataTypeOf returns the HCCL data type of T.
func DataTypeOf[T Number]() hcomm.DataType {
	var z T
	switch any(z).(type) {
	case Float16:
		return hcomm.Float16
	case BFloat16:
		return hcomm.BFloat16
	}
	switch reflect.TypeFor[T]().Kind() {
	case reflect.Int8:
		return hcomm.Int8
	case reflect.Int16:
		return hcomm.Int16
	case reflect.Int32:
		return hcomm.Int32
	case reflect.Int64:
		return hcomm.Int64
	case reflect.Uint8:
		return hcomm.Uint8
	case reflect.Uint16:
		return hcomm.Uint16
	case reflect.Uint32:
		return hcomm.Uint32
	case reflect.Uint64:
		return hcomm.Uint64
	case reflect.Float32:
		return hcomm.Float32
	default:
		return hcomm.Float64
	}
}

func asBytes[T Number](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(z)))
}

// part is a host slice of the slice layer and where it is staged in the
// device buffer.
type part struct {
	off int64
	b   []byte
}

// hostRun stages host data through device memory and runs one collective on
// the communicator's own stream, waiting for it within ctx: in is copied to
// a device buffer of size bytes (MemcpyHtoD), run enqueues the collective on
// it, and out is copied back (MemcpyDtoH) once the stream is done. The host
// slices are only ever reached through those copies, never aliased by device
// memory.
func hostRun(ctx context.Context, c *hcomm.Comm, op string, size int64, in, out part, run func(dev device.Ptr, s *device.Stream) error) error {
	if ctx == nil {
		return collErr(c, op, hcomm.ErrPara, nil, "nil context")
	}
	if err := inGroup(c, op); err != nil { // group.go
		return err
	}
	st, err := getStateContext(ctx, c)
	if err != nil {
		return collErr(c, op, hcomm.ResultOf(err), err, "setting up the collective channels")
	}
	st.mu.Lock()
	if st.own == nil {
		st.own, err = c.Device().CreateStream()
		if err != nil {
			st.mu.Unlock()
			return collErr(c, op, hcomm.ErrRuntime, err, "")
		}
	}
	if size > st.stagingN {
		if st.staging != 0 {
			c.Device().Free(st.staging)
		}
		st.staging, st.stagingN = 0, 0
		if p, err := c.Device().Malloc(size); err != nil {
			st.mu.Unlock()
			return collErr(c, op, hcomm.ErrMemory, err, "staging %d bytes", size)
		} else {
			st.staging, st.stagingN = p, size
		}
	}
	s, buf := st.own, st.staging
	st.mu.Unlock()
	if len(in.b) > 0 {
		if err := c.Device().MemcpyHtoD(buf.Add(in.off), in.b); err != nil {
			return collErr(c, op, hcomm.ErrRuntime, err, "")
		}
	}
	if err := run(buf, s); err != nil {
		return err
	}
	if err := s.Synchronize(ctx); err != nil {
		return collErr(c, op, hcomm.ResultOf(err), err, "")
	}
	if len(out.b) > 0 {
		if err := c.Device().MemcpyDtoH(out.b, buf.Add(out.off)); err != nil {
			return collErr(c, op, hcomm.ErrRuntime, err, "")
		}
	}
	return nil
}

// nilComm is the error of a slice-layer call on a nil communicator.
func nilComm(c *hcomm.Comm, op string) error {
	if c != nil {
		return nil
	}
	return collErr(c, op, hcomm.ErrPtr, nil, "nil communicator")
}

// AllReduceSlice reduces send across all ranks into recv (len(recv) must equal
// len(send); they may be the same slice) and returns when done or when ctx
// ends. A collective cut short by ctx leaves the communicator out of step with
// its peers: Abort it.
func AllReduceSlice[T Number](ctx context.Context, c *hcomm.Comm, send, recv []T, op hcomm.ReduceOp, o *Options) error {
	if err := nilComm(c, "AllReduce"); err != nil {
		return err
	}
	if len(send) != len(recv) {
		return collErr(c, "AllReduce", hcomm.ErrPara, nil, "send has %d elements, recv %d", len(send), len(recv))
	}
	dt := DataTypeOf[T]()
	in := asBytes(send)
	return hostRun(ctx, c, "AllReduce", int64(len(in)), part{b: in}, part{b: asBytes(recv)}, func(p device.Ptr, s *device.Stream) error {
		return AllReduce(p, p, int64(len(send)), dt, op, c, s, o)
	})
}

// BroadcastSlice copies root's buf into every rank's buf and returns when done
// or when ctx ends.
func BroadcastSlice[T Number](ctx context.Context, c *hcomm.Comm, buf []T, root int, o *Options) error {
	if err := nilComm(c, "Broadcast"); err != nil {
		return err
	}
	dt := DataTypeOf[T]()
	var in []byte
	if c.Rank() == root {
		in = asBytes(buf)
	}
	out := asBytes(buf)
	return hostRun(ctx, c, "Broadcast", int64(len(out)), part{b: in}, part{b: out}, func(p device.Ptr, s *device.Stream) error {
		return Broadcast(p, int64(len(buf)), dt, root, c, s, o)
	})
}

// AllGatherSlice gathers every rank's send into recv, rank r's at
// recv[r*len(send):]; len(recv) must be Size()*len(send).
func AllGatherSlice[T Number](ctx context.Context, c *hcomm.Comm, send, recv []T, o *Options) error {
	if err := nilComm(c, "AllGather"); err != nil {
		return err
	}
	n := c.Size()
	if len(recv) != n*len(send) {
		return collErr(c, "AllGather", hcomm.ErrPara, nil, "recv has %d elements, want %d ranks x %d", len(recv), n, len(send))
	}
	dt := DataTypeOf[T]()
	es := int64(dt.Size())
	// Staging: [recv | send] in one device buffer.
	rn := int64(len(recv)) * es
	in := part{off: rn, b: asBytes(send)}
	return hostRun(ctx, c, "AllGather", rn+int64(len(in.b)), in, part{b: asBytes(recv)}, func(p device.Ptr, s *device.Stream) error {
		return AllGather(p.Add(int64(len(recv))*es), p, int64(len(send)), dt, c, s, o)
	})
}

// ReduceScatterSlice reduces send (Size()*len(recv) elements) across all
// ranks; rank r receives the reduced elements [r*len(recv), (r+1)*len(recv)).
func ReduceScatterSlice[T Number](ctx context.Context, c *hcomm.Comm, send, recv []T, op hcomm.ReduceOp, o *Options) error {
	if err := nilComm(c, "ReduceScatter"); err != nil {
		return err
	}
	n := c.Size()
	if len(send) != n*len(recv) {
		return collErr(c, "ReduceScatter", hcomm.ErrPara, nil, "send has %d elements, want %d ranks x %d", len(send), n, len(recv))
	}
	dt := DataTypeOf[T]()
	in := asBytes(send)
	return hostRun(ctx, c, "ReduceScatter", int64(len(in)), part{b: in}, part{b: asBytes(recv)}, func(p device.Ptr, s *device.Stream) error {
		// In place: rank r's result lands over its own part of the input,
		// then is copied out from the start of the staging buffer.
		es := int64(dt.Size())
		mine := p.Add(int64(c.Rank()) * int64(len(recv)) * es)
		if err := ReduceScatter(p, mine, int64(len(recv)), dt, op, c, s, o); err != nil {
			return err
		}
		if mine != p && len(recv) > 0 {
			return s.MemcpyAsync(p, mine, int64(len(recv))*es, device.MemcpyDeviceToDevice)
		}
		return nil
	})
}

// ReduceSlice reduces send across all ranks into root's recv (recv is only
// written on root; other ranks may pass nil).
func ReduceSlice[T Number](ctx context.Context, c *hcomm.Comm, send, recv []T, op hcomm.ReduceOp, root int, o *Options) error {
	if err := nilComm(c, "Reduce"); err != nil {
		return err
	}
	if c.Rank() == root && len(recv) != len(send) {
		return collErr(c, "Reduce", hcomm.ErrPara, nil, "send has %d elements, recv %d", len(send), len(recv))
	}
	dt := DataTypeOf[T]()
	var out []byte
	if c.Rank() == root {
		out = asBytes(recv)
	}
	in := asBytes(send)
	return hostRun(ctx, c, "Reduce", int64(len(in)), part{b: in}, part{b: out}, func(p device.Ptr, s *device.Stream) error {
		return Reduce(p, p, int64(len(send)), dt, op, root, c, s, o)
	})
}

// AlltoAllSlice sends block p of send (len(send)/Size() elements) to rank p,
// which stores it as block r of its recv.
func AlltoAllSlice[T Number](ctx context.Context, c *hcomm.Comm, send, recv []T, o *Options) error {
	if err := nilComm(c, "AlltoAll"); err != nil {
		return err
	}
	n := c.Size()
	if len(send) != len(recv) || len(send)%n != 0 {
		return collErr(c, "AlltoAll", hcomm.ErrPara, nil, "send has %d elements and recv %d: want equal lengths divisible by %d ranks", len(send), len(recv), n)
	}
	dt := DataTypeOf[T]()
	es := int64(dt.Size())
	// Staging: [send | recv] in one device buffer.
	sn := int64(len(send)) * es
	return hostRun(ctx, c, "AlltoAll", 2*sn, part{b: asBytes(send)}, part{off: sn, b: asBytes(recv)}, func(p device.Ptr, s *device.Stream) error {
		bl := int64(len(send) / n)
		return AlltoAll(p, bl, dt, p.Add(sn), bl, dt, c, s, o)
	})
}

// BarrierContext returns once every rank has reached the barrier, or when
// ctx ends.
func BarrierContext(ctx context.Context, c *hcomm.Comm) error {
	if err := nilComm(c, "Barrier"); err != nil {
		return err
	}
	return hostRun(ctx, c, "Barrier", 0, part{}, part{}, func(_ device.Ptr, s *device.Stream) error {
		return Barrier(c, s)
	})
}
