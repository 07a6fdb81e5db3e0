package kvstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/bufpool"
	"github.com/gd2fs/gd2fs/internal/crc32c"
	"github.com/gd2fs/gd2fs/internal/limits"
	"github.com/gd2fs/gd2fs/internal/tier"
)

// This file holds what keeps a block beside its use (issue 23 item 4):
//
//   - A pin in DRAM takes the block out of the eviction queues (s.pinned):
//     it stays in DRAM until unpinned, deleted or replaced. A pin on disk
//     keeps the block in the store: its DRAM copy may leave as any other,
//     but when the oldest segment goes, the block is moved to the head
//     whatever the move budget. Pins are bounded per tier by Config.PinQuota
//     and never more than half a tier, so a put always finds room: a pin
//     beyond the quota is refused with errs.ErrNoSpace, never a put.
//   - A TTL: past Expires the block is gone, as after Delete (a tombstone
//     keeps it gone across a restart). Lookups drop expired blocks as they
//     meet them (as Redis does), and ExpireDue sweeps the rest.
//   - A priority from -MaxPriority to MaxPriority (0 by default): eviction
//     from DRAM passes over blocks of a priority above the lowest one in
//     DRAM, and a block above 0 is moved out of an evicted disk segment
//     within the move budget as a block read since its write is.
//
// Exists and Prefetch never change any of these. A put that replaces a
// block (overwrite) starts with none, as Redis's SET clears a TTL.
//
// A graceful stop (Flush) writes the retention of every block to
// retain.snap beside the segments; Open applies it to the blocks it loaded
// and removes the file. After a crash blocks come back without pins,
// TTLs or priorities (docs/kv-cache.md).

// MaxPriority bounds a block's priority either way.
const MaxPriority = 7

const prioLevels = 2*MaxPriority + 1

func prioIndex(p int8) int { return int(p) + MaxPriority }

// Retention is what keeps a block beside its use.
type Retention struct {
	Pin      Tier      // TierDRAM or TierDisk: pinned there; TierNone: not pinned
	Priority int8      // -MaxPriority..MaxPriority; eviction takes lower first
	Expires  time.Time // the block is gone from then on; zero: never
}

// Change says which parts of a block's retention to set.
type Change struct {
	SetPin      bool
	Pin         Tier
	SetPriority bool
	Priority    int8
	SetExpire   bool
	Expire      time.Time // zero: no expiry (PERSIST); not after now: the block goes at once
}

// check validates c before anything changes.
func (c Change) check() error {
	if c.SetPin && c.Pin > TierDisk {
		return errs.New(errs.ErrBadRequest, "pin tier %d: want none, dram or disk", c.Pin)
	}
	if c.SetPriority && (c.Priority < -MaxPriority || c.Priority > MaxPriority) {
		return errs.New(errs.ErrBadRequest, "priority %d: want -%d to %d", c.Priority, MaxPriority, MaxPriority)
	}
	return nil
}

// pinQuota is the bytes pins may hold in a tier of tierBytes: q (0: a
// quarter of the tier; negative: none), at most half the tier.
func pinQuota(q, tierBytes int64) int64 {
	switch {
	case q < 0 || tierBytes <= 0:
		return 0
	case q == 0:
		return tierBytes / 4
	}
	return min(q, tierBytes/2)
}

func (s *Store) expiredLocked(e *entry) bool {
	return e.expire != 0 && s.now().UnixNano() >= e.expire
}

// liveLocked returns key's block, dropping it first if it expired (the
// caller unlocks with unlockAndWrite: the drop may reserve a tombstone).
func (s *Store) liveLocked(key []byte) *entry {
	e := s.index[string(key)]
	if e != nil && s.expiredLocked(e) {
		s.expireLocked(e)
		return nil
	}
	return e
}

func (s *Store) expireLocked(e *entry) {
	s.expired.Add(1)
	if err := s.deleteLocked(e); err != nil {
		s.log.Warn("no tombstone for an expired KV block: a restart may bring it back", "key", trimKey([]byte(e.key)), "err", err)
	}
}

