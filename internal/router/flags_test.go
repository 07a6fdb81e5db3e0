package router

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/gd2fs/gd2fs/client"
)

// recording is a store that answers every plan with no stored and no fresh
// KV, echoing the request's flags as the master does, and remembers the
// requests.
type recording struct {
	mu   sync.Mutex
	reqs []client.PlanRequest
}

func (p *recording) PlanEngine(_ context.Context, id string, req client.PlanRequest) (client.EnginePlan, error) {
	p.mu.Lock()
	p.reqs = append(p.reqs, req)
	p.mu.Unlock()
	return client.EnginePlan{PlanID: 1, KVCacheParams: client.KVCacheParams{ID: id, Stored: []client.KVRange{},
		Fresh: []client.KVRange{}, Flags: req.Flags}}, nil
}

func (p *recording) CommitSaved(context.Context, string, int64, []client.KVRange) (client.Session, error) {
	return client.Session{}, nil
}

// TestRouterFlagsAndFormat: the router's flags reach the engine in
// kvcache_params.flags, and its engine format reaches the store (issue 28).
func TestRouterFlagsAndFormat(t *testing.T) {
	e := &engine{t: t, l: client.Layout{PageTokens: 4}}
	up := httptest.NewServer(e)
	defer up.Close()
	u, _ := url.Parse(up.URL)
	st := &recording{}
	front := httptest.NewServer(New(Config{Upstream: u, Model: "m", Planner: st, Format: "vllm", SharedSessions: true,
		Flags: map[string]any{"prefill-only": true}}))
	defer front.Close()
	req, _ := http.NewRequest("POST", front.URL+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"a b c d e","max_tokens":1}`))
	req.Header.Set("X-Session-ID", "chat-9")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	kp := e.last()["kv_transfer_params"].(map[string]any)["kvcache_params"].(map[string]any)
	if f, _ := kp["flags"].(map[string]any); f["prefill-only"] != true {
		t.Fatalf("the engine got kvcache_params %v", kp)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.reqs) != 1 || st.reqs[0].Format != "vllm" || st.reqs[0].Flags["prefill-only"] != true {
		t.Fatalf("plan requests %+v", st.reqs)
	}
}
