package kvstore

import (
	"container/list"
	"math"
)

// The store runs one of two policies in DRAM and picks between them by
// measuring both on a sample of the traffic, as miniature simulations
// (Waldspurger et al., "Cache Modeling and Optimization using Miniature
// Simulations", USENIX ATC'17): keys whose fingerprint falls in a fixed 1/S
// slice are replayed through two small caches of 1/S of the DRAM tier's
// bytes, one exact LRU and one S3-FIFO with its own ghosts (as many per page
// as the store's) and its own small-queue sizing, which the store adopts
// when it switches back to S3-FIFO. Hits are counted with exponential decay;
// the store starts in LRU, switches to S3-FIFO when that miniature has 4%
// more hits, and back when LRU's has more. In LRU mode new blocks go
// straight into main and the least recently used block leaves (blocks left
// in small by S3-FIFO mode first). Neither policy is best everywhere: on the
// Mooncake conversation trace with DRAM at 10% of the distinct blocks
// S3-FIFO keeps 1.04x LRU's prefix hits, at 25% it keeps 0.96x
// (docs/kv-cache.md).
//
// Cost: a key fingerprint per stored block (8 bytes in its entry, computed
// at put or load), a modulo per get hit, disk hit and put, and, for the
// sampled 1/S of them, O(1) work in each miniature. A miniature holds at
// most 2*miniPages pages' worth of blocks whatever the DRAM size.

// miniPages is the miniature caches' size in DRAM pages: S is chosen so that
// 1/S of the DRAM tier is about this much (S = 1 for small stores).
const miniPages = 8192

// duelHalfLife: old hits weigh half as much after this many sampled
// accesses, so the choice follows the traffic as it changes.
const duelHalfLife = 8192

var duelDecay = math.Exp2(-256.0 / duelHalfLife) // applied every 256 accesses

type miniEntry struct {
	fp    uint64
	size  int64
	freq  uint8
	small bool
}

// mini is a policy simulator over fingerprints and sizes, no data.
type mini struct {
	lru         bool
	cap         int64
	used        int64
	smallBytes  int64
	small, main list.List // LRU: main only, front = most recent
	at          map[uint64]*list.Element
	ghosts      *ghosts
	smallTarget int64   // sized by ghost hits as the store's (policy.go)
	hits        float64 // decayed
}

func newMini(lru bool, capBytes int64, ghostLimit int) *mini {
	return &mini{lru: lru, cap: capBytes, at: map[uint64]*list.Element{}, ghosts: newGhosts(ghostLimit), smallTarget: capBytes / 10}
}

// access replays one use of a sampled key: a get that hit the store, or a
// put. score says whether a hit here counts: a put of a block the store
// already has is a use but not a hit (the client recomputed the block
// because its prefix broke earlier), and counting it favoured the policy
// that keeps blocks past broken prefixes.
func (m *mini) access(fp uint64, size int64, score bool) {
	if el, ok := m.at[fp]; ok {
		if score {
			m.hits++
		}
		e := el.Value.(*miniEntry)
		if m.lru {
			m.main.MoveToFront(el)
		} else if e.freq < 3 {
			e.freq++
		}
		return
	}
	if size > m.cap/2 {
		return
	}
	for m.used+size > m.cap {
		m.evict()
	}
	e := &miniEntry{fp: fp, size: size}
	m.used += size
	fromSmall, ghost := m.ghosts.take(fp)
	if ghost {
		m.smallTarget = arcStep(m.smallTarget, size, m.cap, m.ghosts, fromSmall)
	}
	if m.lru || ghost {
		m.at[fp] = m.main.PushFront(e)
		return
	}
	e.small = true
	m.smallBytes += size
	m.at[fp] = m.small.PushFront(e)
}

