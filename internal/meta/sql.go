package meta

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"
	_ "modernc.org/sqlite"             // registers "sqlite"
)

type sqlStore struct {
	db       *sql.DB
	postgres bool
	lead     leadership
	// checks runs invariantsTx before every commit (GD2FS_META_INVARIANTS=1;
	// the test suite sets it).
	checks bool
	// group batches session transactions into one SQL transaction
	// (groupcommit.go).
	group groupCommit
	// cache is the session table in the leader's memory (cache.go), used
	// only by the runner of group transactions; leadTerm is the lead term
	// this store took the lead under (0: it does not lead).
	cache    sessionCache
	leadTerm atomic.Int64
	// memCap bounds the bytes of sessions the leader keeps in memory
	// (SetSessionMemory; 0: no bound).
	memCap int64
	// wb answers session operations from the cache and writes them to SQL
	// behind (writebehind.go).
	wb writeBehind
	// ckpt runs SQLite's WAL checkpoints beside the writer (checkpoint.go);
	// nil on PostgreSQL.
	ckpt *checkpointer
}

// Open opens the store named by dsn:
//
//	sqlite:///var/lib/gd2fs/meta.db   (a file; its directory must exist)
//	postgres://user:pass@host:5432/db (also postgresql://)
func Open(ctx context.Context, dsn string) (Store, error) {
	var s sqlStore
	var err error
	s.checks = os.Getenv("GD2FS_META_INVARIANTS") == "1"
	s.wb.mode = DurabilityFlush
	switch {
	case strings.HasPrefix(dsn, "sqlite://"):
		file := strings.TrimPrefix(dsn, "sqlite://")
		// synchronous(FULL), the default: each commit fsyncs the WAL, so
		// a file the client saw committed is still known after a power
		// loss. ?synchronous=normal trades that for fewer fsyncs (commits
		// survive a crash of the process, not of the machine; plans are
		// about twice as fast on a slow disk): docs/architecture.md,
		// "Durability".
		syncMode := "FULL"
		if base, q, ok := strings.Cut(file, "?"); ok {
			switch q {
			case "synchronous=full":
			case "synchronous=normal":
				syncMode = "NORMAL"
			default:
				return nil, errs.New(errs.ErrBadRequest, "meta: sqlite DSN option %q: the only one is synchronous=full (the default) or synchronous=normal", q)
			}
			file = base
		}
		if file == "" {
			return nil, errs.New(errs.ErrBadRequest, "meta: sqlite DSN needs a file: sqlite:///path/to/meta.db")
		}
		s.lead.file = file
		if err := createPrivate(file); err != nil {
			return nil, err
		}
		// cache_size: a 64 MiB page cache (SQLite's default is 2 MB) keeps
		// the tables' inner pages and hot rows of a leader's flushes in
		// memory; wal_autocheckpoint: a checkpoint inside a commit only
		// past 65,536 pages (256 MiB of WAL), a bound the checkpointer
		// (checkpoint.go), which copies beside the writer and starts the
		// WAL again about once a second, keeps far from. SQLite's 1,000
		// copied a page once that many flushes dirtied; on this VM, where
		// a system call is dear, 16,384 and the cache cut a chat turn's
		// master system calls from about 50 to 33 (docs/kv-cache.md, "What
		// a flush costs").
		s.db, err = openSQLiteCached("file:" + file + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_pragma=synchronous(" + syncMode + ")&_pragma=foreign_keys(ON)" + sqliteCachePragmas)
		if err == nil {
			// One connection: SQLite serialises writers anyway, and this
			// keeps transactions from failing with SQLITE_BUSY.
			s.db.SetMaxOpenConns(1)
			s.ckpt = newCheckpointer("file:" + file + "?_pragma=busy_timeout(10000)&_pragma=synchronous(" + syncMode + ")")
		}
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		s.postgres = true
		s.db, err = sql.Open("pgx", dsn)
		if err == nil {
			// As many idle connections kept as may be open: database/sql
			// keeps two by default, so under load every third concurrent
			// query closed its connection after use and the next opened
			// one (a backend forked by the server, pgx's statements
			// prepared again on it). One idle for minutes is closed: a
			// quiet standby's, or one left on a server that is now a
			// read-only replica behind the same address; a leader's are
			// never idle that long.
			s.db.SetMaxOpenConns(pgConns)
			s.db.SetMaxIdleConns(pgConns)
			s.db.SetConnMaxIdleTime(5 * time.Minute)
		}
	default:
		return nil, errs.New(errs.ErrBadRequest, "meta: unknown DSN %q: use sqlite:///path/meta.db or postgres://user@host/db", dsn)
	}
	if err != nil {
		return nil, fmt.Errorf("meta: open %s: %w", redact(dsn), err)
	}
	if err := s.migrate(ctx); err != nil {
		s.db.Close()
		return nil, fmt.Errorf("meta: prepare schema in %s: %w", redact(dsn), err)
	}
	if err := s.checkFormat(ctx); err != nil {
		s.db.Close()
		return nil, fmt.Errorf("%s: %w", redact(dsn), err)
	}
	return &s, nil
}

// pgConns bounds a master's connections to PostgreSQL.
const pgConns = 16

// sqliteCachePragmas size SQLite's page cache and WAL (above).
const sqliteCachePragmas = "&_pragma=cache_size(-65536)&_pragma=wal_autocheckpoint(65536)"

func redact(dsn string) string {
	if i := strings.Index(dsn, "@"); i > 0 {
		if j := strings.Index(dsn, "://"); j > 0 && j < i {
			return dsn[:j+3] + "…" + dsn[i:]
		}
	}
	return dsn
}

var schema = []string{
	`CREATE TABLE IF NOT EXISTS counters (k TEXT PRIMARY KEY, v BIGINT NOT NULL)`,
	`INSERT INTO counters (k, v) VALUES ('epoch', 1) ON CONFLICT (k) DO NOTHING`,
	`INSERT INTO counters (k, v) VALUES ('next_id', 0) ON CONFLICT (k) DO NOTHING`,
	// lead_term counts the times a master took the lead; sessions_gen the
	// session batches written without the leader's cache (cache.go).
	`INSERT INTO counters (k, v) VALUES ('lead_term', 0) ON CONFLICT (k) DO NOTHING`,
	`INSERT INTO counters (k, v) VALUES ('sessions_gen', 0) ON CONFLICT (k) DO NOTHING`,
	`CREATE TABLE IF NOT EXISTS cluster_info (k TEXT PRIMARY KEY, v TEXT NOT NULL)`,
	`CREATE TABLE IF NOT EXISTS servers (id TEXT PRIMARY KEY, addr TEXT NOT NULL, mem_cap BIGINT NOT NULL, disk_cap BIGINT NOT NULL)`,
	`CREATE TABLE IF NOT EXISTS pools (name TEXT PRIMARY KEY, replicas INTEGER NOT NULL)`,
	`CREATE TABLE IF NOT EXISTS dirs (path TEXT PRIMARY KEY, parent TEXT NOT NULL, mtime BIGINT NOT NULL)`,
	`CREATE INDEX IF NOT EXISTS dirs_parent ON dirs (parent)`,
	`CREATE TABLE IF NOT EXISTS files (id BIGINT PRIMARY KEY, path TEXT NOT NULL UNIQUE, parent TEXT NOT NULL,
		pool TEXT NOT NULL, chunk_size BIGINT NOT NULL, size BIGINT NOT NULL, sealed INTEGER NOT NULL, mtime BIGINT NOT NULL)`,
	`CREATE INDEX IF NOT EXISTS files_parent ON files (parent)`,
	// Unsealed files by age, for ExpireUnsealed (few: only files being written).
	`CREATE INDEX IF NOT EXISTS files_unsealed ON files (mtime) WHERE sealed = 0`,
	`CREATE TABLE IF NOT EXISTS chunks (id BIGINT PRIMARY KEY, file_id BIGINT NOT NULL, idx BIGINT NOT NULL,
		length BIGINT NOT NULL, UNIQUE (file_id, idx))`,
	`CREATE TABLE IF NOT EXISTS replicas (chunk_id BIGINT NOT NULL, pos INTEGER NOT NULL, server_id TEXT NOT NULL,
		PRIMARY KEY (chunk_id, server_id))`,
	`CREATE INDEX IF NOT EXISTS replicas_server ON replicas (server_id)`,
	`CREATE TABLE IF NOT EXISTS file_attrs (path TEXT NOT NULL, name TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (path, name))`,
	`CREATE TABLE IF NOT EXISTS tombstones (chunk_id BIGINT NOT NULL, server_id TEXT NOT NULL, PRIMARY KEY (chunk_id, server_id))`,
}

func (s *sqlStore) migrate(ctx context.Context) error {
	schema := append(append([]string{}, schema...), sessionSchema...)
	if s.postgres {
		// A deadlock with a running leader's transactions is still possible
		// when something must be created; it is retried.
		var err error
		for attempt := 0; attempt < 5; attempt++ {
			if err = s.migratePostgres(ctx, schema); err == nil || !isDeadlock(err) || ctx.Err() != nil {
				return err
			}
			time.Sleep(time.Duration(attempt+1) * 200 * time.Millisecond)
		}
		return err
	}
	for _, q := range schema {
		if _, err := s.db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	if err := s.addColumns(ctx, s.db); err != nil {
		return err
	}
	if err := s.addReservedCounter(ctx, s.db); err != nil {
		return fmt.Errorf("count kv_reserved: %w", err)
	}
	return nil
}

// migratePostgres creates what schema lacks, in one transaction under an
// advisory lock (several masters may start at once). Objects that exist are
// skipped, not re-created with IF NOT EXISTS: CREATE INDEX takes a share
// lock on its table before it finds the index there, and a master started
// beside a busy leader deadlocked with the leader's writes (the chaos
// harness found it: the restarted master exited, leaving no standby).
func (s *sqlStore) migratePostgres(ctx context.Context, schema []string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext(current_schema()), 7070001)`); err != nil {
		return err
	}
	for _, q := range schema {
		if name, ok := strings.CutPrefix(q, "DROP INDEX IF EXISTS "); ok {
			// Dropped once; looked up first, for the same reason.
			var exists bool
			if err := tx.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&exists); err != nil {
				return fmt.Errorf("look up %s: %w", name, err)
			}
			if !exists {
				continue
			}
		}
		if name := createdName(q); name != "" {
			var exists bool
			if err := tx.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&exists); err != nil {
				return fmt.Errorf("look up %s: %w", name, err)
			}
			if exists {
				continue
			}
		}
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	if err := s.addColumns(ctx, tx); err != nil {
		return err
	}
	if err := s.addReservedCounter(ctx, tx); err != nil {
		return fmt.Errorf("count kv_reserved: %w", err)
	}
	return tx.Commit()
}

// createdName is the table or index a CREATE ... IF NOT EXISTS statement
// makes ("" for any other statement).
func createdName(q string) string {
	f := strings.Fields(q)
	for i := 0; i+3 < len(f); i++ {
		if f[i] == "IF" && f[i+1] == "NOT" && f[i+2] == "EXISTS" {
			name, _, _ := strings.Cut(f[i+3], "(")
			return name
		}
	}
	return ""
}

// isDeadlock: PostgreSQL aborted the transaction to break a deadlock.
func isDeadlock(err error) bool {
	return strings.Contains(err.Error(), "40P01") || strings.Contains(err.Error(), "deadlock detected")
}

// addColumns adds the columns of sessionColumns that a database made by an
// earlier version lacks.
func (s *sqlStore) addColumns(ctx context.Context, x execer) error {
	for _, c := range sessionColumns {
		var n int
		q := `SELECT COUNT(*) FROM pragma_table_info(?) WHERE name = ?`
		if s.postgres {
			q = `SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = ? AND column_name = ?`
		}
		if err := x.QueryRowContext(ctx, s.q(q), c.table, c.column).Scan(&n); err != nil {
			return fmt.Errorf("columns of %s: %w", c.table, err)
		}
		if n == 0 {
			if _, err := x.ExecContext(ctx, fmt.Sprintf(`ALTER TABLE %s ADD COLUMN %s %s`, c.table, c.column, c.ddl)); err != nil {
				return fmt.Errorf("add %s.%s: %w", c.table, c.column, err)
			}
		}
	}
	return nil
}

func (s *sqlStore) Close() error {
	// What was answered from memory is written before the lead goes, at
	// once: no paced flush is waited for, and none is armed after.
	s.stopPace()
	s.barrier(context.Background()) //nolint:errcheck // a failed write is what a crash would lose
	s.lead.release()
	s.leadTerm.Store(0)
	s.ckpt.close()
	return s.db.Close()
}

// q rewrites ? placeholders to $n for PostgreSQL.
func (s *sqlStore) q(query string) string {
	if !s.postgres {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// queryStrings runs a query of one text column (placeholders as ?) and
// returns its values in order.
func (s *sqlStore) queryStrings(ctx context.Context, x execer, query string, args ...any) ([]string, error) {
	rows, err := x.QueryContext(ctx, s.q(query), args...)
	if err != nil {
		return nil, wrapDB(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			return nil, wrapDB(err)
		}
		out = append(out, v)
	}
	return out, wrapDB(rows.Err())
}

func (s *sqlStore) tx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return wrapDB(err)
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return wrapDB(err)
	}
	if s.checks {
		return s.checkInvariants(ctx)
	}
	return nil
}

// lockedTx is tx with the sessions lock taken first (lockSessions): for
// the transactions that change sessions, names or attributes.
func (s *sqlStore) lockedTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		if err := s.lockSessions(ctx, tx); err != nil {
			return err
		}
		return fn(tx)
	})
}

func wrapDB(err error) error {
	if err == nil {
		return nil
	}
	var e *errs.Error
	if errors.As(err, &e) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return errs.New(errs.ErrUnavailable, "metadata database: %w", err)
}

// lockIDs takes the row lock of the next_id counter until the transaction
// ends (PostgreSQL; SQLite runs one transaction at a time). Every chunk
// allocation takes it anyway, when it draws an id; AddChunks and a file's
// removal take it first, so that on PostgreSQL, under READ COMMITTED, each
// sees what the other committed: two allocations of one chunk both found
// it missing and the second failed on the unique index, and an allocation
// beside a removal left chunks of no file (TestNamespaceRaces). Taken
// after the sessions lock where a transaction holds both, never before.
func (s *sqlStore) lockIDs(ctx context.Context, tx *sql.Tx) error {
	if !s.postgres {
		return nil
	}
	_, err := tx.ExecContext(ctx, `SELECT v FROM counters WHERE k = 'next_id' FOR UPDATE`)
	return wrapDB(err)
}

func (s *sqlStore) counter(ctx context.Context, x execer, k string, add int64) (int64, error) {
	var v int64
	err := x.QueryRowContext(ctx, s.q(`UPDATE counters SET v = v + ? WHERE k = ? RETURNING v`), add, k).Scan(&v)
	return v, wrapDB(err)
}

func (s *sqlStore) Epoch(ctx context.Context) (int64, error) {
	var v int64
	err := s.db.QueryRowContext(ctx, s.q(`SELECT v FROM counters WHERE k = ?`), "epoch").Scan(&v)
	return v, wrapDB(err)
}

func (s *sqlStore) BumpEpoch(ctx context.Context) (int64, error) {
	return s.counter(ctx, s.db, "epoch", 1)
}

func (s *sqlStore) PutServer(ctx context.Context, sv Server) error {
	if err := checkServer(sv); err != nil {
		return err
	}
	_, err := s.db.ExecContext(ctx, s.q(`INSERT INTO servers (id, addr, mem_cap, disk_cap) VALUES (?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET addr = excluded.addr, mem_cap = excluded.mem_cap, disk_cap = excluded.disk_cap`),
		sv.ID, sv.Addr, sv.MemCap, sv.DiskCap)
	return wrapDB(err)
}

func (s *sqlStore) Servers(ctx context.Context) ([]Server, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, addr, mem_cap, disk_cap FROM servers ORDER BY id`)
	if err != nil {
		return nil, wrapDB(err)
	}
	defer rows.Close()
	var out []Server
	for rows.Next() {
		var sv Server
		if err := rows.Scan(&sv.ID, &sv.Addr, &sv.MemCap, &sv.DiskCap); err != nil {
			return nil, wrapDB(err)
		}
		out = append(out, sv)
	}
	return out, wrapDB(rows.Err())
}

func (s *sqlStore) PutPool(ctx context.Context, p Pool) error {
	if err := checkText("pool name", p.Name); err != nil {
		return err
	}
	if p.Name == "" || p.Replicas < 1 {
		return errs.New(errs.ErrBadRequest, "meta: pool needs a name and at least 1 replica")
	}
	_, err := s.db.ExecContext(ctx, s.q(`INSERT INTO pools (name, replicas) VALUES (?, ?)
		ON CONFLICT (name) DO UPDATE SET replicas = excluded.replicas`), p.Name, p.Replicas)
	return wrapDB(err)
}

func (s *sqlStore) Pools(ctx context.Context) ([]Pool, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT name, replicas FROM pools ORDER BY name`)
	if err != nil {
		return nil, wrapDB(err)
	}
	defer rows.Close()
	var out []Pool
	for rows.Next() {
		var p Pool
		if err := rows.Scan(&p.Name, &p.Replicas); err != nil {
			return nil, wrapDB(err)
		}
		out = append(out, p)
	}
	return out, wrapDB(rows.Err())
}

func parentOf(p string) string { return path.Dir(p) }

// dirsAbove is every directory above p, the nearest first, "/" left out.
func dirsAbove(p string) []string {
	var dirs []string
	for d := parentOf(p); d != "/" && d != "."; d = parentOf(d) {
		dirs = append(dirs, d)
	}
	return dirs
}

// placeholders is "?, ?, ..." for n values (an IN list).
func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

// ensureDirs creates every ancestor directory of p (p itself too when self).
func (s *sqlStore) ensureDirs(ctx context.Context, x execer, p string, self bool, now time.Time) error {
	dirs := dirsAbove(p)
	if self && p != "/" {
		dirs = append([]string{p}, dirs...)
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		var n int
		if err := x.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM files WHERE path = ?`), dirs[i]).Scan(&n); err != nil {
			return wrapDB(err)
		}
		if n > 0 {
			return errs.New(errs.ErrNotDir, "%s is a file, so it cannot hold %s", dirs[i], p)
		}
		if _, err := x.ExecContext(ctx, s.q(`INSERT INTO dirs (path, parent, mtime) VALUES (?, ?, ?) ON CONFLICT (path) DO NOTHING`),
			dirs[i], parentOf(dirs[i]), now.UnixNano()); err != nil {
			return wrapDB(err)
		}
	}
	return nil
}