// memPinBytes is what a DRAM pin of e holds: its pages.
func memPinBytes(e *entry) int64 { return int64(pagesFor(e.size)) * PageSize }

// dropRetentionLocked forgets e's pin and TTL (e leaves the index).
func (s *Store) dropRetentionLocked(e *entry) {
	s.setPinLocked(e, TierNone)
	if e.expire != 0 {
		e.expire = 0
		delete(s.expiring, e)
	}
}

// setPinLocked moves e's pin and its accounting; a DRAM pin needs e's pages.
func (s *Store) setPinLocked(e *entry, t Tier) {
	switch e.pin {
	case TierDRAM:
		s.pinnedMem -= memPinBytes(e)
		s.nPinned--
		if e.q == &s.pinned {
			s.dequeueLocked(e)
			if !e.dead && e.pages != nil {
				s.enqueueLocked(e, &s.main)
			}
		}
	case TierDisk:
		s.pinnedDisk -= e.size
		s.nPinned--
	}
	e.pin = t
	switch t {
	case TierDRAM:
		s.pinnedMem += memPinBytes(e)
		s.nPinned++
		s.dequeueLocked(e)
		s.enqueueLocked(e, &s.pinned)
	case TierDisk:
		s.pinnedDisk += e.size
		s.nPinned++
	}
}

// lowestPrioLocked is the lowest priority of a block in small or main.
func (s *Store) lowestPrioLocked() int8 {
	for i, n := range s.prioCount {
		if n > 0 {
			return int8(i - MaxPriority)
		}
	}
	return MaxPriority
}

// Retention returns key's retention, or false when it is not stored.
func (s *Store) Retention(key []byte) (Retention, bool) {
	s.mu.Lock()
	defer s.unlockAndWrite()
	e := s.liveLocked(key)
	if e == nil {
		return Retention{}, false
	}
	return s.retentionLocked(e), true
}

func (s *Store) retentionLocked(e *entry) Retention {
	r := Retention{Pin: e.pin, Priority: e.prio}
	if e.expire != 0 {
		r.Expires = time.Unix(0, e.expire)
	}
	return r
}

// Retain changes key's retention and returns it. A missing key is
// errs.ErrNotFound; a pin beyond the tier's quota errs.ErrNoSpace, and
// nothing of c is applied then. An expiry not after now deletes the block
// (Redis's EXPIRE with a time in the past) and returns its Expires.
func (s *Store) Retain(key []byte, c Change) (Retention, error) {
	if err := c.check(); err != nil {
		return Retention{}, err
	}
	if c.SetPin && c.Pin == TierDRAM && s.arena == nil {
		return Retention{}, errs.New(errs.ErrBadRequest, "no KV DRAM tier to pin in: pin on disk, or start the server with --kv-mem")
	}
	if c.SetPin && c.Pin == TierDisk && s.cfg.Dir == "" {
		return Retention{}, errs.New(errs.ErrBadRequest, "no KV disk tier to pin on: pin in dram, or start the server with --kv-disk")
	}
	for attempt := 0; ; attempt++ {
		s.mu.Lock()
		e := s.liveLocked(key)
		if e == nil || s.closed {
			s.unlockAndWrite()
			return Retention{}, errs.New(errs.ErrNotFound, "no block %q", trimKey(key))
		}
		if c.SetPin && c.Pin == TierDRAM && e.pin != TierDRAM {
			if n := memPinBytes(e); s.pinnedMem+n > s.pinQuotaMem {
				err := errs.New(errs.ErrNoSpace, "KV DRAM pin quota full: %d of %d bytes pinned, this block needs %d: unpin blocks, or start the server with a larger --kv-pin-quota (at most half of --kv-mem)", s.pinnedMem, s.pinQuotaMem, n)
				s.unlockAndWrite()
				return Retention{}, err
			}
			if e.pages == nil {
				// Bring it into DRAM first, outside the lock, then start over.
				s.mu.Unlock()
				if err := s.loadIntoDRAM(e, attempt); err != nil {
					return Retention{}, err
				}
				continue
			}
		}
		if c.SetPin && c.Pin == TierDisk && e.pin != TierDisk {
			if s.pinnedDisk+e.size > s.pinQuotaDisk {
				err := errs.New(errs.ErrNoSpace, "KV disk pin quota full: %d of %d bytes pinned, this block needs %d: unpin blocks, or start the server with a larger --kv-pin-quota (at most half of --kv-disk)", s.pinnedDisk, s.pinQuotaDisk, e.size)
				s.unlockAndWrite()
				return Retention{}, err
			}
		}
		if c.SetExpire && !c.Expire.IsZero() && !c.Expire.After(s.now()) {
			s.expireLocked(e)
			s.unlockAndWrite()
			return Retention{Expires: c.Expire}, nil
		}
		if c.SetPin && c.Pin != e.pin {
			s.setPinLocked(e, c.Pin)
		}
		if c.SetPriority && c.Priority != e.prio {
			if e.q == &s.small || e.q == &s.main {
				s.prioCount[prioIndex(e.prio)]--
				s.prioCount[prioIndex(c.Priority)]++
			}
			e.prio = c.Priority
		}
		if c.SetExpire {
			if c.Expire.IsZero() {
				e.expire = 0
				delete(s.expiring, e)
			} else {
				e.expire = limits.ClampExpiry(c.Expire, s.now()).UnixNano()
				s.expiring[e] = struct{}{}
			}
		}
		r := s.retentionLocked(e)
		s.unlockAndWrite()
		return r, nil
	}
}

