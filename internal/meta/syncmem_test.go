package meta

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/errs"
)

// TestSyncMem: an engine's Sync of the KV it wrote into a session file is
// answered from the leader's memory in flush and window mode on both
// engines, reaches SQL with the log (the file's size and chunk lengths, as
// Commit would have written them), and lets the engine's commit be
// answered from memory too; a file memory does not hold, a sealed one,
// one of another id at the path, a length past the chunk and sync mode go
// to Commit instead.
func TestSyncMem(t *testing.T) {
	for name, open := range engines(t) {
		for _, mode := range []string{DurabilityFlush, DurabilityWindow, DurabilitySync} {
			t.Run(name+"-"+mode, func(t *testing.T) {
				s := inMode(open, mode)(t)
				ms := s.(MemSyncer)
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
					path := p.Fresh[0].Path
					f, chunks, ok := ms.MemFile(path)
					if mode == DurabilitySync {
						if ok {
							t.Fatal("sync mode: memory answered MemFile")
						}
						return
					}
					if !ok {
						t.Fatalf("turn %d: memory does not hold %s", turn, path)
					}
					sqlF, err := s.File(ctx, path)
					if err != nil {
						t.Fatal(err)
					}
					if f.ID != sqlF.ID || f.Size > sqlF.Size || f.Sealed {
						t.Fatalf("turn %d: memory's file %+v, SQL's %+v", turn, f, sqlF)
					}
					end := int64(0)
					for _, r := range p.Fresh {
						end = max(end, r.KVStart+r.KVLength)
					}
					lengths := map[int64]int64{}
					for idx := int64(0); idx <= (end-1)/f.ChunkSize; idx++ {
						lengths[idx] = min(end-idx*f.ChunkSize, f.ChunkSize)
						if !hasChunk(chunks, idx) {
							t.Fatalf("turn %d: memory's chunks %+v lack index %d the plan placed", turn, chunks, idx)
						}
					}
					before := s.(*sqlStore).WriteBehindStats()
					got, ok, err := ms.SyncMem(ctx, f, end, lengths, time.Now())
					if err != nil || !ok {
						t.Fatalf("turn %d: SyncMem = %v, %v", turn, ok, err)
					}
					if got.Size < end || got.ID != f.ID {
						t.Fatalf("turn %d: SyncMem answered %+v, want size >= %d", turn, got, end)
					}
					// A repeat raises nothing and is answered too.
					if _, ok, err := ms.SyncMem(ctx, f, end, lengths, time.Now()); err != nil || !ok {
						t.Fatalf("turn %d: repeated SyncMem = %v, %v", turn, ok, err)
					}
					if st := s.(*sqlStore).WriteBehindStats(); st.Syncs != before.Syncs+2 {
						t.Fatalf("turn %d: %d syncs counted, want 2", turn, st.Syncs-before.Syncs)
					}
					cs, err := s.CommitSession(ctx, CommitInput{Session: "e", PlanID: p.ID, Partial: true, Saved: p.Fresh, Now: time.Now()})
					if err != nil {
						t.Fatal(err)
					}
					if st := s.(*sqlStore).WriteBehindStats(); st.Fast != before.Fast+1 {
						t.Fatalf("turn %d: the engine's commit ran in SQL (slow commits by reason: %v → %v)", turn, before.Slow[1], st.Slow[1])
					}
					if last := p.Fresh[len(p.Fresh)-1]; cs.Tokens != last.TokenStart+last.TokenLength {
						t.Fatalf("turn %d: the session holds %d tokens after the commit of %+v", turn, cs.Tokens, p)
					}
					// SQL's view, once the log is written (File and Chunks wait for it).
					sqlF, err = s.File(ctx, path)
					if err != nil {
						t.Fatal(err)
					}
					if sqlF.Size < end {
						t.Fatalf("turn %d: SQL's size %d after a Sync of %d", turn, sqlF.Size, end)
					}
					sqlChunks, err := s.Chunks(ctx, f.ID)
					if err != nil {
						t.Fatal(err)
					}
					for idx, l := range lengths {
						if c, ok := chunkAt(sqlChunks, idx); !ok || c.Length < l {
							t.Fatalf("turn %d: SQL's chunk %d is %+v after a Sync of length %d", turn, idx, c, l)
						}
					}
					// A length past the chunk is left to Commit, which refuses it.
					if _, ok, _ := ms.SyncMem(ctx, f, end, map[int64]int64{0: f.ChunkSize + 1}, time.Now()); ok {
						t.Fatalf("turn %d: SyncMem took a length past the chunk", turn)
					}
					if _, _, err := ms.SyncMem(ctx, f, -1, nil, time.Now()); err == nil {
						t.Fatalf("turn %d: SyncMem took a negative size", turn)
					}
					other := f
					other.ID++
					if _, ok, _ := ms.SyncMem(ctx, other, end, nil, time.Now()); ok {
						t.Fatalf("turn %d: SyncMem answered for a file of another id at %s", turn, path)
					}
				}
				// A file no session names is not in memory.
				plain, err := s.CreateFile(ctx, File{Path: "/plain", Pool: "perf", ChunkSize: 1 << 20})
				if err != nil {
					t.Fatal(err)
				}
				if _, _, ok := ms.MemFile(plain.Path); ok {
					t.Fatal("MemFile answered for a file no session names")
				}
				// Sealed: memory forgets it, and SyncMem of the view before
				// goes to Commit, which answers "sealed".
				p := wbTurn(t, s, "e", append(ids, seqIDs(900, 20)...), true)
				path := p.Fresh[0].Path
				f, _, ok := ms.MemFile(path)
				if !ok {
					t.Fatalf("memory does not hold %s", path)
				}
				if _, err := s.Commit(ctx, f.ID, 0, nil, true, time.Now()); err != nil {
					t.Fatal(err)
				}
				if _, _, ok := ms.MemFile(path); ok {
					t.Fatal("MemFile answered for a sealed file")
				}
				if _, ok, _ := ms.SyncMem(ctx, f, f.Size, nil, time.Now()); ok {
					t.Fatal("SyncMem answered for a sealed file")
				}
			})
		}
	}
}

