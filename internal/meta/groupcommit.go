package meta

import (
	"context"
	"database/sql"
	"strconv"
	"sync"
	"time"

	"github.com/gd2fs/gd2fs/errs"
)

// Group commit of session transactions (docs/kv-cache.md, "What a turn
// costs"). A plan or a commit is a few small statements; what made each
// cost milliseconds was its own SQL transaction: BEGIN, the sessions lock
// on PostgreSQL, and a COMMIT that waits for the log to reach the disk,
// one after another on one connection. Here the plans and commits that
// arrive while one transaction runs wait for it and then run together in
// the next: one BEGIN, one lock, one COMMIT (one fsync) for all of them.
//
// Each operation runs inside its own SAVEPOINT, so one that fails is rolled
// back alone and answers its error; the others go on. Operations run one
// after another in arrival order, exactly as separate transactions under
// the sessions lock would, so they see each other's writes and every rule
// is checked as before. Nobody is answered before the COMMIT returns: an
// acknowledged plan or commit is as durable as it was with a transaction
// of its own (all of them survive a crash), and if the COMMIT fails every
// operation of the batch answers that error and none took effect.

// maxGroup bounds the operations in one transaction, so one batch's
// latency stays bounded under any load.
const maxGroup = 128

// groupHook, when set (tests), is called with each batch's size before it runs.
var groupHook func(n int)

type groupCommit struct {
	mu      sync.Mutex
	queue   []*groupOp
	running bool
}

type groupOp struct {
	ctx  context.Context
	fn   func(tx *sql.Tx) error
	err  error
	done chan struct{}
}

// groupTx runs fn as part of the next group transaction and returns its
// error, or the transaction's, once that transaction has committed or
// rolled back. fn must use only tx (as every s.tx function does).
func (s *sqlStore) groupTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	op := &groupOp{ctx: ctx, fn: fn, done: make(chan struct{})}
	g := &s.group
	g.mu.Lock()
	g.queue = append(g.queue, op)
	lead := !g.running
	g.running = true
	g.mu.Unlock()
	if lead {
		// This caller runs the first batch (its own operation is in it);
		// a goroutine of its own serves whoever queued meanwhile, and ends
		// when the queue is empty.
		s.runGroup()
		go func() {
			// Between two transactions, on the runner's goroutine (not
			// in the path of a caller), the tail of the WAL a background
			// checkpoint asked for (checkpoint.go).
			for {
				s.ckpt.finishTail(s.db)
				if !s.runGroup() {
					return
				}
			}
		}()
	}
	<-op.done
	return op.err
}

// runGroup runs one batch from the queue; false when the queue was empty
// (and the runner's turn is over).
func (s *sqlStore) runGroup() bool {
	g := &s.group
	g.mu.Lock()
	n := min(len(g.queue), maxGroup)
	if n == 0 {
		g.running = false
		g.mu.Unlock()
		return false
	}
	batch := g.queue[:n:n]
	g.queue = g.queue[n:]
	g.mu.Unlock()
	if groupHook != nil {
		groupHook(len(batch))
	}
	err := s.runBatch(batch)
	for _, op := range batch {
		if err != nil {
			op.err = err
		}
		close(op.done)
	}
	return true
}

