package meta

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/errs"
)

// Write-behind when a flush is lost or late, while the fast path goes on:
// found by an independent review of the write-behind (issue 20). A flush
// that only writes the log runs beside answers from memory, with the
// invariant checks on too (runBatch compares memory with SQL only when no
// answer came meanwhile).

// blockingFailHook makes the next flush block until release is closed, then
// fail; entered is closed when it blocks. Later flushes pass.
func blockingFailHook(t *testing.T) (entered, release chan struct{}) {
	entered, release = make(chan struct{}), make(chan struct{})
	first := true
	h := func() error {
		if !first {
			return nil
		}
		first = false
		close(entered)
		<-release
		return errs.New(errs.ErrUnavailable, "flush refused by the test")
	}
	flushHook.Store(&h)
	t.Cleanup(func() { flushHook.Store(nil) })
	return entered, release
}

// onWait returns a channel closed when an operation answered from memory,
// or a read behind the barrier, first waits for a log.
func onWait(t *testing.T) <-chan struct{} {
	waiting := make(chan struct{})
	var once sync.Once
	h := func() { once.Do(func() { close(waiting) }) }
	waitHook.Store(&h)
	t.Cleanup(func() { waitHook.Store(nil) })
	return waiting
}

// TestRepeatCommitOnLostFlush (flush mode): a commit answered from
// memory waits for flush L1; its client gives up and repeats it. The
// repeat is recognised in memory (last_plan). It must wait for L1, not for
// the current log L2 (empty): L1 fails, and a repeat answered by L2's
// empty flush would acknowledge a commit that is not in SQL, while the
// original, its caller gone, never runs again.
func TestRepeatCommitOnLostFlush(t *testing.T) {
	for name, open := range engines(t) {
		t.Run(name, func(t *testing.T) {
			s := inMode(open, DurabilityFlush)(t).(*sqlStore)
			ctx := context.Background()
			if err := s.PutLayout(ctx, wbLayout); err != nil {
				t.Fatal(err)
			}
			ids := seqIDs(1, 20)
			wbTurn(t, s, "x", ids, true)
			wbTurn(t, s, "x", ids[:16], true)
			p := wbTurn(t, s, "x", ids, false) // outstanding plan, in SQL
			before, err := s.Session(ctx, "x")
			if err != nil {
				t.Fatal(err)
			}
			entered, release := blockingFailHook(t)
			ctxA, cancelA := context.WithCancel(ctx)
			doneA := make(chan error, 1)
			go func() {
				_, err := s.CommitSession(ctxA, CommitInput{Session: "x", PlanID: p.ID, Written: true, Now: time.Now()})
				doneA <- err
			}()
			<-entered
			cancelA() // the client of A gives up (and repeats)
			waiting := onWait(t)
			doneB := make(chan struct{})
			var got Session
			var errB error
			go func() {
				got, errB = s.CommitSession(ctx, CommitInput{Session: "x", PlanID: p.ID, Written: true, Now: time.Now()})
				close(doneB)
			}()
			<-waiting // B was answered from memory and waits for a flush
			close(release)
			<-doneB
			errA := <-doneA
			stored, err := s.Session(ctx, "x")
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("before %d tokens; A: %v; repeat B: %d tokens, %v; SQL now %d tokens", before.Tokens, errA, got.Tokens, errB, stored.Tokens)
			if errB != nil {
				t.Fatalf("the repeat fails (it should run again in SQL): %v", errB)
			}
			if got.Tokens != stored.Tokens || stored.Tokens != before.Tokens+4 {
				t.Fatalf("flush mode acknowledged the repeat commit (session of %d tokens) but SQL holds %d: an acknowledged commit lost", got.Tokens, stored.Tokens)
			}
		})
	}
}

