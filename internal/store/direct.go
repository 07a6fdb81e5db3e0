package store

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gd2fs/gd2fs/internal/crc32c"
	"github.com/gd2fs/gd2fs/internal/limits"
	"github.com/gd2fs/gd2fs/internal/tier"
)

// Pending is a write being received straight into the DRAM tier (zero copy:
// the server reads the socket into the arena pages). Exactly one of Commit
// or Abort must be called; the chunk stays locked until then.
type Pending struct {
	s       *Store
	c       *chunk
	off     int64
	n       int64
	newLen  int64
	oldLen  int64
	dst     [][]byte
	sums    []uint32 // the CRC32C of each view of dst, when summed
	summed  bool     // the receiver filled sums as it read the payload
	settled bool
	// uncached: write the bytes to the chunk file with O_DIRECT where
	// they are aligned (Uncached).
	uncached bool
}

// BeginWrite prepares to receive n bytes at off of chunk id directly into
// DRAM pages. It declines (ok=false) unless the chunk is, or will be, cached
// in DRAM and the bytes land where nothing was written: at or beyond its
// current end, or in a hole a later piece left (pieces of one chunk arrive
// out of order over several streams). A payload that fails its CRC then
// overwrote nothing stored (a hole is zeroed again). Declined writes, such
// as overwrites of stored bytes, go through a buffer and Write/WriteChecked.
func (s *Store) BeginWrite(id uint64, off int64, n int) (dst [][]byte, p *Pending, ok bool) {
	if s.arena == nil || off < 0 || off+int64(n) > limits.MaxChunk {
		return nil, nil, false
	}
	s.mu.Lock()
	c := s.chunks[id]
	if c == nil {
		c = &chunk{id: id}
		s.chunks[id] = c
	}
	s.mu.Unlock()
	c.mu.Lock()
	if c.deleted || c.sealed || off < c.length && c.ext.overlaps(off, off+int64(n)) || c.ext.checkAdd(id, off, off+int64(n)) != nil {
		c.mu.Unlock()
		return nil, nil, false
	}
	s.mu.Lock()
	cached := c.pages != nil || c.length == 0
	s.mu.Unlock()
	newLen := max(c.length, off+int64(n))
	if !cached || s.reserve(c, newLen) != nil {
		s.dropIfEmpty(c)
		c.mu.Unlock()
		return nil, nil, false
	}
	s.mu.Lock()
	if c.pages == nil || int64(len(c.pages)) < int64(blocks(newLen)) { // reserve could not cache it
		s.mu.Unlock()
		s.unreserve(c, newLen)
		s.dropIfEmpty(c)
		c.mu.Unlock()
		return nil, nil, false
	}
	if off > c.length {
		s.arena.Zero(c.pages, c.length, off) // the hole reads as zeros
	}
	c.pins++ // the pages are written outside s.mu: keep eviction off them
	dst = s.arena.Views(c.pages, off, int64(n))
	s.mu.Unlock()
	return dst, &Pending{s: s, c: c, off: off, n: int64(n), newLen: newLen, oldLen: c.length, dst: dst}, true
}

// unreserve gives back the disk space reserve counted for growing to newLen.
func (s *Store) unreserve(c *chunk, newLen int64) {
	s.mu.Lock()
	s.disk.Add(-(newLen - c.length))
	s.mu.Unlock()
}

// Uncached asks Commit to write the bytes to the disk tier past the page
// cache (O_DIRECT, straight from the DRAM pages) where the file system
// takes it and the write is aligned to 4 KiB; otherwise it writes them
// as usual. The page-cache copy, and the page cache it fills, is then
// saved (the bytes are in DRAM already), and an fdatasync that follows has
// only the file's metadata left to make durable; the write returns once
// the device has the bytes. Durability is the same either way: only Sync
// promises it.
func (p *Pending) Uncached() { p.uncached = true }

// Bytes are the destination views the payload must be read into.
func (p *Pending) Bytes() [][]byte { return p.dst }

// Sums returns one slot per view of Bytes, for a receiver that checksums
// the payload as it reads it (wire.Reader.ReadPayloadInto) to fill with
// each view's CRC32C: Commit then checks and stores those instead of
// reading the pages once more. A receiver that asks for Sums must fill
// them; a wrong sum fails Commit's check (nothing is stored) or, at worst,
// a later read of that block, never returns other bytes.
func (p *Pending) Sums() []uint32 {
	if p.sums == nil {
		p.sums = make([]uint32, len(p.dst))
	}
	p.summed = true
	return p.sums
}

