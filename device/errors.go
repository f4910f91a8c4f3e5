package device

import (
	"context"
	"errors"
	"fmt"
	"strconv"
)

// Code is a runtime error code. The values are ACL's aclError values
// (ACL_ERROR_RT_*, from acl_base_rt.h / rt_error_codes.h); the names in the
// comments give the CUDA driver's CUresult with the same meaning where there is
// one. A Code is itself an error, so callers test with errors.Is:
//
//	if errors.Is(err, device.ErrEventNotComplete) { ... }
type Code int32

// Runtime error codes. Every error the package returns is an *Error carrying
// one of these.
const (
	Success                Code = 0      // ACL_SUCCESS / CUDA_SUCCESS
	ErrInvalidValue        Code = 107000 // ACL_ERROR_RT_PARAM_INVALID / CUDA_ERROR_INVALID_VALUE
	ErrInvalidDeviceID     Code = 107001 // ACL_ERROR_RT_INVALID_DEVICEID / CUDA_ERROR_INVALID_DEVICE
	ErrStreamSubscribe     Code = 107011 // ACL_ERROR_RT_STREAM_SUBSCRIBE
	ErrThreadSubscribe     Code = 107012 // ACL_ERROR_RT_THREAD_SUBSCRIBE
	ErrStreamNoCallbackReg Code = 107015 // ACL_ERROR_RT_STREAM_NO_CB_REG
	ErrInvalidHandle       Code = 107017 // ACL_ERROR_RT_INVALID_HANDLE / CUDA_ERROR_INVALID_HANDLE
	ErrWaitTimeout         Code = 107019 // ACL_ERROR_RT_WAIT_TIMEOUT: a wait task (event, notify) timed out
	ErrTaskTimeout         Code = 107020 // ACL_ERROR_RT_TASK_TIMEOUT
	ErrDeviceTaskAbort     Code = 107022 // ACL_ERROR_RT_DEVICE_TASK_ABORT: the device was closed under the task
	ErrStreamAbort         Code = 107023 // ACL_ERROR_RT_STREAM_ABORT: the stream was aborted under the task
	ErrFeatureNotSupported Code = 207000 // ACL_ERROR_RT_FEATURE_NOT_SUPPORT / CUDA_ERROR_NOT_SUPPORTED
	ErrMemoryAllocation    Code = 207001 // ACL_ERROR_RT_MEMORY_ALLOCATION / CUDA_ERROR_OUT_OF_MEMORY
	ErrInternal            Code = 507000 // ACL_ERROR_RT_INTERNAL_ERROR
	ErrStreamNotComplete   Code = 507004 // ACL_ERROR_RT_STREAM_NOT_COMPLETE / CUDA_ERROR_NOT_READY (stream)
	ErrEventNotComplete    Code = 507006 // ACL_ERROR_RT_EVENT_NOT_COMPLETE / CUDA_ERROR_NOT_READY (event)
	ErrReportTimeout       Code = 507012 // ACL_ERROR_RT_REPORT_TIMEOUT
	ErrStreamSyncTimeout   Code = 507046 // ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
	ErrEventSyncTimeout    Code = 507047 // ACL_ERROR_RT_EVENT_SYNC_TIMEOUT
)

var codeNames = map[Code]string{
	Success:                "success",
	ErrInvalidValue:        "invalid value",
	ErrInvalidDeviceID:     "invalid device id",
	ErrStreamSubscribe:     "stream already subscribed",
	ErrThreadSubscribe:     "thread not subscribed",
	ErrStreamNoCallbackReg: "stream has no callback subscription",
	ErrInvalidHandle:       "invalid handle",
	ErrWaitTimeout:         "wait timed out",
	ErrTaskTimeout:         "task timed out",
	ErrDeviceTaskAbort:     "device closed; task aborted",
	ErrStreamAbort:         "stream aborted",
	ErrFeatureNotSupported: "feature not supported",
	ErrMemoryAllocation:    "memory allocation failed",
	ErrInternal:            "internal error",
	ErrStreamNotComplete:   "stream not complete",
	ErrEventNotComplete:    "event not complete",
	ErrReportTimeout:       "report timed out",
	ErrStreamSyncTimeout:   "stream synchronize timed out",
	ErrEventSyncTimeout:    "event synchronize timed out",
}

// Error returns the code's description and its number.
func (c Code) Error() string {
	if n, ok := codeNames[c]; ok {
		return n + " (" + strconv.Itoa(int(c)) + ")"
	}
	return "aclError " + strconv.Itoa(int(c))
}

// Timeout reports whether the code is one of the timeout codes.
func (c Code) Timeout() bool {
	switch c {
	case ErrWaitTimeout, ErrTaskTimeout, ErrReportTimeout, ErrStreamSyncTimeout, ErrEventSyncTimeout:
		return true
	}
	return false
}

// Is makes a timeout code match context.DeadlineExceeded.
func (c Code) Is(target error) bool {
	return target == context.DeadlineExceeded && c.Timeout()
}

// Error is the error every device call returns: which operation, on which
// device and stream, failed with which code, and why.
type Error struct {
	Op     string // the runtime call, e.g. "MemcpyAsync", "Event.ElapsedTime"
	Device int    // device id, -1 if none
	Stream int64  // stream id, -1 if none
	Code   Code
	Msg    string // what exactly was wrong: the address, the length, the handle
	Err    error  // an underlying cause, if any
}

func (e *Error) Error() string {
	s := "device"
	if e.Device >= 0 {
		s += " " + strconv.Itoa(e.Device)
	}
	if e.Stream >= 0 {
		s += " stream " + strconv.FormatInt(e.Stream, 10)
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

// Unwrap returns the underlying cause.
func (e *Error) Unwrap() error { return e.Err }

// Is matches the error's Code, and context.DeadlineExceeded for timeouts.
func (e *Error) Is(target error) bool {
	if c, ok := target.(Code); ok {
		return c == e.Code
	}
	return e.Code.Is(target)
}

// Timeout reports whether the error is a timeout.
func (e *Error) Timeout() bool { return e.Code.Timeout() }

// CodeOf returns the Code carried by err: Success for nil, ErrInternal for an
// error that carries none.
func CodeOf(err error) Code {
	if err == nil {
		return Success
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	var c Code
	if errors.As(err, &c) {
		return c
	}
	return ErrInternal
}

func newErr(op string, dev int, stream int64, code Code, format string, args ...any) *Error {
	msg := format
	if len(args) > 0 {
		msg = fmt.Sprintf(format, args...)
	}
	return &Error{Op: op, Device: dev, Stream: stream, Code: code, Msg: msg}
}