func (s *sqlStore) Mkdir(ctx context.Context, p string, now time.Time) error {
	return s.lockedTx(ctx, func(tx *sql.Tx) error {
		return s.ensureDirs(ctx, tx, p, true, now)
	})
}

func (s *sqlStore) IsDir(ctx context.Context, p string) (bool, error) {
	if p == "/" {
		return true, nil
	}
	var n int
	err := s.db.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM dirs WHERE path = ?`), p).Scan(&n)
	return n > 0, wrapDB(err)
}

func (s *sqlStore) RemoveDir(ctx context.Context, p string) error {
	if p == "/" {
		return errs.New(errs.ErrBadRequest, "cannot remove the root directory")
	}
	return s.lockedTx(ctx, func(tx *sql.Tx) error {
		var n int
		if err := tx.QueryRowContext(ctx, s.q(`SELECT (SELECT COUNT(*) FROM dirs WHERE parent = ?) + (SELECT COUNT(*) FROM files WHERE parent = ?)`), p, p).Scan(&n); err != nil {
			return wrapDB(err)
		}
		if n > 0 {
			return errs.New(errs.ErrNotEmpty, "directory %s is not empty: remove its %d entries first", p, n)
		}
		r, err := tx.ExecContext(ctx, s.q(`DELETE FROM dirs WHERE path = ?`), p)
		if err != nil {
			return wrapDB(err)
		}
		if k, _ := r.RowsAffected(); k == 0 {
			return errs.New(errs.ErrNotFound, "no directory %s", p)
		}
		return nil
	})
}

func (s *sqlStore) CreateFile(ctx context.Context, f File) (File, error) {
	if err := checkText("file", f.Path, f.Pool, f.CreateID); err != nil {
		return File{}, err
	}
	err := s.lockedTx(ctx, func(tx *sql.Tx) error {
		var err error
		f, err = s.createFileTx(ctx, tx, f)
		return err
	})
	return f, err
}

// createFileTx creates f (and its parent directories) inside tx.
func (s *sqlStore) createFileTx(ctx context.Context, tx *sql.Tx, f File) (File, error) {
	if f.Path == "/" {
		return File{}, errs.New(errs.ErrIsDir, "/ is a directory")
	}
	var n int
	if err := tx.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM dirs WHERE path = ?`), f.Path).Scan(&n); err != nil {
		return File{}, wrapDB(err)
	}
	if n > 0 {
		return File{}, errs.New(errs.ErrIsDir, "%s is a directory", f.Path)
	}
	if err := s.ensureDirs(ctx, tx, f.Path, false, f.Modified); err != nil {
		return File{}, err
	}
	id, err := s.counter(ctx, tx, "next_id", 1)
	if err != nil {
		return File{}, err
	}
	r, err := tx.ExecContext(ctx, s.q(`INSERT INTO files (id, path, parent, pool, chunk_size, size, sealed, mtime)
		VALUES (?, ?, ?, ?, ?, 0, 0, ?) ON CONFLICT (path) DO NOTHING`),
		id, f.Path, parentOf(f.Path), f.Pool, f.ChunkSize, f.Modified.UnixNano())
	if err != nil {
		return File{}, wrapDB(err)
	}
	if k, _ := r.RowsAffected(); k == 0 {
		return File{}, errs.New(errs.ErrExists, "%s already exists: remove it first or pick another name", f.Path)
	}
	if f.CreateID != "" {
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO file_attrs (path, name, value) VALUES (?, ?, ?)
			ON CONFLICT (path, name) DO UPDATE SET value = excluded.value`), f.Path, CreateIDAttr, f.CreateID); err != nil {
			return File{}, wrapDB(err)
		}
	}
	f.ID = id
	return f, nil
}

const fileCols = `id, path, pool, chunk_size, size, sealed, mtime`

func scanFile(sc interface{ Scan(...any) error }) (File, error) {
	var f File
	var sealed int
	var mt int64
	err := sc.Scan(&f.ID, &f.Path, &f.Pool, &f.ChunkSize, &f.Size, &sealed, &mt)
	f.Sealed = sealed != 0
	f.Modified = time.Unix(0, mt).UTC()
	return f, err
}

func (s *sqlStore) fileBy(ctx context.Context, x execer, col string, v any) (File, error) {
	f, err := scanFile(x.QueryRowContext(ctx, s.q(`SELECT `+fileCols+` FROM files WHERE `+col+` = ?`), v))
	if errors.Is(err, sql.ErrNoRows) {
		return File{}, errs.New(errs.ErrNotFound, "no such file: %v", v)
	}
	return f, wrapDB(err)
}

func (s *sqlStore) File(ctx context.Context, p string) (File, error) {
	if err := s.barrier(ctx); err != nil { // writebehind.go: a size a commit grew
		return File{}, err
	}
	f, err := s.fileBy(ctx, s.db, "path", p)
	if errors.Is(err, errs.ErrNotFound) {
		if dir, _ := s.IsDir(ctx, p); dir {
			return File{}, errs.New(errs.ErrIsDir, "%s is a directory", p)
		}
	}
	return f, err
}

func (s *sqlStore) List(ctx context.Context, dir string) ([]Entry, error) {
	if ok, err := s.IsDir(ctx, dir); err != nil {
		return nil, err
	} else if !ok {
		if _, err := s.File(ctx, dir); err == nil {
			return nil, errs.New(errs.ErrNotDir, "%s is a file", dir)
		}
		return nil, errs.New(errs.ErrNotFound, "no such directory: %s", dir)
	}
	var out []Entry
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT path FROM dirs WHERE parent = ? AND path <> '/'`), dir)
	if err != nil {
		return nil, wrapDB(err)
	}
	for rows.Next() {
		var e Entry
		if err := rows.Scan(&e.Path); err != nil {
			rows.Close()
			return nil, wrapDB(err)
		}
		e.IsDir = true
		out = append(out, e)
	}
	rows.Close()
	rows, err = s.db.QueryContext(ctx, s.q(`SELECT `+fileCols+` FROM files WHERE parent = ?`), dir)
	if err != nil {
		return nil, wrapDB(err)
	}
	defer rows.Close()
	for rows.Next() {
		f, err := scanFile(rows)
		if err != nil {
			return nil, wrapDB(err)
		}
		out = append(out, Entry{Path: f.Path, File: f})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, wrapDB(rows.Err())
}

