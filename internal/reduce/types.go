package reduce

import (
	"fmt"
	"strconv"
	"strings"
)

// DataType mirrors HcclDataType / HcommDataType values exactly.
type DataType int32

// Data types, with HCCL's values.
const (
	Int8     DataType = 0
	Int16    DataType = 1
	Int32    DataType = 2
	Float16  DataType = 3
	Float32  DataType = 4
	Int64    DataType = 5
	Uint64   DataType = 6
	Uint8    DataType = 7
	Uint16   DataType = 8
	Uint32   DataType = 9
	Float64  DataType = 10
	BFloat16 DataType = 11
)

var dtInfo = [...]struct {
	name string
	size int
}{
	Int8: {"int8", 1}, Int16: {"int16", 2}, Int32: {"int32", 4}, Float16: {"fp16", 2}, Float32: {"fp32", 4},
	Int64: {"int64", 8}, Uint64: {"uint64", 8}, Uint8: {"uint8", 1}, Uint16: {"uint16", 2}, Uint32: {"uint32", 4},
	Float64: {"fp64", 8}, BFloat16: {"bf16", 2},
}

// Valid reports whether d is a supported data type.
func (d DataType) Valid() bool { return d >= 0 && int(d) < len(dtInfo) }

// Size returns the bytes per element, 0 for an unsupported type.
func (d DataType) Size() int {
	if !d.Valid() {
		return 0
	}
	return dtInfo[d].size
}

func (d DataType) String() string {
	if !d.Valid() {
		return "DataType(" + strconv.Itoa(int(d)) + ")"
	}
	return dtInfo[d].name
}

// IsFloat reports whether d is a floating-point type.
func (d DataType) IsFloat() bool {
	return d == Float16 || d == Float32 || d == Float64 || d == BFloat16
}

// DataTypes returns every supported type in enum order.
func DataTypes() []DataType {
	out := make([]DataType, len(dtInfo))
	for i := range out {
		out[i] = DataType(i)
	}
	return out
}

// ParseDataType accepts String's names and common aliases.
func ParseDataType(s string) (DataType, error) {
	switch strings.ToLower(s) {
	case "float32", "float", "f32":
		return Float32, nil
	case "half", "float16", "f16":
		return Float16, nil
	case "bfloat16", "bfp16":
		return BFloat16, nil
	case "double", "float64", "f64":
		return Float64, nil
	}
	for _, d := range DataTypes() {
		if d.String() == strings.ToLower(s) {
			return d, nil
		}
	}
	return 0, fmt.Errorf("unknown data type %q", s)
}

// Op mirrors HcclReduceOp: SUM=0, PROD=1, MAX=2, MIN=3.
type Op int32

// Reductions, with HCCL's values.
const (
	Sum  Op = 0
	Prod Op = 1
	Max  Op = 2
	Min  Op = 3
)

var opNames = [...]string{"sum", "prod", "max", "min"}

// Valid reports whether o is a supported reduction.
func (o Op) Valid() bool { return o >= 0 && int(o) < len(opNames) }

func (o Op) String() string {
	if !o.Valid() {
		return "Op(" + strconv.Itoa(int(o)) + ")"
	}
	return opNames[o]
}

// Ops returns every reduction in enum order.
func Ops() []Op { return []Op{Sum, Prod, Max, Min} }

// ParseOp accepts String's names.
func ParseOp(s string) (Op, error) {
	for _, o := range Ops() {
		if o.String() == strings.ToLower(s) {
			return o, nil
		}
	}
	return 0, fmt.Errorf("unknown reduce op %q", s)
}
