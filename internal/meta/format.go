package meta

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// metaFormat is the format of the metadata this version writes. A later
// version that writes rows an earlier one would read wrong (block hashes
// in a new column, say: docs/kv-cache.md) raises it. counters.meta_format
// holds the highest format any leader has written under; a master refuses
// to open a store, or to take the lead of it, whose format is higher than
// its own, so in a rolling upgrade an old standby never leads after a new
// master did. Masters from before this check ignore the counter: the first
// format change that matters must wait until no such master is left.
const metaFormat = 1

// errNewerFormat says a newer gd2fs wrote the store.
var errNewerFormat = errors.New("meta: this metadata store was written by a newer gd2fs")

// checkFormat refuses a store of a newer format than this version's.
func (s *sqlStore) checkFormat(ctx context.Context) error {
	var v int64
	err := s.db.QueryRowContext(ctx, `SELECT v FROM counters WHERE k = 'meta_format'`).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return wrapDB(err)
	}
	if v > metaFormat {
		return fmt.Errorf("%w (format %d; this master reads up to format %d): run this master with the gd2fs version the others run, or newer", errNewerFormat, v, metaFormat)
	}
	return nil
}

// raiseFormat records that a leader of this version writes the store.
func (s *sqlStore) raiseFormat(ctx context.Context) error {
	_, err := s.db.ExecContext(ctx, s.q(`INSERT INTO counters (k, v) VALUES ('meta_format', ?)
		ON CONFLICT (k) DO UPDATE SET v = CASE WHEN counters.v < excluded.v THEN excluded.v ELSE counters.v END`), metaFormat)
	return wrapDB(err)
}
