package router

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/gd2fs/gd2fs/client"
)

// shortening is a store whose plans were cut short: a server holding the
// session's stored bytes is down.
type shortening struct{ recording }

func (p *shortening) PlanEngine(ctx context.Context, id string, req client.PlanRequest) (client.EnginePlan, error) {
	out, err := p.recording.PlanEngine(ctx, id, req)
	out.Shortened, out.ShortenedTokens = "server_down", 32
	return out, err
}

// TestRouterCountsShortenedPlans: a plan the store shortened (issue 29)
// still goes to the engine, and the router counts it by reason; the plan
// carried the prompt's token ids from /tokenize.
func TestRouterCountsShortenedPlans(t *testing.T) {
	e := &engine{t: t, l: client.Layout{PageTokens: 4}}
	up := httptest.NewServer(e)
	defer up.Close()
	u, _ := url.Parse(up.URL)
	st := &shortening{}
	front := httptest.NewServer(New(Config{Upstream: u, Model: "m", Planner: st, SharedSessions: true}))
	defer front.Close()
	req, _ := http.NewRequest("POST", front.URL+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"a b c d e","max_tokens":1}`))
	req.Header.Set("X-Session-ID", "chat-7")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if e.last()["kv_transfer_params"] == nil {
		t.Fatal("a shortened plan did not reach the engine")
	}
	st.mu.Lock()
	if len(st.reqs) != 1 || len(st.reqs[0].TokenIDs) != 5 {
		t.Fatalf("plans asked: %+v", st.reqs)
	}
	st.mu.Unlock()
	m, err := http.Get(front.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(m.Body)
	m.Body.Close()
	if !strings.Contains(string(b), `gd2fs_router_plans_shortened_total{reason="server_down"} 1`) {
		t.Fatalf("metrics lack the shortened plan:\n%s", b)
	}
}
