package router

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/cluster"
)

// engine is a stand-in for vLLM's HTTP front with the explicit-offloading
// connector: one token per word, it saves every whole block of its fresh
// segment (written through the Go client) and reports what it saved. The
// real engine loop, with a transformer and pygd2fs, is python/tests.
type engine struct {
	t    *testing.T
	cl   *client.Client
	l    client.Layout
	mu   sync.Mutex
	seen []map[string]any // request bodies
	// noSave: report nothing saved, without writing (the latency benchmark
	// measures the router, not the engine's saves).
	noSave bool
	pad    string // added to every answer (a long answer)
	// countOnly: /tokenize answers the count without the ids.
	countOnly bool
	// timeSaves: say in an X-Engine-Save header how long saving took, and
	// keep the times in saves (a benchmark takes the engine's own work off
	// the router's latency).
	timeSaves bool
	saves     []time.Duration
	// hook, when set, runs first for every request; conns holds the
	// remote address of every connection a request came on, lastBody the
	// last request body as it came.
	// compute is how long a completion takes (what a GPU's prefill and
	// decode would), direct or through the router: a benchmark's chats
	// then arrive at an engine's pace, not as fast as the CPU turns them.
	compute  time.Duration
	hook     func(r *http.Request)
	conns    map[string]bool
	lastBody []byte
}

// fail reports err to the test (when there is one) and answers 500.
func (e *engine) fail(w http.ResponseWriter, err error) {
	if e.t != nil {
		e.t.Error(err)
	}
	http.Error(w, err.Error(), http.StatusInternalServerError)
}

// wordIDs is the stand-in's tokenizer: one token per word, its id a hash
// of the word.
func wordIDs(prompt string) []uint32 {
	ids := []uint32{}
	for _, w := range strings.Fields(prompt) {
		h := fnv.New32a()
		h.Write([]byte(w))
		ids = append(ids, h.Sum32())
	}
	return ids
}

func (e *engine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if e.hook != nil {
		e.hook(r)
	}
	raw, err := io.ReadAll(r.Body)
	if err != nil {
		e.fail(w, err)
		return
	}
	var doc map[string]any
	json.Unmarshal(raw, &doc)
	e.mu.Lock()
	e.seen = append(e.seen, doc)
	if e.conns == nil {
		e.conns = map[string]bool{}
	}
	e.conns[r.RemoteAddr] = true
	e.lastBody = raw
	e.mu.Unlock()
	prompt, _ := doc["prompt"].(string)
	tokens := len(strings.Fields(prompt))
	if ids, ok := doc["prompt"].([]any); ok { // token ids, run as they are
		tokens = len(ids)
	}
	if r.URL.Path == "/tokenize" {
		answer := map[string]any{"count": len(strings.Fields(prompt)), "max_model_len": 4096, "tokens": wordIDs(prompt)}
		if e.countOnly {
			delete(answer, "tokens")
		}
		json.NewEncoder(w).Encode(answer)
		return
	}
	if e.compute > 0 {
		time.Sleep(e.compute) // the work a real engine does, not a wait for an event
	}
	answer := map[string]any{"choices": []any{map[string]any{"text": "ok"}}}
	if e.pad != "" {
		answer["pad"] = e.pad
	}
	if ktp, ok := doc["kv_transfer_params"].(map[string]any); ok {
		start := time.Now()
		kp := ktp["kvcache_params"].(map[string]any)
		var saved []client.KVRange
		for _, f := range kp["fresh_kvcache"].([]any) {
			var seg client.KVRange
			b, _ := json.Marshal(f)
			json.Unmarshal(b, &seg)
			// Generation stopped early: save the whole blocks of the prompt.
			n := int64(tokens) / int64(e.l.PageTokens) * int64(e.l.PageTokens)
			seg.TokenLength = min(seg.TokenLength, n-seg.TokenStart)
			if seg.TokenLength <= 0 || e.noSave {
				continue
			}
			seg.KVLength = int64(seg.TokenLength) * e.l.TokenBytes()
			u, err := client.ParseURI(seg.KVURI)
			if err != nil {
				e.fail(w, err)
				return
			}
			f, err := e.cl.Open(r.Context(), u.Path)
			if err == nil {
				_, err = f.WriteAtContext(r.Context(), bytes.Repeat([]byte{7}, int(seg.KVLength)), seg.KVStart)
			}
			if err == nil && !f.Info().CommitRecordsSize { // as pygd2fs: the commit records a session file's size
				err = f.Sync(r.Context())
			}
			if err != nil {
				e.fail(w, err)
				return
			}
			saved = append(saved, seg)
		}
		if saved == nil {
			saved = []client.KVRange{}
		}
		answer["kv_transfer_params"] = map[string]any{"kvcache_params": map[string]any{"id": kp["id"], "fresh_kvcache": saved}}
		if e.timeSaves {
			d := time.Since(start)
			w.Header().Set("X-Engine-Save", d.String())
			e.mu.Lock()
			e.saves = append(e.saves, d)
			e.mu.Unlock()
		}
	}
	if doc["stream"] == true {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: {\"choices\": [{\"text\": \"o\"}]}\n\n")
		b, _ := json.Marshal(answer)
		fmt.Fprintf(w, "data: %s\n\ndata: [DONE]\n\n", b)
		return
	}
	json.NewEncoder(w).Encode(answer)
}

