package hcomm

import (
	"fmt"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/reduce"
)

// LocalReduceToOnThread enqueues dst = a (op) b over count elements: the
// three-operand form of LocalReduceOnThread. It is an hcomm extension (HCCL's
// HcommLocalReduceOnThread only accumulates into dst): a schedule that
// combines a received piece with its own input writes the result straight
// to the output, instead of first copying the input there. dst may be the
// same memory as a or b, but must not partially overlap either.
func LocalReduceToOnThread(t *Thread, dst, a, b device.Ptr, count int64, dt DataType, rop ReduceOp) error {
	const op = "LocalReduceToOnThread"
	if t == nil {
		return &Error{Op: op, Rank: -1, Peer: -1, Code: ErrPtr, Msg: "nil thread"}
	}
	fail := func(code Result, err error, msg string) error {
		return &Error{Op: op, Rank: -1, Peer: -1, Code: code, Msg: msg, Err: err}
	}
	if count < 0 || !dt.Valid() || !rop.Valid() {
		return fail(ErrPara, nil, fmt.Sprintf("count %d, data type %v, op %v", count, dt, rop))
	}
	n := count * int64(dt.Size())
	dev := t.Stream().Device()
	for _, r := range []struct {
		what string
		p    device.Ptr
	}{{"dst", dst}, {"a", a}, {"b", b}} {
		if _, err := dev.Bytes(r.p, n); err != nil {
			return fail(ErrPara, err, r.what)
		}
	}
	return t.Stream().Launch(op, func(<-chan struct{}) error {
		d, err := dev.Bytes(dst, n)
		if err != nil {
			return err
		}
		x, err := dev.Bytes(a, n)
		if err != nil {
			return err
		}
		y, err := dev.Bytes(b, n)
		if err != nil {
			return err
		}
		return reduce.Reduce3(d, x, y, int(count), dt, rop)
	})
}
