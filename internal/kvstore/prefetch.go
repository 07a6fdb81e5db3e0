package kvstore

import "github.com/gd2fs/gd2fs/internal/bufpool"

// Prefetch copies key's block from the disk tier into DRAM, so that a read
// that follows soon finds it there: an engine asks whether a request's
// chain is cached before it schedules the request and reads the blocks a
// little later. It does not count as a read and does not pin: the block
// enters DRAM as a new block does (the small queue in S3-FIFO mode, the head
// of main in LRU mode) and leaves first if it is not read. It reports
// whether the block is in DRAM now; a miss, a store without DRAM, a block
// whose bytes are still on their way to disk, or no room (everything in use)
// is false.
func (s *Store) Prefetch(key []byte) bool {
	s.mu.Lock()
	e := s.index[string(key)]
	switch {
	case s.closed || e == nil || s.arena == nil:
		s.mu.Unlock()
		return false
	case e.pages != nil:
		s.mu.Unlock()
		return true
	case e.seg == nil:
		s.mu.Unlock()
		return false
	}
	seg, off := e.seg, e.off
	seg.refs++
	s.mu.Unlock()
	defer s.unref(seg)
	bp, val, err := seg.readRecord(off, key, e.size, e.crc)
	if err != nil {
		return false // a damaged record: the read that follows drops it
	}
	defer bufpool.Put(bp)
	s.mu.Lock()
	defer s.unlockAndWrite()
	if s.closed || s.index[e.key] != e || e.dead {
		return false
	}
	if e.pages != nil {
		return true
	}
	if ok, _ := s.allocLocked(e); !ok {
		return false
	}
	s.arena.CopyIn(e.pages, 0, val)
	e.freq = 0
	if s.lruMode() {
		s.enqueueLocked(e, &s.main)
	} else {
		s.enqueueLocked(e, &s.small)
	}
	s.promotions.Add(1)
	return true
}
