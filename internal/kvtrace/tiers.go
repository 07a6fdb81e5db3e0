package kvtrace

import "container/list"

// TierResult is a two-tier cache's outcome over a trace: prefix hits as in
// Result, and how many of them the DRAM tier served.
type TierResult struct {
	Result
	DRAMHit int64 // prefix-hit blocks found in the DRAM tier
}

// DRAMShare is the share of prefix-hit blocks served from DRAM.
func (r TierResult) DRAMShare() float64 {
	if r.PrefixHit == 0 {
		return 0
	}
	return float64(r.DRAMHit) / float64(r.PrefixHit)
}

// Infinite is the prefix-hit ratio of a cache that never evicts: every block
// seen before is a hit. No cache of any size or policy does better, so it is
// the bound a DRAM+disk store is held against.
func Infinite(reqs []Request) Result {
	return LRU(reqs, Distinct(reqs))
}

// TwoTierLRU replays reqs through an inclusive two-tier LRU: a DRAM tier of
// dram blocks in front of a disk tier of disk blocks, each an exact LRU
// touched by every access (a hit in either tier, or the put of a miss, makes
// the block most recent in both). When disk >= dram the DRAM tier holds the
// dram most recent blocks and the disk tier the disk most recent, so the
// overall hits are LRU(reqs, disk)'s and a hit is a DRAM hit when the block
// is among the dram most recent. This is the reference for a store whose
// DRAM runs LRU and whose disk keeps what DRAM demotes.
func TwoTierLRU(reqs []Request, dram, disk int) TierResult {
	var res TierResult
	mem, dsk := newLRUSet(dram), newLRUSet(disk)
	for _, q := range reqs {
		run := true
		for _, h := range q.HashIDs {
			res.Blocks++
			inMem, inDisk := mem.touch(h), dsk.touch(h)
			if !(inMem || inDisk) {
				run = false
			}
			if run {
				res.PrefixHit++
				if inMem {
					res.DRAMHit++
				}
			}
		}
	}
	return res
}

// lruSet is an exact LRU set of block ids.
type lruSet struct {
	cap int
	l   list.List
	at  map[int64]*list.Element
}

func newLRUSet(capacity int) *lruSet {
	return &lruSet{cap: capacity, at: map[int64]*list.Element{}}
}

// touch makes h the most recent block, inserting it (and evicting the least
// recent past capacity) if absent, and says whether it was there.
func (s *lruSet) touch(h int64) bool {
	if s.cap <= 0 {
		return false
	}
	if el, ok := s.at[h]; ok {
		s.l.MoveToFront(el)
		return true
	}
	if s.l.Len() >= s.cap {
		old := s.l.Back()
		delete(s.at, old.Value.(int64))
		s.l.Remove(old)
	}
	s.at[h] = s.l.PushFront(h)
	return false
}
