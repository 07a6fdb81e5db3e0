package meta

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/gd2fs/gd2fs/errs"
)

// TestSQLiteSynchronous: a SQLite store commits with synchronous=FULL (a
// commit survives power loss) unless the DSN asks for normal; any other
// option is refused.
func TestSQLiteSynchronous(t *testing.T) {
	ctx := context.Background()
	for dsn, want := range map[string]int{"": 2, "?synchronous=full": 2, "?synchronous=normal": 1} {
		st, err := Open(ctx, "sqlite://"+filepath.Join(t.TempDir(), "m.db")+dsn)
		if err != nil {
			t.Fatal(err)
		}
		var got int
		if err := st.(*sqlStore).db.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&got); err != nil {
			t.Fatal(err)
		}
		st.Close()
		if got != want {
			t.Errorf("DSN option %q: PRAGMA synchronous = %d, want %d", dsn, got, want)
		}
	}
	_, err := Open(ctx, "sqlite://"+filepath.Join(t.TempDir(), "m.db")+"?synchronous=off")
	if !errors.Is(err, errs.ErrBadRequest) {
		t.Errorf("synchronous=off: %v, want a bad request", err)
	}
}