func (m *mini) evict() {
	for {
		fromSmall := m.small.Len() > 0 && (m.smallBytes >= m.smallTarget || m.main.Len() == 0)
		q := &m.main
		if fromSmall {
			q = &m.small
		}
		el := q.Back()
		e := el.Value.(*miniEntry)
		q.Remove(el)
		if e.small {
			m.smallBytes -= e.size
			e.small = false
		}
		if !m.lru && e.freq > 0 {
			if fromSmall {
				e.freq = 0
			} else {
				e.freq--
			}
			m.at[e.fp] = m.main.PushFront(e)
			continue
		}
		delete(m.at, e.fp)
		m.used -= e.size
		if !m.lru {
			m.ghosts.add(e.fp, fromSmall)
		}
		return
	}
}

// duel holds the two miniatures and the current choice.
type duel struct {
	every    uint64 // S
	lru, s3  *mini
	accesses int
	useLRU   bool
	fixed    bool // Config.Policy is not "auto": no miniatures
	switches int64
}

// newDuel starts in LRU mode: until the cache is full both miniatures hit
// alike, and S3-FIFO must then prove itself (on the Mooncake trace at 25%
// an S3-FIFO start cost 2% of LRU's hits before LRU took over).
func newDuel(pages int, policy string) *duel {
	s := uint64(max(1, pages/miniPages))
	capBytes := int64(pages) * PageSize / int64(s)
	ghostLimit := max(1024, 2*pages) / int(s) // the store's ghosts, sampled
	return &duel{every: s, lru: newMini(true, capBytes, 0), s3: newMini(false, capBytes, ghostLimit), useLRU: policy != "s3fifo", fixed: policy != "auto"}
}

// sampled reports whether fp is in the sampled slice: the fingerprint is
// uniform, so fp mod S picks 1/S of the keys, the same ones every time.
func (d *duel) sampled(fp uint64) bool { return d.every == 1 || fp%d.every == 0 }

// duelAccessLocked feeds one use of a key (its fingerprint) to the miniatures (score: see
// mini.access) and updates the store's choice.
func (s *Store) duelAccessLocked(fp uint64, size int64, score bool) {
	d := s.duel
	if d == nil || d.fixed {
		return
	}
	if !d.sampled(fp) {
		return
	}
	sz := max(PageSize, (size+PageSize-1)/PageSize*PageSize)
	d.lru.access(fp, sz, score)
	d.s3.access(fp, sz, score)
	d.accesses++
	if d.accesses%256 == 0 {
		d.lru.hits *= duelDecay
		d.s3.hits *= duelDecay
		was := d.useLRU
		// Hysteresis: S3-FIFO must be clearly better to take over (a switch
		// costs hits while the queues reshape), LRU only better.
		if d.useLRU {
			d.useLRU = d.s3.hits <= d.lru.hits*duelEnter
		} else {
			d.useLRU = d.lru.hits > d.s3.hits*duelLeave
		}
		if was != d.useLRU {
			d.switches++
		}
		if was && !d.useLRU {
			// Back to S3-FIFO: start from the small queue size the
			// miniature has learnt meanwhile.
			s.smallTarget = d.s3.smallTarget * int64(d.every)
		}
	}

}

// lruMode reports whether the miniatures chose LRU.
func (s *Store) lruMode() bool { return s.duel != nil && s.duel.useLRU }

// touchLocked records a use of e in DRAM: a get (read), or a put of a key the
// store has (write-once: a request putting a block it computed uses it as
// much as one reading it, but it is no hit for the miniatures).
func (s *Store) touchLocked(e *entry, read bool) {
	if e.pages == nil {
		return
	}
	if e.freq < 3 {
		e.freq++
	}
	if s.lruMode() && e.q != nil && e.q != &s.pinned {
		// Most recently used: the head of main (a block left in small by
		// S3-FIFO mode moves too, so small only drains what nobody uses).
		s.dequeueLocked(e)
		s.enqueueLocked(e, &s.main)
	}
	s.duelAccessLocked(e.fp, e.size, read)
}

// duelEnter and duelLeave: S3-FIFO's miniature must have 4% more (decayed)
// hits than LRU's to take over, LRU's more than S3-FIFO's to take back.
// Chosen on the traces of docs/kv-cache.md: with 1% and 1% the store
// switched back and forth and lost up to 5% to LRU.
const duelEnter, duelLeave = 1.04, 1.0