// TestRepeatPlanOnLostFlush (flush mode): the same with a plan's request
// id: the repeat must not be answered with the stored answer of a plan
// whose flush failed (that plan is not in SQL).
func TestRepeatPlanOnLostFlush(t *testing.T) {
	for name, open := range engines(t) {
		t.Run(name, func(t *testing.T) {
			s := inMode(open, DurabilityFlush)(t).(*sqlStore)
			ctx := context.Background()
			if err := s.PutLayout(ctx, wbLayout); err != nil {
				t.Fatal(err)
			}
			ids := seqIDs(1, 20)
			wbTurn(t, s, "x", ids, true)
			wbTurn(t, s, "x", ids[:16], true)
			in := PlanInput{Session: "x", Model: "m", TokenIDs: ids, DecodeTokens: 4, Dir: "/kv-sessions", Pool: "perf",
				ChunkSize: 1 << 20, PlanTTL: time.Hour, Now: time.Now(), Place: wbPlace, Quota: 1 << 30, RequestID: "r1"}
			entered, release := blockingFailHook(t)
			ctxA, cancelA := context.WithCancel(ctx)
			doneA := make(chan error, 1)
			go func() {
				_, err := s.PlanSession(ctxA, in)
				doneA <- err
			}()
			<-entered
			cancelA()
			waiting := onWait(t)
			doneB := make(chan struct{})
			var got Plan
			var errB error
			go func() {
				got, errB = s.PlanSession(ctx, in)
				close(doneB)
			}()
			<-waiting
			close(release)
			<-doneB
			errA := <-doneA
			t.Logf("A: %v; repeat B: plan %d repeat=%v %v", errA, got.ID, got.Repeat, errB)
			if errB != nil {
				t.Fatalf("the repeat fails (it should run again in SQL): %v", errB)
			}
			if _, err := s.OutstandingPlan(ctx, "x", got.ID); err != nil {
				t.Fatalf("flush mode answered plan %d (a repeat of request r1) but it is not in SQL: %v", got.ID, err)
			}
			if _, err := s.CommitSession(ctx, CommitInput{Session: "x", PlanID: got.ID, Written: true, Now: time.Now()}); err != nil {
				t.Fatalf("commit of the answered plan %d fails: %v", got.ID, err)
			}
		})
	}
}

