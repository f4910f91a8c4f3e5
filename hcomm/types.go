package hcomm

import (
	"strconv"

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
