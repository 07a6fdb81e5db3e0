package kvtrace

import (
	"container/heap"
	"container/list"
)

// Result is one cache's outcome over a trace.
type Result struct {
	Blocks    int64 // blocks requested
	PrefixHit int64 // blocks in requests' leading runs of hits
}

// Ratio is the prefix-hit ratio.
func (r Result) Ratio() float64 {
	if r.Blocks == 0 {
		return 0
	}
	return float64(r.PrefixHit) / float64(r.Blocks)
}

// LRU replays reqs through an exact LRU cache of capacity blocks. Each
// request touches its blocks in order (hits move to the front, misses are
// inserted), as a cache that sees a request's gets and puts in order does.
func LRU(reqs []Request, capacity int) Result {
	var res Result
	if capacity <= 0 {
		for _, q := range reqs {
			res.Blocks += int64(len(q.HashIDs))
		}
		return res
	}
	var l list.List
	at := map[int64]*list.Element{}
	for _, q := range reqs {
		run := true
		for _, h := range q.HashIDs {
			res.Blocks++
			if el, ok := at[h]; ok {
				if run {
					res.PrefixHit++
				}
				l.MoveToFront(el)
				continue
			}
			run = false
			if l.Len() >= capacity {
				old := l.Back()
				delete(at, old.Value.(int64))
				l.Remove(old)
			}
			at[h] = l.PushFront(h)
		}
	}
	return res
}

// Belady replays reqs through a clairvoyant cache of capacity blocks: on a
// miss with the cache full it drops whichever of the cached blocks and the
// new one is next used furthest in the future (never = infinitely far).
func Belady(reqs []Request, capacity int) Result {
	// Flatten the accesses and compute each one's next use.
	var acc []int64
	for _, q := range reqs {
		acc = append(acc, q.HashIDs...)
	}
	const never = int64(1) << 62
	nextUse := make([]int64, len(acc))
	last := map[int64]int64{}
	for i := len(acc) - 1; i >= 0; i-- {
		if j, ok := last[acc[i]]; ok {
			nextUse[i] = j
		} else {
			nextUse[i] = never
		}
		last[acc[i]] = int64(i)
	}
	var res Result
	h := &farHeap{pos: map[int64]int{}}
	i := 0
	for _, q := range reqs {
		run := true
		for range q.HashIDs {
			id, nu := acc[i], nextUse[i]
			i++
			res.Blocks++
			if _, ok := h.pos[id]; ok {
				if run {
					res.PrefixHit++
				}
				h.update(id, nu)
				continue
			}
			run = false
			if capacity <= 0 || nu == never {
				continue
			}
			if h.Len() >= capacity {
				if h.items[0].next <= nu {
					continue // the new block is the furthest: do not admit it
				}
				heap.Pop(h)
			}
			heap.Push(h, farItem{id, nu})
		}
	}
	return res
}

type farItem struct{ id, next int64 }

// farHeap is a max-heap on next use with an index for updates.
type farHeap struct {
	items []farItem
	pos   map[int64]int
}

func (h *farHeap) Len() int           { return len(h.items) }
func (h *farHeap) Less(i, j int) bool { return h.items[i].next > h.items[j].next }
func (h *farHeap) Swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.pos[h.items[i].id] = i
	h.pos[h.items[j].id] = j
}
func (h *farHeap) Push(x any) {
	it := x.(farItem)
	h.pos[it.id] = len(h.items)
	h.items = append(h.items, it)
}
func (h *farHeap) Pop() any {
	it := h.items[len(h.items)-1]
	h.items = h.items[:len(h.items)-1]
	delete(h.pos, it.id)
	return it
}
func (h *farHeap) update(id, next int64) {
	i := h.pos[id]
	h.items[i].next = next
	heap.Fix(h, i)
}
