// Package kvstore is a data server's hash-mode KV cache: write-once blocks
// (key → bytes) in a DRAM tier (off-heap arena) and a disk tier (append-only
// segment files).
//
// Placement between tiers follows S3-FIFO or LRU, whichever miniature
// simulations of both on sampled keys find better (Config.Policy "auto",
// duel.go). In LRU mode new blocks enter main and the least recently used
// block leaves DRAM. S3-FIFO (Yang et al., SOSP'23): a new block
// enters a small FIFO queue (10% to 90% of DRAM, sized by ghost hits as in
// ARC: policy.go); blocks leaving it that were read
// again move to the main FIFO queue, the rest are demoted to disk and their
// keys remembered in a ghost queue; a block read from disk whose key is a
// ghost is promoted straight to main. Main reinserts blocks read since their
// last pass and demotes the others. A one-time scan therefore passes through
// the small queue without pushing the working set out of DRAM.
//
// The disk tier is a FIFO of segments: past its capacity the oldest segment
// goes, after blocks read since they were written there are appended again at
// the head (bounded to half a segment per eviction). Exists never counts as a
// read and never pins. Everything on disk is CRC32C-checked: a damaged record
// is a miss, never data. Blocks only in DRAM are lost on a crash: KV cache is
// recomputable, and write-behind keeps puts at memory speed; a graceful stop
// writes them to disk first (Flush, flush.go).
package kvstore

import (
	"container/list"
	"hash/crc32"
	"hash/maphash"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/bufpool"
	"github.com/gd2fs/gd2fs/internal/crc32c"
	"github.com/gd2fs/gd2fs/internal/limits"
	"github.com/gd2fs/gd2fs/internal/tier"
)

// PageSize is the DRAM tier's page: small enough that 64 KiB blocks waste
// little, large enough that a 4 MiB block is 256 iovecs.
const PageSize = 16 << 10

// MaxKey is the longest store key accepted: a server stores a client's key
// (at most limits.MaxKVKey bytes) behind its pool name (at most 255 bytes)
// and a NUL, so clients see the same key limit whatever the pool.
const MaxKey = limits.MaxKVKey + 256

// Tier says where a block is.
type Tier uint8

// Tiers.
const (
	TierNone Tier = iota
	TierDRAM
	TierDisk
)

func (t Tier) String() string { return [...]string{"none", "dram", "disk"}[t] }

// Config sizes the store.
type Config struct {
	MemBytes    int64  // DRAM tier; 0 = none
	Dir         string // disk tier directory; "" = none
	DiskBytes   int64
	MaxValue    int64 // default 64 MiB
	SegmentSize int64 // default max(64 MiB, 2*MaxValue)
	// Policy of the DRAM tier: "auto" (default: S3-FIFO or LRU, whichever
	// a miniature simulation of each on sampled keys finds better, duel.go),
	// "s3fifo" or "lru" to fix one.
	Policy string
	// PinQuota bounds the bytes pinned in each tier (retain.go): 0 = a
	// quarter of the tier, negative = pins refused; never more than half
	// of a tier, so pins never leave puts without room.
	PinQuota int64
	// Now is the clock TTLs are measured with (default time.Now); tests
	// inject their own.
	Now func() time.Time
	Log *slog.Logger
	// Prefault makes the DRAM tier resident in the background at start
	// (tier.DRAM.Prefault), so puts do not pay its first-touch faults.
	Prefault bool

	fs tier.FS // the disk tier's file system; nil means the operating system's (tests: tier/memfs)
}

// Policies are the values of Config.Policy.
var Policies = []string{"auto", "s3fifo", "lru"}

// Stats are cumulative counters and current sizes.
type Stats struct {
	Keys                                      int
	MemKeys                                   int // keys with a DRAM copy
	MemCap, MemUsed, DiskCap, DiskUsed        int64
	MemHits, DiskHits, Misses                 uint64
	Puts, Existed                             uint64
	ReservedPuts                              uint64 // values received straight into reserved DRAM pages and stored (reserve.go)
	Demotions, Promotions, Evictions, Corrupt uint64
	SmallTarget, SmallUsed                    int64  // the S3-FIFO small queue's measured target size and use (policy.go)
	Policy                                    string // the DRAM tier's policy now: "s3fifo" or "lru" (duel.go)
	PolicySwitches                            int64  // times "auto" changed it
	// Retention (retain.go).
	PinnedKeys            int   // blocks pinned in either tier
	PinnedMem, PinnedDisk int64 // bytes pinned in DRAM, on disk
	PinQuotaMem           int64 // the most bytes DRAM pins may hold
	PinQuotaDisk          int64 // the most bytes disk pins may hold
	ExpiringKeys          int   // blocks with a TTL
	Expired               uint64
}

