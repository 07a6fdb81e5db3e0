package meta

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/errs"
)

// inMode opens stores of open in write-behind mode mode.
func inMode(open func(t *testing.T) Store, mode string) func(t *testing.T) Store {
	return func(t *testing.T) Store {
		s := open(t)
		if err := s.(DurabilitySetter).SetSessionDurability(mode); err != nil {
			t.Fatal(err)
		}
		return s
	}
}

// windowEngines are engines whose leaders answer at once (window mode).
func windowEngines(t *testing.T) map[string]func(t *testing.T) Store {
	out := map[string]func(t *testing.T) Store{}
	for name, open := range engines(t) {
		out[name+"-window"] = inMode(open, DurabilityWindow)
	}
	return out
}

// TestSessionPropertyWindow is TestSessionProperty on leaders that answer
// plans and commits before writing them (every read waits for the log).
func TestSessionPropertyWindow(t *testing.T) {
	// Half TestSessionProperty's plans: each flush compares memory with SQL.
	propertyRuns(t, windowEngines(t), 120, 0, false, nil, nil)
}

// TestSessionPropertyLostFlushes is TestSessionPropertyWindow with a quarter
// of the leader's flushes failing: what a flush loses reads as a shorter
// or older stored range, never as bytes of another conversation.
func TestSessionPropertyLostFlushes(t *testing.T) {
	propertyRuns(t, windowEngines(t), 120, 5, true, nil, nil)
}

var wbLayout = Layout{Model: "m", Layers: 2, KVHeads: 1, HeadDim: 8, DType: "fp16", PageTokens: 4, Order: "page_first"}

func wbPlace(fileID, idx int64) ([]string, error) { return []string{"s1"}, nil }