// TestFailedBumpKeepsTerm (PostgreSQL): a leader whose flush failed takes
// a new term in its next batch (beginBatch). If that batch fails too,
// SQL's lead_term rolls back, and the store must keep its old term: one
// ahead of SQL, memory would be off for the rest of its lead, and the next
// leader would take the very term this store believes it holds, so a store
// that lost its lock unnoticed would work from memory as a leader of the
// new leader's term and the two would reserve the same bytes of one file.
func TestFailedBumpKeepsTerm(t *testing.T) {
	ctx := context.Background()
	dsn := PostgresDSNForTest(t)
	open := func() *sqlStore {
		s, err := Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s.(*sqlStore)
	}
	a := open()
	leading(t, a)
	if err := a.PutLayout(ctx, wbLayout); err != nil {
		t.Fatal(err)
	}
	ids := seqIDs(1, 20)
	wbTurn(t, a, "x", ids, true)
	wbTurn(t, a, "x", ids[:16], true)
	counter := func(k string) int64 {
		var v int64
		if err := a.db.QueryRowContext(ctx, `SELECT v FROM counters WHERE k = $1`, k).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	// COMMIT fails in any transaction that changed lead_term.
	for _, q := range []string{
		`CREATE FUNCTION bump_fail() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'commit refused by the test'; END $$`,
		`CREATE CONSTRAINT TRIGGER bump_fail AFTER UPDATE ON counters DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.k = 'lead_term') EXECUTE FUNCTION bump_fail()`,
	} {
		if _, err := a.db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	fails := 1
	fail := func() error {
		if fails > 0 {
			fails--
			return errs.New(errs.ErrUnavailable, "flush refused by the test")
		}
		return nil
	}
	flushHook.Store(&fail)
	t.Cleanup(func() { flushHook.Store(nil) })
	// Flush mode: the plan's flush fails (bump), it runs again in SQL in a
	// batch that takes a new term and fails to commit.
	_, err := a.PlanSession(ctx, PlanInput{Session: "x", Model: "m", TokenIDs: ids, DecodeTokens: 4, Dir: "/kv-sessions", Pool: "perf",
		ChunkSize: 1 << 20, PlanTTL: time.Hour, Now: time.Now(), Place: wbPlace, Quota: 1 << 30})
	if !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("plan over two failed transactions: %v, want the failed COMMIT's error", err)
	}
	if _, err := a.db.ExecContext(ctx, `DROP TRIGGER bump_fail ON counters`); err != nil {
		t.Fatal(err)
	}
	flushHook.Store(nil)
	if a.leadTerm.Load() != counter("lead_term") {
		t.Fatalf("a's lead term %d, SQL's %d after a failed batch", a.leadTerm.Load(), counter("lead_term"))
	}
	before := a.WriteBehindStats().Fast
	for range 3 {
		wbTurn(t, a, "x", ids, true)
	}
	if a.leadTerm.Load() != counter("lead_term") {
		t.Fatalf("a's lead term %d, SQL's %d", a.leadTerm.Load(), counter("lead_term"))
	}
	if a.WriteBehindStats().Fast == before {
		t.Fatal("write-behind is off after a failed batch (no operation answered from memory in 3 turns)")
	}

	// a loses its lock unnoticed (as in TestCacheStaleLeader); b leads.
	a.lead.release()
	b := open()
	leading(t, b)
	t.Logf("b leads under term %d; a still believes it leads under %d", b.leadTerm.Load(), a.leadTerm.Load())
	more := append(slices.Clone(ids), seqIDs(300, 8)...)
	a.checks, b.checks = false, false // no invariant check after a's flush (it would catch b's stale memory and fail the flush)
	wbTurn(t, b, "x", more, true)
	wbTurn(t, b, "x", more, true)
	pa := wbTurn(t, a, "x", more, false)
	pb := wbTurn(t, b, "x", more, false)
	t.Logf("SQL term %d gen %d; a planned %+v, b planned %+v", counter("lead_term"), counter("sessions_gen"), pa.Fresh, pb.Fresh)
	if overlaps(pa, pb) {
		t.Fatalf("the stale store and the leader reserved the same bytes: %+v and %+v", pa.Fresh, pb.Fresh)
	}
}

// TestBarrierWaitsForFlushInFlight (window mode, PostgreSQL): while the
// runner writes the log it took, the current log is empty; a read right
// after an answer must still wait for that flush, or it reads SQL without
// the answer (the plan just answered is not outstanding). On SQLite the
// read waits for the flush's connection (there is one) and cannot show it.
func TestBarrierWaitsForFlushInFlight(t *testing.T) {
	s := inMode(engines(t)["postgres"], DurabilityWindow)(t).(*sqlStore)
	ctx := context.Background()
	if err := s.PutLayout(ctx, wbLayout); err != nil {
		t.Fatal(err)
	}
	ids := seqIDs(1, 20)
	wbTurn(t, s, "x", ids, true)
	wbTurn(t, s, "x", ids[:16], true)
	if _, err := s.Session(ctx, "x"); err != nil { // everything before is written
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	first := true
	h := func() error {
		if first {
			first = false
			close(entered)
			<-release
		}
		return nil // the flush succeeds, late
	}
	flushHook.Store(&h)
	t.Cleanup(func() { flushHook.Store(nil) })
	before := s.WriteBehindStats().Fast
	p := wbTurn(t, s, "x", ids, false)
	if s.WriteBehindStats().Fast != before+1 {
		t.Fatal("the plan was not answered from memory")
	}
	<-entered
	waiting := onWait(t)
	read := make(chan error, 1)
	go func() {
		_, err := s.OutstandingPlan(ctx, "x", p.ID)
		read <- err
	}()
	select {
	case <-waiting: // the read waits for the flush: let it end
		close(release)
		if err := <-read; err != nil {
			t.Fatalf("plan %d is not outstanding after its flush: %v", p.ID, err)
		}
	case err := <-read:
		close(release)
		t.Fatalf("window mode: plan %d was answered, and a read during its flush did not wait for it (%v)", p.ID, err)
	}
}

// TestOneTripAllOrNothing (PostgreSQL): a log-only flush is one pipeline
// with no BEGIN or COMMIT of its own; the server runs it as one implicit
// transaction, so a statement that fails, or the guard on the term and
// generation, leaves none of the statements before it in SQL.
func TestOneTripAllOrNothing(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, PostgresDSNForTest(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	a := s.(*sqlStore)
	counter := func(k string) int64 {
		var v int64
		if err := a.db.QueryRowContext(ctx, `SELECT v FROM counters WHERE k = $1`, k).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	term, gen := counter("lead_term"), counter("sessions_gen")
	flush := func(term, gen int64, stmts ...string) error {
		conn, err := a.db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		lg := newLog()
		for _, q := range stmts {
			lg.add(a, q)
		}
		return a.oneTrip(ctx, conn, lg, term, gen)
	}
	bump := `UPDATE counters SET v = v + 7 WHERE k = 'epoch'`
	epoch := counter("epoch")
	if err := flush(term, gen, bump); err != nil {
		t.Fatal(err)
	}
	if got := counter("epoch"); got != epoch+7 {
		t.Fatalf("epoch %d after a flush that added 7 to %d", got, epoch)
	}
	epoch += 7
	// A later statement fails (the key exists): the first is rolled back.
	if err := flush(term, gen, bump, `INSERT INTO counters (k, v) VALUES ('epoch', 0)`); err == nil {
		t.Fatal("a flush with a failing statement succeeded")
	}
	if got := counter("epoch"); got != epoch {
		t.Fatalf("epoch %d after a failed flush, want %d: the statements before the failure stayed", got, epoch)
	}
	// Another writer took a term, or changed sessions: the guard fails.
	for _, tg := range [][2]int64{{term + 1, gen}, {term, gen + 1}} {
		err := flush(tg[0], tg[1], bump)
		if !errors.Is(err, errs.ErrUnavailable) || !strings.Contains(err.Error(), "sessions changed under this leader") {
			t.Fatalf("flush under term %d generation %d (SQL %d, %d): %v, want the guard's error", tg[0], tg[1], term, gen, err)
		}
		if got := counter("epoch"); got != epoch {
			t.Fatalf("epoch %d after a guarded flush, want %d", got, epoch)
		}
	}
}

// TestOneTripConnectionLost (PostgreSQL): the connection of a log-only
// flush dies in the middle of its pipeline — after the sessions lock, the
// guard and the plan's reservation ran, at the plan's row (a trigger makes
// the server end that backend, once). Nothing of the pipeline may stay in
// SQL, the leader must drop what it answered on top of it and take a new
// lead term before it answers from memory again; in flush mode the
// waiting plan runs again in SQL and is answered once, in window mode the
// answered plan is lost and its bytes are never handed out again.
func TestOneTripConnectionLost(t *testing.T) {
	for _, mode := range []string{DurabilityWindow, DurabilityFlush} {
		t.Run(mode, func(t *testing.T) {
			s := inMode(engines(t)["postgres"], mode)(t).(*sqlStore)
			ctx := context.Background()
			if err := s.PutLayout(ctx, wbLayout); err != nil {
				t.Fatal(err)
			}
			ids := seqIDs(1, 20)
			wbTurn(t, s, "x", ids, true)
			wbTurn(t, s, "x", ids[:16], true)  // x's file and chunk exist: from memory from now on
			before, err := s.Session(ctx, "x") // everything before is written
			if err != nil {
				t.Fatal(err)
			}
			count := func(q string, args ...any) int64 {
				t.Helper()
				var v int64
				if err := s.db.QueryRowContext(ctx, q, args...).Scan(&v); err != nil {
					t.Fatal(err)
				}
				return v
			}
			term := count(`SELECT v FROM counters WHERE k = 'lead_term'`)
			for _, q := range []string{
				`CREATE SEQUENCE die_once`,
				`CREATE FUNCTION die_once() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
					IF nextval('die_once') = 1 THEN PERFORM pg_terminate_backend(pg_backend_pid()); END IF; RETURN NEW; END $$`,
				`CREATE TRIGGER die_once AFTER INSERT ON kv_plans FOR EACH ROW EXECUTE FUNCTION die_once()`,
			} {
				if _, err := s.db.ExecContext(ctx, q); err != nil {
					t.Fatal(err)
				}
			}
			st := s.WriteBehindStats()
			first := wbTurn(t, s, "x", ids, false)
			if s.WriteBehindStats().Fast == st.Fast {
				t.Fatal("the plan was not answered from memory: its flush is not a log-only one")
			}
			if mode == DurabilityWindow {
				// Wait for the lost flush (a read waits for the log).
				if _, err := s.Session(ctx, "x"); err != nil && !errors.Is(err, errs.ErrUnavailable) {
					t.Fatal(err)
				}
				if n := count(`SELECT COUNT(*) FROM kv_plans WHERE id = $1`, first.ID); n != 0 {
					t.Fatalf("plan %d is in SQL after its flush's connection died", first.ID)
				}
				if r := count(`SELECT reserved FROM kv_files WHERE path = $1`, first.Fresh[0].Path); r != first.Fresh[0].KVStart {
					t.Fatalf("%s reserves %d bytes after the lost flush, want %d: part of the pipeline stayed", first.Fresh[0].Path, r, first.Fresh[0].KVStart)
				}
			} else if lost := s.WriteBehindStats().Slow[0][SlowLost] - st.Slow[0][SlowLost]; lost != 1 {
				t.Fatalf("%d plans ran again in SQL after their flush was lost, want 1", lost)
			}
			if count(`SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM die_once`) < 1 {
				t.Fatal("the trigger never ended a connection: no plan row was inserted since it was made")
			}
			next := wbTurn(t, s, "x", ids, true)
			if mode == DurabilityWindow && overlaps(first, next) {
				t.Fatalf("after a flush lost with its connection the same bytes were reserved twice: %+v and %+v", first.Fresh, next.Fresh)
			}
			if mode == DurabilityFlush {
				next = first // answered after it ran again; next was planned and committed after it
			}
			if got := count(`SELECT v FROM counters WHERE k = 'lead_term'`); got != term+1 || s.leadTerm.Load() != got {
				t.Fatalf("lead term %d in SQL, %d in the store after a lost flush; want both %d (a new term before memory answers again)", got, s.leadTerm.Load(), term+1)
			}
			if n := count(`SELECT COUNT(*) FROM kv_plans WHERE session_id = 'x'`); mode == DurabilityFlush && n != 1 {
				t.Fatalf("%d plans of x outstanding in SQL, want 1 (the plan answered once)", n)
			}
			st = s.WriteBehindStats()
			wbTurn(t, s, "x", ids, true)
			if s.WriteBehindStats().Fast == st.Fast {
				t.Fatal("memory no longer answers after the new term")
			}
			got, err := s.Session(ctx, "x")
			if err != nil {
				t.Fatal(err)
			}
			if want := int64(len(ids) + 4); got.Tokens != want || before.Tokens >= want {
				t.Fatalf("x holds %d tokens (%d before), want %d", got.Tokens, before.Tokens, want)
			}
		})
	}
}