// entryRAM is what one index entry costs in memory besides its key: the
// entry, its map slot and its place in its segment's key list (measured by
// TestIndexBytesPerKey: about 205 bytes of heap with a 25-byte key, rounded
// up). It is counted against the disk tier with every record
// (indexCharge), so the index of many tiny blocks is bounded by --disk as
// their bytes are (issue 22 finding 5: 300k 1-byte SETs cost ~510 B of RSS
// each while the tier was 4% full).
const entryRAM = 256

// indexCharge is the memory one block's index entry holds.
func indexCharge(key string) int64 { return entryRAM + int64(len(key)) }

type entry struct {
	// Fields ordered by size, so padding costs nothing (112 bytes, was
	// 136; entryRAM counts it).
	key  string
	fp   uint64 // the key's fingerprint, for the ghosts and the miniatures (policy.go, duel.go)
	size int64

	// DRAM copy.
	pages []int32
	q     *list.List // small or main; nil when not in DRAM
	elem  *list.Element

	// Disk copy.
	seg  *segment
	off  int64  // record start
	pend *write // a disk write of this block in flight (write.go)

	expire int64 // unix nanoseconds after which the block is gone; 0 = never (retain.go)

	crc      uint32
	pins     int32 // reads of the DRAM copy in flight
	freq     uint8
	diskRead bool // read since written to this segment
	dead     bool // deleted or replaced; pages freed when unpinned
	prio     int8 // eviction takes lower priorities first (retain.go)
	pin      Tier // pinned in DRAM (in s.pinned, never evicted) or kept on disk
}

// Store is safe for concurrent use.
type Store struct {
	cfg   Config
	log   *slog.Logger
	arena *tier.DRAM // the DRAM tier; nil without one (and after Close)
	disk  *tier.Disk // the disk tier; nil without one

	mu          sync.Mutex
	index       map[string]*entry
	small, main list.List
	smallBytes  int64
	ghosts      *ghosts // keys that left DRAM (policy.go)
	seed        maphash.Seed
	duel        *duel // picks S3-FIFO or LRU (duel.go); nil without DRAM
	smallTarget int64 // adapted by ghost hits (policy.go)

	// Retention (retain.go).
	now                   func() time.Time
	pinned                list.List // blocks pinned in DRAM: in no eviction queue
	pinnedMem, pinnedDisk int64
	pinQuotaMem           int64
	pinQuotaDisk          int64
	nPinned               int
	prioCount             [prioLevels]int // blocks in small and main per priority
	expiring              map[*entry]struct{}
	expired               atomic.Uint64

	segs    []*segment // oldest first; last is active
	queue   []*write   // records reserved by the operation holding mu (write.go)
	nextSeg uint64

	memHits, diskHits, misses, puts, existed      atomic.Uint64
	reservedPuts                                  atomic.Uint64
	demotions, promotions, evictions, corruptRecs atomic.Uint64

	closed bool // guarded by mu

	// Reservations (reserve.go), guarded by mu: their bytes, how many are
	// open, and the DRAM tier Close left for the last of them to unmap.
	reserved        int64
	reservedPages   int
	filling         int
	arenaAfterFills *tier.DRAM
}

