package kvstore

// This file holds the change to S3-FIFO for KV-cache traffic
// (docs/kv-cache.md has the measurements behind it): the small queue's size
// is measured, not fixed at 10% of DRAM. A conversation's blocks are read
// again at its next turn, often after more than 10% of DRAM has been
// written, and a fixed small queue demotes them just before they are needed.
// As in ARC (Megiddo and Modha, FAST'03), the keys of blocks demoted from
// either queue are remembered as ghosts (up to a quarter as many keys as
// DRAM has pages): a reuse of a block demoted from small says small was too short,
// and small's target grows; a reuse of one demoted from main says main was
// too short, and it shrinks. Each step is the block's size times the ratio
// of the other kind of ghosts to this kind (at least 1), so the target
// settles where both kinds are reused at the same rate. It stays within 10%
// and 90% of DRAM.
//
// Bookkeeping is O(1) per operation: one map probe and two counters.

// addGhostLocked remembers the key of a block leaving DRAM and the queue
// it left.
func (s *Store) addGhostLocked(key string, fromSmall bool) {
	if old, ok := s.ghost[key]; ok {
		s.ghostCount(old, -1)
	} else {
		s.ghostFIFO = append(s.ghostFIFO, key)
	}
	s.ghost[key] = fromSmall
	s.ghostCount(fromSmall, 1)
	if len(s.ghostFIFO) > s.ghostCap {
		if old, ok := s.ghost[s.ghostFIFO[0]]; ok {
			s.ghostCount(old, -1)
			delete(s.ghost, s.ghostFIFO[0])
		}
		s.ghostFIFO = s.ghostFIFO[1:]
	}
}

// ghostHitLocked reports whether key is a ghost and, if so, forgets it and
// moves the small queue's target toward the queue that demoted it too early.
func (s *Store) ghostHitLocked(key string, size int64) bool {
	fromSmall, ok := s.ghost[key]
	if !ok {
		return false
	}
	delete(s.ghost, key) // its FIFO slot stays until it falls off
	s.ghostCount(fromSmall, -1)
	if s.arena == nil {
		return true
	}
	memCap := int64(s.arena.Pages()) * PageSize
	// ARC's step: by the ratio of the other ghost list to this one, so the
	// target settles where both ghost lists are hit at the same rate.
	if fromSmall {
		s.smallTarget += size * max(1, s.mainGhosts/max(1, s.smallGhosts))
	} else {
		s.smallTarget -= size * max(1, s.smallGhosts/max(1, s.mainGhosts))
	}
	s.smallTarget = min(max(s.smallTarget, memCap/10), memCap*9/10)
	return true
}

func (s *Store) ghostCount(fromSmall bool, d int64) {
	if fromSmall {
		s.smallGhosts += d
	} else {
		s.mainGhosts += d
	}
}
