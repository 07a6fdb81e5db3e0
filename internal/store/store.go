// Package store holds a data server's chunks in two tiers: DRAM (an off-heap
// arena) and disk (one self-checking file per chunk).
//
// With a disk tier the disk is the store of record and DRAM is a write-through
// cache of whole chunks, evicted least-recently-used when the arena is full;
// a restart rebuilds the store from the disk tier. Without a disk tier DRAM is
// the only copy: nothing is evicted and a full arena answers errs.ErrNoSpace.
//
// Every 64 KiB block of a chunk has a CRC32C, kept in the chunk file's header
// region and checked on every disk read: damaged bytes become errs.ErrChecksum,
// never data.
//
// A write returns once its bytes are in the page cache; Sync makes a chunk's
// writes survive power loss (group-committed fdatasync, durable.go).
package store

import (
	"container/list"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/bufpool"
	"github.com/gd2fs/gd2fs/internal/crc32c"
	"github.com/gd2fs/gd2fs/internal/limits"
	"github.com/gd2fs/gd2fs/internal/tier"
)

// The checksum block of the disk tier and the page of the DRAM tier is
// limits.BlockSize; limits.MaxChunk is the largest chunk the disk format
// describes. Both are protocol facts, kept in internal/limits.

// Config sizes the tiers.
type Config struct {
	MemBytes  int64  // DRAM tier capacity; 0 means no DRAM tier
	Dir       string // disk tier directory; "" means no disk tier
	DiskBytes int64  // disk tier capacity in bytes
	Log       *slog.Logger
	// Sync says which writes the server makes durable before it
	// acknowledges them (SyncReplicated by default). The store itself
	// syncs only when asked (Sync); the server applies the policy.
	Sync SyncPolicy
	// Prefault makes the DRAM tier resident in the background at start
	// (tier.DRAM.Prefault), so writes do not pay its first-touch faults.
	Prefault bool

	fs tier.FS // the disk tier's file system; nil means the operating system's
}

// Usage is a snapshot of tier capacity and use.
type Usage struct {
	MemCap, MemUsed   int64
	DiskCap, DiskUsed int64
	Chunks            int
}

// Stats are cumulative counters.
type Stats struct {
	MemReads, DiskReads, Evictions, Corrupt uint64
	Syncs                                   uint64 // fdatasyncs of chunk files
	// ReadPromotions counts reads that found their chunk on disk only and
	// copied it into DRAM first (counted in MemReads as well): a read
	// served from DRAM without touching the disk is MemReads minus these.
	ReadPromotions uint64
}

// Info describes one stored chunk.
type Info struct {
	ID     uint64
	Length int64
	Sealed bool
}

// Store is a server's chunk store. It is safe for concurrent use.
type Store struct {
	cfg   Config
	log   *slog.Logger
	fs    tier.FS
	arena *tier.DRAM // the DRAM tier; nil without one
	disk  *tier.Disk // the disk tier; nil without one

	mu     sync.Mutex // guards chunks, lru, the DRAM pages and the disk tier's use
	chunks map[uint64]*chunk
	lru    list.List // cached chunks, front = most recent

	dirMu  sync.Mutex      // guards linked
	linked map[string]bool // chunk subdirectories whose own entry is durable

	memReads, diskReads, evictions, corrupt, syncs atomic.Uint64
	readPromotions                                 atomic.Uint64
}

type chunk struct {
	id uint64
	mu sync.Mutex // serialises writes, loads and deletes of this chunk

	// Guarded by mu; read under Store.mu only by Usage/List (length) with care.
	length  int64
	sealed  bool
	deleted bool
	crcs    []uint32  // per block, disk tier only
	ext     extentSet // bytes some write covered (extents.go)

	// Guarded by Store.mu.
	pages []int32 // DRAM pages covering [0, length), nil when not cached
	pins  int
	elem  *list.Element

	// Durability (see Sync). written counts writes that reached the chunk
	// file (bumped under mu); syncMu orders the fdatasyncs of this chunk.
	written atomic.Uint64
	durable atomic.Bool // Sync was asked for: Seal syncs too
	syncMu  sync.Mutex
	synced  uint64 // guarded by syncMu: writes covered by the last fdatasync
	linked  bool   // guarded by syncMu: the file's directory entry is durable
}

