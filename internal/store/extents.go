package store

import (
	"encoding/binary"
	"hash/crc32"
	"sort"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/crc32c"
	"github.com/gd2fs/gd2fs/internal/limits"
)

// Written extents.
//
// A chunk's length is the end of its furthest write; the bytes below it that
// no write covered (a hole) read as zeros with a valid CRC. So "the chunk
// holds N bytes" does not say the bytes were written, and the master must
// not record a session range over a hole as KV (docs/kv-cache.md, "What the
// master checks"). Each chunk therefore keeps the exact set of byte ranges
// its writes covered: sorted, disjoint, touching ranges merged, so a chunk
// written in order is one extent whatever the number of writes.
//
// The set is bounded (limits.MaxChunkExtents): a write that would leave the
// chunk with more separate pieces is refused before a byte is stored, with
// an error that says to fill the gaps or write in order.
//
// With a disk tier the set is persisted in the chunk file's header region,
// written in the same pwrite as the header (bytes 24.., after it):
//
//	24 u32 magic "GDEX"   28 u32 count
//	32 count × (u32 start, u32 end)       (limits.MaxChunk fits in 32 bits)
//	.. u32 CRC32C of the record from the magic on
//
// A chunk file of version 1 (written before extents were kept) is loaded as
// one extent [0, length): it was taken as whole then. A version-2 record
// that fails its CRC (a power loss tore it) is loaded as no extent: the
// chunk's bytes are kept but no commit can claim them — never a claim of
// bytes that were not written. Extents are always clipped to the length the
// header gives, so a write cut short by a crash before its header is not
// claimed either.

// extentSet is a chunk's written byte ranges: [iv[0], iv[1]), [iv[2],
// iv[3]), ... sorted, disjoint and not touching. Guarded by the chunk's mu.
type extentSet struct {
	iv []int64
}

const (
	extMagic     = 0x58454447 // "GDEX"
	extRecordOff = 24         // right after the chunk header
)

// count is the number of extents.
func (e *extentSet) count() int { return len(e.iv) / 2 }

// span finds the extents [start, end) touches or overlaps: indexes i..j-1
// (of extents, not of iv).
func (e *extentSet) span(start, end int64) (i, j int) {
	n := e.count()
	i = sort.Search(n, func(k int) bool { return e.iv[2*k+1] >= start })
	j = sort.Search(n, func(k int) bool { return e.iv[2*k] > end })
	return i, j
}

// overlaps reports whether any byte of [start, end) is written.
func (e *extentSet) overlaps(start, end int64) bool {
	n := e.count()
	k := sort.Search(n, func(k int) bool { return e.iv[2*k+1] > start })
	return k < n && e.iv[2*k] < end
}

// after is how many extents the set would hold with [start, end) added.
func (e *extentSet) after(start, end int64) int {
	if start >= end {
		return e.count()
	}
	i, j := e.span(start, end)
	return e.count() - (j - i) + 1
}

// checkAdd refuses a write of [start, end) that would leave chunk id in more
// than limits.MaxChunkExtents separate pieces.
func (e *extentSet) checkAdd(id uint64, start, end int64) error {
	if n := e.after(start, end); n > limits.MaxChunkExtents {
		return errs.New(errs.ErrTooLarge, "store: a write of [%d, %d) would leave chunk %d in %d separate written pieces (at most %d are tracked): write the gaps first, or write the chunk in order",
			start, end, id, n, limits.MaxChunkExtents)
	}
	return nil
}

// add records [start, end) as written.
func (e *extentSet) add(start, end int64) {
	if start >= end {
		return
	}
	if n := len(e.iv); n > 0 && e.iv[n-2] <= start && start <= e.iv[n-1] {
		e.iv[n-1] = max(e.iv[n-1], end) // the common case: appending in order
		return
	}
	i, j := e.span(start, end)
	if i < j {
		start, end = min(start, e.iv[2*i]), max(end, e.iv[2*j-1])
	}
	e.iv = append(e.iv[:2*i], append([]int64{start, end}, e.iv[2*j:]...)...)
}

// remove forgets [start, end) (a write whose checksums or header could not
// be stored): the set then claims less than may be there, never more.
func (e *extentSet) remove(start, end int64) {
	if start >= end {
		return
	}
	var out []int64
	for k := 0; k < len(e.iv); k += 2 {
		a, b := e.iv[k], e.iv[k+1]
		if b <= start || a >= end {
			out = append(out, a, b)
			continue
		}
		if a < start {
			out = append(out, a, start)
		}
		if b > end {
			out = append(out, end, b)
		}
	}
	e.iv = out
}

// clip drops everything at or past length.
func (e *extentSet) clip(length int64) { e.remove(length, limits.MaxChunk+1) }

// within returns the extents inside [off, off+n), cut to it, as flat pairs.
func (e *extentSet) within(off, n int64) []int64 {
	end := off + n
	var out []int64
	for k := 0; k < len(e.iv); k += 2 {
		a, b := max(e.iv[k], off), min(e.iv[k+1], end)
		if a < b {
			out = append(out, a, b)
		}
	}
	return out
}

// appendRecord appends the persisted form of the set.
func (e *extentSet) appendRecord(dst []byte) []byte {
	le := binary.LittleEndian
	at := len(dst)
	dst = le.AppendUint32(dst, extMagic)
	dst = le.AppendUint32(dst, uint32(e.count()))
	for _, v := range e.iv {
		dst = le.AppendUint32(dst, uint32(v))
	}
	return le.AppendUint32(dst, crc32.Checksum(dst[at:], crc32c.Table))
}

// extRecordMax is the size of the largest record; it must end before the
// block CRC table.
const extRecordMax = 12 + 8*limits.MaxChunkExtents

var _ = [1]int{}[max(0, extRecordOff+extRecordMax-crcTableOff)] // the record fits before the CRC table

// parseRecord reads a persisted set from b (which may be longer), within
// [0, length). ok is false when there is no valid record.
func parseRecord(b []byte, length int64) (e extentSet, ok bool) {
	le := binary.LittleEndian
	if len(b) < 12 || le.Uint32(b) != extMagic {
		return e, false
	}
	n := int(le.Uint32(b[4:]))
	if n > limits.MaxChunkExtents || len(b) < 12+8*n {
		return e, false
	}
	body := b[:8+8*n]
	if le.Uint32(b[8+8*n:]) != crc32.Checksum(body, crc32c.Table) {
		return e, false
	}
	prev := int64(-1)
	for k := range n {
		a, z := int64(le.Uint32(b[8+8*k:])), int64(le.Uint32(b[12+8*k:]))
		if a <= prev || a >= z || z > limits.MaxChunk {
			return extentSet{}, false // not sorted, disjoint and apart: not ours
		}
		e.iv = append(e.iv, a, z)
		prev = z
	}
	e.clip(length)
	return e, true
}

// Extents returns the byte ranges of chunk id written by some write, within
// [off, off+n), as flat pairs [start, end, start, end, ...], and the chunk's
// length and seal. A chunk this server does not hold is errs.ErrNotFound.
func (s *Store) Extents(id uint64, off, n int64) (ext []int64, length int64, sealed bool, err error) {
	if off < 0 || n < 0 || off > limits.MaxChunk || n > limits.MaxChunk {
		return nil, 0, false, errs.New(errs.ErrOutOfRange, "store: extents of [%d, %d+%d) of chunk %d: beyond any chunk", off, off, n, id)
	}
	err = s.withChunk(id, func(c *chunk) error {
		ext, length, sealed = c.ext.within(off, n), c.length, c.sealed
		return nil
	})
	return ext, length, sealed, err
}
