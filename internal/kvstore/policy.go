package kvstore

import "hash/maphash"

// This file holds the change to S3-FIFO for KV-cache traffic
// (docs/kv-cache.md has the measurements behind it): the small queue's size
// is measured, not fixed at 10% of DRAM. A conversation's blocks are read
// again at its next turn, often after more than 10% of DRAM has been
// written, and a fixed small queue demotes them just before they are needed.
// As in ARC (Megiddo and Modha, FAST'03), the keys of blocks demoted from
// either queue are remembered as ghosts (twice as many as DRAM has pages:
// type ghosts): a reuse of a block demoted from small says small was too
// short, and small's target grows; a reuse of one demoted from main says
// main was too short, and it shrinks. Each step is the block's size times the ratio
// of the other kind of ghosts to this kind (at least 1), so the target
// settles where both kinds are reused at the same rate. It stays within 10%
// and 90% of DRAM.
//
// Bookkeeping is O(1) per operation: one fingerprint, one map probe and two
// counters.

// ghosts remembers the fingerprints of keys that left DRAM, and the queue
// each left, FIFO-bounded. A fingerprint is 64 bits in a ring (no pointer for
// the garbage collector to follow), so the store keeps twice as many as DRAM
// has pages: on the Mooncake conversation trace (docs/kv-cache.md) a
// conversation's next turn often comes after more than a DRAM's worth of
// writes, and a quarter as many ghosts forgot it (0.960x LRU at 10% of the
// distinct blocks, against 1.039x with twice as many). A fingerprint
// collision can only misplace a block between queues, never serve wrong
// bytes. The miniature S3-FIFO of duel.go uses the same type.
type ghosts struct {
	live        map[uint64]ghost
	ring        []ringSlot // oldest at next once full
	next, limit int
	seq         uint64
	small, main int64 // how many of each kind are remembered
}

type ghost struct {
	seq       uint64 // of the ring slot that remembers it
	fromSmall bool
}

type ringSlot struct{ fp, seq uint64 }

func newGhosts(limit int) *ghosts {
	return &ghosts{live: map[uint64]ghost{}, limit: limit}
}

// add remembers fp as having left the small queue or main.
func (g *ghosts) add(fp uint64, fromSmall bool) {
	if g.limit <= 0 {
		return
	}
	if old, ok := g.live[fp]; ok {
		g.count(old.fromSmall, -1)
	}
	g.seq++
	slot := ringSlot{fp, g.seq}
	if len(g.ring) < g.limit {
		g.ring = append(g.ring, slot)
	} else {
		// The oldest slot goes; its ghost with it, unless the key was
		// remembered again since (a later slot holds it).
		old := g.ring[g.next]
		if o, ok := g.live[old.fp]; ok && o.seq == old.seq {
			g.count(o.fromSmall, -1)
			delete(g.live, old.fp)
		}
		g.ring[g.next] = slot
		g.next = (g.next + 1) % g.limit
	}
	g.live[fp] = ghost{g.seq, fromSmall}
	g.count(fromSmall, 1)
}

// take forgets fp and reports whether it was a ghost and which queue it
// left. Its ring slot stays until it is reused.
func (g *ghosts) take(fp uint64) (fromSmall, ok bool) {
	o, ok := g.live[fp]
	if ok {
		delete(g.live, fp)
		g.count(o.fromSmall, -1)
	}
	return o.fromSmall, ok
}

func (g *ghosts) has(fp uint64) bool {
	_, ok := g.live[fp]
	return ok
}

func (g *ghosts) count(fromSmall bool, d int64) {
	if fromSmall {
		g.small += d
	} else {
		g.main += d
	}
}

// arcStep moves a small-queue target after a ghost hit, as ARC does: by the
// block's size times the ratio of the other kind of ghosts to this kind, so
// the target settles where both kinds are hit at the same rate; within 10%
// and 90% of capacity.
func arcStep(target, size, capBytes int64, g *ghosts, fromSmall bool) int64 {
	if fromSmall {
		target += size * max(1, g.main/max(1, g.small))
	} else {
		target -= size * max(1, g.small/max(1, g.main))
	}
	return min(max(target, capBytes/10), capBytes*9/10)
}

func (s *Store) fingerprint(key string) uint64 { return maphash.String(s.seed, key) }

// addGhostLocked remembers a block leaving DRAM (its key's fingerprint)
// and the queue it left.
func (s *Store) addGhostLocked(fp uint64, fromSmall bool) { s.ghosts.add(fp, fromSmall) }

// ghostHitLocked reports whether the key with fingerprint fp is a ghost and, if so, forgets it and
// moves the small queue's target toward the queue that demoted it too early.
func (s *Store) ghostHitLocked(fp uint64, size int64) bool {
	fromSmall, ok := s.ghosts.take(fp)
	if !ok || s.arena == nil || s.lruMode() {
		return ok // LRU mode has no small queue to size
	}
	s.smallTarget = arcStep(s.smallTarget, size, int64(s.arena.Pages())*PageSize, s.ghosts, fromSmall)
	return true
}
