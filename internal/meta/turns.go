package meta

import (
	"context"
	"database/sql"
	"time"

	"github.com/gd2fs/gd2fs/errs"
)

// The fast path of a turn (docs/kv-cache.md, "What a turn costs"): a plan
// that allocates the chunks under its fresh range, so the engine writes
// straight to the servers with no master call, and a commit that records
// the written bytes itself, so no Sync comes between. Both run inside the
// plan's and the commit's own transaction.

// PlaceFunc chooses the servers of chunk idx of file fileID, primary
// first (the master's placement over its live servers).
type PlaceFunc func(fileID, idx int64) ([]string, error)

// allocFreshTx allocates the chunks of fr's file that hold fr's bytes (those
// not allocated yet) and returns the file and those chunks in index order;
// none when place cannot place one.
func (s *sqlStore) allocFreshTx(ctx context.Context, tx *sql.Tx, place PlaceFunc, fr Range) (File, []Chunk, error) {
	f, err := s.fileBy(ctx, tx, "path", fr.Path)
	if err != nil {
		return File{}, nil, err
	}
	if f.ChunkSize <= 0 {
		return File{}, nil, errs.New(errs.ErrInternal, "%s has chunk size %d", f.Path, f.ChunkSize)
	}
	first, last := fr.KVStart/f.ChunkSize, (fr.KVStart+fr.KVLength-1)/f.ChunkSize
	// Before the chunks are read: an AddChunks of the same index in
	// between would fail this plan on the unique index (lockIDs).
	if err := s.lockIDs(ctx, tx); err != nil {
		return File{}, nil, err
	}
	have, err := s.chunksTx(ctx, tx, f.ID, first, last)
	if err != nil {
		return File{}, nil, err
	}
	out := make([]Chunk, 0, last-first+1)
	j := 0
	for idx := first; idx <= last; idx++ {
		if j < len(have) && have[j].Index == idx {
			out = append(out, have[j])
			j++
			continue
		}
		replicas, err := place(f.ID, idx)
		if err != nil {
			// No placement now (no server up, a leader warming up): the
			// plan goes without, and the client allocates as it writes,
			// where the error reaches it.
			return File{}, nil, nil
		}
		id, err := s.counter(ctx, tx, "next_id", 1)
		if err != nil {
			return File{}, nil, err
		}
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO chunks (id, file_id, idx, length) VALUES (?, ?, ?, 0)`), id, f.ID, idx); err != nil {
			return File{}, nil, wrapDB(err)
		}
		for pos, sv := range replicas {
			if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO replicas (chunk_id, pos, server_id) VALUES (?, ?, ?)`), id, pos, sv); err != nil {
				return File{}, nil, wrapDB(err)
			}
		}
		out = append(out, Chunk{ID: uint64(id), FileID: f.ID, Index: idx, Replicas: replicas})
	}
	return f, out, nil
}

// chunksTx is file fileID's chunks with indexes first..last, in index order,
// read inside tx.
func (s *sqlStore) chunksTx(ctx context.Context, tx execer, fileID, first, last int64) ([]Chunk, error) {
	rows, err := tx.QueryContext(ctx, s.q(`SELECT c.id, c.idx, c.length, r.server_id FROM chunks c JOIN replicas r ON r.chunk_id = c.id
		WHERE c.file_id = ? AND c.idx >= ? AND c.idx <= ? ORDER BY c.idx, r.pos`), fileID, first, last)
	if err != nil {
		return nil, wrapDB(err)
	}
	defer rows.Close()
	var out []Chunk
	for rows.Next() {
		c := Chunk{FileID: fileID}
		var sv string
		if err := rows.Scan(&c.ID, &c.Index, &c.Length, &sv); err != nil {
			return nil, wrapDB(err)
		}
		if n := len(out); n > 0 && out[n-1].ID == c.ID {
			out[n-1].Replicas = append(out[n-1].Replicas, sv)
			continue
		}
		c.Replicas = []string{sv}
		out = append(out, c)
	}
	return out, wrapDB(rows.Err())
}

// sealedCovers refuses (ErrSealed) a range of sealed file f that its size
// or one of its chunks' lengths does not reach.
func (s *sqlStore) sealedCovers(ctx context.Context, tx *sql.Tx, f File, r Range, first, last int64) error {
	end := r.KVStart + r.KVLength
	short := f.Size < end
	if !short {
		cs, err := s.chunksTx(ctx, tx, f.ID, first, last)
		if err != nil {
			return err
		}
		short = int64(len(cs)) != last-first+1
		for _, c := range cs {
			short = short || c.Length < min(end-c.Index*f.ChunkSize, f.ChunkSize)
		}
	}
	if short {
		return errs.New(errs.ErrSealed, "%s is sealed and does not hold bytes %d to %d as written: a sealed file does not grow (commit before closing the handle)", f.Path, r.KVStart, end)
	}
	return nil
}

// recordWrittenTx records, as a client's Sync would, that r's bytes are
// written: the chunks under them reach at least to r's end and the file's
// size covers it. Every such chunk must exist (the plan allocated it); a
// range over bytes that have no chunk cannot have been written, and is
// refused.
func (s *sqlStore) recordWrittenTx(ctx context.Context, tx *sql.Tx, r Range, nowNano int64) error {
	f, err := s.fileBy(ctx, tx, "path", r.Path)
	if err != nil {
		return err
	}
	if f.ChunkSize <= 0 || r.KVLength < 1 {
		return errs.New(errs.ErrInternal, "%s (chunk size %d): range of %d bytes", f.Path, f.ChunkSize, r.KVLength)
	}
	end := r.KVStart + r.KVLength
	first, last := r.KVStart/f.ChunkSize, (end-1)/f.ChunkSize
	if f.Sealed {
		// A sealed file does not grow: a commit may name what it already
		// holds (a writer that closed its handle, which seals, before the
		// commit), nothing more.
		return s.sealedCovers(ctx, tx, f, r, first, last)
	}
	var n int64
	if err := tx.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM chunks WHERE file_id = ? AND idx >= ? AND idx <= ?`), f.ID, first, last).Scan(&n); err != nil {
		return wrapDB(err)
	}
	if n != last-first+1 {
		return errs.New(errs.ErrBadRequest, "%s bytes %d to %d: %d of their %d chunks were never allocated, so they were not written; write the plan's fresh range (its fresh_files) before commit",
			r.Path, r.KVStart, end, last-first+1-n, last-first+1)
	}
	for idx := first; idx <= last; idx++ {
		l := min(end-idx*f.ChunkSize, f.ChunkSize)
		if _, err := tx.ExecContext(ctx, s.q(`UPDATE chunks SET length = ? WHERE file_id = ? AND idx = ? AND length < ?`), l, f.ID, idx, l); err != nil {
			return wrapDB(err)
		}
	}
	if end > f.Size {
		q, args := `UPDATE files SET size = ? WHERE id = ?`, []any{end, f.ID}
		if time.Unix(0, nowNano).Sub(f.Modified) >= mtimeStep { // as writtenMem
			q, args = `UPDATE files SET size = ?, mtime = ? WHERE id = ?`, []any{end, nowNano, f.ID}
		}
		if _, err := tx.ExecContext(ctx, s.q(q), args...); err != nil {
			return wrapDB(err)
		}
	}
	return nil
}