func hasChunk(cs []Chunk, idx int64) bool { _, ok := chunkAt(cs, idx); return ok }

func chunkAt(cs []Chunk, idx int64) (Chunk, bool) {
	for _, c := range cs {
		if c.Index == idx {
			return c, true
		}
	}
	return Chunk{}, false
}

// TestSyncMemLostFlush (flush mode): a Sync answered from memory whose
// flush fails is not acknowledged: SyncMem says to run it in SQL (or fails),
// and Commit then records it; memory, reloaded, holds no more than SQL.
func TestSyncMemLostFlush(t *testing.T) {
	for name, open := range engines(t) {
		t.Run(name, func(t *testing.T) {
			s := inMode(open, DurabilityFlush)(t).(*sqlStore)
			ctx := context.Background()
			if err := s.PutLayout(ctx, wbLayout); err != nil {
				t.Fatal(err)
			}
			ids := seqIDs(1, 20)
			wbTurn(t, s, "l", ids, true)
			p := wbTurn(t, s, "l", append(ids, seqIDs(500, 20)...), false)
			path := p.Fresh[0].Path
			f, _, ok := s.MemFile(path)
			if !ok {
				t.Fatalf("memory does not hold %s", path)
			}
			r := p.Fresh[len(p.Fresh)-1]
			end := r.KVStart + r.KVLength
			lengths := map[int64]int64{0: end}
			first := true
			h := func() error {
				if first {
					first = false
					return errs.New(errs.ErrUnavailable, "flush refused by the test")
				}
				return nil
			}
			flushHook.Store(&h)
			defer flushHook.Store(nil)
			if _, ok, err := s.SyncMem(ctx, f, end, lengths, time.Now()); ok && err == nil {
				t.Fatal("a Sync whose flush failed was acknowledged")
			}
			if first {
				t.Fatal("the Sync's flush did not run")
			}
			got, err := s.Commit(ctx, f.ID, end, lengths, false, time.Now())
			if err != nil || got.Size != end {
				t.Fatalf("the Sync in SQL: %+v, %v", got, err)
			}
			sqlF, err := s.File(ctx, path)
			if err != nil || sqlF.Size != end {
				t.Fatalf("SQL's file after the Sync: %+v, %v", sqlF, err)
			}
			if mf, _, ok := s.MemFile(path); ok && mf.Size > sqlF.Size {
				t.Fatalf("memory's size %d past SQL's %d", mf.Size, sqlF.Size)
			}
		})
	}
}

