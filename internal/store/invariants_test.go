package store

import (
	"fmt"
	"testing"
)

// checkInvariants checks, with no operation in flight, that every DRAM page
// is either free or held by exactly one chunk, that the disk tier's usage is
// the sum of the chunks' lengths, and that the index and the LRU agree.
// open runs it after every test.
func (s *Store) checkInvariants() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var disk int64
	inLRU := 0
	owner := map[int32]uint64{}
	for id, c := range s.chunks {
		if c.id != id {
			return fmt.Errorf("chunk %d indexed under %d", c.id, id)
		}
		if c.deleted {
			return fmt.Errorf("deleted chunk %d still indexed", id)
		}
		if c.pins != 0 {
			return fmt.Errorf("chunk %d still pinned %d times", id, c.pins)
		}
		disk += c.length
		prev := int64(-1)
		for k := 0; k < len(c.ext.iv); k += 2 {
			if a, b := c.ext.iv[k], c.ext.iv[k+1]; a <= prev || a >= b || b > c.length {
				return fmt.Errorf("chunk %d of %d bytes: written extents %v not sorted, apart and within it", id, c.length, c.ext.iv)
			}
			prev = c.ext.iv[k+1]
		}
		if c.pages != nil {
			if s.arena == nil {
				return fmt.Errorf("chunk %d has DRAM pages without a DRAM tier", id)
			}
			if len(c.pages) < blocks(c.length) {
				return fmt.Errorf("chunk %d of %d bytes cached in %d pages: not all of it", id, c.length, len(c.pages))
			}
			if c.elem == nil {
				return fmt.Errorf("cached chunk %d is not in the LRU", id)
			}
			inLRU++
			for _, p := range c.pages {
				if o, dup := owner[p]; dup {
					return fmt.Errorf("page %d held by chunks %d and %d", p, o, id)
				}
				owner[p] = id
			}
		} else if c.elem != nil {
			return fmt.Errorf("uncached chunk %d is in the LRU", id)
		}
	}
	if inLRU != s.lru.Len() {
		return fmt.Errorf("LRU holds %d chunks, %d are cached", s.lru.Len(), inLRU)
	}
	if s.arena != nil && len(owner)+s.arena.FreePages() != s.arena.Pages() {
		return fmt.Errorf("arena: %d pages held + %d free != %d", len(owner), s.arena.FreePages(), s.arena.Pages())
	}
	if s.disk != nil && disk != s.disk.Used() {
		return fmt.Errorf("disk usage %d, chunks hold %d bytes", s.disk.Used(), disk)
	}
	return nil
}

// checkAfter runs checkInvariants when t ends, before the store closes.
func checkAfter(t *testing.T, s *Store) {
	t.Cleanup(func() {
		if err := s.checkInvariants(); err != nil {
			t.Errorf("store invariant: %v", err)
		}
	})
}

// TestInvariantCheck: the check passes on a store in use and catches a page
// that leaked and a miscounted disk.
func TestInvariantCheck(t *testing.T) {
	s, err := Open(Config{MemBytes: 1 << 20, Dir: t.TempDir(), DiskBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := uint64(1); i <= 4; i++ {
		if err := s.Write(i, 0, rnd(300<<10, i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.checkInvariants(); err != nil {
		t.Fatal(err)
	}
	s.disk.Add(1)
	if s.checkInvariants() == nil {
		t.Error("a miscounted disk passed")
	}
	s.disk.Add(-1)
	leak, _ := s.arena.Alloc(1)
	if s.checkInvariants() == nil {
		t.Error("a leaked page passed")
	}
	s.arena.Release(leak)
}
