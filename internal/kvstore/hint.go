package kvstore

import (
	"hash/crc32"

	"github.com/gd2fs/gd2fs/internal/wire"
)

// Hint is what a client may say about a block's place in a prefix chain
// (block i of a request is only useful when blocks 0..i-1 are). The zero
// Hint says nothing, and a hint naming a key this store does not hold (it
// moved to another server, or was evicted) costs nothing but the hint.
type Hint struct {
	// Parent is the key of the block before this one in its chain; nil for
	// the first block or when unknown.
	Parent []byte
}

// PutHint is Put with a chain hint.
func (s *Store) PutHint(key, value []byte, overwrite bool, h Hint) (existed bool, err error) {
	return s.putHinted(key, value, crc32.Checksum(value, wire.Castagnoli), overwrite, h)
}

// PutCheckedHint is PutChecked with a chain hint.
func (s *Store) PutCheckedHint(key, value []byte, crc uint32, overwrite bool, h Hint) (existed bool, err error) {
	return s.putHinted(key, value, crc, overwrite, h)
}