// wbTurn plans session id for prompt (placing the fresh chunks) and, when
// commit, commits it as written.
func wbTurn(t *testing.T, s Store, id string, prompt []uint32, commit bool) Plan {
	t.Helper()
	ctx := context.Background()
	p, err := s.PlanSession(ctx, PlanInput{Session: id, Model: "m", TokenIDs: prompt, DecodeTokens: 4, Dir: "/kv-sessions", Pool: "perf",
		ChunkSize: 1 << 20, PlanTTL: time.Hour, Now: time.Now(), Place: wbPlace, Quota: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	if commit {
		if _, err := s.CommitSession(ctx, CommitInput{Session: id, PlanID: p.ID, Written: true, Now: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

func seqIDs(first uint32, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = first + uint32(i)
	}
	return out
}

// TestWriteBehindAnswersFromMemory: in flush and window mode a chat's
// turns after its first are answered from memory (the session's file and
// chunk exist), and the session in SQL is what the turns made; in sync
// mode nothing is.
func TestWriteBehindAnswersFromMemory(t *testing.T) {
	for name, open := range engines(t) {
		for _, mode := range []string{DurabilityFlush, DurabilityWindow, DurabilitySync} {
			t.Run(name+"-"+mode, func(t *testing.T) {
				s := inMode(open, mode)(t)
				ctx := context.Background()
				if err := s.PutLayout(ctx, wbLayout); err != nil {
					t.Fatal(err)
				}
				ids := seqIDs(1, 0)
				const turns = 12
				for i := range turns {
					ids = append(ids, seqIDs(uint32(100*i+1), 10)...)
					wbTurn(t, s, "chat", ids, true)
					ids = append(ids, seqIDs(uint32(100*i+50), 4)...) // the answer
				}
				fast := s.(*sqlStore).WriteBehindStats().Fast
				if mode == DurabilitySync && fast != 0 {
					t.Fatalf("sync mode answered %d operations from memory", fast)
				}
				// The first plan makes the session and its file; later ones
				// and their commits come from memory.
				if mode != DurabilitySync && fast < 2*(turns-2) {
					t.Fatalf("%d of %d operations answered from memory", fast, 2*turns)
				}
				got, err := s.Session(ctx, "chat")
				if err != nil {
					t.Fatal(err)
				}
				if want := int64(len(ids)); got.Tokens != want || got.HashedTokens != want-4 {
					t.Fatalf("session holds %d tokens (%d hashed), want %d (%d)", got.Tokens, got.HashedTokens, want, want-4)
				}
			})
		}
	}
}

// overlaps reports whether two plans' fresh ranges share a byte of a file.
func overlaps(a, b Plan) bool {
	for _, x := range a.Fresh {
		for _, y := range b.Fresh {
			if x.Path == y.Path && x.KVStart < y.KVStart+y.KVLength && y.KVStart < x.KVStart+x.KVLength {
				return true
			}
		}
	}
	return false
}

// TestNewLeaderNeverReusesLostReservation: a leader in window mode answers
// a plan whose flush never happens (it dies); the bytes it reserved may
// still be written by that plan's engine. The next leader, which knows
// only SQL, must not hand those bytes out again: its plan of the session
// goes to a new file. Without kv_files.lead_term's rule (reserveTx) the
// new plan reserves the very bytes of the lost one.
func TestNewLeaderNeverReusesLostReservation(t *testing.T) {
	for name, mk := range sharedDSNs {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			dsn := mk(t)
			open := func() *sqlStore {
				s := openShared(t, dsn)
				if err := s.SetSessionDurability(DurabilityWindow); err != nil {
					t.Fatal(err)
				}
				return s
			}
			a := open()
			leading(t, a)
			if err := a.PutLayout(ctx, wbLayout); err != nil {
				t.Fatal(err)
			}
			ids := seqIDs(1, 20)
			wbTurn(t, a, "x", ids, true)
			wbTurn(t, a, "x", ids[:16], true) // the file and its chunk exist under a's term
			// a's flushes fail from now on, as if a were killed before
			// writing: its next plan is answered, never persisted.
			if _, err := a.Session(ctx, "x"); err != nil { // everything before is written
				t.Fatal(err)
			}
			fail := func() error { return errs.New(errs.ErrUnavailable, "flush refused by the test") }
			flushHook.Store(&fail)
			t.Cleanup(func() { flushHook.Store(nil) })
			before := a.WriteBehindStats().Fast
			lost := wbTurn(t, a, "x", ids, false)
			if a.WriteBehindStats().Fast != before+1 {
				t.Fatal("the plan was not answered from memory")
			}
			// Its flush now (not windowPace later, when a no longer leads):
			// refused by the hook, the log is lost.
			failed := a.WriteBehindStats().FailedFlushes
			if err := a.barrier(ctx); err != nil {
				t.Fatal(err)
			}
			if a.WriteBehindStats().FailedFlushes != failed+1 {
				t.Fatal("the lost plan's flush did not fail")
			}
			a.lead.release() // a is gone; its log with it
			a.leadTerm.Store(0)
			flushHook.Store(nil)

			b := open()
			leading(t, b)
			p := wbTurn(t, b, "x", ids, false)
			if overlaps(p, lost) {
				t.Fatalf("the new leader reserved %+v, bytes of the lost plan %+v whose engine may still write them", p.Fresh, lost.Fresh)
			}
			// b's own turns go on in its new file from memory.
			if _, err := b.CommitSession(ctx, CommitInput{Session: "x", PlanID: p.ID, Written: true, Now: time.Now()}); err != nil {
				t.Fatal(err)
			}
			q := wbTurn(t, b, "x", append(ids, seqIDs(500, 8)...), true)
			if q.Fresh[0].Path != p.Fresh[0].Path || overlaps(q, lost) {
				t.Fatalf("b's next turn went to %+v (its file %s)", q.Fresh, p.Fresh[0].Path)
			}
		})
	}
}

// TestLostFlushTakesNewTerm: a leader whose flush fails loses what it
// answered since the last one (window mode) and must not hand those bytes
// out again either; in flush mode the operations waiting for that flush
// run again in SQL and succeed.
func TestLostFlushTakesNewTerm(t *testing.T) {
	for name, open := range engines(t) {
		for _, mode := range []string{DurabilityWindow, DurabilityFlush} {
			t.Run(name+"-"+mode, func(t *testing.T) {
				s := inMode(open, mode)(t).(*sqlStore)
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
				var fails atomic.Int32
				fails.Store(1)
				fail := func() error {
					if fails.Add(-1) < 0 {
						return nil
					}
					return errs.New(errs.ErrUnavailable, "flush refused by the test")
				}
				flushHook.Store(&fail)
				t.Cleanup(func() { flushHook.Store(nil) })
				first := wbTurn(t, s, "x", ids, false)
				if mode == DurabilityWindow {
					// Wait for the failed flush (a read waits for the log).
					if _, err := s.Session(ctx, "x"); err != nil && !errors.Is(err, errs.ErrUnavailable) {
						t.Fatal(err)
					}
				}
				next := wbTurn(t, s, "x", ids, true)
				if overlaps(first, next) {
					t.Fatalf("after a lost flush the same bytes were reserved twice: %+v and %+v", first.Fresh, next.Fresh)
				}
				got, err := s.Session(ctx, "x")
				if err != nil {
					t.Fatal(err)
				}
				if got.Tokens != int64(len(ids)+4) {
					t.Fatalf("session holds %d tokens, want %d", got.Tokens, len(ids)+4)
				}
			})
		}
	}
}

// TestLogDropsUselessStatements: a log is one transaction, so a statement
// a later one of the same log overwrites is not written (the flush is the
// leader's bottleneck). A window-mode leader's flush is held while a plan
// and its commit queue in one log: the plan row is neither inserted nor
// deleted, the quota counter gets one statement; what SQL ends with is
// what memory holds (GD2FS_META_INVARIANTS compares them after the flush)
// and what the turns made. And statements never needed: a plan writes no
// session row (its own row is the session's last use, lastUsedCol), a
// commit that only appends deletes no ranges (TestAppendDeletesNoRanges).
func TestLogDropsUselessStatements(t *testing.T) {
	for name, open := range windowEngines(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t).(*sqlStore)
			ctx := context.Background()
			if err := s.PutLayout(ctx, wbLayout); err != nil {
				t.Fatal(err)
			}
			x, y := seqIDs(1, 20), seqIDs(1000, 20)
			for _, id := range []string{"x", "y"} {
				wbTurn(t, s, id, x, true)
				wbTurn(t, s, id, x[:16], true) // the file and its chunk exist under s's term
			}
			if _, err := s.Session(ctx, "x"); err != nil { // everything before is written
				t.Fatal(err)
			}
			before := s.WriteBehindStats()
			entered, release := make(chan struct{}), make(chan struct{})
			var once atomic.Bool
			hold := func() error {
				if once.CompareAndSwap(false, true) {
					close(entered)
					<-release
				}
				return nil
			}
			flushHook.Store(&hold)
			t.Cleanup(func() { flushHook.Store(nil) })
			x = append(x, seqIDs(100, 8)...)
			px := wbTurn(t, s, "x", x, false) // its log is being written, held
			<-entered
			if _, err := s.CommitSession(ctx, CommitInput{Session: "x", PlanID: px.ID, Written: true, Now: time.Now()}); err != nil {
				t.Fatal(err)
			}
			y = append(y[:16], seqIDs(2000, 12)...)
			// y's plan and commit, and a second reservation of x, all in the
			// log that waits.
			wbTurn(t, s, "y", y, true)
			wbTurn(t, s, "x", append(x, seqIDs(300, 8)...), false)
			s.wb.mu.Lock()
			var plans, sessions, deletes, counter []string
			for _, st := range s.wb.log.live(s) {
				switch {
				case strings.Contains(st.q, "kv_plans"):
					plans = append(plans, st.q)
				case strings.HasPrefix(st.q, "UPDATE kv_sessions"):
					sessions = append(sessions, st.q)
				case strings.HasPrefix(st.q, "DELETE FROM kv_ranges"):
					deletes = append(deletes, st.q)
				case strings.Contains(st.q, "counters"):
					counter = append(counter, st.q)
				}
			}
			ops := s.wb.log.ops
			s.wb.mu.Unlock()
			close(release)
			// x's plan row was written by the held log: its commit deletes
			// it. y's plan was made and committed in this log: no row. x's
			// second plan: a row. Only the two commits write a session row;
			// each deletes the range of the decode tokens before it (not
			// vouched for by hashes, so not kept).
			if ops != 4 || len(plans) != 2 || !strings.HasPrefix(plans[0], "DELETE") || !strings.HasPrefix(plans[1], "INSERT") ||
				len(sessions) != 2 || len(deletes) != 2 || len(counter) != 1 {
				t.Fatalf("a log of %d operations (x's commit, y's plan and commit, x's plan) writes plan statements %q, session updates %q, range deletions %q, counter updates %q; want x's DELETE and INSERT, two, two, one",
					ops, plans, sessions, deletes, counter)
			}
			for id, ids := range map[string][]uint32{"x": x, "y": y} {
				got, err := s.Session(ctx, id) // waits for the log
				if err != nil {
					t.Fatal(err)
				}
				if want := int64(len(ids) + 4); got.Tokens != want {
					t.Fatalf("session %s holds %d tokens, want %d", id, got.Tokens, want)
				}
			}
			if p, err := s.OutstandingPlan(ctx, "x", px.ID); err == nil {
				t.Fatalf("committed plan %d still outstanding: %+v", px.ID, p)
			}
			// Left out: y's plan row (INSERT and DELETE), one of the two
			// counter updates.
			if d := s.WriteBehindStats().Dropped - before.Dropped; d != 3 {
				t.Fatalf("the flushes left out %d statements, want 3", d)
			}
		})
	}
}

