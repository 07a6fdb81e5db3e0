package meta

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// Write-behind of the session table (docs/kv-cache.md, "What a turn
// costs"). The leading store answers the plans and commits of a chat turn
// from the session table in its memory (cache.go) and writes what they
// changed to SQL afterwards: each such operation appends its statements to
// a log, in the order the operations happened, and the runner of group
// transactions (groupcommit.go) writes the whole log in its next
// transaction. A flush is thus always a prefix of the leader's history —
// a consistent cut of sessions, ranges, reservations and plans together —
// and it checks the lead term in its transaction like every batch does.
//
// Only an operation whose whole input is in memory and that succeeds is
// answered this way (the fast path): a plan of a session held in memory
// whose current file this leader created, that evicts nothing and finds
// no plan to expire; a new session's first plan, which makes the session
// and its first file (newSessionMem); a commit of an outstanding plan whose
// files are in memory. Such a plan also allocates the chunks its fresh range enters
// (allocMem: placed by the master, ids from the block below, their rows in
// the log), so a turn on an 8B model's layout (128 tokens a 16 MiB chunk)
// is not sent to SQL every time. Everything else (a new file of an
// existing session, an eviction, an expiry, forks, deletions, errors) runs as before,
// in the group transaction, after the log is written in that same
// transaction, so it reads SQL equal to memory. No file is created in
// memory but a new session's first. In flush mode a chunk a plan names is in SQL before the plan
// is answered; in window mode a reader of the file's chunks waits for the
// log (barrier), and so does AddChunks, so no second chunk is made for an
// index memory allocated.
//
// Durability (SetSessionDurability):
//
//   - flush (the default): an operation is answered after the transaction
//     holding its statements committed. Nothing acknowledged is lost by a
//     crash or a failover, as before; the gain is that a flush carries
//     every operation that arrived while the previous one ran, with no
//     per-operation savepoint or read.
//   - window: an operation is answered at once and the log is written
//     windowPace after the previous flush began, or when it ends if it
//     took longer. A crash loses what was answered since the last flush
//     committed (the window: about two flushes, up to windowPace more):
//     those sessions read shorter, their plans are gone.
//   - sync: no write-behind; every operation runs in the group
//     transaction (the path before write-behind).
//
// What keeps lost operations harmless (window mode, or a flush that
// fails):
//
//   - A lost reservation could be handed out again by a leader that never
//     knew of it, while the lost plan's writer still writes there. So a
//     leader appends only to session files created under its own lead term
//     (kv_files.lead_term): after a failover or restart every session's
//     next plan starts a new file. A leader that loses part of its log
//     (a flush failed, or another writer changed sessions) takes a new
//     term itself before it answers from memory again.
//   - Plan ids, and the ids of chunks plans allocate, are taken from a
//     block persisted ahead (next_id advanced by idBlock in a transaction
//     that commits before any id of it is used), so an id answered and
//     then lost is never given again: a client that wrote to a lost
//     chunk wrote to an id no file will ever name.
//   - Reads that must see every answered change (Session, Sessions, File,
//     Chunks, OutstandingPlan) wait for the log in window mode (barrier):
//     the current one, or the one being written (pending).
//   - A repeat (a plan's request id, a commit's last_plan) found in memory
//     adds nothing to the log: it waits on the newest log with operations,
//     where its original is or before which it was written, and runs
//     again in SQL if that log is lost.

// Session durability modes (SetSessionDurability).
const (
	DurabilityFlush  = "flush"
	DurabilityWindow = "window"
	DurabilitySync   = "sync"
)

// DurabilitySetter is implemented by stores that can answer session
// operations before they are written to SQL.
type DurabilitySetter interface {
	// SetSessionDurability chooses flush, window or sync; call it before
	// the store is used.
	SetSessionDurability(mode string) error
}

// idBlock is how many ids (of plans and of the chunks plans allocate) a
// leader takes from next_id at once. When
// a block runs out, every plan memory would answer goes to SQL until one
// of them takes the next block: with 1,024, at 64 chats, that was 2–4 % of
// all plans (gd2fs-bench turns, "plan_ids"). A leader that stops wastes
// what is left of its block: ids are int64, and a few tens of thousands a
// change of leader is nothing.
const idBlock = 1 << 16

// idLow is how few ids left in a block make a plan run in SQL take the
// next one: a plan answered from memory takes one id, and one for each
// chunk it allocates (a 16 MiB chunk is 128 tokens of an 8B model's KV).
const idLow = 1 << 10

// windowOps bounds what window mode answers ahead of SQL: an operation
// that finds this many waiting in the log waits for their flush, as in
// flush mode. So a crash loses at most about twice this many operations
// however slow the database is, and the log cannot outgrow memory. At
// 256, a flush slowed by a sync of SQLite's checkpoint (30–130 ms on this
// VM) made every operation behind it wait at 4,000 operations a second
// (2,000 turns/s): with the WAL already started again by the writer
// (checkpoint.go), plan p99 67 ms against 44 ms at 1,024, and 2,068
// against 2,530 turns/s (gd2fs-bench turns, 100,000 sessions, one run each).
const windowOps = 1024

// windowPace is how long after a flush began window mode starts the next
// one on its own: an operation answered from memory sooner than that waits
// in the log for the rest of it, so one flush carries what that time
// brings (a read behind the barrier, an operation that runs in SQL, a
// full window and Close write sooner). At 1,000 turns a second flushes ran
// back to back with about 12 operations each, and a flush costs a turn
// about 3.7 times what it costs at saturation (docs/benchmarks.md,
// "Thirteenth session"): SQLite's transaction, and the pages an operation
// dirties, shared by fewer operations. A crash loses up to this much more.
// A variable for tests.
var windowPace = 20 * time.Millisecond

// flushHook, when set (tests), runs in each flush transaction before the
// log is written; an error fails the flush as a database error would.
var flushHook atomic.Pointer[func() error]

// waitHook, when set (tests), runs when an operation answered from memory,
// or a read behind the barrier, is about to wait for a log to be written.
var waitHook atomic.Pointer[func()]

// absentHook, when set (tests), runs in planFast between the read of SQL
// that found a session absent and the look at memory again.
var absentHook atomic.Pointer[func()]

// sealHook, when set (tests), runs in a sealing Commit between its wait
// for the file's logs and its transaction.
var sealHook atomic.Pointer[func()]

// errDiscarded fails a log that was not written: its operations, if still
// waiting (flush mode), run again on the slow path.
var errDiscarded = errs.New(errs.ErrUnavailable, "session changes were not written (the lead changed, or the metadata database failed): retry")

