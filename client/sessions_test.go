package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/cluster"
)

var tiny = client.Layout{Model: "tiny", Layers: 2, KVHeads: 2, HeadDim: 8, DType: "bf16", PageTokens: 16, Order: "page_first"}

// kvBytes is the KV an engine would compute: a function of the tokens only,
// so any range can be checked wherever it is stored.
func kvBytes(seq string, start, tokens int64) []byte {
	b := make([]byte, tiny.RangeBytes(tokens))
	r := rand.New(rand.NewPCG(uint64(start), uint64(len(seq))))
	for i := range b {
		b[i] = byte(r.Uint32()) ^ seq[i%len(seq)]
	}
	return b
}

// seq is n token ids from first on.
func seq(first uint32, n int64) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = first + uint32(i)
	}
	return out
}

// TestSessionTrace runs a multi-turn trace with shared prefixes, forks,
// rewinds, deletions and quota evictions, and checks after every plan that
// every stored range reads back exactly the bytes committed for it.
func TestSessionTrace(t *testing.T) {
	page := tiny.PageBytes()
	c := start(t, cluster.Config{SessionQuota: 60 * page})
	cl := c.Client()
	defer cl.Close()
	ctx := context.Background()
	ss := cl.Sessions()
	if err := ss.SetLayout(ctx, tiny); err != nil {
		t.Fatal(err)
	}
	// A shared system prompt of 32 tokens, written once.
	sys := kvBytes("sys", 0, 32)
	pf, _ := cl.Create(ctx, "/prefixes/sys", client.CreateOptions{Pool: "ha", ChunkSize: 1 << 20})
	pf.Write(sys)
	pf.Close()
	sysIDs := seq(1, 32)
	if err := ss.RegisterPrefixIDs(ctx, "/prefixes/sys", "tiny", sysIDs); err != nil {
		t.Fatal(err)
	}
	convs := map[string][]uint32{} // each session's conversation: the ids of its tokens
	next := uint32(1000)
	// committed[uri@start] = bytes committed there.
	committed := map[string][]byte{fmt.Sprint("gd2fs://local/prefixes/sys@0"): sys}
	tokens := map[string]int64{}
	r := rand.New(rand.NewPCG(7, 7))
	names := []string{"a", "b", "c", "d", "e", "f"}
	evictions, forks, rewinds, checked := 0, 0, 0, 0
	for step := 0; step < 120; step++ {
		id := names[r.IntN(len(names))]
		switch op := r.IntN(10); {
		case op == 0 && tokens[id] > 0: // fork
			nid := fmt.Sprintf("%s%d", id, step)
			if _, err := ss.Fork(ctx, id, nid); err != nil {
				t.Fatal(err)
			}
			tokens[nid], convs[nid] = tokens[id], convs[id]
			names = append(names, nid)
			forks++
			continue
		case op == 1 && tokens[id] > 0: // delete
			if err := ss.Delete(ctx, id); err != nil {
				t.Fatal(err)
			}
			delete(tokens, id)
			delete(convs, id)
			continue
		}
		prompt := tokens[id] + int64(1+r.IntN(60))
		if tokens[id] > 48 && r.IntN(6) == 0 {
			prompt = tokens[id] - int64(1+r.IntN(30)) // rewind
			rewinds++
		}
		if _, ok := tokens[id]; !ok {
			prompt = 32 + int64(1+r.IntN(40))
		}
		conv, ok := convs[id]
		if !ok {
			conv = sysIDs
		}
		ids := append([]uint32(nil), conv[:min(prompt, int64(len(conv)))]...)
		for int64(len(ids)) < prompt {
			ids = append(ids, next)
			next++
		}
		p, err := ss.Plan(ctx, id, client.PlanRequest{Model: "tiny", Prefixes: []string{"/prefixes/sys"}, TokenIDs: ids, NewFile: r.IntN(4) == 0})
		if err != nil {
			t.Fatalf("step %d plan %s: %v", step, id, err)
		}
		if _, ok := convs[id]; !ok && p.CachedTokens != 32 {
			t.Fatalf("step %d: a new session's plan uses %d tokens of the 32-token prefix", step, p.CachedTokens)
		}
		for _, e := range p.Evicted {
			delete(tokens, e)
			delete(convs, e)
			evictions++
		}
		// Every stored range reads back exactly what was committed there.
		buf := make([]byte, p.LoadBytes)
		if _, err := ss.LoadStored(ctx, p, buf); err != nil {
			t.Fatalf("step %d load %s: %v", step, id, err)
		}
		var off int64
		for _, sr := range p.Stored {
			want := committed[fmt.Sprintf("%s@%d", sr.KVURI, sr.KVStart)]
			if int64(len(want)) < sr.KVLength || !bytes.Equal(buf[off:off+sr.KVLength], want[:sr.KVLength]) {
				t.Fatalf("step %d session %s: stored range %+v does not read back the committed bytes", step, id, sr)
			}
			off += sr.KVLength
			checked++
		}
		if p.CachedTokens+p.PrefillTokens != prompt {
			t.Fatalf("cached %d + prefill %d != prompt %d", p.CachedTokens, p.PrefillTokens, prompt)
		}
		var fresh []byte
		for _, fr := range p.Fresh {
			kv := kvBytes(id+fmt.Sprint(step), fr.TokenStart, fr.TokenLength)
			committed[fmt.Sprintf("%s@%d", fr.KVURI, fr.KVStart)] = kv
			fresh = append(fresh, kv...)
		}
		var s client.Session
		if step%2 == 0 {
			// The fast path: the plan placed the fresh range's chunks, the
			// writes go straight to the servers, one call commits.
			if len(p.Fresh) > 0 && len(p.FreshFiles) != 1 {
				t.Fatalf("step %d: plan with a fresh range came with fresh_files %+v", step, p.FreshFiles)
			}
			s, err = ss.WriteAndCommit(ctx, id, p, fresh)
		} else {
			if err := ss.WriteFresh(ctx, p, fresh); err != nil {
				t.Fatal(err)
			}
			s, err = ss.Commit(ctx, id, p.PlanID)
		}
		if err != nil {
			t.Fatalf("step %d commit %s: %v", step, id, err)
		}
		tokens[id], convs[id] = s.Tokens, ids
	}
	if evictions == 0 || forks == 0 || rewinds == 0 || checked < 100 {
		t.Fatalf("trace too tame: %d evictions, %d forks, %d rewinds, %d ranges checked", evictions, forks, rewinds, checked)
	}
	t.Logf("%d evictions, %d forks, %d rewinds, %d stored ranges checked", evictions, forks, rewinds, checked)
}

