package meta

import (
	"context"
	"path/filepath"
	"testing"
)

// TestSQLiteCacheSettings: a SQLite store runs with the page cache and WAL
// checkpoint interval sql.go sets (SQLite's own defaults, 2 MB and 1,000
// pages, cost a leader's flushes a third more system calls a turn).
func TestSQLiteCacheSettings(t *testing.T) {
	ctx := context.Background()
	st, err := Open(ctx, "sqlite://"+filepath.Join(t.TempDir(), "meta.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	db := st.(*sqlStore).db
	for _, c := range []struct {
		pragma string
		want   int64
	}{{"cache_size", -65536}, {"wal_autocheckpoint", 16384}, {"synchronous", 2}} {
		var got int64
		if err := db.QueryRowContext(ctx, "PRAGMA "+c.pragma).Scan(&got); err != nil {
			t.Fatalf("PRAGMA %s: %v", c.pragma, err)
		}
		if got != c.want {
			t.Errorf("PRAGMA %s = %d, want %d", c.pragma, got, c.want)
		}
	}
}