// runBatch runs ops in one transaction, each in a savepoint, after the
// write-behind log (writebehind.go); it returns the error that failed them
// all (begin, lock, commit), or nil with each op's own error in op.err. An
// op with no fn only waits for the log to be written. The transaction is
// not tied to any one caller's context: a caller that gives up must not
// fail the others.
func (s *sqlStore) runBatch(ops []*groupOp) (err error) {
	ctx := context.Background()
	began := time.Now()
	wb := &s.wb
	slow := false
	for _, op := range ops {
		slow = slow || op.fn != nil
	}
	if !slow {
		// Only waiters, and nothing to write (an earlier batch wrote their
		// log): no empty transaction is run; an empty log is written as it
		// stands.
		wb.mu.Lock()
		if lg := wb.log; lg == nil || len(lg.stmts) == 0 {
			if lg != nil {
				close(lg.done)
			}
			wb.log, wb.kicked = newLog(), false
			wb.mu.Unlock()
			return nil
		}
		wb.mu.Unlock()
	}
	var lg *wlog
	held, committed, ran := false, false, 0
	defer func() {
		if !held {
			wb.mu.Lock()
		}
		if err != nil {
			// Memory is dropped: what did not commit leaves nothing there,
			// and what was answered from memory on top of it is lost too.
			// (After COMMIT only a failed check in tests gets here.)
			s.cache.reset()
			s.discard()
			if lg != nil && lg.ops > 0 && !committed {
				wb.bump = true
			}
			wb.newTerm = 0
		}
		if err == nil && committed && s.cache.on && (ran > 0 || lg != nil && lg.ops > 0) {
			// Entries are loaded by operations in SQL and made by plans
			// answered from memory (new sessions): the cap is kept after
			// every batch that wrote either.
			if n := s.cache.shed(s.memCap, lg); n > 0 {
				wb.shed.Add(int64(n))
			}
			wb.held.Store(int64(len(s.cache.sessions)))
		}
		wb.inflight = nil
		if lg != nil {
			if err != nil && !committed && lg.ops > 0 {
				wb.failed.Add(1)
			}
			if err != nil && !committed {
				lg.err = errDiscarded
			} else if err != nil {
				// Written: its operations must not run again (a plan twice),
				// they answer the failed check.
				lg.err = err
			}
			close(lg.done)
		}
		wb.mu.Unlock()
	}()
	// On PostgreSQL the transaction runs on a connection of its own, so
	// the log can go to the server as one pipelined batch (writeLog).
	var conn *sql.Conn
	if s.postgres {
		if conn, err = s.db.Conn(ctx); err != nil {
			return wrapDB(err)
		}
		defer conn.Close()
	}
	if conn != nil && !slow {
		// Only the log, on PostgreSQL: one round trip (oneTrip) when
		// memory is as the last batch left it.
		wb.mu.Lock()
		held = true
		if term, gen, ok := s.oneTripReady(); ok {
			s.cache.journal = journal{}
			lg = s.takeLog()
			wb.mu.Unlock()
			held = false
			if err := s.oneTrip(ctx, conn, lg, term, gen); err != nil { // writebehind.go
				return err
			}
			committed = true
			return s.flushed(ctx, lg, began, 0, &held)
		}
		wb.mu.Unlock()
		held = false
	}
	var tx *sql.Tx
	if conn != nil {
		tx, err = conn.BeginTx(ctx, nil)
	} else {
		tx, err = s.db.BeginTx(ctx, nil)
	}
	if err != nil {
		return wrapDB(err)
	}
	defer tx.Rollback()
	if err := s.lockSessions(ctx, tx); err != nil {
		return err
	}
	var term, gen int64
	if err := tx.QueryRowContext(ctx, termGenQuery).Scan(&term, &gen); err != nil {
		return wrapDB(err)
	}
	wb.mu.Lock()
	held = true
	if err := s.beginBatch(ctx, tx, term, gen); err != nil { // cache.go
		return err
	}
	lg = s.takeLog()
	if !slow && wb.newTerm == 0 {
		// Only the log: operations answered from memory go on meanwhile
		// (into the next log), in tests too.
		wb.mu.Unlock()
		held = false
	}
	if h := flushHook.Load(); h != nil && len(lg.stmts) > 0 {
		if err := (*h)(); err != nil {
			return err
		}
	}
	if err := s.writeLog(ctx, conn, tx, lg); err != nil { // writebehind.go
		return err
	}
	// The release of one operation's savepoint goes in one statement with
	// the next one's SAVEPOINT (a round trip each to PostgreSQL); COMMIT
	// releases the last.
	release := ""
	for i, op := range ops {
		if op.fn == nil {
			continue
		}
		if err := op.ctx.Err(); err != nil {
			op.err = err // gone before its turn: not run
			continue
		}
		sp := "op" + strconv.Itoa(i)
		if _, err := tx.ExecContext(ctx, release+"SAVEPOINT "+sp); err != nil {
			return wrapDB(err)
		}
		release = "RELEASE SAVEPOINT " + sp + "; "
		// Once started, an operation runs to its end whatever its caller
		// does: a statement cancelled half way would break the connection
		// under the whole batch.
		s.cache.journal = journal{}
		if op.err = runOp(op.fn, tx); op.err != nil {
			s.opFailed()
			if _, err := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT "+sp+"; RELEASE SAVEPOINT "+sp); err != nil {
				return wrapDB(err)
			}
			release = ""
			continue
		}
		ran++
	}
	if err := s.endBatch(ctx, tx, ran > 0); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return wrapDB(err)
	}
	committed = true
	s.ckpt.wrote()
	if wb.newTerm != 0 { // wb.mu held: a batch that takes a term keeps it
		// The term taken in beginBatch is ours only now that it committed.
		s.leadTerm.Store(wb.newTerm)
		wb.newTerm = 0
		wb.bump = false
	}
	return s.flushed(ctx, lg, began, ran, &held)
}

// flushed ends a batch that committed: the write-behind figures, and with
// GD2FS_META_INVARIANTS the checks of SQL and of memory against it. *held
// says whether wb.mu is held (the caller's deferred end releases it).
func (s *sqlStore) flushed(ctx context.Context, lg *wlog, began time.Time, ran int, held *bool) error {
	wb := &s.wb
	if lg.ops > 0 {
		wb.flushes.Add(1)
		wb.flushed.Add(int64(lg.ops))
		wb.flushNanos.Add(int64(time.Since(began)))
		wb.written.Add(int64(lg.written))
		wb.dropped.Add(int64(lg.dropped))
	}
	if s.checks && (ran > 0 || len(lg.stmts) > 0) {
		if err := s.checkInvariants(ctx); err != nil {
			return err
		}
		if !*held {
			wb.mu.Lock()
			*held = true
			if len(wb.log.stmts) > 0 {
				// Answered from memory during the flush: memory is ahead
				// of SQL, and a later flush compares them.
				return nil
			}
		}
		return s.checkCache(ctx)
	}
	return nil
}

// runOp runs fn, turning a panic into an error of this operation alone: the
// batch may run on a goroutine of its own, where a panic would end the
// process rather than one request (net/http recovers those).
func runOp(fn func(tx *sql.Tx) error, tx *sql.Tx) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = errs.New(errs.ErrInternal, "session operation panicked: %v", p)
		}
	}()
	return fn(tx)
}
