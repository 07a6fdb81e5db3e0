package kvstore

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/bufpool"
	"github.com/gd2fs/gd2fs/internal/crc32c"
	"github.com/gd2fs/gd2fs/internal/tier"
)

// ---- disk tier ----
//
// A segment file is a sequence of records:
//
//	0  u32 magic "GDKV"   4 u8 flags (1 = tombstone)   5 u8 version
//	6  u16 key length      8 u32 value length           12 u32 value CRC32C
//	16 u32 CRC32C of bytes 0..15 and the key            20 u32 reserved
//	24 key, then value
//
// Records are appended; a later record for a key replaces an earlier one.

const (
	recHeader  = 24
	recMagic   = 0x564b4447 // "GDKV"
	recVersion = 1
	flagTomb   = 1
)

type segment struct {
	id     uint64
	path   string
	f      tier.File
	size   int64 // bytes appended
	charge int64 // the index RAM its records cost (indexCharge), counted with size against DiskBytes
	live   int64 // value bytes of live entries
	keys   []string
	refs   int
	gone   bool
	// sealed: the start-up scan skipped damaged bytes in it, so nothing
	// is appended to it. A header skipped because its record ran past the
	// end of the file would, once the file grew, read as a whole record to
	// the next scan, which would take it and jump over the records after
	// it, bringing older values back (TestNoAppendAfterSkippedBytes).
	sealed bool
}

func encodeHeader(h []byte, key string, vlen int64, vcrc uint32, tomb bool) {
	le := binary.LittleEndian
	le.PutUint32(h[0:], recMagic)
	h[4] = 0
	if tomb {
		h[4] = flagTomb
	}
	h[5] = recVersion
	le.PutUint16(h[6:], uint16(len(key)))
	le.PutUint32(h[8:], uint32(vlen))
	le.PutUint32(h[12:], vcrc)
	c := crc32.Update(crc32.Checksum(h[:16], crc32c.Table), crc32c.Table, []byte(key))
	le.PutUint32(h[16:], c)
	le.PutUint32(h[20:], 0)
}

// activeLocked returns the segment to append need bytes to, starting a new one when full.
func (s *Store) activeLocked(need int64) (*segment, error) {
	if n := len(s.segs); n > 0 && !s.segs[n-1].sealed && s.segs[n-1].size+need <= s.cfg.SegmentSize {
		return s.segs[n-1], nil
	}
	g, err := s.openSegment(s.nextSeg, true)
	if err != nil {
		s.log.Error("open KV segment", "err", err)
		return nil, errs.New(errs.ErrInternal, "kvstore: cannot open a segment in %s: %w", s.cfg.Dir, err)
	}
	s.nextSeg++
	s.segs = append(s.segs, g)
	return g, nil
}

func (s *Store) openSegment(id uint64, create bool) (*segment, error) {
	p := filepath.Join(s.cfg.Dir, fmt.Sprintf("seg-%016x.kv", id))
	flag := os.O_RDWR
	if create {
		flag |= os.O_CREATE | os.O_EXCL
	}
	f, err := s.disk.FS().OpenFile(p, flag, 0o600)
	if err != nil {
		return nil, err
	}
	return &segment{id: id, path: p, f: f}, nil
}

// evictSegmentLocked drops the oldest segment, first reserving room at the
// head for blocks read since they were written there (up to half a
// segment): they are copied after the lock is released (write.go), and read
// from the old segment until then. It returns false when only the active
// segment is left.
func (s *Store) evictSegmentLocked() bool {
	if len(s.segs) < 2 {
		return false
	}
	old := s.segs[0]
	s.segs = s.segs[1:]
	s.disk.Add(-(old.size + old.charge))
	old.gone = true
	old.refs++ // held while the moves below are reserved
	s.dropSegmentFile(old)
	budget := s.cfg.SegmentSize / 2
	for _, k := range old.keys {
		e := s.index[k]
		if e == nil || e.seg != old || e.pend != nil {
			continue // gone, elsewhere, or already moving (a key listed twice)
		}
		// A block pinned on disk moves whatever the budget (pins hold at
		// most half the tier, retain.go); a block read since, or of a
		// priority above the default, within the budget.
		keep := e.pin == TierDisk && e.pages == nil
		if (keep || ((e.diskRead || e.prio > 0) && e.size <= budget)) && !s.expiredLocked(e) {
			if w, err := s.reserveLocked(e.key, e.size, e.crc, false); err == nil {
				if !keep {
					budget -= e.size
				}
				w.e, w.from, w.fromOff = e, old, e.off
				old.refs++
				e.pend = w
				continue
			} else if keep {
				s.log.Warn("a block pinned on disk could not be moved out of an evicted segment; dropping it", "key", trimKey([]byte(e.key)), "err", err)
			}
		}
		e.seg = nil
		if e.pages == nil {
			s.dropRetentionLocked(e)
			delete(s.index, k)
			s.evictions.Add(1)
		}
	}
	s.unrefLocked(old)
	return true
}

func (s *Store) unref(g *segment) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unrefLocked(g)
}

