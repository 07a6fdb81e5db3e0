package meta

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/errs"
)

// TestFirstPlanFromMemory: a new session's first plan (no prefixes) is
// answered from the leader's memory, which makes the session, its first
// file and its chunks there (the invariants compare memory with SQL after
// every batch); a session SQL holds that memory does not (a fork) is not
// made again, even when it appears between the read of SQL and the look
// at memory (absentGen; without it the fork made during the read is
// planned as a new, empty session and the flush fails on its row); a file
// where the session's directory goes refuses the plan as in SQL.
func TestFirstPlanFromMemory(t *testing.T) {
	for name, open := range engines(t) {
		for _, mode := range []string{DurabilityFlush, DurabilityWindow} {
			t.Run(name+"-"+mode, func(t *testing.T) {
				s := inMode(open, mode)(t).(*sqlStore)
				ctx := context.Background()
				if err := s.PutLayout(ctx, wbLayout); err != nil {
					t.Fatal(err)
				}
				plan := func(id string, prompt []uint32) (Plan, error) {
					return s.PlanSession(ctx, PlanInput{Session: id, Model: "m", TokenIDs: prompt, DecodeTokens: 4, Dir: "/kv-sessions",
						Pool: "perf", ChunkSize: 700, PlanTTL: time.Hour, Now: time.Now(), Place: wbPlace, Quota: 1 << 30})
				}
				commit := func(id string, p Plan) {
					t.Helper()
					if _, err := s.CommitSession(ctx, CommitInput{Session: id, PlanID: p.ID, Written: true, Now: time.Now()}); err != nil {
						t.Fatal(err)
					}
				}
				// The first turn loads memory (a plan in SQL).
				wbTurn(t, s, "warm", seqIDs(1, 20), true)
				before := s.WriteBehindStats()
				for i := range 5 {
					id := "new-" + string(rune('a'+i))
					p, err := plan(id, seqIDs(uint32(1000*i+1), 30))
					if err != nil {
						t.Fatal(err)
					}
					if p.Cached != 0 || len(p.Fresh) == 0 || len(p.FreshChunks) == 0 || p.FreshFile.ID == 0 {
						t.Fatalf("first plan of %s: %+v", id, p)
					}
					commit(id, p)
				}
				st := s.WriteBehindStats()
				if n := st.Slow[0][SlowNotInMemory] - before.Slow[0][SlowNotInMemory]; n != 0 || st.Fast-before.Fast != 10 {
					t.Fatalf("5 new sessions: %d plans in SQL (not in memory), %d operations from memory, want 0 and 10 (slow %v)", n, st.Fast-before.Fast, st.Slow)
				}
				got, err := s.Session(ctx, "new-c")
				if err != nil || got.Tokens != 34 || got.HashedTokens != 30 || len(got.Ranges) == 0 { // 30 prompt tokens, 4 decoded
					t.Fatalf("new-c after its first turn: %+v, %v", got, err)
				}
				last := got.Ranges[len(got.Ranges)-1]
				f, err := s.File(ctx, last.Path)
				if err != nil || f.Size < last.KVStart+last.KVLength {
					t.Fatalf("new-c's file: %+v, %v", f, err)
				}
				// A fork made in SQL while a plan of its id reads SQL: the
				// plan must find the fork's stored tokens.
				h := func() {
					if err := s.ForkSession(ctx, "new-c", "fork", "", time.Now()); err != nil {
						t.Error(err)
					}
				}
				absentHook.Store(&h)
				p, err := plan("fork", append(seqIDs(2001, 30), seqIDs(9000, 10)...))
				absentHook.Store(nil)
				if err != nil {
					t.Fatal(err)
				}
				if p.Cached < 28 {
					t.Fatalf("a plan of a fork made during its read of SQL caches %d tokens, the fork holds 30 of its prompt", p.Cached)
				}
				commit("fork", p)
				// A file where the session's directory would be.
				if _, err := s.CreateFile(ctx, File{Path: "/kv-sessions/blocked", Pool: "perf", ChunkSize: 700, Modified: time.Now()}); err != nil {
					t.Fatal(err)
				}
				if _, err := plan("blocked", seqIDs(1, 10)); !errors.Is(err, errs.ErrNotDir) {
					t.Fatalf("plan of a session whose directory is a file: %v", err)
				}
			})
		}
	}
}