type writeBehind struct {
	mode string
	// fast counts operations answered from memory; flushes the
	// transactions that wrote a log, flushed the operations they carried.
	// flushNanos sums the flushes' durations.
	fast, flushes, flushed, flushNanos atomic.Int64
	// written counts the statements flushes wrote; dropped those a later
	// statement of their log made useless (wlog).
	written, dropped atomic.Int64
	// slow counts the plans ([0]) and commits ([1]) that ran in SQL, by
	// why memory could not answer them.
	slow [2][SlowReasons]atomic.Int64
	// shed counts the sessions dropped from memory for its cap, and held
	// is how many memory held after the last batch (cache.go, shed).
	shed, held atomic.Int64
	// syncs counts the Syncs of session files answered from memory
	// (syncmem.go); waits the reads and operations that waited for the
	// log to be written (waitPending: in window mode each forces a flush).
	syncs, waits atomic.Int64
	// failed counts the logs with operations answered from memory that a
	// failed batch did not write (lost in window mode, run again in SQL
	// in flush mode).
	failed atomic.Int64
	// mu guards the session cache against operations answered from
	// memory, and the log. The group runner holds it while it runs
	// operations in SQL, so they and the fast path see one history.
	mu  sync.Mutex
	log *wlog
	// inflight is the log the runner is writing (taken from log), until
	// its transaction ends; the fast path may run meanwhile.
	inflight *wlog
	kicked   bool // window: a flush is queued
	// taken is when the runner last took a log to write; pace starts the
	// next flush windowPace after it (window mode); closed: no more
	// paced flushes.
	taken  time.Time
	pace   *time.Timer
	closed bool
	// bump: a log was lost; take a new lead term before memory is used.
	// newTerm: the term the running batch took for it, stored in
	// leadTerm once that batch commits.
	bump    bool
	newTerm int64
	// sealing counts, by file id, the seals running (Commit): memory does
	// not load those files, so no commit answered from memory can be
	// written after the seal's transaction and grow a sealed file.
	sealing map[int64]int
}

// wlog is the statements of operations answered from memory, in order.
//
// A log is written in one transaction, so only its end state counts: a
// statement that a later one of the same log makes useless is dropped
// (its q set to "") instead of written, which saves the flush — the
// leader's bottleneck — the statement and the pages it dirties. The
// quota's counter gets one statement a log, not one a plan; a plan row
// inserted and deleted by its commit in the same log (window mode: a flush
// in progress lets both queue) is neither; a file's reservation is set
// once, to its last value. In flush mode an operation is answered only
// after its log is written, so a plan and its commit never share a log:
// there only the counter shrinks. (A plan writes no last_used at all: its
// row's created is the session's last use until its commit; lastUsedCol.)
type wlog struct {
	stmts []stmt
	ops   int
	done  chan struct{}
	err   error
	// reserved is what the log's plans add to counters.kv_reserved.
	reserved int64
	// The statement (index in stmts) that a later one may make useless:
	// the reservation set per file path, the plan row inserted per plan id.
	fileStmt map[string]int
	planStmt map[int64]int
	// dead counts the statements dropped, reserves the reservations (each
	// wrote its own counter update before); written and dropped: what
	// writeLog wrote of it, and left out.
	dead, reserves   int
	written, dropped int
}

type stmt struct {
	q    string // "" when a later statement of the log made it useless
	args []any
}

func newLog() *wlog { return &wlog{done: make(chan struct{})} }

func (l *wlog) add(s *sqlStore, q string, args ...any) {
	l.stmts = append(l.stmts, stmt{s.q(q), args})
}

// drop unmakes the statement of key k in m, if this log holds one.
func drop[K comparable](l *wlog, m map[K]int, k K) bool {
	i, ok := m[k]
	if ok {
		l.stmts[i] = stmt{}
		l.dead++
		delete(m, k)
	}
	return ok
}

// keep notes the statement just added as key k's in *m.
func keep[K comparable](l *wlog, m *map[K]int, k K) {
	if *m == nil {
		*m = map[K]int{}
	}
	(*m)[k] = len(l.stmts) - 1
}

// reserve sets file path's reservation to n, adding add to the quota's
// counter.
func (l *wlog) reserve(s *sqlStore, path string, n, add int64) {
	drop(l, l.fileStmt, path)
	l.add(s, `UPDATE kv_files SET reserved = ? WHERE path = ?`, n, path)
	keep(l, &l.fileStmt, path)
	l.reserved += add
	l.reserves++
}

// live is what the log writes: its statements that are still needed, and
// the quota counter's one update.
func (l *wlog) live(s *sqlStore) []stmt {
	out := make([]stmt, 0, len(l.stmts)+1)
	for _, st := range l.stmts {
		if st.q != "" {
			out = append(out, st)
		}
	}
	if l.reserved != 0 {
		// The quota's total is a counter kept with every reservation
		// (reserveTx), not a sum over every session file.
		out = append(out, stmt{s.q(`UPDATE counters SET v = v + ? WHERE k = 'kv_reserved'`), []any{l.reserved}})
	}
	return out
}

// toWrite is live, counted as written and dropped.
func (l *wlog) toWrite(s *sqlStore) []stmt {
	stmts := l.live(s)
	l.written, l.dropped = len(stmts), l.dead
	if l.reserves > 1 {
		l.dropped += l.reserves - 1 // a counter update a plan, before
	}
	return stmts
}

// cachedFile is a file a session range or reservation names, as far as
// the fast path needs it: chunks only ever get longer or appear (a client
// may write and Sync), so memory may hold less than SQL, never more; a
// repair that moves a replica, a seal or a removal drops the entry.
type cachedFile struct {
	file     File
	chunks   chunkSet
	owner    string // session that reserves in it (kv_files), "" if none
	reserved int64
	term     int64 // lead term it was created under (kv_files.lead_term)
}

func (s *sqlStore) SetSessionDurability(mode string) error {
	switch mode {
	case DurabilityFlush, DurabilityWindow, DurabilitySync:
		s.wb.mode = mode
		return nil
	}
	return errs.New(errs.ErrBadRequest, "session durability %q: flush (answer after the write to SQL, the default), window (answer at once, a crash loses about one flush) or sync (no write-behind)", mode)
}

// WriteBehindStats says how many session operations were answered from
// memory, and how many flushes wrote how many of them.
type WriteBehindStats struct {
	Fast, Flushes, Flushed int64
	FlushTime              time.Duration // of all flushes together
	// Statements the flushes wrote, and statements they left out because
	// a later one of the same log overwrote them (wlog).
	Statements, Dropped int64
	// Slow counts the plans ([0]) and commits ([1]) that ran in SQL, by
	// reason.
	Slow [2][SlowReasons]int64
	// Held is how many sessions the leader's memory held after its last
	// batch; Shed how many it dropped for its cap (SetSessionMemory).
	Held, Shed int64
	// FailedFlushes: logs of operations answered from memory that were
	// not written (a database error, a guard that found the sessions
	// changed under the leader, a statement of the log refused).
	FailedFlushes int64
	// Syncs: Syncs of session files answered from memory (syncmem.go).
	// LogWaits: reads and operations that waited for the log to be
	// written (a file's stat or chunk list, an allocation, a Sync in SQL;
	// in window mode each forces a flush).
	Syncs, LogWaits int64
}

// SlowReason says why a plan or a commit ran in SQL instead of being
// answered from the leader's memory (WriteBehindStats.Slow).
type SlowReason int