// loadIntoDRAM copies e, found only on disk (or on its way there), into
// DRAM's main queue, so a DRAM pin can take it.
func (s *Store) loadIntoDRAM(e *entry, attempt int) error {
	if attempt >= 3 {
		return errs.New(errs.ErrUnavailable, "block %q keeps changing while it is pinned: retry", trimKey([]byte(e.key)))
	}
	s.mu.Lock()
	if s.index[e.key] != e || e.pages != nil {
		s.mu.Unlock()
		return nil // replaced or loaded meanwhile: the caller starts over
	}
	var val []byte
	switch {
	case e.seg != nil:
		seg, off := e.seg, e.off
		seg.refs++
		s.mu.Unlock()
		bp, v, err := seg.readRecord(off, []byte(e.key), e.size, e.crc)
		s.unref(seg)
		if err != nil {
			return errs.New(errs.ErrUnavailable, "block %q could not be read from disk to pin it (%v): retry; a damaged block is dropped by the next read", trimKey([]byte(e.key)), err)
		}
		defer bufpool.Put(bp)
		val = v
		s.mu.Lock()
	case e.pend != nil && e.pend.readable:
		val = e.pend.val[:e.size:e.size] // held until published, under s.mu
	case e.pend != nil:
		done := e.pend.done
		s.mu.Unlock()
		<-done
		return nil
	}
	defer s.unlockAndWrite()
	if s.index[e.key] != e || e.pages != nil || e.dead {
		return nil
	}
	if ok, _ := s.allocLocked(e); !ok {
		if s.index[e.key] != e {
			// Making room evicted the block's own segment (allocLocked):
			// it is gone, and Retain, starting over, says so.
			return nil
		}
		return errs.New(errs.ErrNoSpace, "no room in KV DRAM to pin block %q (blocks in use): retry", trimKey([]byte(e.key)))
	}
	s.arena.CopyIn(e.pages, 0, val)
	s.enqueueLocked(e, &s.main)
	s.promotions.Add(1)
	return nil
}

