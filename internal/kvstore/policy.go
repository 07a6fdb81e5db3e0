package kvstore

import "hash/maphash"

// This file holds the change to S3-FIFO for KV-cache traffic
// (docs/kv-cache.md has the measurements behind it): the small queue's size
// is measured, not fixed at 10% of DRAM. A conversation's blocks are read
// again at its next turn, often after more than 10% of DRAM has been
// written, and a fixed small queue demotes them just before they are needed.
// As in ARC (Megiddo and Modha, FAST'03), the keys of blocks demoted from
// either queue are remembered as ghosts (up to twice as many as DRAM has
// pages: addGhostLocked): a reuse of a block demoted from small says small
// was too short, and small's target grows; a reuse of one demoted from main says main was
// too short, and it shrinks. Each step is the block's size times the ratio
// of the other kind of ghosts to this kind (at least 1), so the target
// settles where both kinds are reused at the same rate. It stays within 10%
// and 90% of DRAM.
//
// Bookkeeping is O(1) per operation: one fingerprint, one map probe and two
// counters.

// addGhostLocked remembers the key of a block leaving DRAM and the queue
// it left. Ghosts are 64-bit fingerprints in a ring (no pointers for the
// garbage collector to scan, 8 bytes plus a map slot each), so there can be
// twice as many as DRAM has pages: on the Mooncake conversation trace
// (docs/kv-cache.md) a conversation's next turn often comes after more than
// a DRAM's worth of writes, and a quarter as many ghosts forgot it (0.960x
// LRU at 10% of the distinct blocks, against 1.039x with twice as many). A
// fingerprint collision can only misplace a block between queues, never
// serve wrong bytes.
func (s *Store) addGhostLocked(key string, fromSmall bool) {
	fp := maphash.String(s.ghostSeed, key)
	if old, ok := s.ghost[fp]; ok {
		s.ghostCount(old, -1)
	} else {
		if len(s.ghostRing) < s.ghostCap {
			s.ghostRing = append(s.ghostRing, fp)
		} else {
			// The ring is full: its oldest slot is the next one.
			if old, ok := s.ghost[s.ghostRing[s.ghostNext]]; ok {
				s.ghostCount(old, -1)
				delete(s.ghost, s.ghostRing[s.ghostNext])
			}
			s.ghostRing[s.ghostNext] = fp
			s.ghostNext = (s.ghostNext + 1) % s.ghostCap
		}
	}
	s.ghost[fp] = fromSmall
	s.ghostCount(fromSmall, 1)
}

// isGhostLocked reports whether key is remembered as a ghost.
func (s *Store) isGhostLocked(key string) bool {
	_, ok := s.ghost[maphash.String(s.ghostSeed, key)]
	return ok
}

// ghostHitLocked reports whether key is a ghost and, if so, forgets it and
// moves the small queue's target toward the queue that demoted it too early.
func (s *Store) ghostHitLocked(key string, size int64) bool {
	fp := maphash.String(s.ghostSeed, key)
	fromSmall, ok := s.ghost[fp]
	if !ok {
		return false
	}
	delete(s.ghost, fp) // its ring slot stays until it is reused
	s.ghostCount(fromSmall, -1)
	if s.arena == nil || s.lruMode() {
		return true // LRU mode has no small queue to size
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
