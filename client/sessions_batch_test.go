package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/cluster"
)

// TestPlanBatch: one call plans several sessions; a bad plan answers its
// own error and the others go on; the batch sent again with the same
// request ids answers the same plans (nothing reserved twice); the plans
// write and commit as single plans do, and a second batch stores what the
// first committed.
func TestPlanBatch(t *testing.T) {
	c := start(t, cluster.Config{})
	cl := c.Client()
	defer cl.Close()
	ctx := context.Background()
	ss := cl.Sessions()
	if err := ss.SetLayout(ctx, tiny); err != nil {
		t.Fatal(err)
	}
	const n = 6
	items := make([]client.PlanBatchItem, n+1)
	for i := 0; i < n; i++ {
		items[i] = client.PlanBatchItem{ID: fmt.Sprintf("b%d", i), Request: client.PlanRequest{Model: "tiny", TokenIDs: seq(uint32(100*i), 40)}}
	}
	items[n] = client.PlanBatchItem{ID: "bad", Request: client.PlanRequest{Model: "no-such-model", TokenIDs: seq(1, 8)}}
	res, err := ss.PlanBatch(ctx, items)
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(res[n].Err, errs.ErrNotFound) {
		t.Fatalf("plan of an unknown model: %v, want not found", res[n].Err)
	}
	for i := range items[:n] {
		items[i].RequestID = fmt.Sprintf("req-%d", i)
	}
	res, err = ss.PlanBatch(ctx, items[:n])
	if err != nil {
		t.Fatal(err)
	}
	again, err := ss.PlanBatch(ctx, items[:n]) // a repeat: the same plans
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Err != nil || again[i].Err != nil {
			t.Fatalf("plan %d: %v / %v", i, r.Err, again[i].Err)
		}
		if r.Plan.PlanID != again[i].Plan.PlanID || r.Plan.Fresh[0] != again[i].Plan.Fresh[0] {
			t.Fatalf("plan %d repeated: %+v, then %+v", i, r.Plan, again[i].Plan)
		}
		if r.Plan.CachedTokens != 0 || len(r.Plan.Fresh) == 0 {
			t.Fatalf("first plan of a new session: %+v", r.Plan)
		}
		kv := kvBytes(items[i].ID, 0, 40)
		if _, err := ss.WriteAndCommit(ctx, items[i].ID, r.Plan, kv); err != nil {
			t.Fatalf("commit of batch plan %d: %v", i, err)
		}
	}
	for i := range items[:n] {
		items[i].RequestID = ""
		items[i].Request.TokenIDs = seq(uint32(100*i), 60)
	}
	res, err = ss.PlanBatch(ctx, items[:n])
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Err != nil || r.Plan.CachedTokens != 40 {
			t.Fatalf("second batch, plan %d: cached %d, %v", i, r.Plan.CachedTokens, r.Err)
		}
		got := make([]byte, tiny.RangeBytes(40))
		if _, err := ss.LoadStored(ctx, r.Plan, got); err != nil {
			t.Fatal(err)
		}
		if want := kvBytes(items[i].ID, 0, 40); !bytes.Equal(got, want) {
			t.Fatalf("session %s: stored bytes differ from those committed", items[i].ID)
		}
	}
	if _, err := ss.PlanBatch(ctx, nil); !errors.Is(err, errs.ErrBadRequest) {
		t.Fatalf("empty batch: %v", err)
	}
	if _, err := ss.PlanBatch(ctx, []client.PlanBatchItem{{ID: "x", Request: client.PlanRequest{Model: "tiny", Format: "vllm"}}}); !errors.Is(err, errs.ErrBadRequest) {
		t.Fatalf("engine format in PlanBatch: %v", err)
	}
}