func (s *sqlStore) RemoveFile(ctx context.Context, p string) error {
	err := s.lockedTx(ctx, func(tx *sql.Tx) error {
		if err := s.removableTx(ctx, tx, p); err != nil {
			return err
		}
		var n int
		if err := tx.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM kv_prefixes WHERE path = ?`), p).Scan(&n); err != nil {
			return wrapDB(err)
		}
		if n > 0 {
			return errPrefixFile
		}
		return s.removeFileTx(ctx, tx, p)
	})
	if errors.Is(err, errPrefixFile) {
		// A shared prefix goes in the group transaction, after the
		// leader's log: a session made in memory from it (writebehind.go,
		// newSessionMem) is in SQL before removableTx looks, so a prefix a
		// plan already named is not removed; and absentGen moves, so a
		// first plan that read the prefix before this removal runs in SQL,
		// which refuses it. (Other files stay out of the group transaction:
		// a large file's removal would hold up every plan answered from
		// memory. A file registered as a prefix after the check above is
		// not removed: PutPrefix and this transaction both take the
		// sessions lock.)
		caller := ctx
		ctx = context.WithoutCancel(ctx)
		err = s.groupTx(caller, func(tx *sql.Tx) error {
			s.cache.absentGen++
			s.forgetLocked(func(f *cachedFile) bool { return f.file.Path == p })
			if err := s.removableTx(ctx, tx, p); err != nil {
				return err
			}
			// A shared prefix no session uses goes with its file, so no
			// later session starts from KV that is gone.
			return s.removeFileTx(ctx, tx, p)
		})
	}
	if err == nil {
		s.forgetFiles(func(f *cachedFile) bool { return f.file.Path == p })
	}
	return err
}

// errPrefixFile sends RemoveFile of a registered prefix to the group
// transaction.
var errPrefixFile = errors.New("meta: a registered prefix's file")

// removableTx refuses file p while a KV session uses it.
func (s *sqlStore) removableTx(ctx context.Context, tx *sql.Tx, p string) error {
	if by, err := s.inUseTx(ctx, tx, p); err != nil {
		return err
	} else if by != "" {
		return errs.New(errs.ErrExists, "%s is in use by KV session %q: delete the session first (gd2fs session rm)", p, by)
	}
	return nil
}

// removeFileTx deletes file p and records a tombstone for every replica of
// its chunks, inside tx.
func (s *sqlStore) removeFileTx(ctx context.Context, tx *sql.Tx, p string) error {
	if err := s.lockIDs(ctx, tx); err != nil { // before its chunks are read: AddChunks
		return err
	}
	f, err := s.fileBy(ctx, tx, "path", p)
	if err != nil {
		return err
	}
	stmts := []string{
		`INSERT INTO tombstones (chunk_id, server_id) SELECT r.chunk_id, r.server_id FROM replicas r
			JOIN chunks c ON c.id = r.chunk_id WHERE c.file_id = ? ON CONFLICT DO NOTHING`,
		`DELETE FROM replicas WHERE chunk_id IN (SELECT id FROM chunks WHERE file_id = ?)`,
		`DELETE FROM chunks WHERE file_id = ?`,
		`DELETE FROM files WHERE id = ?`,
	}
	for _, q := range stmts {
		if _, err := tx.ExecContext(ctx, s.q(q), f.ID); err != nil {
			return wrapDB(err)
		}
	}
	for _, q := range []string{`DELETE FROM kv_prefixes WHERE path = ?`, `DELETE FROM file_attrs WHERE path = ?`} {
		if _, err := tx.ExecContext(ctx, s.q(q), p); err != nil {
			return wrapDB(err)
		}
	}
	return nil
}

// SetAttrs sets (or, with an empty value, removes) attributes of file p.
func (s *sqlStore) SetAttrs(ctx context.Context, p string, attrs map[string]string) error {
	if err := checkAttrs(attrs); err != nil {
		return err
	}
	// Under the sessions lock: attributes are kept by path, so one set while
	// the file is removed or renamed would stay on its old path, for the
	// next file there.
	return s.lockedTx(ctx, func(tx *sql.Tx) error {
		if _, err := s.fileBy(ctx, tx, "path", p); err != nil {
			return err
		}
		for k, v := range attrs {
			var err error
			if v == "" {
				_, err = tx.ExecContext(ctx, s.q(`DELETE FROM file_attrs WHERE path = ? AND name = ?`), p, k)
			} else {
				_, err = tx.ExecContext(ctx, s.q(`INSERT INTO file_attrs (path, name, value) VALUES (?, ?, ?)
					ON CONFLICT (path, name) DO UPDATE SET value = excluded.value`), p, k, v)
			}
			if err != nil {
				return wrapDB(err)
			}
		}
		return nil
	})
}

// Attrs returns the attributes of file p (empty when it has none).
func (s *sqlStore) Attrs(ctx context.Context, p string) (map[string]string, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT name, value FROM file_attrs WHERE path = ?`), p)
	if err != nil {
		return nil, wrapDB(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return nil, wrapDB(err)
		}
		out[k] = v
	}
	return out, wrapDB(rows.Err())
}

