package meta

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/gd2fs/gd2fs/errs"
)

// Abandoned files (issue 24). A file is written by a client that allocates
// its chunks, writes them, commits and seals it; a writer that dies first
// (kill -9 of the writer, or of the mount daemon writing for it; a host
// gone) leaves it unsealed, and nothing on the master can tell it from
// one still being written but time: every create, allocation of new
// chunks and commit moves the file's modification time (the master's
// alloc touches it), so an unsealed file whose time is old has had no
// writer for that long. ExpireUnsealed removes those, as RemoveFile would
// (chunks tombstoned), except files of KV sessions and registered
// prefixes, whose own expiry is the sessions' (a session file's written
// commits move its time at most once a minute: writebehind.go, mtimeStep).

func (s *sqlStore) ExpireUnsealed(ctx context.Context, before time.Time, limit int) ([]File, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT `+fileCols+` FROM files WHERE sealed = 0 AND mtime < ?
		AND path NOT IN (SELECT path FROM kv_files) AND path NOT IN (SELECT path FROM kv_ranges) AND path NOT IN (SELECT path FROM kv_prefixes)
		ORDER BY mtime LIMIT ?`), before.UnixNano(), limit)
	if err != nil {
		return nil, wrapDB(err)
	}
	var old []File
	for rows.Next() {
		f, err := scanFile(rows)
		if err != nil {
			rows.Close()
			return nil, wrapDB(err)
		}
		old = append(old, f)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, wrapDB(err)
	}
	var gone []File
	for _, f := range old {
		// Each in its own transaction, looked at again inside it: a writer
		// may have committed (or sealed) since the query.
		err := s.lockedTx(ctx, func(tx *sql.Tx) error {
			now, err := s.fileBy(ctx, tx, "id", f.ID)
			if err != nil {
				return err
			}
			if now.Sealed || !now.Modified.Before(before) {
				return errStillWritten
			}
			if why, err := s.busyTx(ctx, tx, File{Path: now.Path, Sealed: true}); err != nil {
				return err
			} else if why != "" {
				return errStillWritten
			}
			return s.removeFileTx(ctx, tx, now.Path)
		})
		switch {
		case err == nil:
			gone = append(gone, f)
		case errors.Is(err, errStillWritten), errors.Is(err, errs.ErrNotFound):
		default:
			return gone, err
		}
	}
	return gone, nil
}

// errStillWritten: a file ExpireUnsealed found old has a writer after all.
var errStillWritten = errors.New("written since")
