package meta

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/errs"
)

// checkFreshChunks: a plan that was asked to place its fresh range's chunks
// returns exactly the chunks that hold its bytes, in order, each placed.
func checkFreshChunks(p Plan) error {
	if len(p.Fresh) == 0 {
		if len(p.FreshChunks) != 0 {
			return fmt.Errorf("no fresh range but %d fresh chunks", len(p.FreshChunks))
		}
		return nil
	}
	// The fresh ranges (a checked plan cuts its range in two) follow each
	// other in one file: their bytes are one span.
	fr, cs := p.Fresh[0], p.FreshChunks
	tail := p.Fresh[len(p.Fresh)-1]
	fr.KVLength = tail.KVStart + tail.KVLength - fr.KVStart
	if p.FreshFile.Path != fr.Path || tail.Path != fr.Path || p.FreshFile.ChunkSize <= 0 {
		return fmt.Errorf("fresh file %+v, fresh range in %s", p.FreshFile, fr.Path)
	}
	first := fr.KVStart / p.FreshFile.ChunkSize
	last := (fr.KVStart + fr.KVLength - 1) / p.FreshFile.ChunkSize
	if int64(len(cs)) != last-first+1 {
		return fmt.Errorf("fresh range bytes %d+%d span chunks %d..%d; the plan gave %d chunks", fr.KVStart, fr.KVLength, first, last, len(cs))
	}
	for i, c := range cs {
		if c.Index != first+int64(i) || c.ID == 0 || len(c.Replicas) == 0 || c.FileID != p.FreshFile.ID {
			return fmt.Errorf("fresh chunk %d: %+v (want index %d of file %d, placed)", i, c, first+int64(i), p.FreshFile.ID)
		}
	}
	return nil
}

// TestPlanAllocatesAndCommitRecords: a plan with Place allocates the chunks
// under its fresh range (across chunk boundaries, reusing those a previous
// turn allocated), and a Written commit records the size and chunk lengths
// a Sync would have. A Written commit of bytes that have no chunk is
// refused and records nothing; a plan whose placement fails still plans.
func TestPlanAllocatesAndCommitRecords(t *testing.T) {
	for name, open := range engines(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			s := open(t)
			l := Layout{Model: "m", Layers: 2, KVHeads: 1, HeadDim: 8, DType: "fp16", PageTokens: 4, Order: "layer_first"} // 64 bytes/token
			if err := s.PutLayout(ctx, l); err != nil {
				t.Fatal(err)
			}
			placed := 0
			place := func(fileID, idx int64) ([]string, error) { placed++; return []string{"s1", "s2"}, nil }
			now := time.Unix(1000, 0)
			in := func(id string, prompt int64, place PlaceFunc) PlanInput {
				now = now.Add(time.Second)
				return PlanInput{Session: id, Model: "m", PromptTokens: prompt, Dir: "/kv-sessions", Pool: "perf", ChunkSize: 1000,
					PlanTTL: time.Hour, Now: now, Place: place, UnsafeCountOnly: true} // the content check is testSessionContent's
			}
			// 40 tokens = 2560 bytes: chunks 0..2 of 1000.
			p, err := s.PlanSession(ctx, in("a", 40, place))
			if err != nil {
				t.Fatal(err)
			}
			if err := checkFreshChunks(p); err != nil {
				t.Fatal(err)
			}
			if placed != 3 || p.FreshChunks[0].Replicas[1] != "s2" {
				t.Fatalf("placed %d chunks, %+v", placed, p.FreshChunks)
			}
			if _, err := s.CommitSession(ctx, CommitInput{Session: "a", PlanID: p.ID, Written: true, Now: now}); err != nil {
				t.Fatal(err)
			}
			f, err := s.File(ctx, p.Fresh[0].Path)
			if err != nil {
				t.Fatal(err)
			}
			cs, err := s.Chunks(ctx, f.ID)
			if err != nil {
				t.Fatal(err)
			}
			if f.Size != 2560 || len(cs) != 3 || cs[0].Length != 1000 || cs[1].Length != 1000 || cs[2].Length != 560 {
				t.Fatalf("after a written commit: size %d, chunks %+v", f.Size, cs)
			}
			// The next turn continues in chunk 2 (allocated) and needs 3.
			p2, err := s.PlanSession(ctx, in("a", 50, place))
			if err != nil {
				t.Fatal(err)
			}
			if err := checkFreshChunks(p2); err != nil {
				t.Fatal(err)
			}
			if placed != 4 || p2.FreshChunks[0].ID != cs[2].ID || p2.Cached != 40 {
				t.Fatalf("second turn: placed %d in all, chunks %+v (chunk 2 was %d), cached %d", placed, p2.FreshChunks, cs[2].ID, p2.Cached)
			}
			if _, err := s.CommitSession(ctx, CommitInput{Session: "a", PlanID: p2.ID, Written: true, Now: now}); err != nil {
				t.Fatal(err)
			}
			if sess, err := s.Session(ctx, "a"); err != nil || sess.Tokens != 50 || len(sess.Ranges) != 2 {
				t.Fatalf("session a: %+v, %v", sess, err)
			}

			// A plan that allocated nothing: a written commit is refused.
			p3, err := s.PlanSession(ctx, in("b", 40, nil))
			if err != nil {
				t.Fatal(err)
			}
			if len(p3.FreshChunks) != 0 {
				t.Fatalf("plan without Place allocated %+v", p3.FreshChunks)
			}
			_, err = s.CommitSession(ctx, CommitInput{Session: "b", PlanID: p3.ID, Written: true, Now: now})
			if !errors.Is(err, errs.ErrBadRequest) {
				t.Fatalf("written commit of bytes without chunks: %v, want ErrBadRequest", err)
			}
			if sess, err := s.Session(ctx, "b"); err != nil || sess.Tokens != 0 || len(sess.Ranges) != 0 {
				t.Fatalf("refused commit recorded something: %+v, %v", sess, err)
			}
			if f, err := s.File(ctx, p3.Fresh[0].Path); err != nil || f.Size != 0 {
				t.Fatalf("refused commit changed the file: %+v, %v", f, err)
			}

			// Placement failing: the plan is made, without chunks.
			p4, err := s.PlanSession(ctx, in("c", 40, func(int64, int64) ([]string, error) {
				return nil, errs.New(errs.ErrUnavailable, "no server up")
			}))
			if err != nil || len(p4.FreshChunks) != 0 || len(p4.Fresh) != 1 {
				t.Fatalf("plan with failing placement: %+v, %v", p4, err)
			}
		})
	}
}