// The reasons, in the order of the checks.
const (
	SlowNotReady    SlowReason = iota // memory off: not leading, after a failed flush, plans not loaded, sync mode
	SlowLost                          // answered from memory, its log lost: run again
	SlowExpiry                        // a plan old enough to expire
	SlowNotInMemory                   // the session, its layout or the plan not in memory
	SlowFile                          // a first or new session file, or one made under another lead term
	SlowChunk                         // a new chunk that cannot be placed now; a commit's chunk not in memory
	SlowReach                         // a server holding the range unknown or down
	SlowQuota                         // an eviction to make room
	SlowIDs                           // a new block of ids (plans, chunks they allocate) to persist
	SlowOther                         // what the slow path decides or refuses (content, sizes, repeats)
	SlowReasons                       // the number of reasons
)

// SlowReasonNames are the reasons as /metrics labels them.
var SlowReasonNames = [SlowReasons]string{"not_ready", "lost", "expiry", "not_in_memory", "file", "chunk", "reachability", "quota", "plan_ids", "other"}

// slow counts an operation (0 plan, 1 commit) that memory could not answer
// and returns false, the fast path's answer.
func (s *sqlStore) slow(op int, r SlowReason) bool {
	s.wb.slow[op][r].Add(1)
	return false
}

// WriteBehindStatser is implemented by stores with write-behind.
type WriteBehindStatser interface{ WriteBehindStats() WriteBehindStats }

func (s *sqlStore) WriteBehindStats() WriteBehindStats {
	st := WriteBehindStats{Fast: s.wb.fast.Load(), Flushes: s.wb.flushes.Load(), Flushed: s.wb.flushed.Load(), FlushTime: time.Duration(s.wb.flushNanos.Load()),
		Statements: s.wb.written.Load(), Dropped: s.wb.dropped.Load(), Held: s.wb.held.Load(), Shed: s.wb.shed.Load(), FailedFlushes: s.wb.failed.Load(), Syncs: s.wb.syncs.Load(), LogWaits: s.wb.waits.Load()}
	for op := range st.Slow {
		for r := range st.Slow[op] {
			st.Slow[op][r] = s.wb.slow[op][r].Load()
		}
	}
	return st
}

// fastReady says whether memory may answer now (wb.mu held).
func (s *sqlStore) fastReady() bool {
	c := &s.cache
	return s.wb.mode != DurabilitySync && c.on && c.sessions != nil && c.plansLoaded && !s.wb.bump &&
		c.term == s.leadTerm.Load() && c.term > 0
}

// pending is the newest log holding operations answered from memory that
// may not be in SQL yet: the current log, else the one being written, else
// nil (wb.mu held). Logs are written in order and a failed one fails every
// later one that holds operations (discard), so once pending is written,
// everything answered before is.
func (s *sqlStore) pending() *wlog {
	wb := &s.wb
	if wb.log != nil && wb.log.ops > 0 {
		return wb.log
	}
	if wb.inflight != nil && wb.inflight.ops > 0 {
		return wb.inflight
	}
	return nil
}

// answered ends a fast operation whose answer rests on log lg (wb.mu
// held; it is released): window mode queues a flush and answers at once;
// flush mode waits for the transaction that writes lg. ok false: the log
// was not written and the operation must run again on the slow path. lg
// nil: nothing answered is unwritten.
func (s *sqlStore) answered(lg *wlog) (ok bool, err error) {
	wb := &s.wb
	if lg == nil {
		wb.mu.Unlock()
		return true, nil
	}
	current := lg == wb.log
	if wb.mode == DurabilityWindow && lg.ops <= windowOps {
		if current && !wb.kicked {
			wb.kicked = true
			s.kick()
		}
		wb.mu.Unlock()
		return true, nil
	}
	wb.mu.Unlock()
	if h := waitHook.Load(); h != nil {
		(*h)()
	}
	if current { // else the runner is writing it
		s.groupTx(context.Background(), nil) //nolint:errcheck // lg.err says
	}
	<-lg.done
	if lg.err == errDiscarded {
		return false, nil
	}
	return true, lg.err
}

// kick starts a flush of the current log, at once or windowPace after the
// last one began (window mode, wb.mu held).
func (s *sqlStore) kick() {
	wb := &s.wb
	flush := func() { s.groupTx(context.Background(), nil) } //nolint:errcheck // its log's waiters see the outcome
	wait := windowPace - time.Since(wb.taken)
	switch {
	case wait <= 0 || wb.closed:
		go flush()
	case wb.pace == nil:
		wb.pace = time.AfterFunc(wait, flush)
	default:
		wb.pace.Reset(wait)
	}
}

// stopPace ends paced flushes (Close): what is answered from now on is
// flushed at once.
func (s *sqlStore) stopPace() {
	wb := &s.wb
	wb.mu.Lock()
	defer wb.mu.Unlock()
	wb.closed = true
	if wb.pace != nil {
		wb.pace.Stop()
	}
}

// takeLog hands the runner the log to write and starts a new one (wb.mu held).
func (s *sqlStore) takeLog() *wlog {
	wb := &s.wb
	wb.taken = time.Now()
	lg := wb.log
	if lg == nil {
		lg = newLog()
	}
	wb.log = newLog()
	wb.kicked = false
	wb.inflight = lg
	return lg
}

// discard fails the current log (built on memory being dropped) and makes
// the store take a new term before memory answers again (wb.mu held).
func (s *sqlStore) discard() {
	wb := &s.wb
	if wb.log != nil && wb.log.ops > 0 {
		wb.log.err = errDiscarded
		close(wb.log.done)
		wb.log = newLog()
		wb.kicked = false
		wb.bump = true
	}
}

// writeLog writes lg's statements in tx. On PostgreSQL (conn is tx's
// connection) they go as one pipelined batch: a statement at a time, a
// flush cost a round trip to the server per statement.
func (s *sqlStore) writeLog(ctx context.Context, conn *sql.Conn, tx *sql.Tx, lg *wlog) error {
	stmts := lg.toWrite(s)
	if conn == nil || len(stmts) < 2 {
		for _, st := range stmts {
			if _, err := tx.ExecContext(ctx, st.q, st.args...); err != nil {
				return wrapDB(err)
			}
		}
		return nil
	}
	return wrapDB(conn.Raw(func(dc any) error {
		c, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("PostgreSQL connection of type %T", dc)
		}
		b := &pgx.Batch{}
		for _, st := range stmts {
			b.Queue(st.q, st.args...)
		}
		return c.Conn().SendBatch(ctx, b).Close()
	}))
}

// oneTripReady says whether the next log-only flush may be one round
// trip (oneTrip): memory is on and as the last batch left it, with no new
// term to take. It returns the term and generation SQL must still hold
// (wb.mu held).
func (s *sqlStore) oneTripReady() (term, gen int64, ok bool) {
	c := &s.cache
	ok = c.on && c.sessions != nil && !s.wb.bump && s.wb.newTerm == 0 && c.term > 0 && c.term == s.leadTerm.Load()
	return c.term, c.gen, ok
}

// oneTripGuard fails (division by zero, SQLSTATE 22012) unless lead_term
// and sessions_gen are still $1 and $2: the check beginBatch makes, as a
// statement of the pipeline. The divisor is not constant, so the planner
// cannot fold it into an error for every call.
const oneTripGuard = `SELECT 1 / (CASE WHEN count(*) = 2 THEN 1 ELSE 0 END) FROM counters WHERE (k = 'lead_term' AND v = $1) OR (k = 'sessions_gen' AND v = $2)`

