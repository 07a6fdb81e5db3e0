package meta

import (
	"context"
	"database/sql"
	"errors"

	"github.com/gd2fs/gd2fs/errs"
)

// MaxKVHistory bounds the master's saved KV membership history: a few member
// lists of up to a few thousand servers.
const MaxKVHistory = 1 << 20

// SaveKVHistory records the master's KV membership history, an opaque
// document the master encodes (internal/master/kvmembers.go), replacing the
// one saved before. It lives in cluster_info beside the leader's address:
// no schema change.
func (s *sqlStore) SaveKVHistory(ctx context.Context, state []byte) error {
	if len(state) > MaxKVHistory {
		return errs.New(errs.ErrTooLarge, "KV membership history of %d bytes: at most %d", len(state), MaxKVHistory)
	}
	_, err := s.db.ExecContext(ctx, s.q(`INSERT INTO cluster_info (k, v) VALUES ('kv_history', ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v`), string(state))
	return wrapDB(err)
}

// KVHistory is the history SaveKVHistory last saved; nil when none was.
func (s *sqlStore) KVHistory(ctx context.Context) ([]byte, error) {
	var v string
	err := s.db.QueryRowContext(ctx, `SELECT v FROM cluster_info WHERE k = 'kv_history'`).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, wrapDB(err)
	}
	return []byte(v), nil
}
