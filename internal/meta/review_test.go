package meta

import (
	"context"
	"testing"
	"time"
)

// TestCommitSavedEqualsFresh: an engine that reports it saved exactly the
// fresh ranges a checked plan gave (the plan cut its range where the
// prompt ends, inside a page) commits them, as the same plan committed
// whole would; and the next plan with the same prompt and more loads the
// prompt's part.
func TestCommitSavedEqualsFresh(t *testing.T) {
	for name, open := range engines(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			s := open(t)
			l := Layout{Model: "m", Layers: 1, KVHeads: 1, HeadDim: 4, DType: "fp16", PageTokens: 4, Order: "page_first"}
			if err := s.PutLayout(ctx, l); err != nil {
				t.Fatal(err)
			}
			ids := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
			now := time.Unix(1000, 0)
			in := PlanInput{Session: "a", Model: "m", TokenIDs: ids, DecodeTokens: 6, Dir: "/kv-sessions", Pool: "perf",
				ChunkSize: 1 << 20, PlanTTL: time.Hour, Now: now}
			p, err := s.PlanSession(ctx, in)
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Fresh) != 2 || p.Fresh[0].TokenLength != 10 {
				t.Fatalf("fresh %+v: want the range cut at the prompt's end (token 10)", p.Fresh)
			}
			end := p.Fresh[1].KVStart + p.Fresh[1].KVLength
			f, err := s.File(ctx, p.Fresh[0].Path)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Commit(ctx, f.ID, end, nil, false, now); err != nil {
				t.Fatal(err)
			}
			if _, err := s.CommitSession(ctx, CommitInput{Session: "a", PlanID: p.ID, Partial: true, Saved: p.Fresh, Now: now}); err != nil {
				t.Fatalf("commit of exactly the plan's fresh ranges as saved: %v", err)
			}
			in.TokenIDs = append(append([]uint32(nil), ids...), 11, 12, 13)
			in.Now = now.Add(time.Second)
			p2, err := s.PlanSession(ctx, in)
			if err != nil {
				t.Fatal(err)
			}
			if p2.Cached != 10 {
				t.Fatalf("next plan caches %d tokens, want the 10 of the prompt", p2.Cached)
			}
		})
	}
}