// Abort gives up the write (the payload could not be read, or failed its
// CRC). Bytes it left in a hole of the chunk are zeroed again: the hole's
// block CRCs are those of zeros.
func (p *Pending) Abort() {
	if p.settled {
		return
	}
	p.settled = true
	if p.off < p.oldLen {
		p.s.mu.Lock()
		p.s.arena.Zero(p.c.pages, p.off, min(p.off+p.n, p.oldLen))
		p.s.mu.Unlock()
	}
	p.s.unreserve(p.c, p.newLen)
	p.s.unpin(p.c)
	p.s.dropIfEmpty(p.c)
	p.c.mu.Unlock()
}

// Commit checks the received bytes against want (computing the block CRCs
// in the same pass), writes them to the disk tier, and makes them part of
// the chunk. On a CRC mismatch nothing changes.
func (p *Pending) Commit(want uint32) error { return p.CommitWhen(want, nil) }

// CommitWhen is Commit that calls wait, if not nil, before it lets go of the
// pages: a server forwarding the same pages to other replicas waits there
// for the forwards to finish.
func (p *Pending) CommitWhen(want uint32, wait func()) error {
	if p.settled {
		return fmt.Errorf("store: pending write settled twice")
	}
	err := p.commit(want)
	if wait != nil {
		wait()
	}
	if !p.settled { // nothing stored: give the reservation back
		p.Abort()
		return err
	}
	s, c := p.s, p.c
	s.unpin(c)
	c.mu.Unlock()
	return err
}

// commit does Commit's work; it leaves p unsettled when nothing was stored.
func (p *Pending) commit(want uint32) error {
	s, c := p.s, p.c
	// Every view is one block segment: pages are blocks, aligned with the chunk.
	segs := p.sums
	if !p.summed {
		segs = make([]uint32, len(p.dst))
		for i, v := range p.dst {
			segs[i] = crc32c.Checksum(v)
		}
	}
	var got uint32
	for i, v := range p.dst {
		got = combine(got, segs[i], int64(len(v)), i == 0)
	}
	if got != want {
		return errPayloadCRC
	}
	var f tier.File
	if s.disk != nil {
		var err error
		if f, err = s.open(c.id, true); err == nil {
			defer f.Close()
			done := false
			if p.uncached && aligned(p.dst, dataOff+p.off) {
				done, err = s.writeUncached(c.id, p.dst, dataOff+p.off)
			}
			if !done && err == nil {
				_, err = f.WriteVAt(p.dst, dataOff+p.off)
			}
		}
		if err != nil {
			return s.diskErr(fmt.Errorf("store: write chunk %d: %w", c.id, err))
		}
	}
	c.ext.add(p.off, p.off+p.n)
	first := s.updateCRCs(c, f, p.off, p.off+p.n, p.newLen, segs)
	if f != nil {
		if err := s.writeCRCs(c, f, first, p.newLen); err != nil {
			c.ext.remove(p.off, p.off+p.n) // claim less, never more
			return s.diskErr(fmt.Errorf("store: %w", err))
		}
	}
	s.mu.Lock()
	s.touch(c)
	s.mu.Unlock()
	c.length = p.newLen
	c.written.Add(1)
	p.settled = true
	return nil
}

// directAlign is the alignment O_DIRECT asks of offsets, lengths and
// memory on the file systems gd2fs runs on (their block size).
const directAlign = 4096

// aligned reports whether bufs at file offset off can be written with
// O_DIRECT.
func aligned(bufs [][]byte, off int64) bool {
	if off%directAlign != 0 {
		return false
	}
	for _, b := range bufs {
		if len(b)%directAlign != 0 || len(b) > 0 && uintptr(unsafe.Pointer(&b[0]))%directAlign != 0 {
			return false
		}
	}
	return true
}

// writeUncached writes bufs at off of chunk id's file through an O_DIRECT
// descriptor. done is false, with no error, where the file system refuses
// O_DIRECT (tmpfs: EINVAL): the caller writes the bytes as usual then.
func (s *Store) writeUncached(id uint64, bufs [][]byte, off int64) (done bool, err error) {
	f, err := s.fs.OpenFile(s.path(id), os.O_WRONLY|unix.O_DIRECT, 0)
	if errors.Is(err, unix.EINVAL) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	if _, err := f.WriteVAt(bufs, off); err != nil {
		if errors.Is(err, unix.EINVAL) {
			return false, nil // a partial O_DIRECT write is rewritten whole
		}
		return false, err
	}
	return true, nil
}