func (s *sqlStore) Commit(ctx context.Context, fileID int64, size int64, lengths map[int64]int64, seal bool, now time.Time) (File, error) {
	var f File
	if err := CheckSize(size); err != nil {
		return f, err
	}
	// In window mode a chunk a plan allocated in memory (writebehind.go,
	// allocMem) may not be in SQL yet, and its length UPDATE below would
	// match no row: wait for every answered operation, as File does. A
	// seal also keeps the file out of memory until its transaction ends
	// (wb.sealing: no slow operation loads it meanwhile), forgets it and
	// waits in any mode: a session commit memory answered on it, written
	// after the seal, would grow a sealed file.
	wait := s.barrier
	if seal {
		s.wb.mu.Lock()
		if s.wb.sealing == nil {
			s.wb.sealing = map[int64]int{}
		}
		s.wb.sealing[fileID]++
		s.wb.mu.Unlock()
		defer func() {
			s.wb.mu.Lock()
			if s.wb.sealing[fileID]--; s.wb.sealing[fileID] <= 0 {
				delete(s.wb.sealing, fileID)
			}
			s.wb.mu.Unlock()
		}()
		wait = func(ctx context.Context) error {
			return s.waitPending(ctx, func(c *cachedFile) bool { return c.file.ID == fileID })
		}
	}
	if err := wait(ctx); err != nil {
		return f, err
	}
	if h := sealHook.Load(); h != nil && seal {
		(*h)()
	}
	err := s.tx(ctx, func(tx *sql.Tx) error {
		var err error
		if f, err = s.fileBy(ctx, tx, "id", fileID); err != nil {
			return err
		}
		if f.Sealed {
			return errs.New(errs.ErrSealed, "%s is sealed", f.Path)
		}
		for idx, l := range lengths {
			if l < 0 || l > f.ChunkSize {
				return errs.New(errs.ErrBadRequest, "chunk %d length %d outside [0, %d]", idx, l, f.ChunkSize)
			}
			if _, err := tx.ExecContext(ctx, s.q(`UPDATE chunks SET length = ? WHERE file_id = ? AND idx = ? AND length < ?`), l, fileID, idx, l); err != nil {
				return wrapDB(err)
			}
		}
		f.Size = max(f.Size, size)
		f.Sealed = seal
		f.Modified = now
		sealed := 0
		if seal {
			sealed = 1
		}
		// The size only grows, also against a write that committed since
		// it was read above (PostgreSQL: a flush of the leader's log with
		// a Sync answered from memory, syncmem.go): SQL's own is kept when
		// larger, and answered.
		err = tx.QueryRowContext(ctx, s.q(`UPDATE files SET size = CASE WHEN size < ? THEN ? ELSE size END, sealed = ?, mtime = ? WHERE id = ? RETURNING size`),
			f.Size, f.Size, sealed, now.UnixNano(), fileID).Scan(&f.Size)
		return wrapDB(err)
	})
	if err == nil && !seal {
		s.sawSize(f, lengths)
	}
	return f, err
}

