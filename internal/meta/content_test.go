package meta

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/kvlayout"
)

// ids is a run of n distinct token ids starting at first.
func ids(first uint32, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = first + uint32(i)
	}
	return out
}

// edited is a copy of x with the token at i replaced.
func edited(x []uint32, i int) []uint32 {
	y := slices.Clone(x)
	y[i] = 1<<31 + uint32(i)
	return y
}

// testSessionContent: plans check what the prompt is, not only how long
// (docs/kv-cache.md "The content check"): an edit of the same length, an
// edit that makes the prompt longer, a regenerated answer, an edit inside
// the shared prefix, a session's partial last block, by token ids and by
// block hashes; plans that say nothing of the content are refused, and
// plans on counts alone (explicitly unsafe) vouch for nothing new.
func testSessionContent(t *testing.T, s Store) {
	ctx := context.Background()
	pf := Layout{Model: "pfc", Layers: 2, KVHeads: 1, HeadDim: 4, DType: "bf16", PageTokens: 16, Order: "page_first"}
	for _, l := range []Layout{llama, pf} {
		if err := s.PutLayout(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	plan := func(id, model string, prompt []uint32, decode int64) PlanInput {
		in := planIn(id, int64(len(prompt)))
		in.Model, in.TokenIDs, in.DecodeTokens, in.UnsafeCountOnly = model, prompt, decode, false
		return in
	}
	run := func(in PlanInput, wantCached int64) Plan {
		t.Helper()
		p, err := s.PlanSession(ctx, in)
		if err != nil {
			t.Fatalf("plan %s (%d tokens): %v", in.Session, in.PromptTokens, err)
		}
		if p.Cached != wantCached {
			t.Fatalf("plan %s (%d tokens, ids %v, hashes %v): cached %d, want %d (stored %+v)", in.Session, in.PromptTokens,
				len(in.TokenIDs) > 0, len(in.BlockHashes) > 0, p.Cached, wantCached, p.Stored)
		}
		return p
	}
	commit := func(id string, p Plan, wantTokens, wantHashed int64) {
		t.Helper()
		written(t, s, p)
		sess, err := s.CommitSession(ctx, CommitInput{Session: id, PlanID: p.ID, Now: now})
		if err != nil || sess.Tokens != wantTokens || sess.HashedTokens != wantHashed {
			t.Fatalf("commit %s: %v: %d tokens, %d hashed; want %d, %d", id, err, sess.Tokens, sess.HashedTokens, wantTokens, wantHashed)
		}
	}

	// A shared prefix of 20 tokens (a block and a partial one) with its ids.
	sys := ids(1000, 20)
	f, _ := s.CreateFile(ctx, File{Path: "/prefixes/c", Pool: "ha", ChunkSize: 1 << 20, Modified: now})
	s.Commit(ctx, f.ID, pf.RangeBytes(20), nil, true, now)
	mustIs(t, s.PutPrefix(ctx, Prefix{Path: "/prefixes/c", Model: "pfc", Tokens: 21, TokenIDs: sys}), errs.ErrBadRequest)
	if err := s.PutPrefix(ctx, Prefix{Path: "/prefixes/c", Model: "pfc", TokenIDs: sys}); err != nil {
		t.Fatal(err)
	}
	turn1 := append(slices.Clone(sys), ids(2000, 30)...) // 50 tokens
	in := plan("c1", "pfc", turn1, 10)
	in.Prefixes = []string{"/prefixes/c"}
	p := run(in, 20) // the prefix's partial last block checked by the ids
	commit("c1", p, 60, 50)

	// The plan cut its fresh range where the prompt ends (tokens 20..50 of
	// the prompt, 50..60 of room for the answer, whose ids the master never
	// sees): the first part is vouched for whole.
	if len(p.Fresh) != 2 || p.Fresh[0].TokenLength != 30 || p.Fresh[1].TokenStart != 50 || p.Fresh[1].KVStart != p.Fresh[0].KVStart+pf.RangeBytes(30) {
		t.Fatalf("fresh ranges %+v", p.Fresh)
	}
	// The last answer regenerated: the same prompt again. Its partial last
	// block (2 tokens) matches: all of it, not the old answer.
	run(plan("c1", "pfc", turn1, 10), 50)
	// The user edits token 30 (same length): only the blocks before it.
	// Counts alone would have served tokens 20..36, computed for other text.
	sameLen := edited(turn1, 30)
	run(plan("c1", "pfc", sameLen, 0), 16)
	unsafe := planIn("c1", 50)
	unsafe.Model = "pfc"
	run(unsafe, 50)
	// An edit at token 40 that also makes the prompt longer.
	longer := append(edited(turn1, 40), ids(3000, 20)...)
	run(plan("c1", "pfc", longer, 0), 20)
	// An edit inside the shared prefix: nothing is stored for it.
	run(plan("c1", "pfc", edited(turn1, 5), 0), 0)
	// The same edits by block hashes.
	hin := plan("c1", "pfc", nil, 0)
	hin.PromptTokens, hin.BlockHashes = int64(len(sameLen)), kvlayout.BlockHashes(sameLen, 16)
	run(hin, 16)
	hin.PromptTokens, hin.BlockHashes = int64(len(turn1)), kvlayout.BlockHashes(turn1, 16)
	run(hin, 50)

	// A session that ends on a partial block (50 tokens, layer_first, no
	// decode room): a longer prompt sent as ids checks the partial block;
	// sent as hashes it can only check whole blocks, and a layer_first
	// range is not cut, so nothing is stored for it.
	p = run(plan("c2", "llama", turn1, 0), 0)
	commit("c2", p, 50, 50)
	next := append(slices.Clone(turn1), ids(4000, 30)...)
	run(plan("c2", "llama", next, 0), 50)
	hin = plan("c2", "llama", nil, 0)
	hin.PromptTokens, hin.BlockHashes = int64(len(next)), kvlayout.BlockHashes(next, 16)
	run(hin, 0)
	hin.PromptTokens, hin.BlockHashes = int64(len(turn1)), kvlayout.BlockHashes(turn1, 16)
	run(hin, 50)                          // a prompt that ends where the session's hashes end
	edit2 := edited(next, 49)             // inside the partial block
	run(plan("c2", "llama", edit2, 0), 0) // layer_first: the whole range goes
	// A fork holds the same hashes.
	if err := s.ForkSession(ctx, "c2", "c2f", "", now); err != nil {
		t.Fatal(err)
	}
	run(plan("c2f", "llama", next, 0), 50)

	// A plan on counts alone vouches for nothing new: its fresh tokens are
	// never served to a checked plan, whatever their count.
	unsafe = planIn("c2", 80)
	p = run(unsafe, 50)
	commit("c2", p, 80, 50)
	run(plan("c2", "llama", next, 0), 50)
	// ... and a rewind on counts alone cuts the hashes with the tokens
	// (down to a whole block).
	p = run(planIn("c2", 40), 0)
	commit("c2", p, 40, 0)
	p = run(plan("c2", "llama", turn1[:32], 0), 0)
	commit("c2", p, 32, 32)
	unsafe = planIn("c2", 40)
	p = run(unsafe, 32)
	commit("c2", p, 40, 32)
	p = run(planIn("c2", 20), 0) // layer_first: a range not cut inside
	commit("c2", p, 20, 0)

	// A partial commit: the hashes end with what the engine saved.
	eng := plan("c3", "pfc", turn1, 14)
	eng.Aligned = true
	p = run(eng, 0)
	fr := p.Fresh[0]
	written(t, s, p)
	saved := []Range{{TokenStart: 0, TokenLength: 32, Path: fr.Path, KVStart: fr.KVStart, KVLength: pf.RangeBytes(32)}}
	if sess, err := s.CommitSession(ctx, CommitInput{Session: "c3", PlanID: p.ID, Partial: true, Saved: saved, Now: now}); err != nil || sess.HashedTokens != 32 {
		t.Fatalf("partial commit: %v %+v", err, sess)
	}
	eng.TokenIDs, eng.PromptTokens = next, int64(len(next))
	run(eng, 32)
	eng.TokenIDs = edited(next, 17)
	run(eng, 16)

	// A prefix without its ids is stored but vouched for by nothing.
	g, _ := s.CreateFile(ctx, File{Path: "/prefixes/bare", Pool: "ha", ChunkSize: 1 << 20, Modified: now})
	s.Commit(ctx, g.ID, pf.RangeBytes(20), nil, true, now)
	if err := s.PutPrefix(ctx, Prefix{Path: "/prefixes/bare", Model: "pfc", Tokens: 20}); err != nil {
		t.Fatal(err)
	}
	in = plan("c4", "pfc", turn1, 0)
	in.Prefixes = []string{"/prefixes/bare"}
	p = run(in, 0)
	commit("c4", p, 50, 50)
	run(plan("c4", "pfc", turn1, 0), 50)

	// A second prefix's KV was computed from position 0, not after the
	// first: it is stored but vouched for by nothing (found in review: the
	// tools prefix of [sys, tools] was served as verified for tokens 20..).
	h, _ := s.CreateFile(ctx, File{Path: "/prefixes/tools", Pool: "ha", ChunkSize: 1 << 20, Modified: now})
	s.Commit(ctx, h.ID, pf.RangeBytes(16), nil, true, now)
	tools := ids(3000, 16)
	if err := s.PutPrefix(ctx, Prefix{Path: "/prefixes/tools", Model: "pfc", TokenIDs: tools}); err != nil {
		t.Fatal(err)
	}
	both := append(append(slices.Clone(sys), tools...), ids(4000, 10)...)
	in = plan("c5", "pfc", both, 0)
	in.Prefixes = []string{"/prefixes/c", "/prefixes/tools"}
	p = run(in, 20) // the first prefix only
	if p.Verified > 20 {
		t.Fatalf("a second prefix was vouched for at position 20: verified %d", p.Verified)
	}

	// Plans that say nothing of the content, or too much, are refused.
	for name, bad := range map[string]func(*PlanInput){
		"no content":        func(in *PlanInput) { in.TokenIDs = nil },
		"ids and hashes":    func(in *PlanInput) { in.BlockHashes = kvlayout.BlockHashes(in.TokenIDs, 16) },
		"ids and unsafe":    func(in *PlanInput) { in.UnsafeCountOnly = true },
		"ids of another n":  func(in *PlanInput) { in.PromptTokens++ },
		"hashes of another": func(in *PlanInput) { in.BlockHashes, in.TokenIDs = kvlayout.BlockHashes(in.TokenIDs[:16], 16), nil },
	} {
		in := plan("c1", "pfc", turn1, 0)
		bad(&in)
		if _, err := s.PlanSession(ctx, in); !errors.Is(err, errs.ErrBadRequest) {
			t.Fatalf("%s: %v", name, err)
		}
	}
}

// TestVerified: the content check's rule on its own.
func TestVerified(t *testing.T) {
	const pt = 4
	sess := ids(1, 10) // hashed: 10 tokens, blocks 4+4+2
	sh := kvlayout.BlockHashes(sess, pt)
	for _, c := range []struct {
		name   string
		prompt []uint32
		ids    bool
		want   int64
	}{
		{"same, ids", sess, true, 10},
		{"same, hashes", sess, false, 10},
		{"longer, ids", append(slices.Clone(sess), 7, 7), true, 10},
		{"longer, hashes", append(slices.Clone(sess), 7, 7), false, 8},
		{"shorter inside a block", sess[:7], true, 4},
		{"shorter on a block", sess[:8], true, 8},
		{"edit in the partial block", edited(sess, 9), true, 8},
		{"edit in block 1", edited(sess, 5), true, 4},
		{"edit in block 0", edited(sess, 0), false, 0},
	} {
		p := prompt{n: int64(len(c.prompt)), hashes: kvlayout.BlockHashes(c.prompt, pt)}
		if c.ids {
			p.ids = c.prompt
		}
		if got := verified(pt, sh, 10, p); got != c.want {
			t.Errorf("%s: verified %d, want %d", c.name, got, c.want)
		}
	}
	if got := verified(pt, nil, 0, prompt{n: 8, hashes: kvlayout.BlockHashes(sess[:8], pt)}); got != 0 {
		t.Errorf("a session without hashes vouched for %d tokens", got)
	}
}

// testSessionRepeats: a plan or fork sent again with the same request id
// (its answer lost to a cut, or to a failover to another master reading the
// same database) gets the first answer: the same plan id and reservation,
// no second one; the fork is answered as done. Without an id, a repeated
// fork is refused as a duplicate and a repeated plan is a second plan.
func testSessionRepeats(t *testing.T, s Store) {
	ctx := context.Background()
	if err := s.PutLayout(ctx, llama); err != nil {
		t.Fatal(err)
	}
	in := planIn("r1", 40)
	in.UnsafeCountOnly, in.TokenIDs, in.RequestID = false, ids(1, 40), "req-1"
	a, err := s.PlanSession(ctx, in)
	if err != nil || a.Repeat {
		t.Fatalf("first plan: %+v %v", a, err)
	}
	b, err := s.PlanSession(ctx, in)
	if err != nil || !b.Repeat || b.ID != a.ID || len(b.Fresh) != len(a.Fresh) || b.Fresh[0] != a.Fresh[0] || b.Cached != a.Cached {
		t.Fatalf("repeat: %+v %v, first %+v", b, err, a)
	}
	sess, _ := s.Session(ctx, "r1")
	if sess.Bytes != a.Fresh[0].KVLength {
		t.Fatalf("a repeated plan reserved again: %d bytes owned, the plan %d", sess.Bytes, a.Fresh[0].KVLength)
	}
	in.RequestID = "req-2" // another request: another plan
	c, err := s.PlanSession(ctx, in)
	if err != nil || c.ID == a.ID || c.Repeat {
		t.Fatalf("another request id: %+v %v", c, err)
	}
	written(t, s, a)
	if _, err := s.CommitSession(ctx, CommitInput{Session: "r1", PlanID: a.ID, Now: now}); err != nil {
		t.Fatal(err)
	}
	// Committed: no longer outstanding, so the same id plans anew.
	in.RequestID = "req-1"
	d, err := s.PlanSession(ctx, in)
	if err != nil || d.Repeat || d.ID == a.ID || d.Cached != 40 {
		t.Fatalf("after the commit: %+v %v", d, err)
	}
	if err := s.ForkSession(ctx, "r1", "r1f", "fork-1", now); err != nil {
		t.Fatal(err)
	}
	if err := s.ForkSession(ctx, "r1", "r1f", "fork-1", now); err != nil {
		t.Fatalf("repeated fork: %v", err)
	}
	mustIs(t, s.ForkSession(ctx, "r1", "r1f", "fork-2", now), errs.ErrExists)
	mustIs(t, s.ForkSession(ctx, "r1", "r1f", "", now), errs.ErrExists)
}

// testSessionDownServer: a plan's stored part ends before the first range
// with bytes only on servers that are down (an engine is never sent to
// them); the ranges stay in the session and are planned again once the
// server is back.
func testSessionDownServer(t *testing.T, s Store) {
	ctx := context.Background()
	if err := s.PutLayout(ctx, llama); err != nil {
		t.Fatal(err)
	}
	on := func(server string) PlaceFunc {
		return func(fileID, idx int64) ([]string, error) { return []string{server}, nil }
	}
	turn := func(prompt int, server string, newFile bool) Plan {
		t.Helper()
		in := planIn("d1", int64(prompt))
		in.UnsafeCountOnly, in.TokenIDs, in.Place, in.NewFile = false, ids(1, prompt), on(server), newFile
		p, err := s.PlanSession(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.CommitSession(ctx, CommitInput{Session: "d1", PlanID: p.ID, Written: true, Now: now}); err != nil {
			t.Fatal(err)
		}
		return p
	}
	turn(32, "s1", false) // tokens 0..32 on s1
	turn(64, "s2", true)  // tokens 32..64 in another file, on s2
	plan := func(reachable func(string) bool) Plan {
		t.Helper()
		in := planIn("d1", 80)
		in.UnsafeCountOnly, in.TokenIDs, in.Reachable = false, ids(1, 80), reachable
		p, err := s.PlanSession(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if p := plan(func(string) bool { return true }); p.Cached != 64 || p.Shortened != "" {
		t.Fatalf("all up: %+v", p)
	}
	if p := plan(func(id string) bool { return id != "s2" }); p.Cached != 32 || p.Shortened != "server_down" || p.ShortenedTokens != 32 ||
		len(p.Fresh) == 0 || p.Fresh[0].TokenStart != 32 {
		t.Fatalf("s2 down: %+v", p)
	}
	if p := plan(func(id string) bool { return id != "s1" }); p.Cached != 0 || p.Shortened != "server_down" || p.ShortenedTokens != 64 {
		t.Fatalf("s1 down: %+v", p)
	}
	// The ranges are still the session's: back up, planned again.
	if sess, _ := s.Session(ctx, "d1"); sess.Tokens != 64 || len(sess.Ranges) != 2 {
		t.Fatalf("session after shortened plans: %+v", sess)
	}
	if p := plan(nil); p.Cached != 64 {
		t.Fatalf("back up: %+v", p)
	}
}