// RetainPrefix applies c to every block whose key starts with prefix and
// returns how many changed. It stops at the first failure (a full pin
// quota), with the blocks before it changed.
func (s *Store) RetainPrefix(prefix []byte, c Change) (int, error) {
	if err := c.check(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	var keys []string
	for k, e := range s.index {
		if strings.HasPrefix(k, string(prefix)) && !s.expiredLocked(e) {
			keys = append(keys, k)
		}
	}
	s.mu.Unlock()
	n := 0
	for _, k := range keys {
		_, err := s.Retain([]byte(k), c)
		switch {
		case errors.Is(err, errs.ErrNotFound):
		case err != nil:
			return n, err
		default:
			n++
		}
	}
	return n, nil
}

// ExpireDue drops up to limit blocks whose TTL has passed, looking at no
// more than 20×limit blocks with a TTL (Redis's active expiry samples
// too): expired blocks nobody asks for leave without a full walk.
func (s *Store) ExpireDue(limit int) int {
	s.mu.Lock()
	defer s.unlockAndWrite()
	n, looked := 0, 0
	for e := range s.expiring {
		if n >= limit || looked >= 20*limit {
			break
		}
		looked++
		if s.expiredLocked(e) {
			s.expireLocked(e)
			n++
		}
	}
	return n
}

// ---- retain.snap: retention across a graceful restart ----
//
//	"GDRT" u8 version 1, then per block: u16 key length, key, u8 pin tier,
//	i8 priority, i64 expiry (unix ns, 0 none); then u32 CRC32C of all before.

const (
	snapName    = "retain.snap"
	snapMagic   = "GDRT"
	snapVersion = 1
)

type snapRec struct {
	key    string
	pin    Tier
	prio   int8
	expire int64
}

func encodeSnap(recs []snapRec) []byte {
	b := append([]byte(snapMagic), snapVersion)
	le := binary.LittleEndian
	for _, r := range recs {
		b = le.AppendUint16(b, uint16(len(r.key)))
		b = append(b, r.key...)
		b = append(b, byte(r.pin), byte(r.prio))
		b = le.AppendUint64(b, uint64(r.expire))
	}
	return le.AppendUint32(b, crc32.Checksum(b, crc32c.Table))
}

// parseSnap decodes retain.snap, checking its checksum and every length
// and value before use.
func parseSnap(b []byte) ([]snapRec, error) {
	le := binary.LittleEndian
	if len(b) < len(snapMagic)+1+4 || string(b[:4]) != snapMagic {
		return nil, fmt.Errorf("not a retention snapshot")
	}
	if b[4] != snapVersion {
		return nil, fmt.Errorf("retention snapshot version %d, want %d", b[4], snapVersion)
	}
	body := b[:len(b)-4]
	if crc32.Checksum(body, crc32c.Table) != le.Uint32(b[len(b)-4:]) {
		return nil, fmt.Errorf("retention snapshot checksum mismatch")
	}
	var recs []snapRec
	for p := body[5:]; len(p) > 0; {
		if len(p) < 2 {
			return nil, fmt.Errorf("truncated record")
		}
		kl := int(le.Uint16(p))
		if kl == 0 || kl > MaxKey || len(p) < 2+kl+10 {
			return nil, fmt.Errorf("record with a key of %d bytes in %d", kl, len(p))
		}
		r := snapRec{key: string(p[2 : 2+kl]), pin: Tier(p[2+kl]), prio: int8(p[3+kl]), expire: int64(le.Uint64(p[4+kl:]))}
		if r.pin > TierDisk || r.prio < -MaxPriority || r.prio > MaxPriority || r.expire < 0 {
			return nil, fmt.Errorf("record of %q out of range", trimKey([]byte(r.key)))
		}
		recs = append(recs, r)
		p = p[2+kl+10:]
	}
	return recs, nil
}

// snapMaxBytes bounds retain.snap: one record (at most 12+MaxKey bytes)
// per block the tiers can hold, each block costing at least a record
// header and an index entry on disk, or a page in DRAM.
func (s *Store) snapMaxBytes() int64 {
	blocks := s.disk.Cap()/(recHeader+entryRAM) + s.arena.Cap()/PageSize
	return int64(len(snapMagic)+1+4) + blocks*(12+MaxKey)
}

// saveRetention writes the retention of every block that has one to
// retain.snap (Flush: a graceful stop).
func (s *Store) saveRetention() error {
	s.mu.Lock()
	var recs []snapRec
	for _, e := range s.index {
		if e.pin != TierNone || e.prio != 0 || e.expire != 0 {
			recs = append(recs, snapRec{e.key, e.pin, e.prio, e.expire})
		}
	}
	s.mu.Unlock()
	fs := s.disk.FS()
	p := filepath.Join(s.cfg.Dir, snapName)
	if len(recs) == 0 {
		if err := fs.Remove(p); err != nil && !os.IsNotExist(err) {
			return err
		}
		return nil
	}
	tmp := p + ".tmp"
	if err := writeFile(fs, tmp, encodeSnap(recs)); err != nil {
		return fmt.Errorf("kvstore: write %s: %w", tmp, err)
	}
	return fs.Rename(tmp, p)
}

// writeFile is os.WriteFile on fs. Nothing is synced: like the segments,
// the snapshot may be lost or torn by a power loss, and its checksum makes
// a torn one "no retention" (loadRetention).
func writeFile(fs tier.FS, name string, b []byte) error {
	f, err := fs.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(b, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// readFile is os.ReadFile on fs, bounded by max: a file larger than that
// is refused before anything is allocated for it.
func readFile(fs tier.FS, name string, max int64) ([]byte, error) {
	f, err := fs.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	n, err := f.Size()
	if err != nil {
		return nil, err
	}
	if n > max {
		return nil, fmt.Errorf("%s is %d bytes, more than the %d a snapshot of this store can take", name, n, max)
	}
	b := make([]byte, n)
	if _, err := f.ReadAt(b, 0); err != nil && !(errors.Is(err, io.EOF) && n == 0) {
		return nil, err
	}
	return b, nil
}

// loadRetention applies retain.snap to the blocks loaded and removes it,
// durably: a crash or power loss after this start must not bring back what
// was true at the last stop.
func (s *Store) loadRetention() {
	fs := s.disk.FS()
	p := filepath.Join(s.cfg.Dir, snapName)
	b, err := readFile(fs, p, s.snapMaxBytes())
	if os.IsNotExist(err) {
		return
	}
	if err == nil {
		err = fs.Remove(p)
	}
	if err == nil {
		// The removal must be durable: the store syncs nothing else, and
		// a power loss could otherwise undo it (TestRetentionSnapshotGoneAfterPowerLoss).
		err = fs.SyncDir(s.cfg.Dir)
	}
	var recs []snapRec
	if err == nil {
		recs, err = parseSnap(b)
	}
	if err != nil {
		s.log.Warn("KV retention snapshot not applied: blocks keep no pins, TTLs or priorities", "file", p, "err", err)
		return
	}
	kept := 0
	for _, r := range recs {
		// Priority and TTL first, the pin alone after: Retain refuses a
		// change whole, and a pin refused after a restart with a smaller
		// quota or without the tier must not drop the TTL too.
		c := Change{SetPriority: true, Priority: r.prio, SetExpire: true}
		if r.expire != 0 {
			c.Expire = time.Unix(0, r.expire)
		}
		if _, err := s.Retain([]byte(r.key), c); err != nil {
			if !errors.Is(err, errs.ErrNotFound) {
				s.log.Warn("KV block's retention not restored", "key", trimKey([]byte(r.key)), "err", err)
			}
			continue
		}
		kept++
		if r.pin == TierNone {
			continue
		}
		if _, err := s.Retain([]byte(r.key), Change{SetPin: true, Pin: r.pin}); err != nil && !errors.Is(err, errs.ErrNotFound) {
			s.log.Warn("KV block's pin not restored (its TTL and priority are)", "key", trimKey([]byte(r.key)), "err", err)
		}
	}
	s.log.Info("KV retention restored", "blocks", kept, "of", len(recs))
}

// Now is the store's clock (Config.Now): a relative TTL is measured from it.
func (s *Store) Now() time.Time { return s.now() }
