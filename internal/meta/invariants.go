package meta

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/gd2fs/gd2fs/errs"
)

// checkInvariants checks, in a snapshot taken after a transaction
// committed, what every transaction must leave true (invariantsTx). The
// snapshot (REPEATABLE READ on PostgreSQL) sees one committed state even
// while other transactions run.
func (s *sqlStore) checkInvariants(ctx context.Context) error {
	tx, err := s.snapshot(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := s.invariantsTx(ctx, tx); err != nil {
		return errs.New(errs.ErrInternal, "metadata invariant broken after a transaction: %v", err)
	}
	return nil
}

// snapshot begins a read-only transaction that sees one committed state
// (REPEATABLE READ on PostgreSQL; on SQLite any transaction does).
func (s *sqlStore) snapshot(ctx context.Context) (*sql.Tx, error) {
	var opts *sql.TxOptions
	if s.postgres {
		opts = &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true}
	}
	tx, err := s.db.BeginTx(ctx, opts)
	return tx, wrapDB(err)
}

// invariantsTx checks what every transaction must leave true of
// explicit-mode sessions. It reads every session, so it is for tests
// (GD2FS_META_INVARIANTS=1), not production:
//
//   - a session's ranges are sorted, disjoint, contiguous from token 0 and
//     sized by its model's layout (checkRanges), and its token count is
//     where they end;
//   - every range lies inside its file's committed bytes and, for a session
//     file, inside the bytes reserved in it;
//   - a session's block hashes cover at most the tokens it holds, one per
//     block of them (checkHashes);
//   - session files and plans belong to sessions that exist, and a plan was
//     made from a version the session has had.
func (s *sqlStore) invariantsTx(ctx context.Context, tx *sql.Tx) error {
	type sess struct {
		model                   string
		tokens, version, hashed int64
		hashes                  []BlockHash
	}
	sessions := map[string]sess{}
	rows, err := tx.QueryContext(ctx, `SELECT id, model, tokens, version, hashed_tokens, hashes FROM kv_sessions`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var id, hs string
		var x sess
		if err := rows.Scan(&id, &x.model, &x.tokens, &x.version, &x.hashed, &hs); err != nil {
			rows.Close()
			return err
		}
		if x.hashes, err = decodeHashes(hs); err != nil {
			rows.Close()
			return fmt.Errorf("session %s: %w", id, err)
		}
		sessions[id] = x
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	layouts := map[string]Layout{}
	rows, err = tx.QueryContext(ctx, `SELECT model FROM kv_layouts`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var model string
		if err := rows.Scan(&model); err != nil {
			rows.Close()
			return err
		}
		layouts[model] = Layout{}
	}
	rows.Close()
	for model := range layouts {
		if layouts[model], err = s.layoutTx(ctx, tx, model); err != nil {
			return err
		}
	}
	// Every range with its file's written and reserved bytes, in one query
	// (this runs after every transaction of the test suite).
	ranges := map[string][]Range{}
	rows, err = tx.QueryContext(ctx, `SELECT r.session_id, r.token_start, r.token_length, r.path, r.kv_start, r.kv_length, f.size, k.reserved
		FROM kv_ranges r LEFT JOIN files f ON f.path = r.path LEFT JOIN kv_files k ON k.path = r.path
		ORDER BY r.session_id, r.token_start`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var id string
		var r Range
		var size, reserved sql.NullInt64
		if err := rows.Scan(&id, &r.TokenStart, &r.TokenLength, &r.Path, &r.KVStart, &r.KVLength, &size, &reserved); err != nil {
			rows.Close()
			return err
		}
		if _, ok := sessions[id]; !ok {
			rows.Close()
			return fmt.Errorf("range at token %d of %s belongs to no session %s", r.TokenStart, r.Path, id)
		}
		if !size.Valid || r.KVStart+r.KVLength > size.Int64 || (reserved.Valid && r.KVStart+r.KVLength > reserved.Int64) {
			rows.Close()
			return fmt.Errorf("session %s: range at token %d (bytes %d+%d) outside %s (%v bytes written, %v reserved)",
				id, r.TokenStart, r.KVStart, r.KVLength, r.Path, size, reserved)
		}
		ranges[id] = append(ranges[id], r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for id, x := range sessions {
		l, ok := layouts[x.model]
		if !ok {
			return fmt.Errorf("session %s: no layout for model %s", id, x.model)
		}
		rs := ranges[id]
		if err := checkRanges(l, rs); err != nil {
			return fmt.Errorf("session %s: %w", id, err)
		}
		end := int64(0)
		if len(rs) > 0 {
			end = rs[len(rs)-1].TokenStart + rs[len(rs)-1].TokenLength
		}
		if end != x.tokens {
			return fmt.Errorf("session %s holds %d tokens, its ranges end at %d", id, x.tokens, end)
		}
		if err := checkHashes(int64(l.PageTokens), x.hashes, x.hashed, x.tokens); err != nil {
			return fmt.Errorf("session %s: %w", id, err)
		}
	}
	var orphans int64
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM kv_files WHERE session_id NOT IN (SELECT id FROM kv_sessions)
		OR path NOT IN (SELECT path FROM files)`).Scan(&orphans); err != nil {
		return err
	}
	if orphans > 0 {
		return fmt.Errorf("%d session files belong to no session or have no file", orphans)
	}
	var counted, summed int64
	if err := tx.QueryRowContext(ctx, `SELECT (SELECT v FROM counters WHERE k = 'kv_reserved'), (SELECT COALESCE(SUM(reserved), 0) FROM kv_files)`).Scan(&counted, &summed); err != nil {
		return err
	}
	if counted != summed {
		return fmt.Errorf("counter kv_reserved is %d, but session files reserve %d", counted, summed)
	}
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM kv_plans p LEFT JOIN kv_sessions s ON s.id = p.session_id
		WHERE s.id IS NULL OR p.base_version > s.version`).Scan(&orphans); err != nil {
		return err
	}
	if orphans > 0 {
		return fmt.Errorf("%d plans belong to no session or to a version it never had", orphans)
	}
	return namespaceTx(ctx, tx)
}

// namespaceTx checks the tree of names: no path is both a file and a
// directory, every file and directory below the root has its parent
// directory, every chunk and every attribute its file, and every replica
// its chunk.
func namespaceTx(ctx context.Context, tx *sql.Tx) error {
	for _, c := range []struct{ q, what string }{
		{`SELECT f.path FROM files f JOIN dirs d ON d.path = f.path`, "is both a file and a directory"},
		{`SELECT f.path FROM files f WHERE f.parent <> '/' AND NOT EXISTS (SELECT 1 FROM dirs d WHERE d.path = f.parent)`, "is a file in a directory that does not exist"},
		{`SELECT d.path FROM dirs d WHERE d.path <> '/' AND d.parent <> '/' AND NOT EXISTS (SELECT 1 FROM dirs p WHERE p.path = d.parent)`, "is a directory in a directory that does not exist"},
		{`SELECT CAST(c.id AS TEXT) FROM chunks c WHERE NOT EXISTS (SELECT 1 FROM files f WHERE f.id = c.file_id)`, "is a chunk of a file that does not exist"},
		{`SELECT CAST(r.chunk_id AS TEXT) FROM replicas r WHERE NOT EXISTS (SELECT 1 FROM chunks c WHERE c.id = r.chunk_id)`, "has replicas but no chunk"},
		{`SELECT a.path FROM file_attrs a WHERE NOT EXISTS (SELECT 1 FROM files f WHERE f.path = a.path)`, "has attributes but no file"},
	} {
		var p string
		err := tx.QueryRowContext(ctx, c.q+` LIMIT 1`).Scan(&p)
		if err == nil {
			return fmt.Errorf("%s %s", p, c.what)
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
	}
	return nil
}