// Open opens (or creates) a store and, with a disk tier, loads every chunk
// whose header is intact. Damaged chunk files are renamed *.corrupt.
func Open(cfg Config) (*Store, error) {
	s := &Store{cfg: cfg, log: cfg.Log, fs: cfg.fs, chunks: make(map[uint64]*chunk), linked: map[string]bool{}}
	if s.fs == nil {
		s.fs = tier.OS{}
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if cfg.MemBytes <= 0 && cfg.Dir == "" {
		return nil, errs.New(errs.ErrBadRequest, "store: no tier configured: give a DRAM size (--mem) or a disk directory (--disk)")
	}
	mem, err := tier.NewDRAM(cfg.MemBytes, limits.BlockSize)
	if err != nil {
		return nil, err
	}
	s.arena, s.disk = mem, tier.NewDisk(cfg.Dir, cfg.DiskBytes, s.fs)
	if cfg.Prefault {
		mem.Prefault(cfg.Log, "chunks")
	}
	if s.disk != nil {
		if err := s.load(); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

// Close releases the DRAM tier. Chunk files stay on disk.
func (s *Store) Close() error { return s.arena.Close() }

// Prefaulted is closed once Config.Prefault's work has ended (at once
// without it).
func (s *Store) Prefaulted() <-chan struct{} { return s.arena.Prefaulted() }

// Usage reports capacity and use per tier.
func (s *Store) Usage() Usage {
	s.mu.Lock()
	defer s.mu.Unlock()
	// The disk's use counts what its file system cannot hold any more
	// (tier.Disk.UsedOnFS), so the master stops placing chunks on a full
	// disk.
	return Usage{MemCap: s.arena.Cap(), MemUsed: s.arena.Used(), DiskCap: s.disk.Cap(), DiskUsed: s.disk.UsedOnFS(), Chunks: len(s.chunks)}
}

// diskErr classifies a failed write to the disk tier: a full file system
// (ENOSPC, EDQUOT) is errs.ErrNoSpace, so clients see "no space" rather than
// an unknown error; the next heartbeat reports the disk full (Usage).
func (s *Store) diskErr(err error) error {
	if tier.IsFull(err) {
		return errs.New(errs.ErrNoSpace, "%w: the file system under %s is full; free space there (the master places new chunks on other servers meanwhile)", err, s.cfg.Dir)
	}
	return err
}

// Stats returns cumulative counters.
func (s *Store) Stats() Stats {
	return Stats{MemReads: s.memReads.Load(), DiskReads: s.diskReads.Load(),
		Evictions: s.evictions.Load(), Corrupt: s.corrupt.Load(), Syncs: s.syncs.Load(), ReadPromotions: s.readPromotions.Load()}
}

// List returns every chunk held.
// IDs returns the ids of the chunks held, sorted. Unlike List it takes no
// chunk's lock, so a write in progress does not hold it up.
func (s *Store) IDs() []uint64 {
	s.mu.Lock()
	out := make([]uint64, 0, len(s.chunks))
	for id := range s.chunks {
		out = append(out, id)
	}
	s.mu.Unlock()
	slices.Sort(out)
	return out
}

func (s *Store) List() []Info {
	s.mu.Lock()
	cs := make([]*chunk, 0, len(s.chunks))
	for _, c := range s.chunks {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	out := make([]Info, 0, len(cs))
	for _, c := range cs {
		c.mu.Lock()
		if !c.deleted {
			out = append(out, Info{ID: c.id, Length: c.length, Sealed: c.sealed})
		}
		c.mu.Unlock()
	}
	return out
}

// Stat describes chunk id.
func (s *Store) Stat(id uint64) (info Info, err error) {
	err = s.withChunk(id, func(c *chunk) error {
		info = Info{ID: id, Length: c.length, Sealed: c.sealed}
		return nil
	})
	return info, err
}

func notFound(id uint64) error {
	return errs.New(errs.ErrNotFound, "store: chunk %d not on this server", id)
}

func (s *Store) get(id uint64) (*chunk, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.chunks[id]
	if c == nil {
		return nil, notFound(id)
	}
	return c, nil
}

var blockShift = crc32c.NewShift(limits.BlockSize)

// segCRCs returns the CRC32C of each block-aligned segment of p written at
// chunk offset off: one per block the write touches. One pass over p.
func segCRCs(off int64, p []byte) []uint32 {
	var out []uint32
	for len(p) > 0 {
		n := min(int64(len(p)), limits.BlockSize-off%limits.BlockSize)
		out = append(out, crc32.Checksum(p[:n], crc32c.Table))
		p = p[n:]
		off += n
	}
	return out
}

// combine folds the CRC of a following piece of n bytes into acc.
func combine(acc, crc uint32, n int64, first bool) uint32 {
	switch {
	case first:
		return crc
	case n == limits.BlockSize:
		return blockShift.Combine(acc, crc)
	default:
		return crc32c.Combine(acc, crc, n)
	}
}

// Write stores p at offset off of chunk id, creating the chunk if needed.
// It returns only when the bytes are in every tier that holds the chunk.
func (s *Store) Write(id uint64, off int64, p []byte) error {
	return s.write(id, off, p, segCRCs(off, p))
}

// WriteChecked is Write for bytes that came with CRC32C want: the per-block
// CRCs the store keeps are computed in the same pass that checks want, and
// a mismatch stores nothing.
func (s *Store) WriteChecked(id uint64, off int64, p []byte, want uint32) error {
	segs := segCRCs(off, p)
	var got uint32
	o := off
	for i, c := range segs {
		n := min(int64(len(p))-(o-off), limits.BlockSize-o%limits.BlockSize)
		got = combine(got, c, n, i == 0)
		o += n
	}
	if got != want {
		return errPayloadCRC
	}
	return s.write(id, off, p, segs)
}

// errPayloadCRC: the bytes a write brought do not match the CRC the client
// computed (damaged on the way); nothing was stored.
var errPayloadCRC = errs.New(errs.ErrChecksum, "store: payload checksum mismatch: the bytes were damaged on the way; nothing was written")

func (s *Store) write(id uint64, off int64, p []byte, segs []uint32) error {
	end := off + int64(len(p))
	if off < 0 || end > limits.MaxChunk {
		return errs.New(errs.ErrOutOfRange, "store: write [%d, %d) of chunk %d beyond the %d-byte chunk limit", off, end, id, limits.MaxChunk)
	}
	var c *chunk
	for {
		s.mu.Lock()
		c = s.chunks[id]
		if c == nil {
			c = &chunk{id: id}
			s.chunks[id] = c
		}
		s.mu.Unlock()
		c.mu.Lock()
		if !c.deleted {
			break
		}
		c.mu.Unlock() // lost a race with Delete or a failed first write: look again
	}
	defer c.mu.Unlock()
	if c.sealed {
		return errs.New(errs.ErrSealed, "store: chunk %d is sealed: its file was closed and is immutable", id)
	}
	if err := c.ext.checkAdd(id, off, end); err != nil {
		s.dropIfEmpty(c)
		return err
	}
	newLen := max(c.length, end)
	if err := s.reserve(c, newLen); err != nil {
		s.dropIfEmpty(c)
		return err
	}
	var f tier.File
	if s.disk != nil {
		var err error
		if f, err = s.open(id, true); err == nil {
			defer f.Close()
			_, err = f.WriteAt(p, dataOff+off)
		}
		if err != nil {
			s.mu.Lock()
			s.disk.Add(-(newLen - c.length))
			s.mu.Unlock()
			s.dropIfEmpty(c)
			return s.diskErr(fmt.Errorf("store: write chunk %d: %w", id, err))
		}
	}
	s.mu.Lock()
	if c.pages != nil {
		s.copyIn(c, off, p)
		s.touch(c)
	}
	s.mu.Unlock()
	c.ext.add(off, end)
	first := s.updateCRCs(c, f, off, end, newLen, segs)
	if f != nil {
		if err := s.writeCRCs(c, f, first, newLen); err != nil {
			c.ext.remove(off, end) // claim less, never more
			return s.diskErr(err)
		}
	}
	c.length = newLen
	c.written.Add(1)
	return nil
}

// updateCRCs brings the block CRCs of c up to date after a write of
// [off, end) that made the chunk newLen long, and returns the first block
// that changed. Blocks the write covers take their CRC from segs; blocks it
// covers in part (and hole blocks) are checksummed from the merged bytes.
func (s *Store) updateCRCs(c *chunk, f tier.File, off, end, newLen int64, segs []uint32) int {
	first := int(min(off, c.length) / limits.BlockSize)
	last := blocks(newLen)
	if last > len(c.crcs) {
		c.crcs = append(c.crcs, make([]uint32, last-len(c.crcs))...)
	}
	for b := first; b < last; b++ {
		bs, be := int64(b)*limits.BlockSize, min(int64(b+1)*limits.BlockSize, newLen)
		if bs >= end && end < c.length {
			// A write inside the chunk (a hole filled, bytes overwritten)
			// changes no block past its end: those keep their CRCs. Each
			// piece that arrived after a later one used to checksum the
			// chunk from there to its end once more.
			break
		}
		if off <= bs && end >= be {
			c.crcs[b] = segs[b-int(off/limits.BlockSize)]
			continue
		}
		c.crcs[b] = s.mergedCRC(c, f, bs, be)
	}
	return first
}

// mergedCRC checksums bytes [bs, be) of c as they are now, from DRAM when
// cached, else from the chunk file.
func (s *Store) mergedCRC(c *chunk, f tier.File, bs, be int64) uint32 {
	s.mu.Lock()
	if c.pages != nil {
		crc := crc32c.Checksum(s.arena.Views(c.pages, bs, be-bs)...)
		s.mu.Unlock()
		return crc
	}
	s.mu.Unlock()
	bp := bufpool.Get(int(be - bs))
	defer bufpool.Put(bp)
	if f != nil {
		if _, err := f.ReadAt(*bp, dataOff+bs); err != nil {
			return 0 // a later read fails this block's check: never wrong data
		}
	}
	return crc32.Checksum(*bp, crc32c.Table)
}

// reserve accounts for growth to newLen: disk space, and DRAM pages when the
// chunk is (or, being new, will be) cached. Called with c.mu held.
func (s *Store) reserve(c *chunk, newLen int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	grow := newLen - c.length
	if grow > 0 && !s.disk.Fits(grow) {
		return errs.New(errs.ErrNoSpace, "store: disk tier full (%d of %d bytes used, %d more asked): free space with 'gd2fs rm' or give the server a larger --disk", s.disk.Used(), s.disk.Cap(), grow)
	}
	// Without a DRAM tier allocPages fails and, a disk tier being there,
	// the chunk is simply not cached.
	if c.pages != nil || c.length == 0 {
		need := blocks(newLen) - len(c.pages)
		if need > 0 {
			got, ok := s.allocPages(need, c)
			if ok {
				if c.pages == nil {
					c.pages = []int32{}
				}
				c.pages = append(c.pages, got...)
			} else if s.disk == nil {
				return errs.New(errs.ErrNoSpace, "store: DRAM tier full (%d bytes) and no disk tier to spill to: give the server a larger --mem or a --disk", s.cfg.MemBytes)
			} else if c.pages != nil {
				s.uncache(c) // keep the invariant: cached means all of [0, length)
			}
		}
	}
	s.disk.Add(grow)
	return nil
}

func (s *Store) dropIfEmpty(c *chunk) {
	if c.length != 0 {
		return
	}
	s.mu.Lock()
	if c.pages != nil && c.pins == 0 {
		s.uncache(c)
	}
	if s.chunks[c.id] == c {
		delete(s.chunks, c.id)
	}
	s.mu.Unlock()
	c.deleted = true
}

// allocPages takes n pages, evicting unpinned disk-backed chunks other than
// self if needed. Called with s.mu held.
func (s *Store) allocPages(n int, self *chunk) ([]int32, bool) {
	if n > s.arena.Pages() { // always, without a DRAM tier
		return nil, false
	}
	for s.arena.FreePages() < n && s.disk != nil {
		victim := s.lruVictim(self)
		if victim == nil {
			break
		}
		s.uncache(victim)
		s.evictions.Add(1)
	}
	return s.arena.Alloc(n)
}

func (s *Store) lruVictim(self *chunk) *chunk {
	for e := s.lru.Back(); e != nil; e = e.Prev() {
		if c := e.Value.(*chunk); c.pins == 0 && c != self {
			return c
		}
	}
	return nil
}

// uncache drops c's DRAM copy. Called with s.mu held and c unpinned.
func (s *Store) uncache(c *chunk) {
	if c.elem != nil {
		s.lru.Remove(c.elem)
		c.elem = nil
	}
	s.arena.Release(c.pages)
	c.pages = nil
}

func (s *Store) touch(c *chunk) {
	if c.elem == nil {
		c.elem = s.lru.PushFront(c)
	} else {
		s.lru.MoveToFront(c.elem)
	}
}

// copyIn copies p into c's pages at off, zeroing any hole between the old
// length and off. Called with s.mu held.
func (s *Store) copyIn(c *chunk, off int64, p []byte) {
	if off > c.length {
		s.arena.Zero(c.pages, c.length, off)
	}
	s.arena.CopyIn(c.pages, off, p)
}

// Read calls fn with views of bytes [off, off+n) of chunk id and their
// CRC32C. The views are valid only during fn (they may point into the DRAM
// arena, pinned meanwhile); every byte in them was checksum-verified or came
// from DRAM. The CRC is combined from the stored block CRCs, so for aligned
// reads the bytes are not touched to compute it.
func (s *Store) Read(id uint64, off, n int64, fn func(bufs [][]byte, crc uint32) error) error {
	c, err := s.get(id)
	if err != nil {
		return err
	}
	c.mu.Lock()
	if c.deleted {
		c.mu.Unlock()
		return notFound(id)
	}
	if off < 0 || n < 0 || off+n > c.length {
		l := c.length
		c.mu.Unlock()
		return errs.New(errs.ErrOutOfRange, "store: read [%d, %d) of chunk %d, which holds %d bytes", off, off+n, id, l)
	}
	s.mu.Lock()
	if c.pages == nil && s.arena != nil && s.disk != nil {
		// Promote the whole chunk: later reads of it come from DRAM. c.mu is
		// held, so concurrent readers of the same chunk wait for one load.
		s.mu.Unlock()
		// A block that fails its checksum fails the promotion, not this
		// read: the range asked for is read from disk below, and only its
		// own blocks must pass.
		err := s.promote(c)
		if err != nil && !errors.Is(err, errs.ErrNoSpace) && !errors.Is(err, errs.ErrChecksum) {
			c.mu.Unlock()
			return err
		}
		if err == nil {
			s.readPromotions.Add(1)
		}
		s.mu.Lock()
	}
	if c.pages != nil {
		c.pins++
		s.touch(c)
		v := s.arena.Views(c.pages, off, n)
		crcs := c.crcs[off/limits.BlockSize : blocks(off+n)]
		crcs = append([]uint32(nil), crcs...) // a write may change them after we unlock
		length, pages := c.length, c.pages
		s.mu.Unlock()
		c.mu.Unlock()
		s.memReads.Add(1)
		crc := rangeCRC(crcs, off/limits.BlockSize, length, off, n, func(from, to int64) [][]byte {
			return s.arena.Views(pages, from, to-from)
		})
		err := fn(v, crc)
		s.unpin(c)
		return err
	}
	s.mu.Unlock()
	s.diskReads.Add(1)
	// The blocks are read and verified under c.mu (a write must not change
	// them meanwhile), but fn runs after it is released: fn is the network
	// write of the answer, and one slow client must not hold up every reader
	// and writer of the chunk. The pooled buffer is the reader's own.
	bp, v, crc, err := s.readDisk(c, off, n)
	c.mu.Unlock()
	if err != nil {
		return err
	}
	if bp != nil {
		defer bufpool.Put(bp)
	}
	return fn(v, crc)
}

// rangeCRC is the CRC32C of bytes [off, off+n) of a chunk of length bytes
// whose block CRCs from block firstBlock on are crcs: whole blocks use their
// stored CRC, partly covered ones are checksummed from bytesAt.
func rangeCRC(crcs []uint32, firstBlock, length, off, n int64, bytesAt func(from, to int64) [][]byte) uint32 {
	var acc uint32
	for b := off / limits.BlockSize; b*limits.BlockSize < off+n; b++ {
		bs, be := b*limits.BlockSize, min((b+1)*limits.BlockSize, length)
		ro, re := max(off, bs), min(off+n, be)
		var c uint32
		if ro == bs && re == be {
			c = crcs[b-firstBlock]
		} else {
			c = crc32c.Checksum(bytesAt(ro, re)...)
		}
		acc = combine(acc, c, re-ro, b == off/limits.BlockSize)
	}
	return acc
}

func (s *Store) unpin(c *chunk) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c.pins--
	if c.pins == 0 && c.deleted && c.pages != nil {
		s.uncache(c)
	}
}

// promote loads c from disk into DRAM. c.mu held, s.mu not.
func (s *Store) promote(c *chunk) error {
	s.mu.Lock()
	ps, ok := s.allocPages(blocks(c.length), c)
	s.mu.Unlock()
	if !ok {
		return errs.ErrNoSpace
	}
	bp, bufs, _, err := s.readDisk(c, 0, c.length)
	if err == nil {
		s.arena.CopyIn(ps, 0, bufs...)
	}
	if bp != nil {
		bufpool.Put(bp)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.arena.Release(ps)
		return err
	}
	c.pages = ps
	s.touch(c)
	return nil
}

// withChunk runs fn on chunk id with its lock held, or fails with not found.
func (s *Store) withChunk(id uint64, fn func(c *chunk) error) error {
	c, err := s.get(id)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.deleted {
		return notFound(id)
	}
	return fn(c)
}

// Seal makes chunk id immutable.
func (s *Store) Seal(id uint64) error {
	return s.withChunk(id, func(c *chunk) error {
		if c.sealed {
			return nil
		}
		if s.disk != nil {
			if err := s.writeHeader(c, true); err != nil {
				return err
			}
			c.written.Add(1) // the marker is a write the sync must cover
			// A chunk written durably is sealed durably: a seal marker on
			// disk then always stands on bytes that are on disk too.
			if c.durable.Load() {
				if err := s.sync(c); err != nil {
					return err
				}
			}
		}
		c.sealed = true
		return nil
	})
}

// Delete removes chunk id from every tier.
func (s *Store) Delete(id uint64) error {
	return s.withChunk(id, func(c *chunk) error {
		if s.disk != nil {
			if err := s.fs.Remove(s.path(id)); err != nil && !os.IsNotExist(err) {
				return fmt.Errorf("store: delete chunk %d: %w", id, err)
			}
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		c.deleted = true
		delete(s.chunks, id)
		s.disk.Add(-c.length)
		if c.pages != nil && c.pins == 0 {
			s.uncache(c)
		}
		return nil
	})
}

func blocks(n int64) int { return int((n + limits.BlockSize - 1) / limits.BlockSize) }
