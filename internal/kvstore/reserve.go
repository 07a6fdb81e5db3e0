package kvstore

import (
	"errors"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/tier"
)

// A Reservation is DRAM pages for a value about to be put, which the caller
// fills itself (a server reads a large value from its socket straight into
// them) before Commit makes the block visible: the value is copied once,
// by the kernel, instead of into a buffer and then into the pages.
//
// Until Commit the pages belong to no key, so nothing reads, evicts or
// demotes them, and nothing else can change them. Release gives them back
// unused. Exactly one of Commit and Release ends a reservation; a
// reservation that is never ended keeps its pages, and the store's
// Close keeps the DRAM tier mapped until the last one ends (a read from a
// socket may still be filling them).
type Reservation struct {
	s     *Store
	arena *tier.DRAM
	e     *entry
	ended bool
}

// reserveMax is the most of the DRAM tier that reservations may hold at
// once: a flood of slow clients announcing large values must not evict
// the cache's blocks to make room for bytes that may never come. A
// reservation refused for it is not an error: the caller reads the value
// into a buffer and puts it, as without reservations.
func (s *Store) reserveMax() int64 { return s.arena.Cap() / 4 }

// Reserve returns DRAM pages for a value of size bytes under key, or nil
// (and no error) where the value should be put the ordinary way: no DRAM
// tier, a value too large for it, no room without evicting pinned blocks,
// reservations already holding their share of the tier, or, for a
// write-once put (not overwrite), a key already there (Put keeps it
// without allocating: pages made for it would evict blocks for nothing).
// An error is the put's own: a bad key or a value over the limit.
func (s *Store) Reserve(key []byte, size int64, overwrite bool) (*Reservation, error) {
	if err := s.checkPut(key, size); err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.closed || s.arena == nil || s.reserved+size > s.reserveMax() || !overwrite && s.liveLocked(key) != nil {
		s.mu.Unlock()
		return nil, nil
	}
	k := string(key)
	e := &entry{key: k, fp: s.fingerprint(k), size: size}
	ok, err := s.allocLocked(e)
	if ok {
		s.reserved += size
		s.reservedPages += len(e.pages)
		s.filling++
	}
	arena := s.arena
	s.unlockAndWrite() // the demotions that made room
	if err != nil || !ok {
		return nil, err
	}
	return &Reservation{s: s, arena: arena, e: e}, nil
}

// Views are the reservation's pages, size bytes in all, to be filled in
// order. They stay valid until Commit or Release.
func (r *Reservation) Views() [][]byte { return r.arena.Views(r.e.pages, 0, r.e.size) }

// Size is the value's length.
func (r *Reservation) Size() int64 { return r.e.size }

// Commit stores the filled pages as key's value, crc being the CRC32C of
// the bytes in them, with Put's rules: without overwrite a key already
// there is kept (existed true) and the pages are given back. Commit ends
// the reservation whatever it returns.
func (r *Reservation) Commit(crc uint32, overwrite bool) (existed bool, err error) {
	if r.ended {
		return false, errors.New("kvstore: reservation already ended")
	}
	r.ended = true
	s := r.s
	s.mu.Lock()
	s.reserved -= r.e.size
	s.reservedPages -= len(r.e.pages)
	if s.closed {
		s.endFillLocked(r)
		s.mu.Unlock()
		return false, errs.New(errs.ErrUnavailable, "the KV store is closed")
	}
	s.filling--
	r.e.crc = crc
	existed, err = s.insertLocked([]byte(r.e.key), r.e, true, nil, overwrite)
	if err == nil && !existed {
		s.reservedPuts.Add(1)
	}
	return existed, err
}

// Release gives the pages back unused. It does nothing after Commit or
// an earlier Release.
func (r *Reservation) Release() {
	if r.ended {
		return
	}
	r.ended = true
	s := r.s
	s.mu.Lock()
	s.reserved -= r.e.size
	s.reservedPages -= len(r.e.pages)
	s.endFillLocked(r)
	s.mu.Unlock()
}

// endFillLocked frees an uncommitted reservation's pages and, once the
// store is closed and this was the last reservation, unmaps the DRAM tier
// Close left mapped for it.
func (s *Store) endFillLocked(r *Reservation) {
	r.arena.Release(r.e.pages)
	r.e.pages = nil
	s.filling--
	if s.closed && s.filling == 0 && s.arenaAfterFills != nil {
		s.arenaAfterFills.Close()
		s.arenaAfterFills = nil
	}
}
