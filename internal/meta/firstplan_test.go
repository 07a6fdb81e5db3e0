package meta

import (
	"context"
	"errors"
	"slices"
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
				other := wbLayout
				other.Model = "other"
				for _, l := range []Layout{wbLayout, other} {
					if err := s.PutLayout(ctx, l); err != nil {
						t.Fatal(err)
					}
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
				if n := s.WriteBehindStats().FailedFlushes; n != 0 {
					t.Fatalf("%d flushes failed", n)
				}
				// A session made (from memory) and written during the read,
				// then dropped from memory by an operation that touched it
				// and failed: SQL holds it, memory does not. Taking it for
				// absent would make it twice (the flush fails).
				h = func() {
					absentHook.Store(nil) // once: this plan reads SQL too
					p1, err := plan("twice", seqIDs(5001, 20))
					if err != nil {
						t.Error(err)
						return
					}
					commit("twice", p1)
					if _, err := s.Session(ctx, "twice"); err != nil { // writes the log
						t.Error(err)
					}
					if _, err := s.PlanSession(ctx, PlanInput{Session: "twice", Model: "other", PromptTokens: 20, UnsafeCountOnly: true, Dir: "/kv-sessions",
						Pool: "perf", ChunkSize: 700, PlanTTL: time.Hour, Now: time.Now(), Place: wbPlace, Quota: 1 << 30}); !errors.Is(err, errs.ErrBadRequest) {
						t.Errorf("a plan of another model's session: %v", err)
					}
				}
				absentHook.Store(&h)
				// (No quota: a failed operation makes memory forget the
				// reserved total, which alone would send a plan under a
				// quota to SQL.)
				p, err = s.PlanSession(ctx, PlanInput{Session: "twice", Model: "m", TokenIDs: seqIDs(5001, 30), DecodeTokens: 4, Dir: "/kv-sessions",
					Pool: "perf", ChunkSize: 700, PlanTTL: time.Hour, Now: time.Now(), Place: wbPlace})
				absentHook.Store(nil)
				if err != nil {
					t.Fatal(err)
				}
				if p.Cached < 16 {
					t.Fatalf("a plan of a session made during its read of SQL caches %d tokens, the session holds 20 of its prompt", p.Cached)
				}
				commit("twice", p)
				if n := s.WriteBehindStats().FailedFlushes; n != 0 {
					t.Fatalf("%d flushes failed: the session was made twice", n)
				}
				// A file made where the session's directory goes, during the
				// read: the guard fails the flush (no file and directory at
				// one path); in flush mode the plan runs again in SQL and is
				// refused there.
				failed := s.WriteBehindStats().FailedFlushes
				h = func() {
					if _, err := s.CreateFile(ctx, File{Path: "/kv-sessions/late", Pool: "perf", ChunkSize: 700, Modified: time.Now()}); err != nil {
						t.Error(err)
					}
				}
				absentHook.Store(&h)
				_, err = plan("late", seqIDs(1, 10))
				absentHook.Store(nil)
				if mode == DurabilityFlush && !errors.Is(err, errs.ErrNotDir) {
					t.Fatalf("flush mode: plan of a session whose directory became a file during its read: %v", err)
				}
				// A read behind the failed flush reads SQL as it is (the
				// flush's error is not the reader's).
				if err := s.barrier(ctx); err != nil {
					t.Fatal(err)
				}
				if dir, err := s.IsDir(ctx, "/kv-sessions/late"); err != nil || dir {
					t.Fatalf("/kv-sessions/late is a file and a directory (%v)", err)
				}
				if n := s.WriteBehindStats().FailedFlushes - failed; n != 1 {
					t.Fatalf("%d flushes failed on the guard, want 1", n)
				}
				// A file where the session's directory would be.
				if _, err := s.CreateFile(ctx, File{Path: "/kv-sessions/blocked", Pool: "perf", ChunkSize: 700, Modified: time.Now()}); err != nil {
					t.Fatal(err)
				}
				if _, err := plan("blocked", seqIDs(1, 10)); !errors.Is(err, errs.ErrNotDir) {
					t.Fatalf("plan of a session whose directory is a file: %v", err)
				}
				if n := s.WriteBehindStats().FailedFlushes - failed; n != 1 {
					t.Fatalf("%d flushes failed, want only the one above", n)
				}
			})
		}
	}
}

