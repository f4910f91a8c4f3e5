package device

import "encoding/binary"

// The copy descriptor (aclrtSetMemcpyDesc's "level-2 pointer mode"): a small
// record in device memory that a copy task reads when it runs, so that work on
// the device can rewrite a copy's addresses without the host. Layout, little
// endian: magic uint32, kind uint32, src uint64, dst uint64, count uint64.
const (
	memcpyDescSize  = 32
	memcpyDescMagic = 0x444d4348 // "HCMD"
)

// MemcpyDescSize returns how many bytes of device memory a descriptor of kind
// needs (aclrtGetMemcpyDescSize). Only MemcpyInnerDeviceToDevice is supported,
// as in ACL; any other kind is ErrFeatureNotSupported.
func MemcpyDescSize(kind MemcpyKind) (int64, error) {
	if kind != MemcpyInnerDeviceToDevice {
		return 0, newErr("MemcpyDescSize", -1, -1, ErrFeatureNotSupported, "copy descriptors support only %v, not %v", MemcpyInnerDeviceToDevice, kind)
	}
	return memcpyDescSize, nil
}

// SetMemcpyDesc writes into the descriptor at desc a copy of count bytes from
// src to dst (aclrtSetMemcpyDesc). desc must be device memory of at least
// MemcpyDescSize bytes on d; src and dst must be device memory on d.
func (d *Device) SetMemcpyDesc(desc Ptr, kind MemcpyKind, src, dst Ptr, count int64) error {
	const op = "SetMemcpyDesc"
	if err := d.check(op); err != nil {
		return err
	}
	if _, err := MemcpyDescSize(kind); err != nil {
		e := err.(*Error)
		e.Op, e.Device = op, d.id
		return e
	}
	dr, err := resolveDesc(op, d, -1, desc)
	if err != nil {
		return err
	}
	if _, _, err := checkKind(op, d, -1, dst, src, count, kind); err != nil {
		return err
	}
	b := dr.mem
	binary.LittleEndian.PutUint32(b[0:], memcpyDescMagic)
	binary.LittleEndian.PutUint32(b[4:], uint32(kind))
	binary.LittleEndian.PutUint64(b[8:], uint64(src))
	binary.LittleEndian.PutUint64(b[16:], uint64(dst))
	binary.LittleEndian.PutUint64(b[24:], uint64(count))
	return nil
}

func resolveDesc(op string, d *Device, stream int64, desc Ptr) (region, error) {
	r, err := resolve(op, d, stream, "desc", desc, memcpyDescSize)
	if err != nil {
		return r, err
	}
	if r.a.host {
		return r, newErr(op, d.id, stream, ErrInvalidValue, "desc %#x is host memory; a copy descriptor lives in device memory", uintptr(desc))
	}
	if r.a.dev != d {
		return r, newErr(op, d.id, stream, ErrInvalidValue, "desc %#x belongs to another device context (device %d)", uintptr(desc), r.a.dev.id)
	}
	return r, nil
}

// MemcpyAsyncWithDesc enqueues the copy that the descriptor at desc describes
// (aclrtMemcpyAsyncWithDesc). The descriptor is read when the task runs, not
// now: a descriptor rewritten in between is honoured, and one that is not valid
// then (never set, wrong kind, addresses freed) fails the stream with
// ErrInvalidValue and raises the exception callback. A nil s is the default
// stream of desc's device.
func (s *Stream) MemcpyAsyncWithDesc(desc Ptr, kind MemcpyKind) error {
	const op = "MemcpyAsyncWithDesc"
	s, err := s.orDefault(op, ownerOf(desc))
	if err != nil {
		return err
	}
	if err := s.usable(op); err != nil {
		return err
	}
	if _, err := MemcpyDescSize(kind); err != nil {
		e := err.(*Error)
		e.Op, e.Device, e.Stream = op, s.dev.id, s.id
		return e
	}
	dr, err := resolveDesc(op, s.dev, s.id, desc)
	if err != nil {
		return err
	}
	return s.Launch(op, func(<-chan struct{}) error {
		if !pin(dr) {
			return s.errf(op, ErrInvalidValue, "descriptor memory was freed before the task ran")
		}
		var b [memcpyDescSize]byte
		copy(b[:], dr.mem)
		unpin(dr)
		if binary.LittleEndian.Uint32(b[0:]) != memcpyDescMagic {
			return s.errf(op, ErrInvalidValue, "descriptor at %#x was never set by SetMemcpyDesc", uintptr(desc))
		}
		if k := MemcpyKind(binary.LittleEndian.Uint32(b[4:])); k != kind {
			return s.errf(op, ErrInvalidValue, "descriptor at %#x holds kind %v, the call says %v", uintptr(desc), k, kind)
		}
		src := Ptr(binary.LittleEndian.Uint64(b[8:]))
		dst := Ptr(binary.LittleEndian.Uint64(b[16:]))
		n := int64(binary.LittleEndian.Uint64(b[24:]))
		dreg, sreg, err := checkKind(op, s.dev, s.id, dst, src, n, kind)
		if err != nil {
			return err
		}
		return s.copyTask(op, dreg, sreg, nil)
	})
}