// TestAppendDeletesNoRanges: a commit that appends to its session (the
// plan kept every stored token) writes no DELETE of range rows, and one that
// rewinds does; a file that grows within a minute keeps its mtime; what SQL
// ends with is the turns' (GD2FS_META_INVARIANTS compares memory with SQL
// after the flush).
func TestAppendDeletesNoRanges(t *testing.T) {
	for name, open := range windowEngines(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t).(*sqlStore)
			ctx := context.Background()
			if err := s.PutLayout(ctx, wbLayout); err != nil {
				t.Fatal(err)
			}
			turn := func(id string, tokens int64) {
				t.Helper()
				p, err := s.PlanSession(ctx, PlanInput{Session: id, Model: "m", PromptTokens: tokens, UnsafeCountOnly: true, Dir: "/kv-sessions", Pool: "perf",
					ChunkSize: 1 << 20, PlanTTL: time.Hour, Now: time.Now(), Place: wbPlace})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := s.CommitSession(ctx, CommitInput{Session: id, PlanID: p.ID, Written: true, Now: time.Now()}); err != nil {
					t.Fatal(err)
				}
			}
			for _, id := range []string{"a", "b", "z"} {
				turn(id, 16)
				turn(id, 20) // the file and its chunk exist under s's term
			}
			if _, err := s.Session(ctx, "a"); err != nil { // everything before is written
				t.Fatal(err)
			}
			entered, release := make(chan struct{}), make(chan struct{})
			var once atomic.Bool
			hold := func() error {
				if once.CompareAndSwap(false, true) {
					close(entered)
					<-release
				}
				return nil
			}
			flushHook.Store(&hold)
			t.Cleanup(func() { flushHook.Store(nil) })
			turn("z", 24) // its log is being written, held
			<-entered
			turn("a", 28) // appends at token 20
			turn("b", 12) // rewinds: the range from token 16 goes
			s.wb.mu.Lock()
			var deletes []any
			var files []string
			for _, st := range s.wb.log.live(s) {
				if strings.HasPrefix(st.q, "DELETE FROM kv_ranges") {
					deletes = append(deletes, st.args[0])
				}
				if strings.HasPrefix(st.q, "UPDATE files") {
					files = append(files, st.q)
				}
			}
			s.wb.mu.Unlock()
			close(release)
			if !slices.Equal(deletes, []any{"b"}) {
				t.Fatalf("range rows deleted for sessions %v, want b's alone (a's turn only appends)", deletes)
			}
			// a's file grew within a minute of its last commit: its size
			// moves, its mtime (files_unsealed's key) does not (mtimeStep).
			if len(files) != 1 || strings.Contains(files[0], "mtime") {
				t.Fatalf("file updates %q, want one of the size alone", files)
			}
			for id, want := range map[string]int64{"a": 28, "b": 12, "z": 24} {
				got, err := s.Session(ctx, id) // waits for the log
				if err != nil || got.Tokens != want {
					t.Fatalf("session %s holds %d tokens (%v), want %d", id, got.Tokens, err, want)
				}
			}
		})
	}
}