func (e *engine) last() map[string]any {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.seen[len(e.seen)-1]
}

// parts is a cluster, the stand-in engine serving as the upstream and a
// router in front of it, as startRouter made them.
type parts struct {
	r     *Router
	cl    *client.Client
	up    *httptest.Server // the engine
	u     *url.URL         // up's URL, the router's Upstream
	front *httptest.Server // the router
	// master is the master's URL, for its /metrics (startRouter and
	// BenchmarkRouterConcurrentChats set it).
	master string
}

// startRouter starts a cluster with cc (in a temporary folder unless
// cc.Dir says), sets layout l, serves the stand-in engine e (its client
// and layout filled in here) and puts in front the router cfg(cl)
// configures, with Upstream and Model set here. All of it closes when tb
// ends.
func startRouter(tb testing.TB, cc cluster.Config, l client.Layout, e *engine, cfg func(cl *client.Client) Config) parts {
	tb.Helper()
	if cc.Dir == "" {
		cc.Dir = tb.TempDir()
	}
	c, err := cluster.Start(context.Background(), cc)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	cl := c.Client()
	tb.Cleanup(func() { cl.Close() })
	p := startRouterOn(tb, cl, l, e, cfg)
	p.master = c.Master.URL()
	return p
}

// startRouterOn is startRouter on the cluster cl is a client of.
func startRouterOn(tb testing.TB, cl *client.Client, l client.Layout, e *engine, cfg func(cl *client.Client) Config) parts {
	tb.Helper()
	if err := cl.Sessions().SetLayout(context.Background(), l); err != nil {
		tb.Fatal(err)
	}
	e.cl, e.l = cl, l
	up := httptest.NewServer(e)
	tb.Cleanup(up.Close)
	u, err := url.Parse(up.URL)
	if err != nil {
		tb.Fatal(err)
	}
	conf := cfg(cl)
	conf.Upstream, conf.Model = u, l.Model
	r := New(conf)
	front := httptest.NewServer(r)
	tb.Cleanup(func() {
		front.Close()
		r.Wait()
	})
	return parts{r: r, cl: cl, up: up, u: u, front: front}
}

// failing is a store that is down.
type failing struct{}

func (failing) PlanEngine(context.Context, string, client.PlanRequest) (client.EnginePlan, error) {
	return client.EnginePlan{}, errors.New("store down")
}
func (failing) CommitSaved(context.Context, string, int64, []client.KVRange) (client.Session, error) {
	return client.Session{}, errors.New("store down")
}