// oneTrip writes lg on PostgreSQL in one round trip, with no BEGIN or
// COMMIT of its own: the sessions lock, a guard that the term and
// generation memory was built under are still SQL's, and the log's
// statements go as one pipeline ending in a single Sync, which the server
// runs as one implicit transaction — committed at the Sync, or rolled back
// whole when any statement fails. A log-only flush so costs one round trip
// instead of five (BEGIN, lock, the counters' read, the log, COMMIT): under
// load each was a wake-up of the server's backend and of the leader. A
// failed guard reads as a failed flush: memory is dropped and the log's
// operations run again in SQL (runBatch).
func (s *sqlStore) oneTrip(ctx context.Context, conn *sql.Conn, lg *wlog, term, gen int64) error {
	if h := flushHook.Load(); h != nil && len(lg.stmts) > 0 {
		if err := (*h)(); err != nil {
			return err
		}
	}
	stmts := lg.toWrite(s)
	err := conn.Raw(func(dc any) error {
		c, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("PostgreSQL connection of type %T", dc)
		}
		b := &pgx.Batch{}
		b.Queue(lockSessionsSQL, sessionsLockKey)
		b.Queue(oneTripGuard, term, gen)
		for _, st := range stmts {
			b.Queue(st.q, st.args...)
		}
		return c.Conn().SendBatch(ctx, b).Close()
	})
	if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && pe.Code == "22012" {
		return errs.New(errs.ErrUnavailable, "the sessions changed under this leader (lead term %d or generation %d is no longer SQL's): memory dropped, the operations run again from SQL", term, gen)
	}
	return wrapDB(err)
}

// barrier waits, in window mode, until everything answered so far is in
// SQL (or lost with a failed flush).
func (s *sqlStore) barrier(ctx context.Context) error {
	if s.wb.mode != DurabilityWindow {
		return nil
	}
	return s.waitPending(ctx, nil)
}

// waitPending waits, in any mode, until the newest log with operations is
// written (or lost): the current one, or, when it is empty, the one the
// runner is writing while the fast path goes on. forget, when set, first
// drops the files it matches from memory, under the same lock as the look
// at the logs (AddChunks).
func (s *sqlStore) waitPending(ctx context.Context, forget func(f *cachedFile) bool) error {
	s.wb.mu.Lock()
	if forget != nil {
		s.forgetLocked(forget)
	}
	lg := s.pending()
	current := lg != nil && lg == s.wb.log
	s.wb.mu.Unlock()
	if lg == nil {
		return nil
	}
	s.wb.waits.Add(1)
	if h := waitHook.Load(); h != nil {
		(*h)()
	}
	if current { // else the runner is writing it
		if err := s.groupTx(ctx, nil); err != nil {
			select {
			case <-lg.done:
				// Written or lost with a failed batch: either way the
				// caller reads SQL as it is now (memory was dropped with
				// the lost log); the batch's error is not the reader's.
			default:
				return err
			}
		}
	}
	<-lg.done
	return nil
}

// forgetFiles drops files from memory after a write that is not a session
// operation changed them (a moved replica, a seal, a removal).
func (s *sqlStore) forgetFiles(match func(f *cachedFile) bool) {
	s.wb.mu.Lock()
	defer s.wb.mu.Unlock()
	s.forgetLocked(match)
}

// forgetLocked is forgetFiles with wb.mu held.
func (s *sqlStore) forgetLocked(match func(f *cachedFile) bool) {
	for p, f := range s.cache.files {
		if match(f) {
			delete(s.cache.files, p)
		}
	}
}

// planFast answers a plan from memory when it can; ok false sends it to
// the slow path. Nothing changes before every check passed.
func (s *sqlStore) planFast(ctx context.Context, in PlanInput) (Plan, bool, error) {
	wb := &s.wb
	wb.mu.Lock()
	if !s.fastReady() {
		wb.mu.Unlock()
		return Plan{}, s.slow(0, SlowNotReady), nil
	}
	var ask bool
	p, ok := s.planMem(in, false, nil, &ask)
	if ask {
		// A session memory does not hold may not exist: a read of SQL
		// (without wb.mu) says, and memory then makes it unless something
		// that could hide a session from memory happened meanwhile.
		gen := s.cache.absentGen
		wb.mu.Unlock()
		absent, pre, err := s.sessionAbsent(ctx, in)
		if h := absentHook.Load(); h != nil {
			(*h)()
		}
		wb.mu.Lock()
		if err == nil && absent && s.fastReady() && s.cache.absentGen == gen {
			p, ok = s.planMem(in, true, pre, &ask)
		} else {
			s.slow(0, SlowNotInMemory)
		}
	}
	if !ok {
		wb.mu.Unlock()
		return Plan{}, false, nil
	}
	lg := wb.log
	if p.Repeat {
		// The original may wait in an earlier log (the one in flight):
		// the repeat is answered once that is written, and runs again in
		// SQL if it is lost.
		lg = s.pending()
	}
	wb.fast.Add(1)
	ok, err := s.answered(lg)
	if !ok {
		s.slow(0, SlowLost)
	}
	return p, ok, err
}