// sawSize raises the size of f and the lengths of its chunks in the
// leader's memory (writebehind.go) to what a Sync just committed in SQL: an
// engine's commit, which the memory checks against the file's size, is then
// answered from memory instead of running in SQL because memory had not
// seen the Sync, and a plan's warming (HintChunks) sees the chunks' bytes.
// Memory stays at most SQL (checkFiles), as sizes and lengths only grow; a
// file of another id at that path, a sealed one, and chunks memory does
// not know are left alone.
func (s *sqlStore) sawSize(f File, lengths map[int64]int64) {
	s.wb.mu.Lock()
	defer s.wb.mu.Unlock()
	c, ok := s.cache.files[f.Path]
	if !ok || c.file.ID != f.ID || c.file.Sealed {
		return
	}
	c.file.Size = max(c.file.Size, f.Size)
	for idx, l := range lengths {
		if ch, ok := c.chunks.get(idx); ok && l > ch.Length {
			ch.Length = l
			c.chunks.put(ch)
		}
	}
}

func (s *sqlStore) AddChunks(ctx context.Context, fileID int64, want []Chunk) ([]Chunk, error) {
	// A plan answered from memory may have allocated some of them
	// (writebehind.go, allocMem): wait, in any mode (a flush-mode log may
	// still wait for its flush), until every such chunk is in SQL, so as to
	// see it and not make a second one for its index; and forget the file,
	// so memory makes no chunk in it until a slow operation reloads it
	// from SQL (else a plan could allocate an index inserted here, which
	// would fail its whole flush on UNIQUE (file_id, idx)).
	if err := s.waitPending(ctx, func(f *cachedFile) bool { return f.file.ID == fileID }); err != nil {
		return nil, err
	}
	added := false
	err := s.tx(ctx, func(tx *sql.Tx) error {
		added = false
		if err := s.lockIDs(ctx, tx); err != nil {
			return err
		}
		if _, err := s.fileBy(ctx, tx, "id", fileID); errors.Is(err, errs.ErrNotFound) {
			return errs.New(errs.ErrNotFound, "file %d was removed: its chunks cannot be allocated", fileID)
		} else if err != nil {
			return err
		}
		for _, c := range want {
			var n int
			if err := tx.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM chunks WHERE file_id = ? AND idx = ?`), fileID, c.Index).Scan(&n); err != nil {
				return wrapDB(err)
			}
			if n > 0 {
				continue
			}
			added = true
			id, err := s.counter(ctx, tx, "next_id", 1)
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO chunks (id, file_id, idx, length) VALUES (?, ?, ?, 0)`), id, fileID, c.Index); err != nil {
				return wrapDB(err)
			}
			for pos, sv := range c.Replicas {
				if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO replicas (chunk_id, pos, server_id) VALUES (?, ?, ?)`), id, pos, sv); err != nil {
					return wrapDB(err)
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if added {
		// Memory would otherwise allocate these indexes again for a plan
		// (the flush would then fail on UNIQUE (file_id, idx)).
		s.forgetFiles(func(f *cachedFile) bool { return f.file.ID == fileID })
	}
	all, err := s.Chunks(ctx, fileID)
	if err != nil {
		return nil, err
	}
	asked := map[int64]bool{}
	for _, c := range want {
		asked[c.Index] = true
	}
	out := all[:0]
	for _, c := range all {
		if asked[c.Index] {
			out = append(out, c)
		}
	}
	return out, nil
}

func (s *sqlStore) chunksWhere(ctx context.Context, where string, arg any) ([]Placed, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT c.id, c.file_id, c.idx, c.length, f.pool, r.server_id
		FROM chunks c JOIN files f ON f.id = c.file_id JOIN replicas r ON r.chunk_id = c.id
		WHERE `+where+` ORDER BY c.idx, c.id, r.pos`), arg)
	if err != nil {
		return nil, wrapDB(err)
	}
	defer rows.Close()
	var out []Placed
	for rows.Next() {
		var p Placed
		var sv string
		if err := rows.Scan(&p.ID, &p.FileID, &p.Index, &p.Length, &p.Pool, &sv); err != nil {
			return nil, wrapDB(err)
		}
		if n := len(out); n > 0 && out[n-1].ID == p.ID {
			out[n-1].Replicas = append(out[n-1].Replicas, sv)
			continue
		}
		p.Replicas = []string{sv}
		out = append(out, p)
	}
	return out, wrapDB(rows.Err())
}