// Open opens a store; with a disk tier it loads the segments, keeping every
// record whose header checks out (values are checked when read).
func Open(cfg Config) (*Store, error) {
	defaultMax := cfg.MaxValue <= 0
	if defaultMax {
		cfg.MaxValue = limits.MaxKVValue
	}
	if cfg.SegmentSize <= 0 {
		var err error
		if cfg.SegmentSize, cfg.MaxValue, err = segmentSizeFor(cfg, defaultMax); err != nil {
			return nil, err
		}
	}
	if cfg.SegmentSize < cfg.MaxValue+recHeader+MaxKey {
		return nil, errs.New(errs.ErrBadRequest, "kvstore: segment size %d cannot hold a %d-byte value", cfg.SegmentSize, cfg.MaxValue)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.MemBytes <= 0 && cfg.Dir == "" {
		return nil, errs.New(errs.ErrBadRequest, "kvstore: no tier: give a DRAM size or a disk directory")
	}
	if cfg.Policy == "" {
		cfg.Policy = "auto"
	}
	if !slices.Contains(Policies, cfg.Policy) {
		return nil, errs.New(errs.ErrBadRequest, "kvstore: policy %q: want one of %s", cfg.Policy, strings.Join(Policies, ", "))
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Store{cfg: cfg, log: cfg.Log, index: map[string]*entry{}, ghosts: newGhosts(0), seed: maphash.MakeSeed(),
		now: cfg.Now, expiring: map[*entry]struct{}{}}
	a, err := tier.NewDRAM(cfg.MemBytes, PageSize)
	if err != nil {
		return nil, err
	}
	s.arena, s.disk = a, tier.NewDisk(cfg.Dir, cfg.DiskBytes, cfg.fs)
	if cfg.Prefault {
		a.Prefault(cfg.Log, "kv")
	}
	if a != nil {
		s.ghosts = newGhosts(max(1024, 2*a.Pages()))
		s.duel = newDuel(a.Pages(), cfg.Policy)
		s.smallTarget = a.Cap() / 10
	}
	s.pinQuotaMem, s.pinQuotaDisk = pinQuota(cfg.PinQuota, cfg.MemBytes), pinQuota(cfg.PinQuota, s.disk.Cap())
	if s.disk != nil {
		if err := s.load(); err != nil {
			s.Close()
			return nil, err
		}
		s.loadRetention()
	}
	return s, nil
}

// Close releases the DRAM tier and closes segment files.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for _, g := range s.segs {
		g.f.Close()
	}
	s.segs = nil
	if s.filling > 0 {
		// Reservations may still be filling their pages from a socket:
		// the last to end unmaps the tier (reserve.go).
		s.arenaAfterFills, s.arena = s.arena, nil
		return nil
	}
	err := s.arena.Close()
	s.arena = nil
	return err
}

// Stats returns counters and sizes.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	st := Stats{Keys: len(s.index), MemKeys: s.small.Len() + s.main.Len(), DiskCap: s.disk.Cap(), DiskUsed: s.disk.Used(),
		MemCap: s.arena.Cap(), MemUsed: s.arena.Used()}
	if s.arena != nil {
		st.SmallTarget, st.SmallUsed = s.smallTarget, s.smallBytes
		st.Policy, st.PolicySwitches = "s3fifo", s.duel.switches
		if s.lruMode() {
			st.Policy = "lru"
		}
	}
	st.MemKeys += s.pinned.Len()
	st.PinnedKeys, st.PinnedMem, st.PinnedDisk = s.nPinned, s.pinnedMem, s.pinnedDisk
	st.PinQuotaMem, st.PinQuotaDisk, st.ExpiringKeys = s.pinQuotaMem, s.pinQuotaDisk, len(s.expiring)
	s.mu.Unlock()
	st.MemHits, st.DiskHits, st.Misses = s.memHits.Load(), s.diskHits.Load(), s.misses.Load()
	st.Puts, st.Existed, st.ReservedPuts = s.puts.Load(), s.existed.Load(), s.reservedPuts.Load()
	st.Demotions, st.Promotions, st.Evictions, st.Corrupt = s.demotions.Load(), s.promotions.Load(), s.evictions.Load(), s.corruptRecs.Load()
	st.Expired = s.expired.Load()
	return st
}

// CheckKey validates a key.
func CheckKey(key []byte) error {
	if len(key) == 0 {
		return errs.New(errs.ErrBadRequest, "empty key")
	}
	if len(key) > MaxKey {
		return errs.New(errs.ErrTooLarge, "key of %d bytes: the limit is %d", len(key), MaxKey)
	}
	return nil
}

// checkPut refuses a put's bad key or a value over the limit.
func (s *Store) checkPut(key []byte, size int64) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	if size < 0 || size > s.cfg.MaxValue {
		return errs.New(errs.ErrTooLarge, "value of %d bytes: the limit is %d (server --kv-max-value)", size, s.cfg.MaxValue)
	}
	return nil
}

func pagesFor(n int64) int { return int((n + PageSize - 1) / PageSize) }

// Put stores value under key. Without overwrite an existing key is left as
// it is and Put reports existed=true.
func (s *Store) Put(key []byte, value []byte, overwrite bool) (existed bool, err error) {
	return s.PutChecked(key, value, crc32.Checksum(value, crc32c.Table), overwrite)
}

