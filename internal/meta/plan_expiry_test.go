package meta

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/errs"
)

// TestPlanExpiry: a session planned and never committed stops owning the
// bytes its plans reserved once they expire (its file goes, the next plan
// starts a new one); a file that holds committed ranges keeps them; an
// outstanding plan can be read back by id until it expires or commits.
func TestPlanExpiry(t *testing.T) {
	for name, mk := range engines(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			s := mk(t)
			if err := s.PutLayout(ctx, llama); err != nil {
				t.Fatal(err)
			}
			pr, ok := s.(PlanReader)
			if !ok {
				t.Fatal("the SQL store does not implement PlanReader")
			}
			in := planIn("idle", 100)
			in.PlanTTL = time.Minute
			p1, err := s.PlanSession(ctx, in)
			if err != nil {
				t.Fatal(err)
			}
			got, err := pr.OutstandingPlan(ctx, "idle", p1.ID)
			if err != nil || got != p1.Fresh[0] {
				t.Fatalf("OutstandingPlan: %+v %v, want %+v", got, err, p1.Fresh[0])
			}
			_, err = pr.OutstandingPlan(ctx, "other", p1.ID)
			mustIs(t, err, errs.ErrNotFound)
			p2, err := s.PlanSession(ctx, in) // a second plan, never committed either
			if err != nil {
				t.Fatal(err)
			}
			sess, _ := s.Session(ctx, "idle")
			if want := 2 * llama.RangeBytes(100); sess.Bytes != want || sess.Tokens != 0 {
				t.Fatalf("before expiry: %d tokens, %d bytes owned, want 0 and %d", sess.Tokens, sess.Bytes, want)
			}
			// A committed session beside it, with an uncommitted plan behind.
			keep := planIn("kept", 50)
			keep.PlanTTL = time.Minute
			k1, err := s.PlanSession(ctx, keep)
			if err != nil {
				t.Fatal(err)
			}
			written(t, s, k1)
			if _, err := s.CommitSession(ctx, CommitInput{Session: "kept", PlanID: k1.ID, Now: now}); err != nil {
				t.Fatal(err)
			}
			keep.PromptTokens = 80
			if _, err := s.PlanSession(ctx, keep); err != nil {
				t.Fatal(err)
			}

			// Two minutes later any plan expires the lot.
			later := planIn("third", 10)
			later.PlanTTL, later.Now = time.Minute, now.Add(2*time.Minute)
			if _, err := s.PlanSession(ctx, later); err != nil {
				t.Fatal(err)
			}
			sess, _ = s.Session(ctx, "idle")
			if sess.Bytes != 0 {
				t.Fatalf("after expiry the idle session still owns %d bytes", sess.Bytes)
			}
			if _, err := s.File(ctx, p1.Fresh[0].Path); !errors.Is(err, errs.ErrNotFound) {
				t.Fatalf("the idle session's unused file: %v, want it removed", err)
			}
			_, err = pr.OutstandingPlan(ctx, "idle", p2.ID)
			mustIs(t, err, errs.ErrNotFound)
			_, err = s.CommitSession(ctx, CommitInput{Session: "idle", PlanID: p2.ID, Now: later.Now})
			mustIs(t, err, errs.ErrNotFound)
			kept, _ := s.Session(ctx, "kept")
			if kept.Tokens != 50 || len(kept.Ranges) != 1 {
				t.Fatalf("the committed session after expiry: %+v", kept)
			}
			if _, err := s.File(ctx, k1.Fresh[0].Path); err != nil {
				t.Fatalf("a file with committed ranges: %v", err)
			}
			// The idle session plans again: a new file, from byte 0.
			in.Now = later.Now
			p3, err := s.PlanSession(ctx, in)
			if err != nil {
				t.Fatal(err)
			}
			if p3.Fresh[0].Path == p1.Fresh[0].Path || p3.Fresh[0].KVStart != 0 {
				t.Fatalf("plan after expiry: %+v, want a new file from byte 0 (old %s)", p3.Fresh[0], p1.Fresh[0].Path)
			}
		})
	}
}

// TestExpiryKeepsSessionsInMemory: the leader forgets only what an
// expiry changed. Session x's first plan is abandoned; the next plan of
// another session expires it, removing x's file (x's next plan starts a new
// one). Sessions a and b stay in memory: b's next turn is answered from it,
// where once every session reloaded from SQL after any expiry. The cache
// is compared with SQL after every batch (checks), which fails if x's
// entry is kept.
func TestExpiryKeepsSessionsInMemory(t *testing.T) {
	for name, open := range engines(t) {
		t.Run(name, func(t *testing.T) {
			s := inMode(open, DurabilityFlush)(t).(*sqlStore)
			s.checks = true
			ctx := context.Background()
			if err := s.PutLayout(ctx, wbLayout); err != nil {
				t.Fatal(err)
			}
			ids := seqIDs(1, 20)
			for _, id := range []string{"a", "b"} {
				wbTurn(t, s, id, ids, true)
				wbTurn(t, s, id, ids, true) // the file and its chunk exist: from memory from now on
			}
			// x's first plan, two hours ago, never committed.
			first, err := s.PlanSession(ctx, PlanInput{Session: "x", Model: "m", TokenIDs: ids, DecodeTokens: 4, Dir: "/kv-sessions", Pool: "perf",
				ChunkSize: 1 << 20, PlanTTL: time.Hour, Now: time.Now().Add(-2 * time.Hour), Place: wbPlace, Quota: 1 << 30})
			if err != nil {
				t.Fatal(err)
			}
			before := s.WriteBehindStats()
			wbTurn(t, s, "a", ids, true) // its plan expires x's
			mid := s.WriteBehindStats()
			if got := mid.Slow[0][SlowExpiry] - before.Slow[0][SlowExpiry]; got != 1 {
				t.Fatalf("a's plan ran the expiry %d times, want 1", got)
			}
			wbTurn(t, s, "b", ids, true)
			after := s.WriteBehindStats()
			if got := after.Fast - mid.Fast; got != 2 {
				t.Fatalf("b's turn after the expiry: %d of its plan and commit answered from memory, want 2 (in SQL, by why: %v)", got, after.Slow)
			}
			x, err := s.Session(ctx, "x")
			if err != nil {
				t.Fatal(err)
			}
			if x.Tokens != 0 || len(x.Ranges) != 0 {
				t.Fatalf("x after its only plan expired: %+v", x)
			}
			p := wbTurn(t, s, "x", ids, true)
			if len(p.Fresh) == 0 || len(first.Fresh) == 0 || p.Fresh[0].Path == first.Fresh[0].Path {
				t.Fatalf("x's next plan wrote %+v, its expired plan %+v: want a new file (the first was removed)", p.Fresh, first.Fresh)
			}
			if _, err := s.File(ctx, first.Fresh[0].Path); !errors.Is(err, errs.ErrNotFound) {
				t.Fatalf("x's first file after its plan expired: %v, want it removed", err)
			}
		})
	}
}
