package kvstore

import (
	"fmt"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/bufpool"
)

// Disk writes happen outside the store lock. Under s.mu an operation only
// reserves its records: it picks the segment and offset, counts the bytes
// and queues a write; after releasing the lock it writes the queued records
// (writeOut) and then publishes them under the lock again. So a demotion, a
// compaction or a put that goes straight to disk never holds the lock while
// the kernel waits for the disk, and every other operation goes on.
//
// Reservation order is record order: a record reserved later lies later in
// the disk tier, whenever its bytes land. Restart (load) keeps the last
// record of a key, so a tombstone reserved after a value deletes it even
// when the value's bytes landed last. A crash between reservation and write
// leaves a hole that load skips (its header fails its checksum), never bytes
// of another key.
//
// While a block's bytes are on the way (entry.pend):
//   - a demoted block is read from the copy being written (pinned by its
//     readers), so it stays a hit;
//   - a block put straight to disk is not readable until its Put returns:
//     a Get waits for the write;
//   - a block moved by compaction stays readable in its old segment, whose
//     file is unlinked at eviction but kept open until the move is done;
//   - deleting or replacing it writes a tombstone, as for a block on disk.

// write is one record reserved in a segment.
type write struct {
	e        *entry // nil: a tombstone
	key      string
	size     int64
	crc      uint32
	g        *segment
	off      int64
	val      []byte   // the value to write (nil: tombstone, or read from from)
	pooled   *[]byte  // val's pooled buffer, returned once written and unread
	readable bool     // Get may serve val while it is written (a demotion)
	from     *segment // compaction: the value is read from here, at fromOff
	fromOff  int64
	readers  int           // Gets using val; guarded by s.mu
	done     chan struct{} // closed once published
	err      error
}

// reserveLocked reserves a record for key (a tombstone when tomb) at the
// head of the disk tier, evicting old segments past capacity, and queues
// it. The segment stays open until the write is published.
func (s *Store) reserveLocked(key string, size int64, crc uint32, tomb bool) (*write, error) {
	need := int64(recHeader + len(key))
	if !tomb {
		need += size
	}
	charge := indexCharge(key) // the RAM of its index entry counts too
	if need+charge > s.disk.Cap() {
		return nil, errs.New(errs.ErrNoSpace, "KV disk tier of %d bytes cannot hold a %d-byte block", s.disk.Cap(), need)
	}
	for !s.disk.Fits(need + charge) {
		if !s.evictSegmentLocked() {
			return nil, errs.New(errs.ErrNoSpace, "KV disk tier full and nothing can be evicted (blocks in use): retry, or give the server a larger --kv-disk")
		}
	}
	g, err := s.activeLocked(need)
	if err != nil {
		return nil, err
	}
	w := &write{key: key, size: size, crc: crc, g: g, off: g.size, done: make(chan struct{})}
	if tomb {
		w.size = 0
	}
	g.size += need
	g.charge += charge
	g.refs++
	s.disk.Add(need + charge)
	s.queue = append(s.queue, w)
	return w, nil
}

// unlockAndWrite releases s.mu, writes the records this operation reserved
// and publishes them. Every method that may reserve unlocks through it.
func (s *Store) unlockAndWrite() {
	ws := s.queue
	s.queue = nil
	s.mu.Unlock()
	if len(ws) == 0 {
		return
	}
	for _, w := range ws {
		w.err = s.writeOut(w)
	}
	s.mu.Lock()
	for _, w := range ws {
		s.publishLocked(w)
	}
	s.mu.Unlock()
	for _, w := range ws {
		close(w.done)
	}
}

// testWriteHook, set only by tests, sees each record before it is written;
// returning false drops the write as if the process had died before it.
var testWriteHook func(w *write) bool

// testWriteErr, set only by tests, fails every record write as a failing
// disk would.
var testWriteErr error

// writeOut writes w's record at its reserved place.
func (s *Store) writeOut(w *write) error {
	if testWriteHook != nil && !testWriteHook(w) {
		return nil
	}
	if testWriteErr != nil {
		return testWriteErr
	}
	val := w.val
	if w.from != nil {
		bp, v, err := w.from.readRecord(w.fromOff, []byte(w.key), w.size, w.crc)
		if err != nil {
			return err
		}
		defer bufpool.Put(bp)
		val = v
	}
	rec := bufpool.Get(recHeader + len(w.key))
	defer bufpool.Put(rec)
	encodeHeader(*rec, w.key, w.size, w.crc, w.e == nil)
	copy((*rec)[recHeader:], w.key)
	if _, err := w.g.f.WriteAt(*rec, w.off); err != nil {
		return fmt.Errorf("kvstore: write segment %s: %w", w.g.path, err)
	}
	if len(val) > 0 {
		if _, err := w.g.f.WriteAt(val, w.off+int64(len(*rec))); err != nil {
			return fmt.Errorf("kvstore: write segment %s: %w", w.g.path, err)
		}
	}
	return nil
}

// publishLocked makes a written record the block's disk copy, or, when the
// write failed or the block changed meanwhile, lets the record be garbage
// and drops a block left with no copy.
func (s *Store) publishLocked(w *write) {
	defer s.unrefLocked(w.g)
	if w.from != nil {
		defer s.unrefLocked(w.from)
	}
	w.val = nil
	if w.readers == 0 && w.pooled != nil {
		bufpool.Put(w.pooled)
		w.pooled = nil
	}
	e := w.e
	if e == nil {
		return // a tombstone: nothing refers to it
	}
	if e.pend == w {
		e.pend = nil
	}
	indexed := s.index[e.key] == e && !e.dead
	if !indexed {
		return
	}
	if w.err != nil && w.from == nil {
		s.log.Warn("kv write to disk failed; dropping block", "key", trimKey([]byte(e.key)), "err", w.err)
	}
	ok := w.err == nil && !w.g.gone && !s.closed
	if w.from != nil {
		ok = ok && e.seg == w.from
	} else {
		ok = ok && e.seg == nil
	}
	if ok {
		e.seg, e.off, e.diskRead = w.g, w.off, false
		w.g.live += e.size
		w.g.keys = append(w.g.keys, e.key)
		if w.readable {
			s.demotions.Add(1)
		}
		return
	}
	if w.from != nil && e.seg == w.from {
		e.seg = nil // its old segment is gone
	}
	if e.seg == nil && e.pages == nil {
		s.dropRetentionLocked(e)
		delete(s.index, e.key)
		s.evictions.Add(1)
	}
}

// unrefLocked drops a reference to g, closing it once it is gone and unused.
func (s *Store) unrefLocked(g *segment) {
	g.refs--
	if g.refs == 0 && g.gone {
		g.f.Close()
	}
}

// releasePending ends a Get's use of a demoted block's copy in flight.
func (s *Store) releasePending(w *write) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w.readers--
	if w.readers == 0 && w.val == nil && w.pooled != nil {
		bufpool.Put(w.pooled)
		w.pooled = nil
	}
}

// dropSegmentFile unlinks an evicted segment now, so a crash can never load
// it again (with blocks whose tombstones lived in younger segments, since
// evicted); open readers and moves keep using its descriptor.
func (s *Store) dropSegmentFile(g *segment) {
	s.disk.FS().Remove(g.path)
}