// TestFastPlanAllocatesChunks: a chat whose every turn enters a new chunk
// (a real model's layout: 128 tokens of an 8B model fill a 16 MiB chunk)
// is answered from memory, the plans allocating the chunks there; what
// they allocated is what SQL holds once written, an index has one chunk
// however many plans name it, and a client's AddChunks of an index memory
// allocated gets that chunk, not a second one (window mode: it waits for
// the log). Without allocMem every plan here runs in SQL ("chunk").
func TestFastPlanAllocatesChunks(t *testing.T) {
	for name, open := range engines(t) {
		for _, mode := range []string{DurabilityFlush, DurabilityWindow} {
			t.Run(name+"-"+mode, func(t *testing.T) {
				s := inMode(open, mode)(t)
				ctx := context.Background()
				if err := s.PutLayout(ctx, wbLayout); err != nil { // 64 bytes a token
					t.Fatal(err)
				}
				placed := map[[2]int64]int{}
				place := func(fileID, idx int64) ([]string, error) {
					placed[[2]int64{fileID, idx}]++
					return []string{"s1", "s2"}, nil
				}
				plan := func(prompt []uint32) Plan {
					t.Helper()
					// Chunks of 700 bytes: a turn of 14 tokens (896 bytes)
					// enters one or two new chunks.
					p, err := s.PlanSession(ctx, PlanInput{Session: "chat", Model: "m", TokenIDs: prompt, DecodeTokens: 4, Dir: "/kv-sessions",
						Pool: "perf", ChunkSize: 700, PlanTTL: time.Hour, Now: time.Now(), Place: place, Quota: 1 << 30})
					if err != nil {
						t.Fatal(err)
					}
					if err := checkFreshChunks(p); err != nil {
						t.Fatal(err)
					}
					return p
				}
				byIndex := map[int64]Chunk{}
				seen := func(p Plan) {
					t.Helper()
					for _, ch := range p.FreshChunks {
						if old, ok := byIndex[ch.Index]; ok && (old.ID != ch.ID || !slices.Equal(old.Replicas, ch.Replicas)) {
							t.Fatalf("chunk %d named as %+v, earlier as %+v", ch.Index, ch, old)
						}
						byIndex[ch.Index] = ch
					}
				}
				ids := []uint32{}
				const turns = 12
				var p Plan
				for i := range turns {
					ids = append(ids, seqIDs(uint32(100*i+1), 10)...)
					p = plan(ids)
					seen(p)
					if _, err := s.CommitSession(ctx, CommitInput{Session: "chat", PlanID: p.ID, Written: true, Now: time.Now()}); err != nil {
						t.Fatal(err)
					}
					ids = append(ids, seqIDs(uint32(100*i+50), 4)...) // the answer
				}
				st := s.(*sqlStore).WriteBehindStats()
				if n := st.Slow[0][SlowChunk]; n != 0 {
					t.Fatalf("%d plans ran in SQL to allocate a chunk", n)
				}
				if st.Fast < 2*(turns-1) {
					t.Fatalf("%d of %d operations answered from memory (slow: %v)", st.Fast, 2*turns, st.Slow)
				}
				for k, n := range placed {
					if n != 1 {
						t.Fatalf("chunk %d of file %d placed %d times", k[1], k[0], n)
					}
				}
				// In window mode the next plans' flushes are held until a
				// read waits for them. One that does not wait finds the
				// flush held (on SQLite it queues behind it for the store's
				// one connection): the timer then ends the hold, and the
				// returned check fails the test.
				hold := func() (func(), func()) {
					if mode != DurabilityWindow {
						return func() {}, func() {}
					}
					release := make(chan struct{})
					var once sync.Once
					var timedOut atomic.Bool
					free := func() { once.Do(func() { close(release) }) }
					h := func() error {
						select {
						case <-release:
						case <-time.After(5 * time.Second):
							timedOut.Store(true)
						}
						return nil
					}
					flushHook.Store(&h)
					waitHook.Store(&free)
					return func() { free(); flushHook.Store(nil); waitHook.Store(nil) }, func() {
						t.Helper()
						if timedOut.Load() {
							t.Fatal("the call did not wait for the log: the held flush ended by the timer")
						}
					}
				}
				// A server that restarts and reports holding a chunk a plan
				// allocated (and its client wrote) is told it is no orphan:
				// the sweep waits for the log.
				free, waited := hold()
				ids = append(ids, seqIDs(4000, 30)...)
				p = plan(ids)
				seen(p)
				n, err := s.Orphans(ctx, "s1", []uint64{p.FreshChunks[len(p.FreshChunks)-1].ID})
				free()
				waited()
				if err != nil || n != 0 {
					t.Fatalf("a chunk the outstanding plan allocated swept as an orphan: %d, %v", n, err)
				}
				// A repair scan of the server the plan's chunks are on
				// finds them (it waits for the log too).
				free, waited = hold()
				ids = append(ids, seqIDs(4500, 30)...)
				p2 := plan(ids)
				seen(p2)
				on, err := s.ChunksOn(ctx, "s2")
				free()
				waited()
				if err != nil {
					t.Fatal(err)
				}
				want := p2.FreshChunks[len(p2.FreshChunks)-1].ID
				if !slices.ContainsFunc(on, func(pc Placed) bool { return pc.ID == want }) {
					t.Fatalf("a repair scan of s2 misses chunk %d, which a plan placed there", want)
				}
				// (p2 stays outstanding: the next plan of the chat supersedes it.)
				if _, err := s.CommitSession(ctx, CommitInput{Session: "chat", PlanID: p.ID, Written: true, Now: time.Now()}); err != nil {
					t.Fatal(err)
				}
				// A client's AddChunks of an outstanding plan's chunks gets
				// their ids: without the wait it finds none in SQL and makes
				// its own.
				free, waited = hold()
				defer free()
				ids = append(ids, seqIDs(5000, 30)...)
				p = plan(ids)
				seen(p)
				got, err := s.AddChunks(ctx, p.FreshFile.ID, p.FreshChunks)
				if err != nil {
					t.Fatal(err)
				}
				waited()
				if len(got) != len(p.FreshChunks) {
					t.Fatalf("AddChunks of the plan's %d chunks: %+v", len(p.FreshChunks), got)
				}
				for i, ch := range got {
					if ch.ID != p.FreshChunks[i].ID {
						t.Fatalf("AddChunks made chunk %+v for index %d, the plan allocated %+v", ch, ch.Index, p.FreshChunks[i])
					}
				}
				if _, err := s.CommitSession(ctx, CommitInput{Session: "chat", PlanID: p.ID, Written: true, Now: time.Now()}); err != nil {
					t.Fatal(err)
				}
				// A file-level commit (a client's Sync) of a length in a
				// chunk the outstanding plan allocated records it: without
				// its wait the UPDATE finds no row yet and the length is
				// lost, whatever its caller waited for before.
				free, waited = hold()
				ids = append(ids, seqIDs(6000, 30)...)
				p = plan(ids)
				seen(p)
				last := p.FreshChunks[len(p.FreshChunks)-1]
				if _, err := s.Commit(ctx, p.FreshFile.ID, last.Index*700+100, map[int64]int64{last.Index: 100}, false, time.Now()); err != nil {
					t.Fatal(err)
				}
				free()
				waited()
				cs, err := s.Chunks(ctx, p.FreshFile.ID)
				if err != nil {
					t.Fatal(err)
				}
				for _, ch := range cs {
					if ch.Index == last.Index && ch.Length < 100 {
						t.Fatalf("chunk %d: length %d in SQL after a commit of 100", ch.Index, ch.Length)
					}
				}
				if _, err := s.CommitSession(ctx, CommitInput{Session: "chat", PlanID: p.ID, Written: true, Now: time.Now()}); err != nil {
					t.Fatal(err)
				}
				// SQL holds exactly the chunks the plans named.
				cs, err = s.Chunks(ctx, p.FreshFile.ID)
				if err != nil {
					t.Fatal(err)
				}
				if len(cs) != len(byIndex) {
					t.Fatalf("SQL holds %d chunks, the plans named %d", len(cs), len(byIndex))
				}
				for _, ch := range cs {
					want := byIndex[ch.Index]
					if ch.ID != want.ID || !slices.Equal(ch.Replicas, want.Replicas) {
						t.Fatalf("SQL holds chunk %d as %+v, the plans named %+v", ch.Index, ch, want)
					}
				}
			})
		}
	}
}

