package kvlayout

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"

	"github.com/gd2fs/gd2fs/errs"
)

// Block hashes: what explicit-mode plans compare so that a session's stored
// KV is used only for the very tokens it was computed from (docs/kv-cache.md
// "The content check"). One definition, shared by the master, the SDK, the
// router, the CLI and pygd2fs (python/pygd2fs/_hashes.py, checked against
// this one by TestBlockHashesMatchPython and the CLI's `session hashes`):
//
//	h[-1] = 16 zero bytes
//	h[i]  = SHA-256(h[i-1] || uint32le(id) for each token id of block i)[:16]
//
// Block i is tokens [i*pageTokens, (i+1)*pageTokens); the last block of a
// sequence may be partial (fewer tokens), and its hash covers just those.
// Because each hash takes its parent, block i's hash covers tokens 0 to the
// end of block i, as hash-mode KV keys chain. The text form is 32 lowercase
// hex digits.

// BlockHashSize is the size in bytes of a block hash.
const BlockHashSize = 16

// BlockHash is the chained hash of a block of token ids.
type BlockHash [BlockHashSize]byte

// String is the hash as 32 lowercase hex digits.
func (h BlockHash) String() string { return hex.EncodeToString(h[:]) }

// MarshalText writes the hex form (JSON strings).
func (h BlockHash) MarshalText() ([]byte, error) { return []byte(h.String()), nil }

// UnmarshalText reads the hex form.
func (h *BlockHash) UnmarshalText(b []byte) error {
	x, err := ParseBlockHash(string(b))
	*h = x
	return err
}

// ParseBlockHash reads a hash in its text form.
func ParseBlockHash(s string) (BlockHash, error) {
	var h BlockHash
	if len(s) != 2*BlockHashSize {
		return h, errs.New(errs.ErrBadRequest, "block hash %.40q: want %d hex digits, got %d", s, 2*BlockHashSize, len(s))
	}
	if _, err := hex.Decode(h[:], []byte(s)); err != nil {
		return h, errs.New(errs.ErrBadRequest, "block hash %.40q: not hex: %v", s, err)
	}
	return h, nil
}

// HashBlock is the hash of a block of token ids whose predecessor's hash is
// parent (the zero hash for block 0).
func HashBlock(parent BlockHash, ids []uint32) BlockHash {
	d := sha256.New()
	d.Write(parent[:])
	var b [4 * 256]byte
	for len(ids) > 0 {
		n := min(len(ids), 256)
		for i, id := range ids[:n] {
			binary.LittleEndian.PutUint32(b[4*i:], id)
		}
		d.Write(b[:4*n])
		ids = ids[n:]
	}
	var sum [sha256.Size]byte
	var h BlockHash
	copy(h[:], d.Sum(sum[:0]))
	return h
}

// BlockHashes is the chain of block hashes of ids in blocks of pageTokens
// tokens: one per block, the last one of a partial block when len(ids) is
// not a multiple of pageTokens. pageTokens must be at least 1.
func BlockHashes(ids []uint32, pageTokens int) []BlockHash {
	if pageTokens < 1 {
		panic("kvlayout.BlockHashes: pageTokens < 1")
	}
	out := make([]BlockHash, 0, (len(ids)+pageTokens-1)/pageTokens)
	var parent BlockHash
	for at := 0; at < len(ids); at += pageTokens {
		parent = HashBlock(parent, ids[at:min(at+pageTokens, len(ids))])
		out = append(out, parent)
	}
	return out
}