// PutChecked is Put for a value whose CRC32C the caller already verified
// (the server has it from the frame), saving a pass over the bytes.
func (s *Store) PutChecked(key []byte, value []byte, crc uint32, overwrite bool) (existed bool, err error) {
	if err := s.checkPut(key, int64(len(value))); err != nil {
		return false, err
	}
	s.mu.Lock()
	if old := s.liveLocked(key); old != nil && !overwrite {
		s.touchLocked(old, false) // a put of a block it has says a request uses it
		s.unlockAndWrite()
		s.existed.Add(1)
		return true, nil
	}
	k := string(key)
	e := &entry{key: k, fp: s.fingerprint(k), size: int64(len(value)), crc: crc}
	ok, err := s.allocLocked(e) // false without a DRAM tier
	s.unlockAndWrite()          // the demotions that made room
	if err != nil {
		return false, err
	}
	if ok {
		// Copy outside the lock: the entry is not visible yet.
		s.arena.CopyIn(e.pages, 0, value)
	}
	s.mu.Lock()
	return s.insertLocked(key, e, ok, value, overwrite)
}

// insertLocked makes e, whose bytes are in its DRAM pages (inDRAM) or in
// value, key's block; without overwrite a block already there wins and e
// is freed. It is called with mu held and returns with it released.
func (s *Store) insertLocked(key []byte, e *entry, inDRAM bool, value []byte, overwrite bool) (existed bool, err error) {
	ok := inDRAM
	if old := s.liveLocked(key); old != nil {
		if !overwrite { // another put won the race
			s.touchLocked(old, false)
			s.freeLocked(e)
			s.mu.Unlock()
			s.existed.Add(1)
			return true, nil
		}
		// deleteLocked writes a tombstone if the old value is on disk, so a
		// restart can never bring the old bytes back.
		if err := s.deleteLocked(old); err != nil {
			s.freeLocked(e)
			s.unlockAndWrite()
			return false, err
		}
	}
	var w *write
	if !ok {
		// No room in DRAM (or no DRAM tier): straight to disk. The block is
		// indexed now (a second put of the key sees it) and readable once
		// its bytes are written.
		if s.disk == nil {
			s.unlockAndWrite()
			return false, errs.New(errs.ErrNoSpace, "KV DRAM tier full (%d bytes) and every block is in use, no disk tier: retry, or give the server more --mem or a --disk", s.cfg.MemBytes)
		}
		if w, err = s.reserveLocked(e.key, e.size, e.crc, false); err != nil {
			s.unlockAndWrite()
			return false, err
		}
		w.e, w.val = e, value
		e.pend = w
	} else if s.ghostHitLocked(e.fp, e.size) || s.lruMode() {
		// Seen recently and demoted: it belongs in main. (In LRU mode every
		// new block does.)
		s.enqueueLocked(e, &s.main)
	} else {
		s.enqueueLocked(e, &s.small)
	}
	s.index[e.key] = e
	s.duelAccessLocked(e.fp, e.size, true)
	s.puts.Add(1)
	s.unlockAndWrite()
	if w != nil && w.err != nil {
		return false, w.err
	}
	return false, nil
}

// allocLocked gives e DRAM pages, demoting per S3-FIFO to make room.
// It returns false (no error) when e cannot be placed in DRAM.
//
// For a block already indexed (a disk block brought into DRAM: promote,
// Prefetch, loadIntoDRAM) it also returns false when making room dropped
// it: a demotion may evict the oldest disk segment, which may hold e. Out
// of the index nothing deletes or replaces e any more, so in DRAM it would
// later be demoted (or flushed) again, writing its old bytes to disk after
// whatever replaced it, for a restart to bring back.
func (s *Store) allocLocked(e *entry) (bool, error) {
	n := pagesFor(e.size)
	if n > s.arena.Pages()/2 || s.arena == nil { // a block bigger than half of DRAM goes to disk
		return false, nil
	}
	indexed := s.index[e.key] == e
	for s.arena.FreePages() < n {
		if !s.evictOneLocked() || indexed && s.index[e.key] != e {
			return false, nil
		}
	}
	ps, ok := s.arena.Alloc(n)
	e.pages = ps
	return ok, nil
}

func (s *Store) enqueueLocked(e *entry, q *list.List) {
	e.q = q
	e.elem = q.PushFront(e)
	if q == &s.small {
		s.smallBytes += e.size
	}
	if q != &s.pinned {
		s.prioCount[prioIndex(e.prio)]++
	}
}

