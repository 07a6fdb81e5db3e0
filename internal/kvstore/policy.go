package kvstore

// This file holds the parts of the DRAM placement policy that adapt S3-FIFO
// to KV-cache traffic (docs/kv-cache.md has the numbers behind them):
//
//   - The small queue's size is measured, not fixed at 10% of DRAM. A
//     conversation's blocks are read again at its next turn, often after
//     more than 10% of DRAM has been written, and a fixed small queue
//     demotes them just before they are needed. As in ARC (Megiddo and
//     Modha, FAST'03), the keys of blocks demoted from either queue are
//     remembered as ghosts: a reuse of a block demoted from small says the
//     reuse distance of new blocks is longer than small, and small grows by
//     the block's size; a reuse of one demoted from main says main was too
//     short, and small shrinks. The size stays within 10% and 90% of DRAM.
//   - Leaves go first. A put may name its parent in a prefix chain (Hint).
//     The child is queued just behind its parent in the small queue, so a
//     chain written at once is demoted from its end, never from its root (a
//     root gone makes every descendant useless to a prefix lookup). A block
//     with children still in DRAM gets one extra pass in main before it is
//     demoted, so a shared prefix outlives its children.
//
// Everything is O(1) per operation: one map probe for a ghost, a parent
// pointer and a child count per entry.

// chain is an entry's chain bookkeeping.
type chain struct {
	parent *entry // the parent that counts this entry in its kids
	kids   int32  // DRAM entries naming this one as parent
	spared bool   // had its extra pass in main for having kids
}

// addGhostLocked remembers the key of a block leaving DRAM.
func (s *Store) addGhostLocked(key string, fromSmall bool) {
	if _, ok := s.ghost[key]; !ok {
		s.ghostFIFO = append(s.ghostFIFO, key)
	}
	s.ghost[key] = fromSmall
	if len(s.ghostFIFO) > s.ghostCap {
		delete(s.ghost, s.ghostFIFO[0])
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
	memCap := int64(s.arena.Pages()) * PageSize
	if fromSmall {
		s.smallTarget += size
	} else {
		s.smallTarget -= size
	}
	s.smallTarget = min(max(s.smallTarget, memCap/10), memCap*9/10)
	return true
}

// enqueueSmallLocked queues a new block in small: just behind its parent
// when the parent is there too (so it is demoted before the parent), else
// at the head.
func (s *Store) enqueueSmallLocked(e *entry, parentKey []byte) {
	var p *entry
	if len(parentKey) > 0 {
		if p = s.index[string(parentKey)]; p != nil && (p.pages == nil || p.dead) {
			p = nil
		}
	}
	if p != nil {
		e.parent = p
		p.kids++
	}
	if p != nil && p.q == &s.small {
		e.q = &s.small
		e.elem = s.small.InsertAfter(e, p.elem)
		s.smallBytes += e.size
		return
	}
	s.enqueueLocked(e, &s.small)
}

// unlinkLocked drops e from its parent's child count (e leaves DRAM).
func (s *Store) unlinkLocked(e *entry) {
	if e.parent != nil {
		e.parent.kids--
		e.parent = nil
	}
}