func TestSessionErrors(t *testing.T) {
	c := start(t, cluster.Config{})
	cl := c.Client()
	defer cl.Close()
	ctx := context.Background()
	ss := cl.Sessions()
	_, err := ss.Plan(ctx, "s", client.PlanRequest{Model: "nope", TokenIDs: seq(0, 10)})
	if !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("unknown model: %v", err)
	}
	bad := tiny
	bad.PageTokens = 0
	if err := ss.SetLayout(ctx, bad); !errors.Is(err, errs.ErrBadRequest) {
		t.Fatalf("bad layout: %v", err)
	}
	ss.SetLayout(ctx, tiny)
	if _, err := ss.Plan(ctx, "s", client.PlanRequest{Model: "tiny", PromptTokens: -1, UnsafeCountOnly: true}); !errors.Is(err, errs.ErrBadRequest) {
		t.Fatalf("negative tokens: %v", err)
	}
	// A plan that says nothing of the prompt's content is refused, and says
	// what to send.
	if _, err := ss.Plan(ctx, "s", client.PlanRequest{Model: "tiny", PromptTokens: 40}); !errors.Is(err, errs.ErrBadRequest) ||
		!strings.Contains(err.Error(), "token_ids") || !strings.Contains(err.Error(), "unsafe_count_only") {
		t.Fatalf("plan without content: %v", err)
	}
	if _, err := ss.Commit(ctx, "s", 12345); !errors.Is(err, errs.ErrExists) {
		t.Fatalf("commit for a session that is gone: %v", err)
	}
	p, _ := ss.Plan(ctx, "s", client.PlanRequest{Model: "tiny", TokenIDs: seq(0, 40)})
	if _, err := ss.Commit(ctx, "s", 12345); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("unknown plan: %v", err)
	}
	if _, err := ss.Commit(ctx, "s", p.PlanID); !errors.Is(err, errs.ErrBadRequest) {
		t.Fatalf("commit before writing: %v", err)
	}
	if err := ss.WriteFresh(ctx, p, make([]byte, 3)); !errors.Is(err, errs.ErrBadRequest) {
		t.Fatalf("wrong fresh size: %v", err)
	}
	if _, err := ss.Get(ctx, "ghost"); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("unknown session: %v", err)
	}
	// A session's file cannot be removed under it.
	path := p.Fresh[0].KVURI[len("gd2fs://local"):]
	if err := cl.Remove(ctx, path); !errors.Is(err, errs.ErrExists) {
		t.Fatalf("remove a session file: %v", err)
	}
}

