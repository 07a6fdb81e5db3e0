package meta

import (
	"context"
	"time"
)

// A Sync of a session file from the leader's memory (issue 20).
//
// An engine saves a turn's KV with its own writes and a Sync of the file
// (pygd2fs's Write, WriteFresh), then commits the segments it saved. Each
// Sync was a SQL transaction of its own, after a wait for everything the
// leader had answered from memory to be written (barrier: File, Chunks and
// Commit each waited): in window mode every Sync forced a flush, so an
// engine's turns ran at the rate of one flush each — about 800 turns/s and
// 74 ms a save at 10,000 sessions, against 3,000 turns/s on the path whose
// commits carry what was written. A Sync of an unsealed file memory holds
// is now answered as a session commit is: the master checks the lengths
// against the file and chunks as memory holds them (MemFile), and the
// servers' word, as before; the raise of the size and lengths goes into
// the log (SyncMem), written with the next flush — in flush mode before
// the answer, in window mode within the window, like the commits that name
// those bytes. Memory holds at most what SQL holds, so a check that fails
// on memory's view is made again on SQL's (the caller's slow path), which
// decides.

// MemSyncer is implemented by stores that answer a Sync of a session
// file from the leader's memory.
type MemSyncer interface {
	// MemFile is the unsealed file at path and its chunks (in index
	// order: FindChunk) as the leader's memory holds them (sizes and
	// lengths at most SQL's), when memory may answer a Sync of it; ok
	// false: read SQL. HintChunks is the same view for any file held.
	MemFile(path string) (f File, chunks []Chunk, ok bool)
	// SyncMem is Commit, not sealing, of file f that MemFile returned,
	// answered from memory once the caller has checked size and lengths
	// against MemFile's view: it raises them in memory and writes them
	// with the leader's log, and returns once they are as durable as the
	// store's session operations (flush mode: written). ok false: memory
	// no longer holds f (sealed, removed, moved, the lead changed) or its
	// log was lost: run Commit.
	SyncMem(ctx context.Context, f File, size int64, lengths map[int64]int64, now time.Time) (File, bool, error)
	// StatMem is the session file at path and its chunks as the leader's
	// memory holds them, for a stat (GET /v1/files) in window mode, where
	// File and Chunks first wait for the whole log: ok only in window
	// mode, for an unsealed file a session owns (kv_files; not a prefix a
	// plan read), with every chunk under its size in memory (a reader
	// takes a missing one for a hole of zeros). In flush mode SQL holds
	// all that was answered, and a stat reads it without a wait.
	StatMem(path string) (f File, chunks []Chunk, ok bool)
	// Settled returns once what memory has answered so far is as durable
	// as the store's session operations: in flush mode, written (so a
	// chunk MemFile showed, which a plan allocated, is in SQL); at once in
	// window mode. false: that log was lost (memory was dropped) or ctx
	// ended: read SQL.
	Settled(ctx context.Context) bool
}

func (s *sqlStore) MemFile(path string) (File, []Chunk, bool) {
	wb := &s.wb
	wb.mu.Lock()
	defer wb.mu.Unlock()
	c, ok := s.syncable(path, 0)
	if !ok {
		return File{}, nil, false
	}
	f, cs := c.snapshot()
	return f, cs, true
}

func (s *sqlStore) StatMem(path string) (File, []Chunk, bool) {
	wb := &s.wb
	wb.mu.Lock()
	defer wb.mu.Unlock()
	if wb.mode != DurabilityWindow {
		return File{}, nil, false
	}
	c, ok := s.syncable(path, 0)
	if !ok || c.owner == "" || c.file.ChunkSize <= 0 {
		return File{}, nil, false
	}
	f, cs := c.snapshot()
	if f.Size > 0 && int64(len(cs)) < (f.Size-1)/f.ChunkSize+1 {
		return File{}, nil, false // too few chunks to cover the size (and no loop over a huge size)
	}
	for idx := int64(0); idx*f.ChunkSize < f.Size; idx++ {
		if _, ok := FindChunk(cs, idx); !ok {
			return File{}, nil, false
		}
	}
	return f, cs, true
}