// planMem is PlanSession's transaction in memory (wb.mu held). *ask is
// set when the session is not in memory and memory could make it, were it
// known not to exist (then nothing is counted as slow yet); absent: it is
// known not to exist in SQL (sessionAbsent), so a plan of a session memory
// does not hold makes it, with its first file, from its prefixes' rows pre
// as SQL had them (nil when one is not registered, or not of in.Model).
func (s *sqlStore) planMem(in PlanInput, absent bool, pre []prefixRow, ask *bool) (Plan, bool) {
	c := &s.cache
	var p Plan
	now := in.Now.UnixNano()
	if len(c.plans) > 0 && c.oldest < in.Now.Add(-in.PlanTTL).UnixNano() {
		return p, s.slow(0, SlowExpiry) // some plan expires: the slow path does it
	}
	if in.RequestID != "" {
		if id, ok := c.byRequest[in.Session+"\x00"+in.RequestID]; ok {
			if json.Unmarshal([]byte(c.plans[id].answer), &p) != nil {
				return Plan{}, s.slow(0, SlowOther)
			}
			p.Repeat = true
			return p, true
		}
	}
	l, ok := c.layouts[in.Model]
	if !ok {
		return p, s.slow(0, SlowNotInMemory)
	}
	pr, checked, err := promptOf(in, l)
	if err != nil {
		return p, s.slow(0, SlowOther)
	}
	e, ok := c.sessions[in.Session]
	// made: the new session's first file, when this plan makes the session.
	var made *cachedFile
	switch {
	case !ok && absent:
		if len(pre) != len(in.Prefixes) {
			return p, s.slow(0, SlowOther) // a prefix not registered, or of another model: SQL says so
		}
		var err error
		if e, err = newSession(in, l, pre); err != nil {
			return p, s.slow(0, SlowOther)
		}
		e.row.fileSeq, e.lastUsed, e.created = c.ids.next, now, now
		made = &cachedFile{file: File{ID: c.ids.next + 1, Path: sessionFile(in.Dir, in.Session, c.ids.next), Pool: in.Pool,
			ChunkSize: in.ChunkSize, Modified: time.Unix(0, now).UTC()}, owner: in.Session, term: c.term}
	case !ok && (in.Quota <= 0 || c.totalKnown) && c.unwritten[in.Session] == nil && !c.shedIDs.has(in.Session):
		*ask = true // not counted: planFast asks SQL
		return p, false
	case !ok || e.row.model != in.Model:
		return p, s.slow(0, SlowNotInMemory)
	}
	sess, ranges := e.row, e.ranges
	n, pt := in.PromptTokens, int64(l.PageTokens)
	end := planStored(&p, l, in, sess.hashes, sess.hashed, ranges, pr, checked)
	if in.Reachable != nil {
		known := true
		planReachable(&p, func(r Range) (bool, error) {
			down, ok := c.unreachable(in.Reachable, r)
			known = known && ok
			return down, nil
		})
		if !known {
			return p, s.slow(0, SlowReach)
		}
	}
	planCounts(&p, in)
	fr := Range{TokenStart: p.Cached}
	var split int64
	var f *cachedFile
	var chunks []Chunk // the fresh range's chunks (in.Place), missing those to allocate
	var missing []int
	if fresh := end - p.Cached; fresh > 0 {
		if checked {
			split = freshSplit(pt, p.Cached, end, n, in.Aligned)
		}
		fr.TokenLength = fresh
		for _, part := range splitFresh(l, fr, split) {
			fr.KVLength += part.KVLength
		}
		if made == nil && (sess.fileSeq == 0 || in.NewFile) {
			return p, s.slow(0, SlowFile)
		}
		fr.Path = sessionFile(in.Dir, in.Session, sess.fileSeq)
		// Only a file this leader created: an earlier leader may have
		// handed out bytes past what SQL says it reserved.
		if f = c.files[fr.Path]; made != nil {
			f = made
		} else if f == nil || f.owner != in.Session || f.term != c.term || f.file.Sealed {
			return p, s.slow(0, SlowFile)
		}
		if in.Reachable != nil && f.reserved > 0 {
			if down, ok := c.unreachable(in.Reachable, Range{Path: fr.Path, KVStart: f.reserved - 1, KVLength: 1}); !ok || down {
				return p, s.slow(0, SlowReach)
			}
		}
		fr.KVStart = f.reserved
		p.Fresh = splitFresh(l, fr, split)
		if in.Place != nil {
			var ok bool
			if chunks, missing, ok = f.toAllocate(fr.KVStart, fr.KVLength, in.Place); !ok {
				return p, s.slow(0, SlowChunk) // no placement now: the slow path plans without chunks
			}
		}
	}
	if in.Quota > 0 && (!c.totalKnown || c.total+fr.KVLength > in.Quota) {
		return p, s.slow(0, SlowQuota) // an eviction: the slow path picks the victims
	}
	if made != nil && f == nil {
		return p, s.slow(0, SlowNotInMemory) // nothing to write: the slow path makes the session alone
	}
	need := int64(1 + len(missing))
	if made != nil {
		need += 2 // the file's number and its id
	}
	if c.ids.end-c.ids.next < need {
		c.idsWanted = need
		return p, s.slow(0, SlowIDs)
	}
	// Every check passed: from here on nothing fails.
	if made != nil {
		s.newSessionMem(s.wb.log, in, e, pre, made, now)
	}
	if in.Place != nil && f != nil {
		s.allocMem(s.wb.log, f, chunks, missing)
		p.FreshFile, p.FreshChunks = f.file, chunks
	}
	p.ID = c.ids.next
	c.ids.next++
	hashFrom, planned, hashes := p.Cached/pt, int64(-1), ""
	if checked {
		planned, hashes = n, encodeHashes(pr.hashes[hashFrom:])
	}
	answer := ""
	if in.RequestID != "" {
		a, err := planAnswer(&p)
		if err != nil {
			c.ids.next--
			return Plan{}, s.slow(0, SlowOther)
		}
		answer = a
	}
	lg := s.wb.log
	ne := *e
	// The plan's row is the session's last use in SQL (lastUsedCol): no
	// statement of its own on the session's row and LRU index entry,
	// which its commit rewrites anyway.
	ne.lastUsed = max(e.lastUsed, now)
	if f != nil {
		f.reserved += fr.KVLength
		ne.bytes += fr.KVLength
		c.total += fr.KVLength
		lg.reserve(s, fr.Path, f.reserved, fr.KVLength)
	}
	lg.add(s, `INSERT INTO kv_plans (id, session_id, token_start, token_length, path, kv_start, kv_length, base_tokens, base_version, created,
			hash_from, hashes, planned_tokens, split_at, request_id, answer) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, p.ID, in.Session, fr.TokenStart, fr.TokenLength, fr.Path, fr.KVStart, fr.KVLength,
		sess.tokens, sess.version, now, hashFrom, hashes, planned, split, in.RequestID, answer)
	keep(lg, &lg.planStmt, p.ID)
	lg.ops++
	c.addPlan(p.ID, &cachedPlan{session: in.Session, fr: fr, base: sess.version, hashFrom: hashFrom, hashes: hashes, planned: planned,
		split: split, requestID: in.RequestID, answer: answer, created: now})
	c.sessions[in.Session] = &ne
	return p, true
}

// newSessionMem makes, in memory and in log lg, a session planMem found
// absent: its directories (if missing), its first file (number and id
// from the block persisted ahead: planMem checked there are enough), its
// row and its file's reservation row, as createSessionTx and reserveTx do
// in SQL, and the ranges of its prefixes. The file's path holds a number
// never used before, so its plain INSERT fails only if something made that
// very path since sessionAbsent; then the flush fails and its operations
// are lost or run again in SQL, as with any failed flush (allocMem). So do
// the prefixes' guards, if a prefix the session starts from was removed or
// registered again with other content since sessionAbsent read it.
func (s *sqlStore) newSessionMem(lg *wlog, in PlanInput, e *cachedSession, pre []prefixRow, f *cachedFile, now int64) {
	c := &s.cache
	c.ids.next += 2
	dirs := dirsAbove(f.file.Path)
	// A guard first: sessionAbsent found no file where these directories
	// go, but a file made since (CreateFile does not see the log) would
	// leave a file and a directory at one path. Any such file, or a
	// directory at the file's own path, inserts a row with no parent,
	// which fails the flush (and in flush mode the plan runs again in SQL,
	// which refuses it as createFileTx does).
	args := make([]any, 0, len(dirs)+1)
	for _, d := range dirs {
		args = append(args, d)
	}
	lg.add(s, `INSERT INTO dirs (path, parent, mtime) SELECT path, NULL, 0 FROM files WHERE path IN (`+placeholders(len(dirs))+`)
		UNION ALL SELECT path, NULL, 0 FROM dirs WHERE path = ?`, append(args, f.file.Path)...)
	for i := len(dirs) - 1; i >= 0; i-- {
		lg.add(s, `INSERT INTO dirs (path, parent, mtime) VALUES (?, ?, ?) ON CONFLICT (path) DO NOTHING`, dirs[i], parentOf(dirs[i]), now)
	}
	lg.add(s, `INSERT INTO files (id, path, parent, pool, chunk_size, size, sealed, mtime) VALUES (?, ?, ?, ?, ?, 0, 0, ?)`,
		f.file.ID, f.file.Path, parentOf(f.file.Path), f.file.Pool, f.file.ChunkSize, now)
	for i, r := range e.ranges {
		// A row with no parent fails the flush unless the prefix is still
		// registered as it was read.
		p := pre[i]
		lg.add(s, `INSERT INTO dirs (path, parent, mtime) SELECT ?, NULL, 0 WHERE NOT EXISTS
			(SELECT 1 FROM kv_prefixes WHERE path = ? AND model = ? AND tokens = ? AND token_ids = ?)`, r.Path, r.Path, p.model, p.tokens, p.ids)
		lg.add(s, `INSERT INTO kv_ranges (session_id, token_start, token_length, path, kv_start, kv_length) VALUES (?, ?, ?, ?, 0, ?)`,
			in.Session, r.TokenStart, r.TokenLength, r.Path, r.KVLength)
	}
	lg.add(s, `INSERT INTO kv_sessions (id, model, tokens, last_used, created, file_seq, hashes, hashed_tokens) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
		in.Session, in.Model, e.row.tokens, now, now, f.file.ID-1, encodeHashes(e.row.hashes), e.row.hashed)
	lg.add(s, `INSERT INTO kv_files (path, session_id, reserved, lead_term) VALUES (?, ?, 0, ?)`, f.file.Path, in.Session, c.term)
	c.files[f.file.Path] = f
	c.owned[in.Session] = append(c.owned[in.Session], f.file.Path)
	if s.memCap > 0 {
		c.unwritten[in.Session] = lg // until lg is written, SQL does not know it (shed)
	}
}

