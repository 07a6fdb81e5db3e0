package client_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/cluster"
)

// TestEnginePlan: a plan in the vllm format, written rank by rank as a
// tensor-parallel engine does, committed from what it saved, and loaded by
// the next turn through the kv_uri alone.
func TestEnginePlan(t *testing.T) {
	c := start(t, cluster.Config{})
	cl := c.Client()
	defer cl.Close()
	ctx := context.Background()
	ss := cl.Sessions()
	l := client.Layout{Model: "tp2", Layers: 2, KVHeads: 4, HeadDim: 8, DType: "bf16", PageTokens: 16, Order: "kv_first", TPSize: 2}
	if err := ss.SetLayout(ctx, l); err != nil {
		t.Fatal(err)
	}
	p, err := ss.PlanEngine(ctx, "chat-1", client.PlanRequest{Model: "tp2", TokenIDs: seq(0, 40), DecodeTokens: 10, LoadThreshold: 16})
	if err != nil {
		t.Fatal(err)
	}
	kp := p.KVCacheParams
	// The fresh blocks are cut where the prompt's whole blocks end (32): the
	// first part's content is known, the rest is room for decoded tokens.
	if kp.ID != "chat-1" || kp.LoadThreshold != 16 || len(kp.Stored) != 0 || len(kp.Fresh) != 2 || kp.Fresh[0].TokenLength != 32 ||
		kp.Fresh[1].TokenStart != 32 || kp.Fresh[1].TokenLength != 32 || kp.Fresh[1].KVStart != kp.Fresh[0].KVStart+kp.Fresh[0].KVLength {
		t.Fatalf("first plan %+v", p)
	}
	fr := kp.Fresh[0]
	u, err := client.ParseURI(fr.KVURI)
	if err != nil || len(u.Masters) != 1 || u.Cluster != "local" || !strings.HasPrefix(u.Path, "/kv-sessions/chat-1/") ||
		"http://"+u.Masters[0] != c.Master.URL() {
		t.Fatalf("kv_uri %q: %+v %v (master %s)", fr.KVURI, u, err, c.Master.URL())
	}
	// The engine stopped after 2 of the 4 blocks: each rank writes its
	// region of those 32 tokens, packed from kv_start.
	const saved = 32
	rank := l.RankTokenBytes() * saved
	kv := make([]byte, 2*rank)
	for i := range kv {
		kv[i] = byte(i*7 + i/int(rank))
	}
	f, err := cl.Open(ctx, u.Path)
	if err != nil {
		t.Fatal(err)
	}
	for r := int64(0); r < 2; r++ {
		if _, err := f.WriteAtContext(ctx, kv[r*rank:(r+1)*rank], fr.KVStart+r*rank); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	seg := client.KVRange{TokenStart: 0, TokenLength: saved, KVURI: fr.KVURI, KVStart: fr.KVStart, KVLength: 2 * rank}
	// Bad answers from an engine record nothing.
	for name, bad := range map[string][]client.KVRange{
		"unaligned": {{TokenStart: 0, TokenLength: 20, KVURI: fr.KVURI, KVStart: fr.KVStart, KVLength: l.RangeBytes(20)}},
		"bad uri":   {{TokenStart: 0, TokenLength: saved, KVURI: "gd2fs://h:x/p", KVStart: fr.KVStart, KVLength: 2 * rank}},
		"beyond":    {{TokenStart: 0, TokenLength: saved, KVURI: fr.KVURI, KVStart: kp.Fresh[1].KVStart + kp.Fresh[1].KVLength, KVLength: 2 * rank}},
	} {
		if _, err := ss.CommitSaved(ctx, "chat-1", p.PlanID, bad); !errors.Is(err, errs.ErrBadRequest) {
			t.Fatalf("%s: %v", name, err)
		}
	}
	sess, err := ss.CommitSaved(ctx, "chat-1", 0, []client.KVRange{seg}) // plan found by the segment
	if err != nil || sess.Tokens != saved {
		t.Fatalf("commit: %+v %v", sess, err)
	}
	// Next turn: the 32 saved tokens are stored, the rest is fresh.
	q, err := ss.PlanEngine(ctx, "chat-1", client.PlanRequest{Model: "tp2", TokenIDs: seq(0, 50)})
	if err != nil {
		t.Fatal(err)
	}
	if q.CachedTokens != saved || len(q.KVCacheParams.Stored) != 1 || len(q.KVCacheParams.Fresh) != 2 || q.KVCacheParams.Fresh[0].TokenStart != saved || q.KVCacheParams.Fresh[0].TokenLength != 16 {
		t.Fatalf("second plan %+v", q)
	}
	st := q.KVCacheParams.Stored[0]
	su, _ := client.ParseURI(st.KVURI)
	g, err := cl.Open(ctx, su.Path)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, st.KVLength)
	if _, err := g.ReadAtContext(ctx, got, st.KVStart); err != nil || !bytes.Equal(got, kv) {
		t.Fatalf("stored segment does not read back what the ranks wrote: %v", err)
	}
	// A plan id of another session, and a session id that cannot be a URI.
	if _, err := ss.CommitSaved(ctx, "other", q.PlanID, nil); !errors.Is(err, errs.ErrExists) {
		t.Fatalf("commit of a session that does not exist: %v", err)
	}
	if _, err := ss.PlanEngine(ctx, "a?b", client.PlanRequest{Model: "tp2", TokenIDs: seq(0, 5)}); !errors.Is(err, errs.ErrBadRequest) {
		t.Fatalf("session id with '?': %v", err)
	}
}