// TestSessionRewindThenGrow is issue 8's reproduction through the SDK, in
// both layouts: 422 tokens, a rewind to 155 that is written and committed,
// then a plan of 347 tokens must load exactly the 155 tokens of the current
// conversation (the first 128 from turn 1, the rest from turn 2), never the
// bytes of the turn the rewind replaced.
func TestSessionRewindThenGrow(t *testing.T) {
	c := start(t, cluster.Config{})
	cl := c.Client()
	defer cl.Close()
	ctx := context.Background()
	ss := cl.Sessions()
	for _, order := range []string{"page_first", "layer_first"} {
		l := client.Layout{Model: "m-" + order, Layers: 3, KVHeads: 1, HeadDim: 128, DType: "fp16", PageTokens: 32, Order: order}
		if err := ss.SetLayout(ctx, l); err != nil {
			t.Fatal(err)
		}
		// The rewind keeps the first 155 tokens of the conversation; the
		// next prompt continues from them with new tokens.
		conv := append(seq(0, 155), seq(5000, 422-155)...)
		grown := append(seq(0, 155), seq(9000, 347-155)...)
		turn := func(prompt int64, fill byte) client.Plan {
			p, err := ss.Plan(ctx, "s-"+order, client.PlanRequest{Model: l.Model, TokenIDs: conv[:prompt]})
			if err != nil {
				t.Fatal(err)
			}
			var fresh []byte
			for _, fr := range p.Fresh {
				fresh = append(fresh, bytes.Repeat([]byte{fill}, int(fr.KVLength))...)
			}
			if err := ss.WriteFresh(ctx, p, fresh); err != nil {
				t.Fatal(err)
			}
			if _, err := ss.Commit(ctx, "s-"+order, p.PlanID); err != nil {
				t.Fatal(err)
			}
			return p
		}
		turn(422, 1)
		rw := turn(155, 2)
		p, err := ss.Plan(ctx, "s-"+order, client.PlanRequest{Model: l.Model, TokenIDs: grown})
		if err != nil {
			t.Fatal(err)
		}
		if p.CachedTokens != 155 {
			t.Fatalf("%s: %d tokens cached after the rewind to 155, stored %+v", order, p.CachedTokens, p.Stored)
		}
		buf := make([]byte, p.LoadBytes)
		if _, err := ss.LoadStored(ctx, p, buf); err != nil {
			t.Fatal(err)
		}
		// What each stored byte must be: turn 1's fill for the tokens the
		// rewind kept, turn 2's for the rest.
		var want []byte
		kept := rw.CachedTokens
		if kept > 0 {
			want = append(want, bytes.Repeat([]byte{1}, int(l.RangeBytes(kept)))...)
		}
		want = append(want, bytes.Repeat([]byte{2}, int(l.RangeBytes(155-kept)))...)
		if !bytes.Equal(buf, want) {
			t.Fatalf("%s: stored ranges %+v do not load the KV of the current conversation", order, p.Stored)
		}
		if err := ss.Delete(ctx, "s-"+order); err != nil {
			t.Fatal(err)
		}
	}
}