// sessionAbsent reads SQL, without wb.mu: true when no session in.Session
// exists and no file stands where a directory of its first file's path
// goes (createFileTx's checks). Memory may make the session then, if
// nothing that could hide a session from memory happened during the read
// (absentGen): a session made in SQL since is in memory (a slow plan puts
// it there), and one made in memory is there until its log is written.
// pre is the rows of in.Prefixes, nil unless each is registered for
// in.Model.
func (s *sqlStore) sessionAbsent(ctx context.Context, in PlanInput) (absent bool, pre []prefixRow, err error) {
	dirs := dirsAbove(sessionFile(in.Dir, in.Session, 1))
	args := []any{in.Session}
	for _, d := range dirs {
		args = append(args, d)
	}
	var n int64
	err = s.db.QueryRowContext(ctx, s.q(`SELECT (SELECT COUNT(*) FROM kv_sessions WHERE id = ?) +
		(SELECT COUNT(*) FROM files WHERE path IN (`+placeholders(len(dirs))+`))`), args...).Scan(&n)
	if err != nil || n != 0 || len(in.Prefixes) == 0 {
		return n == 0, nil, wrapDB(err)
	}
	pre, err = s.prefixRows(ctx, s.db, in)
	if errors.Is(err, errs.ErrNotFound) || errors.Is(err, errs.ErrBadRequest) {
		return true, nil, nil // the slow path refuses the plan
	}
	return err == nil, pre, err
}

// toAllocate is f's chunks holding bytes [start, start+n), in index order,
// with missing the positions in it of those not allocated yet: each of
// them has its servers from place and no id (allocMem gives it one). ok
// false when place cannot place one (no server up, a leader warming up):
// the slow path then plans without chunks and the client allocates as it
// writes, where the error reaches it. Nothing changes here.
func (f *cachedFile) toAllocate(start, n int64, place PlaceFunc) (cs []Chunk, missing []int, ok bool) {
	size := f.file.ChunkSize
	if size <= 0 || n <= 0 {
		return nil, nil, false
	}
	first, last := start/size, (start+n-1)/size
	cs = make([]Chunk, 0, last-first+1)
	for idx := first; idx <= last; idx++ {
		ch, ok := f.chunks.get(idx)
		if !ok {
			replicas, err := place(f.file.ID, idx)
			if err != nil || len(replicas) == 0 {
				return nil, nil, false
			}
			ch = Chunk{FileID: f.file.ID, Index: idx, Replicas: replicas}
			missing = append(missing, len(cs))
		}
		cs = append(cs, ch)
	}
	return cs, missing, true
}

// allocMem allocates, in memory and in log lg, the chunks of cs at the
// positions missing (toAllocate), with ids from the block persisted ahead
// (wb.mu held; the caller checked there are enough). The rows are plain
// INSERTs: should SQL hold another chunk at the same index (an AddChunks
// racing a slow operation that reloaded the file), the flush fails on the
// UNIQUE (file_id, idx) and its operations are lost or run again in SQL,
// as with any failed flush; memory and SQL never name two chunks for one
// index. A chunk allocated here and lost with its log (window mode, a
// crash) leaves what a client wrote to it as a chunk no file uses on its
// servers (docs/kv-cache.md, "What a crash loses").
func (s *sqlStore) allocMem(lg *wlog, f *cachedFile, cs []Chunk, missing []int) {
	c := &s.cache
	for _, i := range missing {
		ch := &cs[i]
		ch.ID = uint64(c.ids.next)
		c.ids.next++
		f.chunks.put(*ch)
		lg.add(s, `INSERT INTO chunks (id, file_id, idx, length) VALUES (?, ?, ?, 0)`, int64(ch.ID), ch.FileID, ch.Index)
		for pos, sv := range ch.Replicas {
			lg.add(s, `INSERT INTO replicas (chunk_id, pos, server_id) VALUES (?, ?, ?)`, int64(ch.ID), pos, sv)
		}
	}
}

// unreachable is unreachableTx from memory; ok false when a file or a
// chunk under r is not in memory.
func (c *sessionCache) unreachable(reachable func(string) bool, r Range) (down, ok bool) {
	f := c.files[r.Path]
	if f == nil {
		return false, false
	}
	if f.file.ChunkSize <= 0 || r.KVLength <= 0 {
		return false, true
	}
	cs, ok := f.under(r.KVStart, r.KVLength)
	if !ok {
		return false, false
	}
	for _, ch := range cs {
		if !slices.ContainsFunc(ch.Replicas, reachable) {
			return true, true
		}
	}
	return false, true
}

// under is f's chunks holding bytes [start, start+n), in index order;
// ok false if one of them is not in memory.
func (f *cachedFile) under(start, n int64) ([]Chunk, bool) {
	cs := f.file.ChunkSize
	if cs <= 0 || n <= 0 {
		return nil, false
	}
	first, last := start/cs, (start+n-1)/cs
	out := make([]Chunk, 0, last-first+1)
	for idx := first; idx <= last; idx++ {
		ch, ok := f.chunks.get(idx)
		if !ok {
			return nil, false
		}
		out = append(out, ch)
	}
	return out, true
}

// commitFast answers a commit from memory when it can; ok false sends it
// to the slow path.
func (s *sqlStore) commitFast(in CommitInput) (Session, bool, error) {
	wb := &s.wb
	wb.mu.Lock()
	if !s.fastReady() {
		wb.mu.Unlock()
		return Session{}, s.slow(1, SlowNotReady), nil
	}
	ops := wb.log.ops
	out, ok, err := s.commitMem(in)
	if !ok || err != nil {
		wb.mu.Unlock()
		return Session{}, ok, err
	}
	lg := wb.log
	if lg.ops == ops {
		// A repeat: the commit it repeats may wait in an earlier log (the
		// one in flight), and is lost if that one is.
		lg = s.pending()
	}
	wb.fast.Add(1)
	ok, err = s.answered(lg)
	if !ok {
		s.slow(1, SlowLost)
	}
	return out, ok, err
}

