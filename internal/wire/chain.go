package wire

import "github.com/gd2fs/gd2fs/errs"

// ChainHint is where a KV block sits in the chain of blocks of the request
// that put it (a request's blocks are a chain: block i is only useful after
// blocks 0..i-1). Clients send it in an OpKVPut's Count; servers use it for
// eviction (docs/kv-cache.md). It is a hint: a wrong one costs hits, never
// bytes.
//
//	bit 63: a hint is present (Count 0: no hint, as older clients send)
//	bit 62: Leaf, the last block of the request's chain
//	bits 0..31: Pos, the block's 0-based position in the chain
//	other bits: zero
type ChainHint struct {
	Pos  uint32
	Leaf bool
}

const (
	chainPresent  = uint64(1) << 63
	chainLeaf     = uint64(1) << 62
	chainReserved = ^(chainPresent | chainLeaf | 0xffffffff)
)

// Encode returns h as an OpKVPut Count.
func (h ChainHint) Encode() uint64 {
	c := chainPresent | uint64(h.Pos)
	if h.Leaf {
		c |= chainLeaf
	}
	return c
}

// DecodeChain reads an OpKVPut Count: ok is false when the put has no hint.
// Reserved bits set are a bad request, so the field can grow later.
func DecodeChain(count uint64) (h ChainHint, ok bool, err error) {
	if count == 0 {
		return ChainHint{}, false, nil
	}
	if count&chainPresent == 0 || count&chainReserved != 0 {
		return ChainHint{}, false, errs.New(errs.ErrBadRequest, "wire: kv_put chain hint %#x has reserved bits set", count)
	}
	return ChainHint{Pos: uint32(count), Leaf: count&chainLeaf != 0}, true, nil
}