func TestRouter(t *testing.T) {
	ctx := context.Background()
	e := &engine{t: t}
	p := startRouter(t, cluster.Config{MemBytes: 8 << 20, DiskBytes: 64 << 20},
		client.Layout{Model: "m", Layers: 2, KVHeads: 2, HeadDim: 4, DType: "fp16", PageTokens: 4, Order: "kv_first"}, e,
		func(cl *client.Client) Config { return Config{Planner: cl.Sessions(), SharedSessions: true} })
	cl, u, front := p.cl, p.u, p.front
	post := func(body, session string) (*http.Response, string) {
		req, _ := http.NewRequest("POST", front.URL+"/v1/completions", strings.NewReader(body))
		if session != "" {
			req.Header.Set("X-Session-ID", session)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	words := func(n int) string { return strings.TrimSpace(strings.Repeat("w ", n)) }

	// No session: untouched.
	body := `{"model":"m","prompt":"a b c","max_tokens":3}`
	if resp, _ := post(body, ""); resp.StatusCode != 200 || e.last()["kv_transfer_params"] != nil {
		t.Fatalf("request without a session was changed: %v", e.last())
	}
	// Turn 1 of a chat: nothing cached, fresh for prompt + max_tokens.
	resp, out := post(fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":5}`, words(10)), "chat-1")
	kp := e.last()["kv_transfer_params"].(map[string]any)["kvcache_params"].(map[string]any)
	if resp.StatusCode != 200 || kp["id"] != "chat-1" || len(kp["stored_kvcache"].([]any)) != 0 || !strings.Contains(out, "kv_transfer_params") {
		t.Fatalf("turn 1: %d %v %s", resp.StatusCode, kp, out)
	}
	// Turn 2 (the user field names the session, streamed): the 8 tokens of
	// whole blocks the engine saved are stored.
	post(fmt.Sprintf(`{"model":"m","prompt":%q,"user":"chat-1","stream":true}`, words(14)), "")
	kp = e.last()["kv_transfer_params"].(map[string]any)["kvcache_params"].(map[string]any)
	st := kp["stored_kvcache"].([]any)
	if len(st) != 1 || st[0].(map[string]any)["token_length"].(float64) != 8 {
		t.Fatalf("turn 2 stored %v", st)
	}
	p.r.Wait() // the commit runs after the answer
	s, err := cl.Sessions().Get(ctx, "chat-1")
	if err != nil || s.Tokens != 12 || s.HashedTokens != 12 { // the streamed turn saved 3 blocks
		t.Fatalf("after the streamed turn: %+v %v", s, err)
	}
	// The user edits the second word: a prompt of the same length, whose
	// stored KV (computed for the old text) must not be loaded.
	edited := strings.Replace(words(14), "w w", "w x", 1)
	post(fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":2}`, edited), "chat-1")
	kp = e.last()["kv_transfer_params"].(map[string]any)["kvcache_params"].(map[string]any)
	if st := kp["stored_kvcache"].([]any); len(st) != 0 {
		t.Fatalf("an edited prompt of the same length was given the old KV: %v", st)
	}
	// An engine whose /tokenize gives no ids: no plan (the chat goes on
	// without cache), unless the router is told to plan on counts alone.
	e.countOnly = true
	post(fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":2}`, edited), "chat-1")
	if e.last()["kv_transfer_params"] != nil {
		t.Fatalf("planned without token ids: %v", e.last())
	}
	unsafe := httptest.NewServer(New(Config{Upstream: u, Model: "m", Planner: cl.Sessions(), UnsafeCountOnly: true, SharedSessions: true}))
	defer unsafe.Close()
	ureq, _ := http.NewRequest("POST", unsafe.URL+"/v1/completions", strings.NewReader(fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":2}`, words(9))))
	ureq.Header.Set("X-Session-ID", "chat-u")
	if resp, err := http.DefaultClient.Do(ureq); err != nil || resp.StatusCode != 200 || e.last()["kv_transfer_params"] == nil {
		t.Fatalf("--unsafe-count-only did not plan: %v %v %v", resp, err, e.last())
	}
	e.countOnly = false
	// A store that is down: the chat goes on, without kv_transfer_params.
	down := httptest.NewServer(New(Config{Upstream: u, Model: "m", Planner: failing{}, SharedSessions: true}))
	defer down.Close()
	req, _ := http.NewRequest("POST", down.URL+"/v1/completions", strings.NewReader(body))
	req.Header.Set("X-Session-ID", "chat-2")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 || e.last()["kv_transfer_params"] != nil {
		t.Fatalf("store down: %v %v %v", resp, err, e.last())
	}
	// Metrics.
	_, m := func() (*http.Response, string) {
		resp, err := http.Get(front.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}()
	for _, want := range []string{"gd2fs_router_plans_total 3", "gd2fs_router_cached_tokens_total 8", "gd2fs_router_commits_total 3", "gd2fs_router_commit_failures_total 0",
		"gd2fs_router_store_misses_total 1"} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q:\n%s", want, m)
		}
	}
}
