// Package dtype is the one table of tensor element types gd2fs knows: the
// names KV layouts use (bf16, fp8, ...) and the names safetensors headers use
// (BF16, F8_E4M3, ...), each with its size in bytes.
package dtype

// sizes maps every accepted spelling to its element size. Names are matched
// exactly: the lower-case ones are what `gd2fs model layout set --dtype`
// documents, the upper-case ones are the safetensors specification's.
var sizes = map[string]int{
	// KV layout names (DESIGN.md §6).
	"fp32": 4, "float32": 4,
	"fp16": 2, "float16": 2, "bf16": 2, "bfloat16": 2,
	"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1, "uint8": 1,
	// safetensors names.
	"F64": 8, "I64": 8, "U64": 8,
	"F32": 4, "I32": 4, "U32": 4,
	"F16": 2, "BF16": 2, "I16": 2, "U16": 2,
	"F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1,
}

// Size is the size in bytes of one element of name, or 0 when the name is
// unknown.
func Size(name string) int { return sizes[name] }
