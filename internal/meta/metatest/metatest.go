// Package metatest gives tests a fresh PostgreSQL schema (scripts/test.sh
// starts the server and sets GD2FS_TEST_POSTGRES).
package metatest

import (
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"
)

// PostgresDSN creates a fresh schema in the test PostgreSQL and returns a
// DSN that uses it; the schema is dropped when the test ends. Without
// GD2FS_TEST_POSTGRES the test is skipped, or fails when
// GD2FS_REQUIRE_POSTGRES=1.
func PostgresDSN(t testing.TB) string {
	dsn := os.Getenv("GD2FS_TEST_POSTGRES")
	if dsn == "" {
		if os.Getenv("GD2FS_REQUIRE_POSTGRES") == "1" {
			t.Fatal("GD2FS_TEST_POSTGRES is not set: run the tests with scripts/test.sh")
		}
		t.Skip("GD2FS_TEST_POSTGRES not set; scripts/test.sh starts PostgreSQL and sets it")
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	schema := fmt.Sprintf("t_%d_%d", time.Now().UnixNano(), rand.IntN(1e6))
	if _, err := db.Exec("CREATE SCHEMA " + schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		db.Exec("DROP SCHEMA " + schema + " CASCADE")
		db.Close()
	})
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return dsn + sep + "search_path=" + schema
}
