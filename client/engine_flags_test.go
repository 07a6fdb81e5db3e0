package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/cluster"
)

// TestEngineFlagsAndAnswers: kvcache_params.flags go out with the plan as
// given, and the engine's answer is taken as vLLM's newest connector sends
// it — with "flags", a field gd2fs does not know, and a prefill-only save
// shorter than the reservation — while an unknown field outside
// kvcache_params is still refused (issue 28).
func TestEngineFlagsAndAnswers(t *testing.T) {
	c := start(t, cluster.Config{})
	cl := c.Client()
	defer cl.Close()
	ctx := context.Background()
	ss := cl.Sessions()
	l := client.Layout{Model: "m", Layers: 2, KVHeads: 2, HeadDim: 8, DType: "bf16", PageTokens: 16, Order: "kv_first"}
	if err := ss.SetLayout(ctx, l); err != nil {
		t.Fatal(err)
	}
	flags := map[string]any{"prefill-only": true}
	p, err := ss.PlanEngine(ctx, "s1", client.PlanRequest{Model: "m", TokenIDs: seq(0, 40), DecodeTokens: 64, Flags: flags})
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := p.KVCacheParams.Flags["prefill-only"].(bool); !ok || !v {
		t.Fatalf("flags not passed through: %+v", p.KVCacheParams)
	}
	// 40 + 64 rounded up to 16, cut where the prompt's whole blocks end.
	fr := p.KVCacheParams.Fresh[0]
	if len(p.KVCacheParams.Fresh) != 2 || fr.TokenLength != 32 || p.KVCacheParams.Fresh[1].TokenLength != 80 {
		t.Fatalf("fresh %+v", p.KVCacheParams.Fresh)
	}
	// Flags are checked, and only go to engines.
	for name, bad := range map[string]client.PlanRequest{
		"nested value": {Model: "m", TokenIDs: seq(0, 40), Format: "vllm", Flags: map[string]any{"x": map[string]any{"y": 1}}},
		"no format":    {Model: "m", TokenIDs: seq(0, 40), Flags: flags},
	} {
		var err error
		if bad.Format == "vllm" {
			_, err = ss.PlanEngine(ctx, "s2", bad)
		} else {
			_, err = ss.Plan(ctx, "s2", bad)
		}
		if !errors.Is(err, errs.ErrBadRequest) {
			t.Fatalf("%s: %v", name, err)
		}
	}
	// The prefill-only engine saved the prompt's whole blocks: 32 tokens.
	if err := writeZeros(ctx, cl, fr.KVURI, fr.KVStart, l.RangeBytes(32)); err != nil {
		t.Fatal(err)
	}
	seg := map[string]any{"token_start": 0, "token_length": 32, "kv_uri": fr.KVURI, "kv_start": fr.KVStart,
		"kv_length": l.RangeBytes(32), "a_field_from_the_future": 1}
	answer := map[string]any{"kvcache_params": map[string]any{"id": "s1", "stored_kvcache": []any{},
		"fresh_kvcache": []any{seg}, "load_threshold": 0, "flags": map[string]any{"prefill-only": true}, "unknown": "x"}}
	strict := map[string]any{"kvcache_params": answer["kvcache_params"], "not_ours": 1}
	if code, body := post(t, c.Master.URL()+"/v1/sessions/s1/commit", strict); code != http.StatusBadRequest ||
		!strings.Contains(body, "not_ours") {
		t.Fatalf("unknown field outside kvcache_params: %d %s", code, body)
	}
	if code, body := post(t, c.Master.URL()+"/v1/sessions/s1/commit", answer); code != http.StatusOK {
		t.Fatalf("engine's answer: %d %s", code, body)
	}
	s, err := ss.Get(ctx, "s1")
	if err != nil || s.Tokens != 32 {
		t.Fatalf("session after a prefill-only commit: %+v %v", s, err)
	}
}

func writeZeros(ctx context.Context, cl *client.Client, uri string, off, n int64) error {
	u, err := client.ParseURI(uri)
	if err != nil {
		return err
	}
	f, err := cl.Open(ctx, u.Path)
	if err != nil {
		return err
	}
	if _, err := f.WriteAtContext(ctx, make([]byte, n), off); err != nil {
		return err
	}
	return f.Sync(ctx)
}

func post(t *testing.T, url string, body any) (int, string) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(url, "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(out)
}