func (s *Store) dequeueLocked(e *entry) {
	if e.q == nil {
		return
	}
	if e.q == &s.small {
		s.smallBytes -= e.size
	}
	if e.q != &s.pinned {
		s.prioCount[prioIndex(e.prio)]--
	}
	e.q.Remove(e.elem)
	e.q, e.elem = nil, nil
}

// evictOneLocked frees DRAM by one S3-FIFO or LRU step. It returns false
// when nothing can go (everything pinned).
func (s *Store) evictOneLocked() bool {
	// Each pass over main lowers every frequency by one (at most 3, also
	// after LRU mode raised them): four passes reach a block that can go.
	// Blocks of a priority above the lowest in DRAM are passed over
	// (retain.go): once more per pass, hence five.
	low := s.lowestPrioLocked()
	for tries := 5*(s.small.Len()+s.main.Len()) + 1; tries > 0; tries-- {
		fromSmall := s.small.Len() > 0 && (s.lruMode() || s.smallBytes >= s.smallTarget || s.main.Len() == 0)
		q := &s.main
		if fromSmall {
			q = &s.small
		}
		el := q.Back()
		if el == nil {
			return false
		}
		e := el.Value.(*entry)
		s.dequeueLocked(e)
		switch {
		case e.pins > 0 && s.lruMode():
			s.enqueueLocked(e, &s.main) // in use: the most recently used
		case e.pins > 0:
			s.enqueueLocked(e, q) // in use: look at the next one
		case e.prio > low:
			s.enqueueLocked(e, &s.main) // lower priorities go first
		case s.lruMode():
			// LRU: the least recently used goes, read or not.
			s.demoteLocked(e, fromSmall)
			return true
		case fromSmall && e.freq > 0:
			e.freq = 0
			s.enqueueLocked(e, &s.main)
		case !fromSmall && e.freq > 0:
			e.freq--
			s.enqueueLocked(e, &s.main)
		default:
			s.demoteLocked(e, fromSmall)
			return true
		}
	}
	return false
}

// demoteLocked frees e's pages, queueing a copy of its bytes for the disk
// tier if it has none there yet (the write happens after the lock is
// released; Gets meanwhile read the copy). Without a disk tier the block is
// dropped.
func (s *Store) demoteLocked(e *entry, fromSmall bool) {
	s.addGhostLocked(e.fp, fromSmall)
	if e.seg == nil && e.pend == nil && s.disk != nil {
		if w, err := s.reserveLocked(e.key, e.size, e.crc, false); err != nil {
			s.log.Warn("kv demotion to disk failed; dropping block", "err", err)
		} else {
			bp := bufpool.Get(int(e.size))
			s.arena.CopyOut(*bp, e.pages, 0)
			w.e, w.val, w.pooled, w.readable = e, *bp, bp, true
			e.pend = w
		}
	}
	s.arena.Release(e.pages)
	e.pages = nil
	if e.seg == nil && e.pend == nil {
		s.dropRetentionLocked(e)
		delete(s.index, e.key)
		s.evictions.Add(1)
	}
}

// freeLocked releases e's storage (e is not, or no longer, indexed).
func (s *Store) freeLocked(e *entry) {
	e.dead = true
	s.dequeueLocked(e)
	if e.pages != nil && e.pins == 0 {
		s.arena.Release(e.pages)
		e.pages = nil
	}
}

func (s *Store) removeLocked(e *entry) {
	delete(s.index, e.key)
	s.dropRetentionLocked(e)
	s.freeLocked(e)
	if e.seg != nil {
		e.seg.live -= e.size
		e.seg = nil
	}
}

