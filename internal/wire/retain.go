package wire

import (
	"encoding/binary"
	"strconv"

	"github.com/gd2fs/gd2fs/errs"
)

// Retain is the payload of an OpKVRetain request (the changes to make) and
// of its response (the block's retention after them; Set is then all
// three). 16 bytes:
//
//	0 u8 set: 1 pin, 2 priority, 4 TTL   1 u8 pin tier (0 none, 1 DRAM, 2 disk)
//	2 i8 priority   3..7 zero   8 i64 TTL in ms
//
// TTL in a request: -1 removes the expiry, 0 or more expires the block that
// many ms from when the server reads it (0: at once, deleting it). In a
// response: the ms left, -1 for none, -2 when the block is gone (as Redis's
// TTL answers). Relative, so the clocks of clients and servers need not agree.
type Retain struct {
	Set      uint8
	Pin      uint8
	Priority int8
	TTL      int64
}

// Retain.Set bits.
const (
	RetainPin      uint8 = 1
	RetainPriority uint8 = 2
	RetainTTL      uint8 = 4
)

// RetainSize is the encoded size of a Retain.
const RetainSize = 16

// AppendRetain encodes r into b.
func AppendRetain(b []byte, r Retain) []byte {
	b = append(b, r.Set, r.Pin, byte(r.Priority), 0, 0, 0, 0, 0)
	return binary.LittleEndian.AppendUint64(b, uint64(r.TTL))
}

// ParseRetain decodes a Retain, checking every field's range.
func ParseRetain(b []byte) (Retain, error) {
	bad := func(what string) (Retain, error) {
		return Retain{}, errs.New(errs.ErrBadRequest, "wire: KV retain: %s", what)
	}
	if len(b) != RetainSize {
		return bad("payload of " + strconv.Itoa(len(b)) + " bytes, want 16")
	}
	r := Retain{Set: b[0], Pin: b[1], Priority: int8(b[2]), TTL: int64(binary.LittleEndian.Uint64(b[8:]))}
	switch {
	case r.Set&^(RetainPin|RetainPriority|RetainTTL) != 0:
		return bad("unknown change bits")
	case r.Pin > 2:
		return bad("pin tier beyond disk")
	case b[3]|b[4]|b[5]|b[6]|b[7] != 0:
		return bad("reserved bytes set")
	case r.TTL < -2:
		return bad("TTL below -2")
	}
	return r, nil
}
