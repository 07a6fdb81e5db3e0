package meta

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
)

// SQLite connections that keep their prepared statements. modernc's
// driver prepares every statement anew on each Exec and Query; on the
// session path that was a quarter of the master's CPU (a profile of
// `gd2fs-bench turns`), all of it inside the store's one connection, where
// plans and commits wait for each other. A connection here keeps the
// statements it prepared, by query text, and reuses them (the driver
// resets a reused statement after each use). Only parameterised single
// statements are kept (their text does not vary with the values); a
// statement whose rows are still open is not reused until they close.

// maxCachedStmts bounds the statements one connection keeps.
const maxCachedStmts = 512

// openSQLiteCached is sql.Open("sqlite", name) with statement caching.
func openSQLiteCached(name string) (*sql.DB, error) {
	probe, err := sql.Open("sqlite", "")
	if err != nil {
		return nil, err
	}
	drv := probe.Driver()
	probe.Close()
	return sql.OpenDB(cachingConnector{name: name, drv: drv}), nil
}

type cachingConnector struct {
	name string
	drv  driver.Driver
}

func (c cachingConnector) Connect(context.Context) (driver.Conn, error) {
	inner, err := c.drv.Open(c.name)
	if err != nil {
		return nil, err
	}
	for _, ok := range []bool{isExecer(inner), isQueryer(inner), isPreparer(inner), isBeginner(inner)} {
		if !ok {
			inner.Close()
			return nil, errors.New("meta: the sqlite driver's connection lacks a context method the statement cache needs")
		}
	}
	return &cachingConn{inner: inner, stmts: map[string]*cachedStmt{}}, nil
}

func (c cachingConnector) Driver() driver.Driver { return c.drv }

func isExecer(c driver.Conn) bool   { _, ok := c.(driver.ExecerContext); return ok }
func isQueryer(c driver.Conn) bool  { _, ok := c.(driver.QueryerContext); return ok }
func isPreparer(c driver.Conn) bool { _, ok := c.(driver.ConnPrepareContext); return ok }
func isBeginner(c driver.Conn) bool { _, ok := c.(driver.ConnBeginTx); return ok }

// cachingConn is used by one goroutine at a time (database/sql's rule for
// a driver connection), so its map needs no lock.
type cachingConn struct {
	inner driver.Conn
	stmts map[string]*cachedStmt
}

type cachedStmt struct {
	s    driver.Stmt
	busy bool // rows of it are open
}

func cacheable(query string) bool {
	return strings.Contains(query, "?") && !strings.Contains(query, ";")
}

// stmt is the kept statement for query, prepared now if need be; nil when
// query is not kept (not cacheable, the cache full, or in use).
func (c *cachingConn) stmt(ctx context.Context, query string) *cachedStmt {
	if !cacheable(query) {
		return nil
	}
	if cs := c.stmts[query]; cs != nil {
		if cs.busy {
			return nil
		}
		return cs
	}
	if len(c.stmts) >= maxCachedStmts {
		return nil
	}
	s, err := c.inner.(driver.ConnPrepareContext).PrepareContext(ctx, query)
	if err != nil {
		return nil // the uncached path reports the error
	}
	_, okE := s.(driver.StmtExecContext)
	_, okQ := s.(driver.StmtQueryContext)
	if !okE || !okQ {
		s.Close()
		return nil
	}
	cs := &cachedStmt{s: s}
	c.stmts[query] = cs
	return cs
}

func (c *cachingConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if cs := c.stmt(ctx, query); cs != nil {
		return cs.s.(driver.StmtExecContext).ExecContext(ctx, args)
	}
	return c.inner.(driver.ExecerContext).ExecContext(ctx, query, args)
}

func (c *cachingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if cs := c.stmt(ctx, query); cs != nil {
		rows, err := cs.s.(driver.StmtQueryContext).QueryContext(ctx, args)
		if err != nil {
			return nil, err
		}
		cs.busy = true
		return &cachedRows{Rows: rows, cs: cs}, nil
	}
	return c.inner.(driver.QueryerContext).QueryContext(ctx, query, args)
}

func (c *cachingConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	return c.inner.(driver.ConnPrepareContext).PrepareContext(ctx, query)
}

func (c *cachingConn) Prepare(query string) (driver.Stmt, error) { return c.inner.Prepare(query) }

func (c *cachingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return c.inner.(driver.ConnBeginTx).BeginTx(ctx, opts)
}

// Begin is required by driver.Conn; database/sql calls BeginTx.
func (c *cachingConn) Begin() (driver.Tx, error) { return c.inner.Begin() }

func (c *cachingConn) ResetSession(ctx context.Context) error {
	if r, ok := c.inner.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *cachingConn) IsValid() bool {
	if v, ok := c.inner.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

func (c *cachingConn) Ping(ctx context.Context) error {
	if p, ok := c.inner.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

func (c *cachingConn) Close() error {
	for q, cs := range c.stmts {
		cs.s.Close()
		delete(c.stmts, q)
	}
	return c.inner.Close()
}

// cachedRows frees its statement for reuse when closed.
type cachedRows struct {
	driver.Rows
	cs *cachedStmt
}

func (r *cachedRows) Close() error {
	err := r.Rows.Close()
	r.cs.busy = false
	return err
}