// Get calls fn with views of key's bytes (valid only during fn) and their
// CRC32C, recorded at put time, so the bytes can be sent without another
// pass over them. It returns errs.ErrNotFound on a miss, and the tier that
// served it.
func (s *Store) Get(key []byte, fn func(bufs [][]byte, crc uint32) error) (Tier, error) {
	s.mu.Lock()
	e := s.liveLocked(key)
	for e != nil && e.pages == nil && e.seg == nil && e.pend != nil && !e.pend.readable {
		// Put straight to disk and still being written: wait for it.
		done := e.pend.done
		s.mu.Unlock()
		<-done
		s.mu.Lock()
		e = s.liveLocked(key)
	}
	if e == nil {
		s.unlockAndWrite()
		s.misses.Add(1)
		return TierNone, errs.New(errs.ErrNotFound, "no block %q", trimKey(key))
	}
	if e.pages != nil {
		e.pins++
		s.touchLocked(e, true)
		v := s.arena.Views(e.pages, 0, e.size)
		s.mu.Unlock()
		s.memHits.Add(1)
		err := fn(v, e.crc)
		s.unpin(e)
		return TierDRAM, err
	}
	if e.seg == nil {
		// Demoted, its bytes on the way to disk: serve the copy being
		// written. It counts as a disk hit: the block has left DRAM.
		s.duelAccessLocked(e.fp, e.size, true)
		w := e.pend
		w.readers++
		v := w.val[:e.size:e.size]
		e.diskRead = true
		s.mu.Unlock()
		defer s.releasePending(w)
		s.diskHits.Add(1)
		return TierDisk, fn([][]byte{v}, e.crc)
	}
	seg, off := e.seg, e.off
	seg.refs++
	e.diskRead = true
	s.duelAccessLocked(e.fp, e.size, true)
	promote := s.ghosts.has(e.fp)
	s.mu.Unlock()
	defer s.unref(seg)

	bp, val, err := seg.readRecord(off, key, e.size, e.crc)
	if err != nil {
		s.corruptRecs.Add(1)
		s.misses.Add(1)
		s.log.Warn("dropping damaged KV record", "segment", seg.path, "offset", off, "err", err)
		s.mu.Lock()
		if s.index[e.key] == e && e.seg == seg {
			// A tombstone, as for any block on disk: a copy on its way to
			// another segment must not come back after a restart.
			if err := s.deleteLocked(e); err != nil {
				s.log.Warn("no tombstone for a damaged KV record", "err", err)
			}
		}
		s.unlockAndWrite()
		return TierNone, errs.New(errs.ErrNotFound, "block %q failed its checksum on disk and was dropped", trimKey(key))
	}
	defer bufpool.Put(bp)
	s.diskHits.Add(1)
	if promote && s.arena != nil {
		s.promote(e, val)
	}
	return TierDisk, fn([][]byte{val}, e.crc)
}

// promote copies a disk block back into DRAM's main queue (a ghost hit).
func (s *Store) promote(e *entry, val []byte) {
	s.mu.Lock()
	defer s.unlockAndWrite()
	if s.index[e.key] != e || e.pages != nil {
		return
	}
	if ok, _ := s.allocLocked(e); !ok {
		return
	}
	s.arena.CopyIn(e.pages, 0, val)
	s.ghostHitLocked(e.fp, e.size)
	s.enqueueLocked(e, &s.main)
	s.promotions.Add(1)
}

func (s *Store) unpin(e *entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e.pins--
	if e.pins == 0 && e.dead && e.pages != nil {
		s.arena.Release(e.pages)
		e.pages = nil
	}
}

func trimKey(k []byte) string {
	if len(k) > 64 {
		return string(k[:64]) + "…"
	}
	return string(k)
}

// Exists reports the tier and size of key without counting a read or pinning.
func (s *Store) Exists(key []byte) (Tier, int64) {
	s.mu.Lock()
	defer s.unlockAndWrite()
	e := s.liveLocked(key)
	switch {
	case e == nil:
		return TierNone, 0
	case e.pages != nil:
		return TierDRAM, e.size
	default:
		return TierDisk, e.size
	}
}

// Delete removes key; a tombstone on disk keeps it deleted across restarts.
func (s *Store) Delete(key []byte) (bool, error) {
	s.mu.Lock()
	defer s.unlockAndWrite()
	e := s.liveLocked(key)
	if e == nil {
		return false, nil
	}
	return true, s.deleteLocked(e)
}

func (s *Store) deleteLocked(e *entry) error {
	// A block whose bytes are on the way to disk counts as on disk: its
	// record may land after this returns, and only a tombstone reserved
	// after it keeps a restart from loading it.
	onDisk := e.seg != nil || e.pend != nil
	s.removeLocked(e)
	if onDisk {
		_, err := s.reserveLocked(e.key, 0, 0, true)
		return err
	}
	return nil
}

// DeleteByPrefix removes every key starting with prefix and returns how many.
func (s *Store) DeleteByPrefix(prefix []byte) (int, error) {
	s.mu.Lock()
	defer s.unlockAndWrite()
	n := 0
	for k, e := range s.index {
		if strings.HasPrefix(k, string(prefix)) {
			live := !s.expiredLocked(e)
			if err := s.deleteLocked(e); err != nil {
				return n, err
			}
			if live {
				n++
			}
		}
	}
	return n, nil
}

// Prefaulted is closed once Config.Prefault's work has ended (at once
// without it).
func (s *Store) Prefaulted() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.arena.Prefaulted()
}