// TestFirstPlanWithPrefixFromMemory: a new session's first plan that starts
// from a registered prefix is answered from memory, and makes what the SQL
// path makes (the prefix's range, its hashes); a prefix registered again or
// removed during the plan's read of SQL sends the plan there (absentGen);
// a prefix named by a plan answered from memory cannot be removed, even
// before the plan's log is written.
func TestFirstPlanWithPrefixFromMemory(t *testing.T) {
	for name, open := range engines(t) {
		for _, mode := range []string{DurabilityFlush, DurabilityWindow} {
			t.Run(name+"-"+mode, func(t *testing.T) {
				s := inMode(open, mode)(t).(*sqlStore)
				ctx := context.Background()
				if err := s.PutLayout(ctx, wbLayout); err != nil {
					t.Fatal(err)
				}
				l := wbLayout
				prefix := func(path string, ids []uint32) {
					t.Helper()
					f, err := s.CreateFile(ctx, File{Path: path, Pool: "perf", ChunkSize: 700, Modified: now})
					if err != nil {
						t.Fatal(err)
					}
					if _, err := s.Commit(ctx, f.ID, l.RangeBytes(int64(len(ids))), nil, true, now); err != nil {
						t.Fatal(err)
					}
					if err := s.PutPrefix(ctx, Prefix{Path: path, Model: "m", TokenIDs: ids}); err != nil {
						t.Fatal(err)
					}
				}
				sys := seqIDs(7001, 16)
				prefix("/prefixes/sys", sys)
				prefix("/prefixes/gone", sys)
				plan := func(id, pre string, prompt []uint32) (Plan, error) {
					return s.PlanSession(ctx, PlanInput{Session: id, Model: "m", TokenIDs: prompt, DecodeTokens: 4, Prefixes: []string{pre},
						Dir: "/kv-sessions", Pool: "perf", ChunkSize: 700, PlanTTL: time.Hour, Now: time.Now(), Place: wbPlace})
				}
				wbTurn(t, s, "warm", seqIDs(1, 20), true) // memory loaded
				before := s.WriteBehindStats()
				prompt := append(slices.Clone(sys), seqIDs(100, 10)...)
				p, err := plan("chat", "/prefixes/sys", prompt)
				if err != nil {
					t.Fatal(err)
				}
				if p.Cached != 16 || len(p.Fresh) == 0 || p.Fresh[0].TokenStart != 16 {
					t.Fatalf("first plan on the prefix: cached %d, fresh %+v; want the prefix's 16 tokens stored", p.Cached, p.Fresh)
				}
				if _, err := s.CommitSession(ctx, CommitInput{Session: "chat", PlanID: p.ID, Written: true, Now: time.Now()}); err != nil {
					t.Fatal(err)
				}
				st := s.WriteBehindStats()
				if st.Fast-before.Fast != 2 || st.Slow[0] != before.Slow[0] {
					t.Fatalf("a first plan on a prefix and its commit: %d from memory, plans in SQL %v (before %v)", st.Fast-before.Fast, st.Slow[0], before.Slow[0])
				}
				got, err := s.Session(ctx, "chat")
				if err != nil {
					t.Fatal(err)
				}
				if len(got.Ranges) < 2 || got.Ranges[0] != (Range{TokenStart: 0, TokenLength: 16, Path: "/prefixes/sys", KVLength: l.RangeBytes(16)}) ||
					got.Tokens != 30 || got.HashedTokens != 26 {
					t.Fatalf("the session after its first turn: %+v", got)
				}
				// Its next turn finds the whole conversation stored.
				p, err = plan("chat", "/prefixes/sys", append(slices.Clone(prompt), seqIDs(200, 12)...))
				if err != nil || p.Cached < 24 {
					t.Fatalf("second turn: cached %d, %v", p.Cached, err)
				}
				if err := s.checkInvariants(ctx); err != nil {
					t.Fatal(err)
				}

				// Registered again with other ids during the read: the plan
				// runs in SQL and sees the new ids (nothing cached).
				h := func() {
					if err := s.PutPrefix(ctx, Prefix{Path: "/prefixes/sys", Model: "m", TokenIDs: seqIDs(8001, 16)}); err != nil {
						t.Error(err)
					}
				}
				before = s.WriteBehindStats()
				absentHook.Store(&h)
				p, err = plan("chat2", "/prefixes/sys", prompt)
				absentHook.Store(nil)
				if err != nil {
					t.Fatal(err)
				}
				if p.Cached != 0 {
					t.Fatalf("a prefix registered again with other ids: the plan caches %d tokens of the old ones", p.Cached)
				}
				if n := s.WriteBehindStats().Slow[0][SlowNotInMemory] - before.Slow[0][SlowNotInMemory]; n != 1 {
					t.Fatalf("%d plans in SQL after the prefix changed during the read, want 1", n)
				}

				// Removed during the read: the removal moves the generation,
				// so the plan runs in SQL, which finds no prefix.
				failed := s.WriteBehindStats().FailedFlushes
				h = func() {
					if err := s.RemoveFile(ctx, "/prefixes/gone"); err != nil {
						t.Error(err)
					}
				}
				absentHook.Store(&h)
				_, err = plan("orphan", "/prefixes/gone", prompt)
				absentHook.Store(nil)
				if !errors.Is(err, errs.ErrNotFound) {
					t.Fatalf("a plan on a prefix removed during its read: %v", err)
				}
				if _, err := s.Session(ctx, "orphan"); !errors.Is(err, errs.ErrNotFound) {
					t.Fatalf("a session on a removed prefix: %v", err)
				}
				// Answered from memory, not yet in SQL (window mode): the
				// prefix the answer names cannot be removed now, as it cannot
				// once the session is in SQL (RemoveFile writes the log first).
				prefix("/prefixes/kept", sys)
				if _, err := plan("warm2", "/prefixes/kept", prompt); err != nil { // the prefix's file into memory
					t.Fatal(err)
				}
				before = s.WriteBehindStats()
				p, err = plan("holder", "/prefixes/kept", prompt)
				if err != nil {
					t.Fatal(err)
				}
				if st := s.WriteBehindStats(); st.Fast-before.Fast != 1 || p.Cached != 16 || p.Stored[0].Path != "/prefixes/kept" {
					t.Fatalf("a first plan on /prefixes/kept: %d from memory, %+v", st.Fast-before.Fast, p.Stored)
				}
				if err := s.RemoveFile(ctx, "/prefixes/kept"); !errors.Is(err, errs.ErrExists) {
					t.Fatalf("removing a prefix a plan answered from memory names: %v, want it refused as in use", err)
				}
				if n := s.WriteBehindStats().FailedFlushes - failed; n != 0 {
					t.Fatalf("%d flushes failed", n)
				}
				if err := s.checkInvariants(ctx); err != nil {
					t.Fatal(err)
				}
				// An unregistered prefix is refused, in SQL.
				if _, err := plan("none", "/prefixes/never", prompt); !errors.Is(err, errs.ErrNotFound) {
					t.Fatalf("a plan on an unregistered prefix: %v", err)
				}
			})
		}
	}
}
