package meta

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestCacheStaleLeader: a master that lost the lead without noticing (its
// lock gone, its process still answering) must not plan from its session
// cache, and the new leader's cache must not miss what that old master
// then wrote. Master a plans and commits turns of session x (x is in a's
// cache); a's lock goes, b leads, deletes x and makes it again with other
// content. a plans and commits a rewind of x, which must start from b's x
// (a's cache is of an older term), and b must see a's rewind: b's next
// plan stores only ranges x holds in SQL. The lead term and the sessions
// generation of cache.go are each needed: without either, b plans from
// the x of its own last turn — 40 tokens where x holds 28 others.
func TestCacheStaleLeader(t *testing.T) {
	for name, mk := range sharedDSNs {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			dsn := mk(t)
			a, b := openShared(t, dsn), openShared(t, dsn)
			if ok, err := a.Lead(ctx, "http://a"); !ok || err != nil {
				t.Fatalf("a: %v %v", ok, err)
			}
			l := Layout{Model: "m", Layers: 2, KVHeads: 1, HeadDim: 8, DType: "fp16", PageTokens: 4, Order: "page_first"}
			if err := a.PutLayout(ctx, l); err != nil {
				t.Fatal(err)
			}
			ids := func(first uint32, n int) []uint32 {
				out := make([]uint32, n)
				for i := range out {
					out[i] = first + uint32(i)
				}
				return out
			}
			turn := func(s *sqlStore, prompt []uint32) Plan {
				t.Helper()
				p, err := s.PlanSession(ctx, PlanInput{Session: "x", Model: "m", TokenIDs: prompt, Dir: "/kv-sessions", Pool: "perf",
					ChunkSize: 1 << 20, PlanTTL: time.Hour, Now: time.Now(),
					Place: func(fileID, idx int64) ([]string, error) { return []string{"s1"}, nil }})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := s.CommitSession(ctx, CommitInput{Session: "x", PlanID: p.ID, Written: true, Now: time.Now()}); err != nil {
					t.Fatal(err)
				}
				return p
			}
			// storedInSQL: every stored range of p is one x holds now, or
			// its first pages.
			storedInSQL := func(who string, p Plan) {
				t.Helper()
				x, err := b.Session(ctx, "x")
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range p.Stored {
					if !slices.ContainsFunc(x.Ranges, func(h Range) bool {
						return h.Path == r.Path && h.TokenStart == r.TokenStart && h.KVStart == r.KVStart && h.TokenLength >= r.TokenLength && h.KVLength >= r.KVLength
					}) {
						t.Fatalf("%s planned x with stored range %+v, which x does not hold (it holds %+v): a stale session cache", who, r, x.Ranges)
					}
				}
			}
			first := ids(100, 40)
			turn(a, first)
			turn(a, first[:32]) // a rewind: x is in a's cache, read and written

			a.lead.release() // a's lock is gone; a has not noticed (its term stays)
			if ok, err := b.Lead(ctx, "http://b"); !ok || err != nil {
				t.Fatalf("b: %v %v", ok, err)
			}
			if err := b.DeleteSession(ctx, "x"); err != nil {
				t.Fatal(err)
			}
			turn(b, ids(900, 40)) // x again, other content

			// A rewind to 20 tokens and 8 new ones: x's ranges change.
			p, err := a.PlanSession(ctx, PlanInput{Session: "x", Model: "m", UnsafeCountOnly: true, PromptTokens: 20, DecodeTokens: 8, Dir: "/kv-sessions", Pool: "perf",
				ChunkSize: 1 << 20, PlanTTL: time.Hour, Now: time.Now(), Place: func(fileID, idx int64) ([]string, error) { return []string{"s1"}, nil }})
			if err != nil {
				t.Fatal(err)
			}
			storedInSQL("the old leader", p)
			if _, err := a.CommitSession(ctx, CommitInput{Session: "x", PlanID: p.ID, Written: true, Now: time.Now()}); err != nil {
				t.Fatal(err)
			}
			// a committed x from SQL; b's cache (x from its own turn) must
			// not be used as it was.
			// (Its fresh range goes to a new file: a's was made under no
			// lead term, and a leader appends only to files of its own.)
			p, err = b.PlanSession(ctx, PlanInput{Session: "x", Model: "m", UnsafeCountOnly: true, PromptTokens: 60, Dir: "/kv-sessions", Pool: "perf",
				ChunkSize: 1 << 20, PlanTTL: time.Hour, Now: time.Now(), Place: func(fileID, idx int64) ([]string, error) { return []string{"s1"}, nil }})
			if err != nil {
				t.Fatal(err)
			}
			storedInSQL("the leader", p)
			if _, err := b.CommitSession(ctx, CommitInput{Session: "x", PlanID: p.ID, Written: true, Now: time.Now()}); err != nil {
				t.Fatalf("the leader's commit after the old leader's: %v", err)
			}
		})
	}
}

// TestChunkSet: a file's chunks in memory answer what a map by index
// would, whatever the order they are put in, and stay sorted.
func TestChunkSet(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 13))
	for round := range 200 {
		var cs chunkSet
		model := map[int64]Chunk{}
		for k := range rng.IntN(40) {
			idx := rng.Int64N(24)
			if round%3 == 0 {
				idx = int64(k) // a file that grows at its end
			}
			ch := Chunk{ID: rng.Uint64(), Index: idx, Length: rng.Int64N(100)}
			cs.put(ch)
			model[idx] = ch
			for i := int64(-1); i <= 25; i++ {
				got, ok := cs.get(i)
				want, wok := model[i]
				if ok != wok || got.ID != want.ID || got.Length != want.Length {
					t.Fatalf("round %d: get(%d) = %+v %v, want %+v %v", round, i, got, ok, want, wok)
				}
			}
			if len(cs) != len(model) || !slices.IsSortedFunc(cs, func(a, b Chunk) int { return int(a.Index - b.Index) }) {
				t.Fatalf("round %d: %d chunks for %d indexes, or out of order: %+v", round, len(cs), len(model), cs)
			}
		}
	}
}
