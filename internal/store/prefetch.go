package store

// Prefetch copies chunk id from the disk tier into DRAM, as a read of it
// would, without reading it for anyone: the chunk is not pinned (it stays
// evictable like any cached chunk, at the front of the LRU) and no read is
// counted. It reports whether it copied anything; a chunk already in DRAM, an
// empty one, or a store without both tiers is left as it is. An explicit-mode
// plan warms the chunks of its stored ranges this way, so the engine's load
// that follows finds them in DRAM (docs/kv-cache.md, "Plans warm their
// stored ranges").
func (s *Store) Prefetch(id uint64) (bool, error) {
	if s.arena == nil || s.cfg.Dir == "" {
		return false, nil
	}
	c, err := s.get(id)
	if err != nil {
		return false, err
	}
	// c.mu as in Read: concurrent readers of the chunk wait for one load,
	// and no write changes its blocks while they are copied.
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.deleted {
		return false, notFound(id)
	}
	s.mu.Lock()
	cached := c.pages != nil
	s.mu.Unlock()
	if cached || c.length == 0 {
		return false, nil
	}
	if err := s.promote(c); err != nil {
		return false, err
	}
	return true, nil
}
