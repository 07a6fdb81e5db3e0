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
	}{{"cache_size", -65536}, {"wal_autocheckpoint", 65536}, {"synchronous", 2}} {
		var got int64
		if err := db.QueryRowContext(ctx, "PRAGMA "+c.pragma).Scan(&got); err != nil {
			t.Fatalf("PRAGMA %s: %v", c.pragma, err)
		}
		if got != c.want {
			t.Errorf("PRAGMA %s = %d, want %d", c.pragma, got, c.want)
		}
	}
}

// TestSQLiteCacheSettingsEveryConn: each connection database/sql opens
// (not only the first) runs with the page cache and checkpoint interval;
// both are per-connection settings in SQLite.
func TestSQLiteCacheSettingsEveryConn(t *testing.T) {
	ctx := context.Background()
	st, err := Open(ctx, "sqlite://"+filepath.Join(t.TempDir(), "meta.db")+"?synchronous=normal")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	db := st.(*sqlStore).db
	db.SetMaxOpenConns(3)
	for i := 0; i < 3; i++ {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for _, p := range []struct {
			pragma string
			want   int64
		}{{"cache_size", -65536}, {"wal_autocheckpoint", 65536}, {"synchronous", 1}, {"foreign_keys", 1}, {"busy_timeout", 10000}} {
			var got int64
			if err := c.QueryRowContext(ctx, "PRAGMA "+p.pragma).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != p.want {
				t.Errorf("conn %d: PRAGMA %s = %d, want %d", i, p.pragma, got, p.want)
			}
		}
		var mode string
		if err := c.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
			t.Errorf("conn %d: journal_mode %q, %v", i, mode, err)
		}
	}
}