// commitMem is CommitSession's transaction in memory (wb.mu held).
func (s *sqlStore) commitMem(in CommitInput) (Session, bool, error) {
	c := &s.cache
	id, planID := in.Session, in.PlanID
	e, ok := c.sessions[id]
	if !ok || planID == 0 {
		return Session{}, s.slow(1, SlowNotInMemory), nil
	}
	cp, ok := c.plans[planID]
	if !ok {
		if e.lastPlan == planID { // a repeat of this very commit
			return e.session(id), true, nil
		}
		return Session{}, s.slow(1, SlowNotInMemory), nil
	}
	if cp.session != id || e.row.version != cp.base {
		return Session{}, s.slow(1, SlowOther), nil
	}
	l, ok := c.layouts[e.row.model]
	if !ok {
		return Session{}, s.slow(1, SlowNotInMemory), nil
	}
	fresh := in.Saved
	if !in.Partial {
		fresh = nil
		if cp.fr.TokenLength > 0 {
			fresh = splitFresh(l, cp.fr, cp.split)
		}
	} else if checkSaved(l, cp.fr, cp.split, fresh) != nil {
		return Session{}, s.slow(1, SlowOther), nil
	}
	for _, r := range fresh {
		f := c.files[r.Path]
		if f == nil {
			return Session{}, s.slow(1, SlowNotInMemory), nil
		}
		if !recordsWritten(in) {
			if f.file.Size < r.KVStart+r.KVLength {
				return Session{}, s.slow(1, SlowOther), nil // perhaps a Sync memory did not see
			}
			continue
		}
		// Recorded even when the file's size already covers the range: a
		// Sync through another handle (another TP rank's) raises the size
		// and its own chunks' lengths, not those of the chunks this range
		// reaches (a reader takes bytes past a chunk's length for zeros).
		if f.file.Sealed || r.KVLength < 1 {
			return Session{}, s.slow(1, SlowOther), nil
		}
		if _, ok := f.under(r.KVStart, r.KVLength); !ok {
			return Session{}, s.slow(1, SlowChunk), nil
		}
	}
	hs, err := decodeHashes(cp.hashes)
	if err != nil {
		return Session{}, s.slow(1, SlowOther), nil
	}
	pc := planContent{from: cp.hashFrom, planned: cp.planned, hashes: hs}
	ch, err := computeCommit(l, e, cp.fr.TokenStart, fresh, pc)
	if err != nil {
		return Session{}, s.slow(1, SlowOther), nil
	}
	if in.Held != nil && len(fresh) > 0 {
		if err := in.Held(l, fresh); err != nil {
			return Session{}, true, fmt.Errorf("commit of plan %d: %w", planID, err)
		}
	}
	// Every check passed: from here on nothing fails.
	lg := s.wb.log
	exec := func(q string, args ...any) error { lg.add(s, q, args...); return nil }
	if recordsWritten(in) {
		for _, r := range fresh {
			s.writtenMem(lg, c.files[r.Path], r, in.Now.UnixNano()) // only raises: nothing logged when all is covered
		}
	}
	next, _ := s.replaceRanges(exec, id, e, planID, cp.fr.TokenStart, ch, in.Now) // exec never fails
	if drop(lg, lg.planStmt, planID) {
		lg.dead++ // nor the DELETE
	} else {
		lg.add(s, `DELETE FROM kv_plans WHERE id = ?`, planID)
	}
	lg.ops++
	c.removePlan(planID)
	c.sessions[id] = next
	return next.session(id), true, nil
}

// mtimeStep is how far a session file's modification time may lag its
// last written commit. A commit that moved it would move the file's entry
// in files_unsealed (an index on mtime): a random page a turn, for an
// index no expiry of session files reads (ExpireUnsealed leaves them to
// the sessions' own expiry); its time is shown, and a minute late.
const mtimeStep = time.Minute

// writtenMem is recordWrittenTx in memory: chunk lengths and the file's
// size only grow, so the statements hold whatever a client's Sync did.
// The modification time moves only when it is mtimeStep old.
func (s *sqlStore) writtenMem(lg *wlog, f *cachedFile, r Range, nowNano int64) {
	cs := f.file.ChunkSize
	end := r.KVStart + r.KVLength
	for idx := r.KVStart / cs; idx <= (end-1)/cs; idx++ {
		// The plan placed every chunk under its fresh range, so one is
		// absent only if memory lost it (growChunk).
		s.growChunk(lg, f, idx, min(end-idx*cs, cs))
	}
	s.growFile(lg, f, end, nowNano, false)
}

// session is the entry as Session answers it.
func (e *cachedSession) session(id string) Session {
	return Session{ID: id, Model: e.row.model, Tokens: e.row.tokens, Bytes: e.bytes, LastUsed: time.Unix(0, e.lastUsed).UTC(),
		Created: time.Unix(0, e.created).UTC(), Ranges: slices.Clone(e.ranges), HashedTokens: e.row.hashed}
}