// syncable is the file at path in memory, when a Sync of it may be
// answered there: memory may answer, the file is held, of id (when not 0),
// unsealed, and no seal of it runs (wb.mu held).
func (s *sqlStore) syncable(path string, id int64) (*cachedFile, bool) {
	if !s.fastReady() {
		return nil, false
	}
	c, ok := s.cache.files[path]
	if !ok || c.file.Sealed || (id != 0 && c.file.ID != id) || s.wb.sealing[c.file.ID] > 0 {
		return nil, false
	}
	return c, true
}

func (s *sqlStore) SyncMem(ctx context.Context, f File, size int64, lengths map[int64]int64, now time.Time) (File, bool, error) {
	if err := CheckSize(size); err != nil {
		return File{}, true, err
	}
	wb := &s.wb
	wb.mu.Lock()
	c, ok := s.syncable(f.Path, f.ID)
	if !ok {
		wb.mu.Unlock()
		return File{}, false, nil
	}
	for _, l := range lengths {
		if l < 0 || l > c.file.ChunkSize {
			wb.mu.Unlock()
			return File{}, false, nil // Commit refuses it
		}
	}
	lg := wb.log
	n := len(lg.stmts)
	for idx, l := range lengths {
		s.growChunk(lg, c, idx, l)
	}
	s.growFile(lg, c, size, now.UnixNano(), true)
	if len(lg.stmts) > n {
		lg.ops++
	} else {
		// Nothing to raise: what this Sync reports may still wait in a
		// log (another client's Sync of the same bytes), as durable once
		// that is written.
		lg = s.pending()
	}
	out := c.file
	ok, err := s.answered(lg)
	if !ok {
		return File{}, false, nil // flush mode: lost with its log, SQL decides
	}
	if err == nil {
		s.wb.syncs.Add(1)
	}
	return out, true, err
}

func (s *sqlStore) Settled(ctx context.Context) bool {
	wb := &s.wb
	wb.mu.Lock()
	if wb.mode != DurabilityFlush {
		wb.mu.Unlock()
		return true // window: answered at once; sync: memory answers nothing
	}
	lg := s.pending()
	current := lg != nil && lg == wb.log
	wb.mu.Unlock()
	if lg == nil {
		return true
	}
	if current { // else the runner is writing it
		s.groupTx(ctx, nil) //nolint:errcheck // lg.err says
	}
	select {
	case <-lg.done:
		return lg.err == nil
	case <-ctx.Done():
		return false
	}
}

// growChunk raises the length of file c's chunk idx to l in memory, and
// in SQL through log lg: SQL's row grows too when memory does not know
// the chunk (memory holds at most what SQL holds), and memory gets no
// chunk it does not know the id of (wb.mu held).
func (s *sqlStore) growChunk(lg *wlog, c *cachedFile, idx, l int64) {
	ch, ok := c.chunks.get(idx)
	if ok && ch.Length >= l {
		return
	}
	if ok {
		ch.Length = l
		c.chunks.put(ch)
	}
	lg.add(s, `UPDATE chunks SET length = ? WHERE file_id = ? AND idx = ? AND length < ?`, l, c.file.ID, idx, l)
}

// growFile raises file c's size to end in memory and, through log lg, in
// SQL. Its modification time moves only when it is mtimeStep old (with
// touch, even when the size does not grow), so that a turn does not move
// the file's entry in files_unsealed (wb.mu held).
func (s *sqlStore) growFile(lg *wlog, c *cachedFile, end, nowNano int64, touch bool) {
	grow := end > c.file.Size
	now := time.Unix(0, nowNano).UTC()
	stale := now.Sub(c.file.Modified) >= mtimeStep && (grow || touch)
	if grow {
		c.file.Size = end
	}
	if stale {
		c.file.Modified = now
	}
	switch {
	case grow && stale:
		lg.add(s, `UPDATE files SET size = ?, mtime = ? WHERE id = ? AND size < ?`, end, nowNano, c.file.ID, end)
	case grow:
		lg.add(s, `UPDATE files SET size = ? WHERE id = ? AND size < ?`, end, c.file.ID, end)
	case stale:
		lg.add(s, `UPDATE files SET mtime = ? WHERE id = ? AND mtime < ?`, nowNano, c.file.ID, nowNano)
	}
}