// TestQuotaLowMarkKeepsPlansInMemory: under a full --session-quota a plan
// that must evict runs in SQL; it evicts down to the quota's low mark
// (quotaLow), so the plans after it fit and are answered from memory. Two
// chats take turns while idle one-turn sessions fill the quota: without
// the low mark every one of their plans evicts one session in SQL.
func TestQuotaLowMarkKeepsPlansInMemory(t *testing.T) {
	for name, open := range engines(t) {
		t.Run(name, func(t *testing.T) {
			s := inMode(open, DurabilityFlush)(t)
			ctx := context.Background()
			if err := s.PutLayout(ctx, wbLayout); err != nil { // 64 bytes a token
				t.Fatal(err)
			}
			const quota = 16 << 10 // its low mark 512 bytes below
			plan := func(id string, prompt []uint32) Plan {
				t.Helper()
				p, err := s.PlanSession(ctx, PlanInput{Session: id, Model: "m", TokenIDs: prompt, Dir: "/kv-sessions",
					Pool: "perf", ChunkSize: 1 << 20, PlanTTL: time.Hour, Now: time.Now(), Place: wbPlace, Quota: quota})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := s.CommitSession(ctx, CommitInput{Session: id, PlanID: p.ID, Written: true, Now: time.Now()}); err != nil {
					t.Fatal(err)
				}
				return p
			}
			// 62 idle sessions of 4 tokens (256 bytes): 15.5 KiB.
			for i := range 62 {
				plan(fmt.Sprintf("cold%03d", i), seqIDs(uint32(i*100), 4))
			}
			before := s.(*sqlStore).WriteBehindStats()
			var evicted []string
			chats := [2][]uint32{}
			const turns = 60
			for i := range turns {
				c := &chats[i%2]
				*c = append(*c, seqIDs(uint32(10000*(i%2+1)+len(*c)), 4)...) // 4 tokens a turn
				evicted = append(evicted, plan(fmt.Sprintf("chat%d", i%2), *c).Evicted...)
			}
			after := s.(*sqlStore).WriteBehindStats()
			quotaSlow := after.Slow[0][SlowQuota] - before.Slow[0][SlowQuota]
			// Least recently used first: the idle sessions in the order made.
			for i, id := range evicted {
				if want := fmt.Sprintf("cold%03d", i); id != want {
					t.Fatalf("eviction %d took %s, want %s (%v)", i, id, want, evicted)
				}
			}
			if len(evicted) < 20 || quotaSlow > turns/2 {
				t.Fatalf("%d turns evicted %d sessions; %d plans ran in SQL to evict", turns, len(evicted), quotaSlow)
			}
			t.Logf("%d turns evicted %d sessions; %d plans ran in SQL to evict", turns, len(evicted), quotaSlow)
		})
	}
}