// loadFile reads path's file, chunks and reservation; nil when no such file.
func (s *sqlStore) loadFile(ctx context.Context, x execer, path string) (*cachedFile, error) {
	f, err := s.fileBy(ctx, x, "path", path)
	if errors.Is(err, errs.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	cf := &cachedFile{file: f}
	cs, err := s.chunksTx(ctx, x, f.ID, 0, math.MaxInt64)
	if err != nil {
		return nil, err
	}
	for _, ch := range cs {
		cf.chunks.put(ch)
	}
	var owner string
	var reserved, term int64
	err = x.QueryRowContext(ctx, s.q(`SELECT session_id, reserved, lead_term FROM kv_files WHERE path = ?`), path).Scan(&owner, &reserved, &term)
	if err == nil {
		cf.owner, cf.reserved, cf.term = owner, reserved, term
	} else if !errors.Is(err, sql.ErrNoRows) {
		return nil, wrapDB(err)
	}
	return cf, nil
}

// cacheFiles loads paths into memory after a slow operation (cache on):
// the fast path then finds them. A path already in memory is loaded again
// only when reload (the operation may have changed it).
func (s *sqlStore) cacheFiles(ctx context.Context, tx execer, reload bool, paths ...string) error {
	c := &s.cache
	if !c.on || s.wb.mode == DurabilitySync {
		return nil
	}
	for _, p := range paths {
		if p == "" {
			continue
		}
		if _, ok := c.files[p]; ok && !reload {
			continue
		}
		f, err := s.loadFile(ctx, tx, p)
		if err != nil {
			return err
		}
		c.journal.files = append(c.journal.files, p)
		if f == nil || s.wb.sealing[f.file.ID] > 0 {
			delete(c.files, p)
			continue
		}
		c.files[p] = f
		if f.owner != "" && !slices.Contains(c.owned[f.owner], p) {
			c.owned[f.owner] = append(c.owned[f.owner], p)
		}
	}
	return nil
}

// afterSlowPlan brings memory up to what a plan run in SQL did: the
// session's entry, its files, the reserved total and a block of plan ids.
func (s *sqlStore) afterSlowPlan(ctx context.Context, tx execer, in PlanInput, p Plan, fresh string) error {
	c := &s.cache
	if !c.on || p.Repeat {
		return nil
	}
	e, ok, err := s.loadSession(ctx, tx, in.Session)
	if err != nil {
		return err
	}
	if ok {
		c.putSession(in.Session, e)
	}
	if s.wb.mode == DurabilitySync {
		return nil
	}
	paths := []string{}
	for _, r := range p.Stored {
		paths = append(paths, r.Path)
	}
	if err := s.cacheFiles(ctx, tx, false, paths...); err != nil {
		return err
	}
	if err := s.cacheFiles(ctx, tx, true, fresh); err != nil {
		return err
	}
	if err := tx.QueryRowContext(ctx, quotaTotalQuery).Scan(&c.total); err != nil {
		return wrapDB(err)
	}
	c.totalKnown = true
	need := int64(idLow)
	if c.idsWanted <= idBlock { // more than a block: a new one would not do
		need = max(need, c.idsWanted)
	}
	if c.ids.end-c.ids.next < need {
		// What is left of the block is dropped: a plan that needs more
		// ids than are left (one per chunk it allocates, one its own)
		// would otherwise go to SQL every time, and never use them up.
		end, err := s.counter(ctx, tx, "next_id", idBlock)
		if err != nil {
			return err
		}
		c.journal.ids = true
		c.ids.next, c.ids.end = end-idBlock+1, end+1
		c.idsWanted = 0
	}
	return nil
}

// afterSlowCommit brings memory up to what a commit run in SQL did.
func (s *sqlStore) afterSlowCommit(ctx context.Context, tx execer, id string, fresh []Range) error {
	c := &s.cache
	if !c.on {
		return nil
	}
	e, ok, err := s.loadSession(ctx, tx, id)
	if err != nil {
		return err
	}
	if ok {
		c.putSession(id, e)
	}
	if s.wb.mode == DurabilitySync {
		return nil
	}
	for _, r := range fresh {
		if err := s.cacheFiles(ctx, tx, true, r.Path); err != nil {
			return err
		}
	}
	return nil
}

// checkIDs compares the block of plan ids in memory with SQL
// (GD2FS_META_INVARIANTS=1): next_id is past all of it (it was persisted
// before any of it was answered), and nothing in SQL holds an id of it
// that memory has not handed out yet (plans, files and chunks share
// next_id): an id answered and lost is then never given again.
func (s *sqlStore) checkIDs(ctx context.Context, x execer) error {
	c := &s.cache
	if c.ids.next >= c.ids.end {
		return nil
	}
	var next, used int64
	if err := x.QueryRowContext(ctx, s.q(`SELECT (SELECT v FROM counters WHERE k = 'next_id'),
		(SELECT COUNT(*) FROM kv_plans WHERE id >= ? AND id < ?) + (SELECT COUNT(*) FROM files WHERE id >= ? AND id < ?) +
		(SELECT COUNT(*) FROM chunks WHERE id >= ? AND id < ?)`), c.ids.next, c.ids.end, c.ids.next, c.ids.end, c.ids.next, c.ids.end).Scan(&next, &used); err != nil {
		return wrapDB(err)
	}
	if c.ids.end-1 > next || used > 0 {
		return errs.New(errs.ErrInternal, "plan ids %d to %d in memory: next_id is %d in SQL, and %d rows hold ids of them not handed out yet",
			c.ids.next, c.ids.end-1, next, used)
	}
	return nil
}

// checkFiles compares the files in memory with SQL (GD2FS_META_INVARIANTS=1):
// memory may hold fewer chunks, shorter ones and a smaller size (a client's
// Sync), never more, and exactly the reservation.
func (s *sqlStore) checkFiles(ctx context.Context, x execer) error {
	for p, f := range s.cache.files {
		got, err := s.loadFile(ctx, x, p)
		if err != nil {
			return err
		}
		if got == nil {
			return errs.New(errs.ErrInternal, "session cache holds file %s, which SQL does not", p)
		}
		if got.file.ID != f.file.ID || got.file.ChunkSize != f.file.ChunkSize || got.owner != f.owner || got.reserved != f.reserved ||
			got.term != f.term || got.file.Size < f.file.Size || got.file.Sealed != f.file.Sealed {
			return errs.New(errs.ErrInternal, "session cache differs from SQL for file %s:\ncache %+v owner %q reserved %d term %d\nsql   %+v owner %q reserved %d term %d",
				p, f.file, f.owner, f.reserved, f.term, got.file, got.owner, got.reserved, got.term)
		}
		for _, ch := range f.chunks {
			g, ok := got.chunks.get(ch.Index)
			if !ok || g.ID != ch.ID || g.Length < ch.Length {
				return errs.New(errs.ErrInternal, "session cache holds chunk %d of %s as %+v, SQL as %+v", ch.Index, p, ch, g)
			}
		}
	}
	if c := &s.cache; c.totalKnown {
		var total int64
		if err := x.QueryRowContext(ctx, `SELECT COALESCE(SUM(reserved), 0) FROM kv_files`).Scan(&total); err != nil {
			return wrapDB(err)
		}
		if total != c.total {
			return errs.New(errs.ErrInternal, "session cache counts %d bytes reserved, SQL %d", c.total, total)
		}
	}
	return nil
}

// chunkSet is a file's chunks held in memory, sorted by index. A session
// file has a few chunks, and a map of one chunk held a whole group of
// slots: about 550 bytes a file, a third of a leader's heap at 100,000
// sessions (docs/kv-cache.md, "The leader's memory and its cap").
type chunkSet []Chunk

// get is the chunk at index idx.
func (cs chunkSet) get(idx int64) (Chunk, bool) {
	if i, ok := cs.find(idx); ok {
		return cs[i], true
	}
	return Chunk{}, false
}

// put adds ch, or replaces the chunk at its index.
func (cs *chunkSet) put(ch Chunk) {
	i, ok := cs.find(ch.Index)
	if ok {
		(*cs)[i] = ch
		return
	}
	*cs = slices.Insert(*cs, i, ch)
}

// find is where the chunk at idx is, or would go.
func (cs chunkSet) find(idx int64) (int, bool) { return FindChunk(cs, idx) }

// FindChunk is where the chunk at index idx is in cs, chunks in index
// order (as MemFile and HintChunks answer them), or would go.
func FindChunk(cs []Chunk, idx int64) (int, bool) {
	if n := len(cs); n > 0 && cs[n-1].Index < idx {
		return n, false // a file grows at its end
	}
	return slices.BinarySearchFunc(cs, idx, func(c Chunk, idx int64) int { return cmp.Compare(c.Index, idx) })
}

// snapshot is the file and a copy of its chunks, in index order, that
// outlives wb.mu (their replica lists copied too).
func (f *cachedFile) snapshot() (File, []Chunk) {
	cs := make([]Chunk, len(f.chunks))
	for i, c := range f.chunks {
		c.Replicas = slices.Clone(c.Replicas)
		cs[i] = c
	}
	return f.file, cs
}
