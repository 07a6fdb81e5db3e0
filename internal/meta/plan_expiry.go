package meta

import (
	"context"
	"database/sql"
	"errors"

	"github.com/gd2fs/gd2fs/errs"
)

// Plans never committed expire (PlanInput.PlanTTL), and so do their
// reservations: a plan reserves its fresh bytes at the end of a session
// file, and a session planned many times and never committed would
// otherwise own those bytes for ever (counted in its size and against the
// session quota). A session file that no committed range and no plan
// still outstanding uses is removed with its reservation, and the
// session's next plan starts a new file.
//
// Reserved bytes are never handed back for reuse within a file: an engine
// still writing an expired plan's range (hung past the TTL) would write
// into the range of the plan that reused it, and that session would then
// serve its bytes as a hit. A removed file takes such a late write nowhere
// (the write fails), so no reader ever sees it. An expired reservation in
// a file that also holds committed ranges stays reserved and goes with the
// file.

// expirePlansC is expirePlansTx through the session cache: the leader
// knows its outstanding plans and their oldest, so most plans run no
// expiry statement at all. When some plan expires, the expiry runs in SQL
// as before and the cache forgets what it changed: the sessions of the
// expired plans (their last use), the files it removed and their owners
// (whose next plan starts a new file), the expired plans, and the quota's
// total. Forgetting every session instead, as it once did, made each
// abandoned plan's expiry a storm of reloads: every session's next plan
// and commit ran in SQL (gd2fs-bench turns, "ran in SQL, by why").
func (s *sqlStore) expirePlansC(ctx context.Context, tx *sql.Tx, dir string, before int64) error {
	c := &s.cache
	if !c.on {
		_, err := s.expirePlansTx(ctx, tx, dir, before)
		return err
	}
	if err := s.loadPlans(ctx, tx); err != nil {
		return err
	}
	if len(c.plans) == 0 || c.oldest >= before {
		return nil
	}
	owners, err := s.expirePlansTx(ctx, tx, dir, before)
	if err != nil {
		return err
	}
	// Only the entries: a session's other plans are outstanding still.
	forget := func(id string) {
		c.touchSession(id)
		c.unload(id)
	}
	for id, p := range c.plans {
		if p.created < before {
			forget(p.session)
			c.removePlan(id)
		}
	}
	for path, owner := range owners {
		forget(owner)
		c.journal.files = append(c.journal.files, path)
		delete(c.files, path)
	}
	c.totalKnown = false
	c.oldest = 0
	first := true
	for _, p := range c.plans {
		if first || p.created < c.oldest {
			c.oldest, first = p.created, false
		}
	}
	return nil
}

// expirePlansTx deletes the plans created before before (Unix ns) and
// removes the session files they leave unused; dir is where session files
// live (PlanInput.Dir). It returns the files removed, each with the
// session that owned it.
func (s *sqlStore) expirePlansTx(ctx context.Context, tx *sql.Tx, dir string, before int64) (map[string]string, error) {
	paths, err := s.queryStrings(ctx, tx, `SELECT DISTINCT path FROM kv_plans WHERE created < ? AND path <> ''`, before)
	if err != nil {
		return nil, err
	}
	removed := map[string]string{}
	// A plan wrote no last_used of its own (lastUsedCol): its session
	// keeps the plan's time as its last use when the plan goes, so the
	// quota's LRU order is the one it was while the plan was outstanding.
	if _, err := tx.ExecContext(ctx, s.q(`UPDATE kv_sessions SET last_used = (SELECT MAX(created) FROM kv_plans WHERE session_id = kv_sessions.id AND created < ?)
		WHERE id IN (SELECT session_id FROM kv_plans WHERE created < ?)
		AND last_used < (SELECT MAX(created) FROM kv_plans WHERE session_id = kv_sessions.id AND created < ?)`), before, before, before); err != nil {
		return nil, wrapDB(err)
	}
	if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM kv_plans WHERE created < ?`), before); err != nil {
		return nil, wrapDB(err)
	}
	for _, p := range paths {
		var used int64
		if err := tx.QueryRowContext(ctx, s.q(`SELECT (SELECT COUNT(*) FROM kv_ranges WHERE path = ?) + (SELECT COUNT(*) FROM kv_plans WHERE path = ?)`), p, p).Scan(&used); err != nil {
			return nil, wrapDB(err)
		}
		if used > 0 {
			continue
		}
		var owner string
		var seq int64
		err := tx.QueryRowContext(ctx, s.q(`SELECT f.session_id, s.file_seq FROM kv_files f JOIN kv_sessions s ON s.id = f.session_id WHERE f.path = ?`), p).Scan(&owner, &seq)
		if errors.Is(err, sql.ErrNoRows) {
			continue // gone with its session
		}
		if err != nil {
			return nil, wrapDB(err)
		}
		if err := s.dropKVFileTx(ctx, tx, p); err != nil {
			return nil, err
		}
		if err := s.removeFileTx(ctx, tx, p); err != nil && !errors.Is(err, errs.ErrNotFound) {
			return nil, err
		}
		removed[p] = owner
		if sessionFile(dir, owner, seq) == p { // its current file: the next plan starts a new one
			if _, err := tx.ExecContext(ctx, s.q(`UPDATE kv_sessions SET file_seq = 0 WHERE id = ?`), owner); err != nil {
				return nil, wrapDB(err)
			}
		}
	}
	return removed, nil
}

// PlanReader is implemented by stores that can show an outstanding plan's
// fresh range (the CLI's session write asks for it by plan id).
type PlanReader interface {
	OutstandingPlan(ctx context.Context, session string, planID int64) (Range, error)
}

// OutstandingPlan returns the fresh range plan planID of session reserved,
// or errs.ErrNotFound when there is no such plan outstanding (committed,
// expired, or never made).
func (s *sqlStore) OutstandingPlan(ctx context.Context, session string, planID int64) (Range, error) {
	var r Range
	if err := s.barrier(ctx); err != nil { // writebehind.go
		return r, err
	}
	err := s.db.QueryRowContext(ctx, s.q(`SELECT token_start, token_length, path, kv_start, kv_length FROM kv_plans WHERE id = ? AND session_id = ?`), planID, session).
		Scan(&r.TokenStart, &r.TokenLength, &r.Path, &r.KVStart, &r.KVLength)
	if errors.Is(err, sql.ErrNoRows) {
		return Range{}, errs.New(errs.ErrNotFound, "no outstanding plan %d for session %s (plans expire, and commit once): plan again", planID, session)
	}
	return r, wrapDB(err)
}