// TestSealKeepsFileOutOfMemory: while a Commit seals a session's file, a
// turn of the session (run between the seal's wait for the file's logs
// and its transaction) must not be answered from memory: its commit,
// written after the seal, would grow a sealed file past the size the
// seal returned. Without wb.sealing the turn's plan, run in SQL, loads
// the file back into memory and the next commit is answered there. After
// the seal the chat goes on in a new file.
func TestSealKeepsFileOutOfMemory(t *testing.T) {
	for name, open := range engines(t) {
		t.Run(name, func(t *testing.T) {
			s := inMode(open, DurabilityWindow)(t)
			ctx := context.Background()
			if err := s.PutLayout(ctx, wbLayout); err != nil {
				t.Fatal(err)
			}
			place := func(fileID, idx int64) ([]string, error) { return []string{"s1", "s2"}, nil }
			var ids []uint32
			turn := func(i int) Plan {
				t.Helper()
				ids = append(ids, seqIDs(uint32(100*i+1), 10)...)
				p, err := s.PlanSession(ctx, PlanInput{Session: "chat", Model: "m", TokenIDs: ids, DecodeTokens: 4, Dir: "/kv-sessions",
					Pool: "perf", ChunkSize: 700, PlanTTL: time.Hour, Now: time.Now(), Place: place, Quota: 1 << 30})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := s.CommitSession(ctx, CommitInput{Session: "chat", PlanID: p.ID, Written: true, Now: time.Now()}); err != nil {
					t.Fatal(err)
				}
				ids = append(ids, seqIDs(uint32(100*i+50), 4)...)
				return p
			}
			var p Plan
			for i := range 4 {
				p = turn(i)
			}
			h := func() {
				for i := 4; i < 7; i++ {
					turn(i)
				}
			}
			sealHook.Store(&h)
			sealed, err := s.Commit(ctx, p.FreshFile.ID, 0, nil, true, time.Now())
			sealHook.Store(nil)
			if err != nil {
				t.Fatal(err)
			}
			if !sealed.Sealed {
				t.Fatalf("Commit with seal returned %+v", sealed)
			}
			f, err := s.File(ctx, sealed.Path) // waits for the log
			if err != nil {
				t.Fatal(err)
			}
			if !f.Sealed || f.Size != sealed.Size {
				t.Fatalf("sealed at %d bytes, now %+v: a commit written after the seal grew it", sealed.Size, f)
			}
			// The chat goes on in a new file; the sealed one takes nothing.
			if p := turn(7); p.Fresh[0].Path == sealed.Path {
				t.Fatalf("a plan after the seal appends to the sealed file %s", sealed.Path)
			}
			if f, err = s.File(ctx, sealed.Path); err != nil || f.Size != sealed.Size {
				t.Fatalf("after the seal a turn left %+v, %v", f, err)
			}
		})
	}
}