func (s *sqlStore) Chunks(ctx context.Context, fileID int64) ([]Chunk, error) {
	if err := s.barrier(ctx); err != nil { // writebehind.go: lengths a commit grew
		return nil, err
	}
	ps, err := s.chunksWhere(ctx, `c.file_id = ?`, fileID)
	out := make([]Chunk, len(ps))
	for i, p := range ps {
		out[i] = p.Chunk
	}
	return out, err
}

func (s *sqlStore) ChunksOn(ctx context.Context, serverID string) ([]Placed, error) {
	// A repair scan must see the chunks plans allocated in memory too
	// (writebehind.go, allocMem): in window mode wait until they are in SQL.
	if err := s.barrier(ctx); err != nil {
		return nil, err
	}
	return s.chunksWhere(ctx, `c.id IN (SELECT chunk_id FROM replicas WHERE server_id = ?)`, serverID)
}

func (s *sqlStore) ReplaceReplica(ctx context.Context, chunkID uint64, old, new string) error {
	missing := false
	err := s.tx(ctx, func(tx *sql.Tx) error {
		missing = false
		// After a removal of the chunk's file, or before it (lockIDs): a
		// removal in between would tombstone the old copy and leave the new.
		if err := s.lockIDs(ctx, tx); err != nil {
			return err
		}
		r, err := tx.ExecContext(ctx, s.q(`UPDATE replicas SET server_id = ? WHERE chunk_id = ? AND server_id = ?`), new, chunkID, old)
		if err != nil {
			return wrapDB(err)
		}
		if k, _ := r.RowsAffected(); k == 0 {
			// The copy new may have just made is recorded nowhere (the
			// chunk's file was removed meanwhile, or another repair moved
			// the replica first): unless new holds a replica of the chunk,
			// it owes a delete, or the copy stays until new restarts and
			// sweeps its orphans.
			if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO tombstones (chunk_id, server_id) SELECT ?, ?
				WHERE NOT EXISTS (SELECT 1 FROM replicas WHERE chunk_id = ? AND server_id = ?) ON CONFLICT DO NOTHING`), chunkID, new, chunkID, new); err != nil {
				return wrapDB(err)
			}
			missing = true // committed: the tombstone stays
			return nil
		}
		// The old server may come back holding a stale copy: it owes a delete.
		if _, err = tx.ExecContext(ctx, s.q(`INSERT INTO tombstones (chunk_id, server_id) VALUES (?, ?) ON CONFLICT DO NOTHING`), chunkID, old); err != nil {
			return wrapDB(err)
		}
		// The new one may owe a delete of this chunk from an earlier move
		// away from it: it holds the chunk again now, so that delete is void.
		_, err = tx.ExecContext(ctx, s.q(`DELETE FROM tombstones WHERE chunk_id = ? AND server_id = ?`), chunkID, new)
		return wrapDB(err)
	})
	if err == nil && missing {
		return errs.New(errs.ErrNotFound, "chunk %d has no replica on %s", chunkID, old)
	}
	if err == nil { // plans answered from memory name the new replica
		s.forgetFiles(func(f *cachedFile) bool {
			for _, c := range f.chunks {
				if c.ID == chunkID {
					return true
				}
			}
			return false
		})
	}
	return err
}

// Orphans records a tombstone for every chunk in held that serverID does
// not hold a replica of (a file removed while the server was away and its
// tombstone lost, or a copy abandoned half-way), and returns how many.
func (s *sqlStore) Orphans(ctx context.Context, serverID string, held []uint64) (int, error) {
	// A chunk a plan allocated in memory (writebehind.go, allocMem) and a
	// client wrote before this server restarted is no orphan: wait until
	// every answered allocation is in SQL.
	if err := s.barrier(ctx); err != nil {
		return 0, err
	}
	n := 0
	err := s.tx(ctx, func(tx *sql.Tx) error {
		n = 0
		for _, id := range held {
			var k int
			if err := tx.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM replicas WHERE chunk_id = ? AND server_id = ?`), id, serverID).Scan(&k); err != nil {
				return wrapDB(err)
			}
			if k > 0 {
				continue
			}
			if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO tombstones (chunk_id, server_id) VALUES (?, ?) ON CONFLICT DO NOTHING`), id, serverID); err != nil {
				return wrapDB(err)
			}
			n++
		}
		return nil
	})
	return n, err
}

func (s *sqlStore) Tombstones(ctx context.Context, serverID string, limit int) ([]uint64, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT chunk_id FROM tombstones WHERE server_id = ? ORDER BY chunk_id LIMIT ?`), serverID, limit)
	if err != nil {
		return nil, wrapDB(err)
	}
	defer rows.Close()
	var out []uint64
	for rows.Next() {
		var id uint64
		if err := rows.Scan(&id); err != nil {
			return nil, wrapDB(err)
		}
		out = append(out, id)
	}
	return out, wrapDB(rows.Err())
}

func (s *sqlStore) ClearTombstones(ctx context.Context, serverID string, ids []uint64) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		for _, id := range ids {
			if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM tombstones WHERE server_id = ? AND chunk_id = ?`), serverID, id); err != nil {
				return wrapDB(err)
			}
		}
		return nil
	})
}

func (s *sqlStore) Totals(ctx context.Context) (int64, int64, error) {
	// Summed as floating point: an integer SUM fails on both engines once
	// the total passes 2^63, and status must keep answering whatever was
	// committed (sizes are bounded by CheckSize, but files are not counted).
	var n int64
	var b float64
	err := s.db.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(CAST(size AS DOUBLE PRECISION)), 0) FROM files`).Scan(&n, &b)
	if b >= math.MaxInt64 { // float64(MaxInt64) is 2^63, which int64() cannot hold
		return n, math.MaxInt64, wrapDB(err)
	}
	return n, int64(b), wrapDB(err)
}
