package kvstore

// This file holds the parts of the DRAM placement policy that adapt S3-FIFO
// to KV-cache traffic (see docs/kv-cache.md for the numbers behind them):
//
//   - The small queue is as long as the measured reuse distance, not a fixed
//     10% of DRAM. A conversation's blocks are read again at its next turn,
//     typically after far more than 10% of DRAM has been written, so a fixed
//     small queue demotes them just before they are needed. The store counts
//     the bytes put into DRAM; a block's first read while in small (or a put
//     or read of a key in the ghost queue, i.e. a reuse small was too short
//     for) is one sample of "bytes written between a block's write and its
//     first reuse". The small queue's target follows a high quantile of those
//     samples, between 10% and 90% of DRAM.
//   - Leaves go first. A put may name its parent in a prefix chain. The
//     child is queued just behind its parent in the small queue, so a chain
//     written at once is demoted from its end, never from its root (a root
//     gone makes every descendant useless to a prefix lookup). A block with
//     children still in DRAM gets one extra pass in main before it is
//     demoted, so a shared prefix with many children outlives them.
//
// Everything is O(1) per operation: a counter and a quantile estimate, a
// parent pointer and a child count per entry.

// chain is an entry's chain bookkeeping.
type chain struct {
	born   int64  // Store.reuse.written when the block was put
	parent *entry // the DRAM parent that counts this entry in its kids
	kids   int32  // DRAM entries naming this one as parent
	spared bool   // had its extra pass in main for having kids
}

// reuseDist estimates a high quantile of reuse distances in bytes written.
type reuseDist struct {
	written int64 // bytes put into DRAM so far
	q       int64 // the estimate; 0 until the first sample
}

// reuseQuantile is the share of first reuses the small queue aims to keep.
const reuseQuantile = 0.9

// observe feeds one reuse distance d (bytes) into a stochastic quantile
// estimate: up by step*τ when d is above it, down by step*(1-τ) otherwise,
// which settles where a share τ of samples lies below.
func (r *reuseDist) observe(d, memCap int64) {
	if d < 0 {
		return
	}
	step := max(memCap/64, 1)
	if r.q == 0 {
		r.q = d
		return
	}
	if d > r.q {
		r.q += int64(float64(step) * reuseQuantile)
	} else {
		r.q -= int64(float64(step) * (1 - reuseQuantile))
	}
	r.q = min(max(r.q, 0), 2*memCap)
}

// smallTarget is the small queue's size: the reuse-distance estimate, within
// 10% and 90% of DRAM.
func (r *reuseDist) smallTarget(memCap int64) int64 {
	return min(max(r.q, memCap/10), memCap*9/10)
}

func (s *Store) memCap() int64 {
	if s.arena == nil {
		return 0
	}
	return int64(s.arena.Pages()) * PageSize
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