// TestWindowPace: in window mode, operations answered within windowPace of
// the last flush's start wait for one flush together, and a read behind
// the barrier, or Close, writes them at once without waiting for the pace
// (here an hour: this test would time out waiting for it).
func TestWindowPace(t *testing.T) {
	defer func(p time.Duration) { windowPace = p }(windowPace)
	windowPace = time.Hour
	for name, dsn := range sharedDSNs {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			url := dsn(t)
			st, err := Open(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			s := st.(*sqlStore)
			closed := false
			t.Cleanup(func() {
				if !closed { // failed before its own Close
					s.Close()
				}
			})
			if err := s.SetSessionDurability(DurabilityWindow); err != nil {
				t.Fatal(err)
			}
			leading(t, s)
			if err := s.PutLayout(ctx, wbLayout); err != nil {
				t.Fatal(err)
			}
			ids := seqIDs(1, 10)
			wbTurn(t, s, "chat", ids, true) // its first plan makes the session in SQL
			if _, err := s.Session(ctx, "chat"); err != nil {
				t.Fatal(err)
			}
			before := s.WriteBehindStats()
			const turns = 5
			for i := range turns {
				ids = append(ids, seqIDs(uint32(100*i+20), 8)...)
				wbTurn(t, s, "chat", ids, true)
			}
			if got := s.WriteBehindStats(); got.Flushes != before.Flushes || got.Fast != before.Fast+2*turns {
				t.Fatalf("%d flushes before the pace ended (%d before), %d operations from memory (%d before)", got.Flushes, before.Flushes, got.Fast, before.Fast)
			}
			s.wb.mu.Lock()
			paced := s.wb.pace != nil && s.wb.pace.Stop() // Stop: it was waiting
			if paced {
				s.wb.pace.Reset(windowPace)
			}
			s.wb.mu.Unlock()
			if !paced {
				t.Fatal("the turns' flush was started at once, not windowPace after the last one began")
			}
			sess, err := s.Session(ctx, "chat") // behind the barrier
			if err != nil {
				t.Fatal(err)
			}
			if got := s.WriteBehindStats(); got.Flushes != before.Flushes+1 || got.Flushed != before.Flushed+2*turns || sess.Tokens != int64(len(ids))+4 {
				t.Fatalf("the barrier's read: %d flushes carrying %d operations (want 1 of %d), session of %d tokens (want %d and the answer's 4)",
					got.Flushes-before.Flushes, got.Flushed-before.Flushed, 2*turns, sess.Tokens, len(ids))
			}
			// Answered, then Close: written at once.
			ids = append(ids, seqIDs(900, 8)...)
			wbTurn(t, s, "chat", ids, true)
			closed = true
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			b := openShared(t, url)
			leading(t, b)
			if sess, err := b.Session(ctx, "chat"); err != nil || sess.Tokens != int64(len(ids))+4 {
				t.Fatalf("after Close the session holds %d tokens (%v), want %d and the answer's 4", sess.Tokens, err, len(ids))
			}
		})
	}
}

