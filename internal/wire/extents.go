package wire

import (
	"encoding/binary"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/limits"
)

// AppendExtents encodes written byte ranges of a chunk — flat pairs
// [start, end, start, end, ...], sorted and apart — as the payload of an
// OpExtents response: a u64 start and a u64 end each.
func AppendExtents(b []byte, ext []int64) []byte {
	for _, v := range ext {
		b = binary.LittleEndian.AppendUint64(b, uint64(v))
	}
	return b
}

// ParseExtents decodes an OpExtents response payload. It accepts only what
// a server can mean: at most limits.MaxChunkExtents ranges, each non-empty,
// inside a chunk, in order and apart; anything else is an error, never a
// claim that bytes were written.
func ParseExtents(b []byte) ([]int64, error) {
	if len(b)%16 != 0 {
		return nil, errs.New(errs.ErrBadRequest, "wire: extents: %d bytes, not whole (start, end) pairs", len(b))
	}
	if n := len(b) / 16; n > limits.MaxChunkExtents {
		return nil, errs.New(errs.ErrBadRequest, "wire: extents: %d ranges, at most %d", n, limits.MaxChunkExtents)
	}
	out := make([]int64, 0, len(b)/8)
	prev := int64(-1)
	for i := 0; i < len(b); i += 16 {
		a, z := binary.LittleEndian.Uint64(b[i:]), binary.LittleEndian.Uint64(b[i+8:])
		if a >= z || z > limits.MaxChunk || int64(a) <= prev {
			return nil, errs.New(errs.ErrBadRequest, "wire: extents: range [%d, %d) is empty, beyond a chunk or not after the one before", a, z)
		}
		out = append(out, int64(a), int64(z))
		prev = int64(z)
	}
	return out, nil
}
