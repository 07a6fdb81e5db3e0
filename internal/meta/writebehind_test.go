package meta

import (
	"context"
	"errors"
	"path/filepath"
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
	plans := 120 // half TestSessionProperty's: each flush compares memory with SQL

	if *long {
		plans = 6000
	}
	for name, open := range windowEngines(t) {
		t.Run(name, func(t *testing.T) {
			runSessionProperty(t, open(t), plans, 4, uint64(len(name)))
		})
	}
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
	dsns := map[string]func(t *testing.T) string{
		"sqlite":   func(t *testing.T) string { return "sqlite://" + filepath.Join(t.TempDir(), "meta.db") },
		"postgres": func(t *testing.T) string { return PostgresDSNForTest(t) },
	}
	for name, mk := range dsns {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			dsn := mk(t)
			open := func() *sqlStore {
				s, err := Open(ctx, dsn)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				if err := s.(DurabilitySetter).SetSessionDurability(DurabilityWindow); err != nil {
					t.Fatal(err)
				}
				return s.(*sqlStore)
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
