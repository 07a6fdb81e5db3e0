package meta

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// TestQuotaQueriesUseIndexes: under --session-quota every plan sums what
// session files reserve and may pick the least recently used idle session;
// at a million sessions a query that reads a whole table costs seconds a
// plan (docs/kv-cache.md, "Scale of the session table"). SQLite's plan for
// each must read no table whole: the total is one counter row, and the
// victim an ordered walk of the (last_used, id) index that stops at the
// first idle session (no sort of the table). PostgreSQL's planner picks a
// sequential scan for a test-sized table whatever the indexes, so it is
// measured at scale instead (gd2fs-bench plan --quota-plans).
func TestQuotaQueriesUseIndexes(t *testing.T) {
	ctx := context.Background()
	s := leading(t, sqliteForTest(t)).(*sqlStore)
	if err := s.PutLayout(ctx, llama); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", "c"} {
		p, err := s.PlanSession(ctx, planIn(id, 40))
		if err != nil {
			t.Fatal(err)
		}
		written(t, s, p)
		if _, err := s.CommitSession(ctx, CommitInput{Session: id, PlanID: p.ID, Now: now}); err != nil {
			t.Fatal(err)
		}
	}
	for _, q := range []string{quotaTotalQuery, quotaVictimQuery} {
		rows, err := s.db.QueryContext(ctx, `EXPLAIN QUERY PLAN `+q, "a")
		if err != nil {
			t.Fatal(err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, notused int
			var detail string
			if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
		for _, d := range plan {
			if (strings.HasPrefix(d, "SCAN ") && !strings.Contains(d, " INDEX ")) || strings.Contains(d, "TEMP B-TREE") {
				t.Fatalf("%s\nreads a whole table: %q (plan %q)", q, d, plan)
			}
		}
	}
}

// TestReservedCounterOnOldDatabase: a database made before the kv_reserved
// counter and the (last_used, id) index gets both when a master opens it,
// and the counter is exact (the invariants, with
// GD2FS_META_INVARIANTS=1, then check it after every transaction).
func TestReservedCounterOnOldDatabase(t *testing.T) {
	ctx := context.Background()
	dsn := "sqlite://" + filepath.Join(t.TempDir(), "meta.db")
	st, err := Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	s := st.(*sqlStore)
	if err := s.PutLayout(ctx, llama); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b"} {
		if _, err := s.PlanSession(ctx, planIn(id, 40)); err != nil {
			t.Fatal(err)
		}
	}
	// As an earlier version left it.
	for _, q := range []string{`DROP INDEX kv_sessions_lru_id`, `CREATE INDEX kv_sessions_lru ON kv_sessions (last_used)`, `DELETE FROM counters WHERE k = 'kv_reserved'`} {
		if _, err := s.db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	st, err = Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s = leading(t, st).(*sqlStore)
	var counted, summed int64
	var oldIndex, newIndex int
	if err := s.db.QueryRowContext(ctx, `SELECT (SELECT v FROM counters WHERE k = 'kv_reserved'), (SELECT SUM(reserved) FROM kv_files),
		(SELECT COUNT(*) FROM sqlite_master WHERE name = 'kv_sessions_lru'), (SELECT COUNT(*) FROM sqlite_master WHERE name = 'kv_sessions_lru_id')`).
		Scan(&counted, &summed, &oldIndex, &newIndex); err != nil {
		t.Fatal(err)
	}
	if counted != summed || summed == 0 || oldIndex != 0 || newIndex != 1 {
		t.Fatalf("kv_reserved %d for %d reserved; old index %d, new %d", counted, summed, oldIndex, newIndex)
	}
}

// TestDeletedSessionLeavesNoDir: a session's directory (made by its first
// plan) goes with its last file, when the session is deleted or evicted
// and no fork still holds a file there; under a quota's churn of new
// session ids it was left behind, one row of dirs per session ever made.
func TestDeletedSessionLeavesNoDir(t *testing.T) {
	for name, open := range engines(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			s := open(t)
			if err := s.PutLayout(ctx, llama); err != nil {
				t.Fatal(err)
			}
			for _, id := range []string{"a", "b"} {
				p, err := s.PlanSession(ctx, planIn(id, 40))
				if err != nil {
					t.Fatal(err)
				}
				written(t, s, p)
				if _, err := s.CommitSession(ctx, CommitInput{Session: id, PlanID: p.ID, Now: now}); err != nil {
					t.Fatal(err)
				}
			}
			isDir := func(id string, want bool) {
				t.Helper()
				if ok, err := s.IsDir(ctx, "/kv-sessions/"+id); err != nil || ok != want {
					t.Fatalf("directory of %s: %v %v, want %v", id, ok, err, want)
				}
			}
			isDir("a", true)
			if err := s.ForkSession(ctx, "a", "fork", "", now); err != nil {
				t.Fatal(err)
			}
			if err := s.DeleteSession(ctx, "a"); err != nil {
				t.Fatal(err)
			}
			isDir("a", true) // its file passed to the fork
			if err := s.DeleteSession(ctx, "fork"); err != nil {
				t.Fatal(err)
			}
			isDir("a", false)
			// Evicted under the quota.
			b, err := s.Session(ctx, "b")
			if err != nil {
				t.Fatal(err)
			}
			in := planIn("c", 40)
			in.Quota = b.Bytes // room for c's 40 tokens alone
			p, err := s.PlanSession(ctx, in)
			if err != nil || len(p.Evicted) != 1 || p.Evicted[0] != "b" {
				t.Fatalf("evicted %v: %v", p.Evicted, err)
			}
			isDir("b", false)
			isDir("c", true)
		})
	}
}