// readRecord reads the whole record at off with one pread into a pooled
// buffer (the caller returns it with bufpool.Put) and checks the header, the
// key and the value CRC. val is the value within the buffer.
func (g *segment) readRecord(off int64, key []byte, size int64, want uint32) (buf *[]byte, val []byte, err error) {
	kl := int64(len(key))
	buf, err = tier.ReadPooled(g.f, off, int(recHeader+kl+size))
	if err != nil {
		return nil, nil, err // a torn tail (tier.ErrShort) is a miss too
	}
	b := *buf
	h, kb := b[:recHeader], b[recHeader:recHeader+kl]
	val = b[recHeader+kl:]
	le := binary.LittleEndian
	if le.Uint32(h[0:]) != recMagic || le.Uint32(h[16:]) != crc32.Update(crc32.Checksum(h[:16], crc32c.Table), crc32c.Table, kb) ||
		string(kb) != string(key) || int64(le.Uint32(h[8:])) != size {
		bufpool.Put(buf)
		return nil, nil, fmt.Errorf("record header damaged")
	}
	if crc32.Checksum(val, crc32c.Table) != want || le.Uint32(h[12:]) != want {
		bufpool.Put(buf)
		return nil, nil, fmt.Errorf("value checksum mismatch")
	}
	return buf, val, nil
}

// load scans segments oldest first; a record whose header fails is skipped
// up to the next valid one (scan), and a torn tail is cut off.
func (s *Store) load() error {
	fs := s.disk.FS()
	if err := fs.MkdirAll(s.cfg.Dir, 0o700); err != nil {
		return fmt.Errorf("kvstore: create %s: %w", s.cfg.Dir, err)
	}
	es, err := fs.ReadDir(s.cfg.Dir)
	if err != nil {
		return fmt.Errorf("kvstore: list %s: %w", s.cfg.Dir, err)
	}
	for _, e := range es { // sorted: oldest segment first
		n := filepath.Join(s.cfg.Dir, e.Name)
		var id uint64
		if e.IsDir || !strings.HasPrefix(e.Name, "seg-") || !strings.HasSuffix(e.Name, ".kv") {
			continue
		}
		if _, err := fmt.Sscanf(e.Name, "seg-%016x.kv", &id); err != nil {
			continue
		}
		g, err := s.openSegment(id, false)
		if err != nil {
			return fmt.Errorf("kvstore: open %s: %w", n, err)
		}
		size, err := g.f.Size()
		if err != nil {
			return err
		}
		s.scan(g, size)
		for _, k := range g.keys {
			g.charge += indexCharge(k)
		}
		s.segs = append(s.segs, g)
		s.disk.Add(g.size + g.charge)
		s.nextSeg = id + 1
	}
	return nil
}

func (s *Store) scan(g *segment, fileSize int64) {
	le := binary.LittleEndian
	var h [recHeader]byte
	kb := make([]byte, MaxKey)
	// record parses the record at off; ok=false when it is not a valid one.
	record := func(off int64) (klen, vlen int64, ok bool) {
		if off+recHeader > fileSize {
			return 0, 0, false
		}
		if _, err := g.f.ReadAt(h[:], off); err != nil {
			return 0, 0, false
		}
		klen, vlen = int64(le.Uint16(h[6:])), int64(le.Uint32(h[8:]))
		if le.Uint32(h[0:]) != recMagic || klen == 0 || klen > MaxKey || off+recHeader+klen+vlen > fileSize {
			return 0, 0, false
		}
		if _, err := g.f.ReadAt(kb[:klen], off+recHeader); err != nil {
			return 0, 0, false
		}
		if le.Uint32(h[16:]) != crc32.Update(crc32.Checksum(h[:16], crc32c.Table), crc32c.Table, kb[:klen]) {
			return 0, 0, false
		}
		return klen, vlen, true
	}
	off, end := int64(0), int64(0)
	for off+recHeader <= fileSize {
		klen, vlen, ok := record(off)
		if !ok {
			// A damaged header: look for the next record, so one bad byte
			// costs one block, not the rest of the segment.
			next := s.resync(g, off+1, fileSize, record)
			if next < 0 {
				break
			}
			s.corruptRecs.Add(1)
			s.log.Warn("skipping a damaged KV record", "segment", g.path, "offset", off, "next", next)
			g.sealed = true
			off = next
			continue
		}
		key := string(kb[:klen])
		if old := s.index[key]; old != nil {
			old.seg.live -= old.size
			delete(s.index, key)
		}
		if h[4]&flagTomb == 0 {
			e := &entry{key: key, fp: s.fingerprint(key), size: vlen, crc: le.Uint32(h[12:]), seg: g, off: off}
			s.index[key] = e
			g.live += vlen
			g.keys = append(g.keys, key)
		} else {
			vlen = 0
		}
		off += recHeader + klen + vlen
		end = off
	}
	if end < fileSize {
		s.log.Warn("KV segment ends in a torn record; cutting it off", "segment", g.path, "offset", end, "size", fileSize)
		if err := g.f.Truncate(end); err != nil {
			// Its torn bytes stay after end: appends would overwrite
			// them in part only where a write fails (see sealed).
			s.log.Warn("cannot cut a KV segment's torn tail; appending to a new segment", "segment", g.path, "err", err)
			g.sealed = true
		}
	}
	g.size = end
}

// resync finds the first valid record at or after from, or returns -1.
func (s *Store) resync(g *segment, from, fileSize int64, valid func(int64) (int64, int64, bool)) int64 {
	var magic [4]byte
	binary.LittleEndian.PutUint32(magic[:], recMagic)
	buf := make([]byte, 1<<20)
	for pos := from; pos < fileSize; pos += int64(len(buf)) - 3 {
		n, _ := g.f.ReadAt(buf, pos)
		if n < 4 {
			return -1
		}
		for i := 0; i+4 <= n; {
			j := bytes.Index(buf[i:n], magic[:])
			if j < 0 {
				break
			}
			if _, _, ok := valid(pos + int64(i+j)); ok {
				return pos + int64(i+j)
			}
			i += j + 1
		}
	}
	return -1
}
