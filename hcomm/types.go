package hcomm

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/reduce"
)

// DataType is an element type, with HcclDataType's values.
type DataType = reduce.DataType

// Data types (HCCL_DATA_TYPE_*).
const (
	Int8     = reduce.Int8     // HCCL_DATA_TYPE_INT8 = 0
	Int16    = reduce.Int16    // HCCL_DATA_TYPE_INT16 = 1
	Int32    = reduce.Int32    // HCCL_DATA_TYPE_INT32 = 2
	Float16  = reduce.Float16  // HCCL_DATA_TYPE_FP16 = 3
	Float32  = reduce.Float32  // HCCL_DATA_TYPE_FP32 = 4
	Int64    = reduce.Int64    // HCCL_DATA_TYPE_INT64 = 5
	Uint64   = reduce.Uint64   // HCCL_DATA_TYPE_UINT64 = 6
	Uint8    = reduce.Uint8    // HCCL_DATA_TYPE_UINT8 = 7
	Uint16   = reduce.Uint16   // HCCL_DATA_TYPE_UINT16 = 8
	Uint32   = reduce.Uint32   // HCCL_DATA_TYPE_UINT32 = 9
	Float64  = reduce.Float64  // HCCL_DATA_TYPE_FP64 = 10
	BFloat16 = reduce.BFloat16 // HCCL_DATA_TYPE_BFP16 = 11
)

// ReduceOp is a reduction, with HcclReduceOp's values.
type ReduceOp = reduce.Op

// Reductions (HCCL_REDUCE_*).
const (
	Sum  = reduce.Sum  // HCCL_REDUCE_SUM = 0
	Prod = reduce.Prod // HCCL_REDUCE_PROD = 1
	Max  = reduce.Max  // HCCL_REDUCE_MAX = 2
	Min  = reduce.Min  // HCCL_REDUCE_MIN = 3
)

// Engine is where communication work runs (CommEngine, with HCCL's values).
// hcomm runs every task on the host: EngineCPU and EngineCPUTS are honoured,
// the others return ErrNotSupport.
type Engine int32

const (
	EngineCPU     Engine = 0 // COMM_ENGINE_CPU: host CPU
	EngineCPUTS   Engine = 1 // COMM_ENGINE_CPU_TS: host CPU with task scheduling (streams)
	EngineAICPU   Engine = 2 // COMM_ENGINE_AICPU: not supported
	EngineAICPUTS Engine = 3 // COMM_ENGINE_AICPU_TS: not supported
	EngineAIV     Engine = 4 // COMM_ENGINE_AIV: not supported
	EngineCCU     Engine = 5 // COMM_ENGINE_CCU: not supported
)

func (e Engine) String() string {
	switch e {
	case EngineCPU:
		return "CPU"
	case EngineCPUTS:
		return "CPU_TS"
	case EngineAICPU:
		return "AICPU"
	case EngineAICPUTS:
		return "AICPU_TS"
	case EngineAIV:
		return "AIV"
	case EngineCCU:
		return "CCU"
	}
	return "Engine(" + strconv.Itoa(int(e)) + ")"
}

func (e Engine) supported() bool { return e == EngineCPU || e == EngineCPUTS }

// Protocol is a link protocol (CommProtocol, with HCCL's values). Each maps to
// a transport: HCCS, SIO and HCCS_ONLY to memory the ranks share (inproc
// between ranks of one process, shm between processes of one host), PCIE to
// shm, ROCE and the UB family to tcp (transport.go). ProtocolAuto — HCCL's RESERVED, the value
// ChannelDescInit leaves — asks hcomm to pick the fastest transport that
// reaches the peer: a departure, since HCCL rejects RESERVED.
type Protocol int32

const (
	ProtocolAuto     Protocol = -1 // COMM_PROTOCOL_RESERVED: hcomm picks
	ProtocolHCCS     Protocol = 0  // COMM_PROTOCOL_HCCS
	ProtocolROCE     Protocol = 1  // COMM_PROTOCOL_ROCE
	ProtocolPCIE     Protocol = 2  // COMM_PROTOCOL_PCIE
	ProtocolSIO      Protocol = 3  // COMM_PROTOCOL_SIO
	ProtocolUBCCTP   Protocol = 4  // COMM_PROTOCOL_UBC_CTP
	ProtocolUBCTP    Protocol = 5  // COMM_PROTOCOL_UBC_TP
	ProtocolUBMem    Protocol = 6  // COMM_PROTOCOL_UB_MEM
	ProtocolUBOE     Protocol = 7  // COMM_PROTOCOL_UBOE
	ProtocolHCCSOnly Protocol = 8  // COMM_PROTOCOL_HCCS_ONLY
)

var protocolNames = map[Protocol]string{ProtocolAuto: "AUTO", ProtocolHCCS: "HCCS", ProtocolROCE: "ROCE",
	ProtocolPCIE: "PCIE", ProtocolSIO: "SIO", ProtocolUBCCTP: "UBC_CTP", ProtocolUBCTP: "UBC_TP",
	ProtocolUBMem: "UB_MEM", ProtocolUBOE: "UBOE", ProtocolHCCSOnly: "HCCS_ONLY"}

func (p Protocol) String() string {
	if s, ok := protocolNames[p]; ok {
		return s
	}
	return "Protocol(" + strconv.Itoa(int(p)) + ")"
}

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
	ErrUnavail      Result = 7  // HCCL_E_UNAVAIL: the communicator cannot be used (aborted, destroyed)
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

// Error is the error of every hcomm call: which communicator, rank and peer,
// which operation, which HcclResult, and the cause.
type Error struct {
	Op   string // "WriteOnThread", "ChannelAcquire", "AllReduce", …
	Comm string // the communicator's name
	Rank int    // -1 when not known (a launch environment that names none)
	Peer int    // -1 when no single peer is concerned
	Code Result
	Msg  string
	Err  error // the cause: a *device.Error, ErrAborted, a transport error…
}

func (e *Error) Error() string {
	s := "hcomm " + e.Comm
	if e.Rank >= 0 { // -1: the rank is not known (yet)
		s += fmt.Sprintf(" rank %d", e.Rank)
	}
	if e.Peer >= 0 {
		s += fmt.Sprintf(" peer %d", e.Peer)
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
