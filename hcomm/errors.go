package hcomm

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/hcomm-dev/hcomm/device"
)

// Result is an HcclResult code. A Result is an error; errors.Is(err, hcomm.ErrTimeout) works.
type Result int32

// HcclResult values.
const (
	Success         Result = 0  // HCCL_SUCCESS
	ErrPara         Result = 1  // HCCL_E_PARA: a parameter is wrong
	ErrPtr          Result = 2  // HCCL_E_PTR: a nil or bad pointer/handle
	ErrMemory       Result = 3  // HCCL_E_MEMORY
	ErrInternal     Result = 4  // HCCL_E_INTERNAL
	ErrNotSupport   Result = 5  // HCCL_E_NOT_SUPPORT
	ErrNotFound     Result = 6  // HCCL_E_NOT_FOUND
	ErrUnavail      Result = 7  // HCCL_E_UNAVAIL: the communicator cannot be used (aborted, destroyed), or the caller's context cancelled the call
	ErrSyscall      Result = 8  // HCCL_E_SYSCALL
	ErrTimeout      Result = 9  // HCCL_E_TIMEOUT
	ErrOpenFile     Result = 10 // HCCL_E_OPEN_FILE_FAILURE
	ErrTCPConnect   Result = 11 // HCCL_E_TCP_CONNECT
	ErrROCEConnect  Result = 12 // HCCL_E_ROCE_CONNECT
	ErrTCPTransfer  Result = 13 // HCCL_E_TCP_TRANSFER
	ErrROCETransfer Result = 14 // HCCL_E_ROCE_TRANSFER
	ErrRuntime      Result = 15 // HCCL_E_RUNTIME: the device runtime failed
	ErrDrv          Result = 16 // HCCL_E_DRV
	ErrProfiling    Result = 17 // HCCL_E_PROFILING
	ErrCCE          Result = 18 // HCCL_E_CCE
	ErrNetwork      Result = 19 // HCCL_E_NETWORK
	ErrAgain        Result = 20 // HCCL_E_AGAIN
	ErrRemote       Result = 21 // HCCL_E_REMOTE
	ErrSuspending   Result = 22 // HCCL_E_SUSPENDING
	ErrOpRetryFail  Result = 23 // HCCL_E_OPRETRY_FAIL
	ErrOOM          Result = 24 // HCCL_E_OOM
)

var resultNames = [...]string{"success", "parameter error", "pointer error", "memory error", "internal error",
	"not supported", "not found", "unavailable", "system call error", "timeout", "open file failure",
	"TCP connect error", "RoCE connect error", "TCP transfer error", "RoCE transfer error", "runtime error",
	"driver error", "profiling error", "CCE error", "network error", "try again", "remote error",
	"suspending", "op retry failed", "out of memory"}

// Error returns the HCCL name of the code.
func (r Result) Error() string {
	if r >= 0 && int(r) < len(resultNames) {
		return resultNames[r] + " (HcclResult " + strconv.Itoa(int(r)) + ")"
	}
	return "HcclResult " + strconv.Itoa(int(r))
}

// Is makes ErrTimeout match context.DeadlineExceeded.
func (r Result) Is(target error) bool { return r == ErrTimeout && target == context.DeadlineExceeded }

// ErrAborted is wrapped by every error of an operation that Abort ended.
var ErrAborted = errors.New("communicator aborted")

// ErrRevoked is wrapped by every error of an operation that failed because
// its communicator was revoked (Revoke, Shrink) on this rank or another.
var ErrRevoked = errors.New("communicator revoked")

// Error is the error of every hcomm call: which communicator, rank and peer,
// which operation, which HcclResult, and the cause.
type Error struct {
	Op   string // "WriteOnThread", "ChannelAcquire", "AllReduce", …
	Comm string // the communicator's name
	Rank int
	Peer int // -1 when no single peer is concerned
	Code Result
	Msg  string
	Err  error // the cause: a *device.Error, ErrAborted, a transport error…
}

func (e *Error) Error() string {
	s := "hcomm"
	if e.Comm != "" {
		s += " " + e.Comm
	}
	if e.Rank >= 0 {
		s += " rank " + strconv.Itoa(e.Rank)
	}
	if e.Peer >= 0 {
		s += " peer " + strconv.Itoa(e.Peer)
	}
	s += ": " + e.Op + ": " + e.Code.Error()
	if e.Msg != "" {
		s += ": " + e.Msg
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// ended returns the code and cause of a failed setup step bounded by ctx
// (the caller's context, bounded by HCCL_CONNECT_TIMEOUT): when ctx has
// ended, ErrTimeout for a deadline and ErrUnavail for a cancellation, the
// cause then wrapping the context's error so that errors.Is matches it;
// otherwise code and err unchanged.
func ended(ctx context.Context, code Result, err error) (Result, error) {
	ce := ctx.Err()
	if ce == nil {
		return code, err
	}
	if !errors.Is(err, ce) {
		err = fmt.Errorf("%w (%w)", err, ce)
	}
	if ce == context.DeadlineExceeded {
		return ErrTimeout, err
	}
	return ErrUnavail, err
}

// noRankErr is the error of a call that knows no rank of a communicator: a
// nil handle, or a communicator not made yet (Rank and Peer are -1). msg is
// format with args, as in fmt.Sprintf, or "" for none.
func noRankErr(op, comm string, code Result, cause error, format string, args ...any) *Error {
	msg := format
	if len(args) > 0 {
		msg = fmt.Sprintf(format, args...)
	}
	return &Error{Op: op, Comm: comm, Rank: -1, Peer: -1, Code: code, Msg: msg, Err: cause}
}

// nilCommErr is the error of a method called on a nil *Comm.
func nilCommErr(op string) *Error { return noRankErr(op, "", ErrPtr, nil, "nil communicator") }

// Timeout reports whether the error is a timeout: its code is ErrTimeout (a
// wait past HCCL_EXEC_TIMEOUT, a setup past HCCL_CONNECT_TIMEOUT) or a
// deadline of the caller's context ended the call. Such an error also
// matches context.DeadlineExceeded.
func (e *Error) Timeout() bool {
	return e.Code == ErrTimeout || errors.Is(e.Err, context.DeadlineExceeded)
}

// Is matches the Result code, and context.DeadlineExceeded for timeouts.
func (e *Error) Is(target error) bool {
	if r, ok := target.(Result); ok {
		return r == e.Code
	}
	return e.Code.Is(target)
}

// ResultOf returns the HcclResult an error carries: Success for nil, the code
// of an *Error, a device timeout as ErrTimeout, other device errors as
// ErrRuntime, anything else as ErrInternal.
func ResultOf(err error) Result {
	if err == nil {
		return Success
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	var r Result
	if errors.As(err, &r) {
		return r
	}
	var de *device.Error
	if errors.As(err, &de) {
		return fromDevice(de)
	}
	return ErrInternal
}

func fromDevice(de *device.Error) Result {
	switch {
	case de.Code.Timeout():
		return ErrTimeout
	case de.Code == device.ErrStreamAbort || de.Code == device.ErrDeviceTaskAbort:
		return ErrUnavail
	case de.Code == device.ErrInvalidValue:
		return ErrPara
	case de.Code == device.ErrInvalidHandle:
		return ErrPtr
	}
	return ErrRuntime
}
