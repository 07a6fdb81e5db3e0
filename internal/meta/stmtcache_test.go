package meta

import (
	"context"
	"path/filepath"
	"testing"
)

// TestStmtCache: a kept statement gives the right rows on every reuse, the
// same query run again while its rows are still open (a nested loop) runs
// uncached and both read correctly, a failed statement leaves the kept one
// usable, and a multi-statement Exec still runs every statement.
func TestStmtCache(t *testing.T) {
	ctx := context.Background()
	db, err := openSQLiteCached("file:" + filepath.Join(t.TempDir(), "c.db") + "?_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	if _, err := db.ExecContext(ctx, `CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 50; i++ {
		if _, err := db.ExecContext(ctx, `INSERT INTO t (k, v) VALUES (?, ?)`, i, string(rune('a'+i%26))); err != nil {
			t.Fatal(err)
		}
	}
	// Duplicate key: an error, then the kept INSERT still works.
	if _, err := db.ExecContext(ctx, `INSERT INTO t (k, v) VALUES (?, ?)`, 3, "x"); err == nil {
		t.Fatal("duplicate key accepted")
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO t (k, v) VALUES (?, ?)`, 50, "y"); err != nil {
		t.Fatalf("the kept statement after an error: %v", err)
	}
	const q = `SELECT k, v FROM t WHERE k >= ? ORDER BY k LIMIT 3`
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	outer, err := tx.QueryContext(ctx, q, 10)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for outer.Next() {
		var k int
		var v string
		if err := outer.Scan(&k, &v); err != nil {
			t.Fatal(err)
		}
		if k != 10+n || v != string(rune('a'+k%26)) {
			t.Fatalf("outer row %d: %d %q", n, k, v)
		}
		var k2 int
		if err := tx.QueryRowContext(ctx, q, 40+n).Scan(&k2, &v); err != nil || k2 != 40+n {
			t.Fatalf("nested run of the same query: %d, %v", k2, err)
		}
		n++
	}
	if err := outer.Err(); err != nil || n != 3 {
		t.Fatalf("outer: %d rows, %v", n, err)
	}
	outer.Close()
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ { // reuse, rows drained and closed each time
		var k int
		var v string
		if err := db.QueryRowContext(ctx, q, i).Scan(&k, &v); err != nil || k != i {
			t.Fatalf("reuse %d: %d, %v", i, k, err)
		}
	}
	if _, err := db.ExecContext(ctx, `UPDATE t SET v = 'p' WHERE k = 1; UPDATE t SET v = 'q' WHERE k = 2`); err != nil {
		t.Fatal(err)
	}
	var v1, v2 string
	if err := db.QueryRowContext(ctx, `SELECT (SELECT v FROM t WHERE k = ?), (SELECT v FROM t WHERE k = ?)`, 1, 2).Scan(&v1, &v2); err != nil || v1 != "p" || v2 != "q" {
		t.Fatalf("multi-statement exec: %q %q %v", v1, v2, err)
	}
}
