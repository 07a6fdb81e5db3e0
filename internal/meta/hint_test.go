package meta

import (
	"context"
	"testing"
)

// TestHintChunks: what the leader's memory tells of a session file's
// chunks is SQL's file and chunks (ids, indexes, replicas; lengths at most
// SQL's); a file memory does not hold, or a store that does not lead,
// says so.
func TestHintChunks(t *testing.T) {
	for name, open := range engines(t) {
		t.Run(name, func(t *testing.T) {
			s := inMode(open, DurabilityFlush)(t).(*sqlStore)
			ctx := context.Background()
			if err := s.PutLayout(ctx, wbLayout); err != nil {
				t.Fatal(err)
			}
			ids := seqIDs(1, 20)
			wbTurn(t, s, "x", ids, true)
			wbTurn(t, s, "x", append(ids, seqIDs(100, 40)...), true)
			sess, err := s.Session(ctx, "x")
			if err != nil {
				t.Fatal(err)
			}
			if len(sess.Ranges) == 0 {
				t.Fatal("session x holds no range")
			}
			seen := 0
			for _, r := range sess.Ranges {
				f, cs, ok := s.HintChunks(r.Path)
				if !ok {
					continue // memory may not hold it; SQL answers then
				}
				seen++
				want, err := s.File(ctx, r.Path)
				if err != nil {
					t.Fatal(err)
				}
				sqlChunks, err := s.Chunks(ctx, want.ID)
				if err != nil {
					t.Fatal(err)
				}
				if f.ID != want.ID || f.ChunkSize != want.ChunkSize || f.Path != want.Path {
					t.Fatalf("%s: memory's file %+v, SQL's %+v", r.Path, f, want)
				}
				byIndex := map[int64]Chunk{}
				for _, c := range sqlChunks {
					byIndex[c.Index] = c
				}
				for i, c := range cs {
					w, ok := byIndex[c.Index]
					if !ok || c.ID != w.ID || c.Length > w.Length || len(c.Replicas) != len(w.Replicas) || c.Replicas[0] != w.Replicas[0] {
						t.Fatalf("%s: memory's chunk %+v, SQL's %+v (found %v)", r.Path, c, w, ok)
					}
					if i > 0 && cs[i-1].Index >= c.Index {
						t.Fatalf("%s: chunks out of order: %+v", r.Path, cs)
					}
				}
			}
			if seen == 0 {
				t.Fatal("the leader's memory holds none of the session's files: warming reads SQL for every plan")
			}
			if _, _, ok := s.HintChunks("/no/such/file"); ok {
				t.Fatal("a file memory does not hold answered ok")
			}
		})
	}
}