// TestEngineCommitAfterSyncFromMemory: an engine's commit (the segments it
// saved, the bytes made durable by its Sync of the file) is answered from
// memory: the Sync raises the file's size in memory too. Before, memory
// did not see the Sync, and every such commit (every commit of `gd2fs
// router`) ran in SQL.
func TestEngineCommitAfterSyncFromMemory(t *testing.T) {
	for name, open := range engines(t) {
		for _, mode := range []string{DurabilityFlush, DurabilityWindow} {
			t.Run(name+"-"+mode, func(t *testing.T) {
				s := inMode(open, mode)(t)
				ctx := context.Background()
				if err := s.PutLayout(ctx, wbLayout); err != nil {
					t.Fatal(err)
				}
				ids := seqIDs(1, 20)
				wbTurn(t, s, "e", ids, true) // the session and its file
				for turn := range 3 {
					ids = append(ids, seqIDs(uint32(100*turn+200), 20)...)
					p := wbTurn(t, s, "e", ids, false)
					if len(p.Fresh) == 0 {
						t.Fatalf("turn %d: no fresh range", turn)
					}
					end := int64(0)
					lengths := map[int64]int64{}
					for _, r := range p.Fresh {
						end = max(end, r.KVStart+r.KVLength)
					}
					f, err := s.File(ctx, p.Fresh[0].Path)
					if err != nil {
						t.Fatal(err)
					}
					for idx := int64(0); idx <= (end-1)/f.ChunkSize; idx++ {
						lengths[idx] = min(end-idx*f.ChunkSize, f.ChunkSize)
					}
					// The engine's Sync of what it wrote.
					if _, err := s.Commit(ctx, f.ID, end, lengths, false, time.Now()); err != nil {
						t.Fatal(err)
					}
					before := s.(*sqlStore).WriteBehindStats()
					got, err := s.CommitSession(ctx, CommitInput{Session: "e", PlanID: p.ID, Partial: true, Saved: p.Fresh, Now: time.Now()})
					if err != nil {
						t.Fatal(err)
					}
					after := s.(*sqlStore).WriteBehindStats()
					if after.Fast != before.Fast+1 {
						t.Fatalf("turn %d: the engine's commit ran in SQL (slow commits by reason: %v → %v)", turn, before.Slow[1], after.Slow[1])
					}
					if last := p.Fresh[len(p.Fresh)-1]; got.Tokens != last.TokenStart+last.TokenLength {
						t.Fatalf("turn %d: the session holds %d tokens after the commit of %+v", turn, got.Tokens, p)
					}
				}
			})
		}
	}
}