// TestCommitRecordsVouched: an engine's commit of saved segments past the
// file's recorded size (no Sync before it) records their size when the
// servers vouched for them (Held), on both engines and in every mode — in
// memory or in SQL — and is refused, recording nothing, without Held or
// when Held finds a hole.
func TestCommitRecordsVouched(t *testing.T) {
	for name, open := range engines(t) {
		for _, mode := range []string{DurabilityFlush, DurabilityWindow, DurabilitySync} {
			t.Run(name+"-"+mode, func(t *testing.T) {
				s := inMode(open, mode)(t)
				ctx := context.Background()
				if err := s.PutLayout(ctx, wbLayout); err != nil {
					t.Fatal(err)
				}
				ids := seqIDs(1, 20)
				wbTurn(t, s, "e", ids, true)
				for turn := range 3 {
					ids = append(ids, seqIDs(uint32(100*turn+200), 20)...)
					p := wbTurn(t, s, "e", ids, false)
					path := p.Fresh[0].Path
					end := int64(0)
					for _, r := range p.Fresh {
						end = max(end, r.KVStart+r.KVLength)
					}
					size := func() int64 {
						t.Helper()
						f, err := s.File(ctx, path)
						if err != nil {
							t.Fatal(err)
						}
						return f.Size
					}
					was := size()
					if was >= end {
						t.Fatalf("turn %d: the file holds %d bytes before the commit of bytes to %d", turn, was, end)
					}
					in := CommitInput{Session: "e", PlanID: p.ID, Partial: true, Saved: p.Fresh, Now: time.Now()}
					if turn > 0 { // the first turn's commit comes first, to be answered from memory
						hole := errs.New(errs.ErrBadRequest, "a hole")
						in.Held = func(Layout, []Range) error { return hole }
						if _, err := s.CommitSession(ctx, in); err == nil {
							t.Fatalf("turn %d: a commit whose bytes the servers do not hold was recorded", turn)
						}
						in.Held = nil
						if _, err := s.CommitSession(ctx, in); !errors.Is(err, errs.ErrBadRequest) {
							t.Fatalf("turn %d: a commit past the size with no word from the servers: %v", turn, err)
						}
						if got := size(); got != was {
							t.Fatalf("turn %d: a refused commit moved the size %d -> %d", turn, was, got)
						}
					}
					in.Held = func(Layout, []Range) error { return nil }
					before := s.(*sqlStore).WriteBehindStats()
					sess, err := s.CommitSession(ctx, in)
					if err != nil {
						t.Fatalf("turn %d: a commit the servers vouched for: %v", turn, err)
					}
					if after := s.(*sqlStore).WriteBehindStats(); turn == 0 && mode != DurabilitySync && after.Fast == before.Fast {
						t.Fatalf("turn %d: the commit was not answered from memory", turn)
					}
					if sess.Tokens != int64(len(ids))+4 { // the prompt and wbTurn's 4 decoded tokens
						t.Fatalf("turn %d: %d tokens held, want %d", turn, sess.Tokens, len(ids)+4)
					}
					if got := size(); got != end {
						t.Fatalf("turn %d: the file holds %d bytes after the commit, want %d", turn, got, end)
					}
					chunks, err := s.Chunks(ctx, mustFile(t, s, path).ID)
					if err != nil {
						t.Fatal(err)
					}
					var extent int64
					for _, c := range chunks {
						extent = max(extent, c.Index*(1<<20)+c.Length)
					}
					if extent < end {
						t.Fatalf("turn %d: the chunks' lengths reach %d, the size %d", turn, extent, end)
					}
				}
			})
		}
	}
}

func mustFile(t *testing.T, s Store, path string) File {
	t.Helper()
	f, err := s.File(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	return f
}
