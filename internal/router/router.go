// Package router is an OpenAI-compatible HTTP proxy in front of an
// inference engine that keeps each chat's KV cache in gd2fs sessions: for a
// completion request that names a session, it counts the prompt's tokens
// (the engine's /tokenize), plans in the vllm format, adds the plan's
// kvcache_params to the request as kv_transfer_params, forwards it
// (streaming included), and commits what the engine reports it saved.
// Requests without a session pass through untouched, and a store that
// fails never fails a chat: the request goes on without kv_transfer_params
// and the miss is counted.
package router

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/fastjson"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Planner is what the router needs of gd2fs's explicit mode.
type Planner interface {
	PlanEngine(ctx context.Context, id string, req client.PlanRequest) (client.EnginePlan, error)
	CommitSaved(ctx context.Context, id string, planID int64, saved []client.KVRange) (client.Session, error)
}

// Config configures a Router.
type Config struct {
	Upstream *url.URL // the engine's base URL
	Model    string   // model whose KV layout the store uses
	Planner  Planner
	// SessionHeader names the session (default X-Session-ID); without it
	// the request's "user" field is the session.
	SessionHeader string
	// DecodeTokens is the room planned for generation when a request sets
	// no max_tokens (default 256).
	DecodeTokens int64
	// Timeout bounds each call to the store (default 2s): a slow store
	// costs a chat its cache, not its answer.
	Timeout time.Duration
	// MaxBody bounds a request body the router reads (default 16 MiB);
	// BodyTimeout the time to read it (default 60s; a trickled body is cut).
	MaxBody     int64
	BodyTimeout time.Duration
	// MaxAnswer bounds the bytes of an engine's answer that are held to
	// find what it saved (default 16 MiB). A longer answer that is not a
	// stream is passed on as it comes and commits nothing.
	MaxAnswer int64
	// Tenants (tenant.go): Keys maps API keys to tenants (a keys file);
	// TenantHeader names a header an authenticating proxy sets; KeyTenants
	// makes the API key's hash the tenant. SharedSessions lets requests
	// with no tenant share one namespace of session ids; without it they
	// have no session.
	Keys           map[string]string
	TenantHeader   string
	KeyTenants     bool
	SharedSessions bool
	// Flags go into every plan's kvcache_params.flags, e.g.
	// {"prefill-only": true} for an engine that serves prefill only and
	// saves the prompt's range (a commit shorter than the plan is fine).
	Flags map[string]any
	// Format is the engine's plan format: "vllm" (the default) or
	// "sglang" (the same kvcache_params, never with flags).
	Format string
	// UnsafeCountOnly plans on the token count alone, for an engine whose
	// /tokenize answers no ids: a user's edit of an earlier message then
	// gets KV computed for other text (docs/kv-cache.md "The content
	// check"). Otherwise every plan carries the prompt's token ids.
	UnsafeCountOnly bool
	Log             *slog.Logger
}

// Router is the proxy. It is an http.Handler.
type Router struct {
	cfg   Config
	proxy *httputil.ReverseProxy
	hc    *http.Client
	reg   *prometheus.Registry
	order turnOrder
	m     struct {
		requests, shortened                       *prometheus.CounterVec
		plans, misses, commits, failures          prometheus.Counter
		cachedTokens, prefillTokens               prometheus.Counter
		untenanted, unparsed                      prometheus.Counter
		planSeconds, tokenizeSeconds, waitSeconds prometheus.Histogram
	}
}

// engineIdleConns is how many idle connections to the engine the router
// keeps (net/http's default is 2 a host): with more requests in flight than
// that, every request beyond it would dial a new connection and close it
// after, a TCP handshake on the request's path and a socket in TIME_WAIT.
// Idle ones still close after the transport's IdleConnTimeout (90 s).
const engineIdleConns = 1024

// New returns a router.
func New(cfg Config) *Router {
	if cfg.SessionHeader == "" {
		cfg.SessionHeader = "X-Session-ID"
	}
	if cfg.DecodeTokens <= 0 {
		cfg.DecodeTokens = 256
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = 16 << 20
	}
	if cfg.BodyTimeout <= 0 {
		cfg.BodyTimeout = 60 * time.Second
	}
	if cfg.MaxAnswer <= 0 {
		cfg.MaxAnswer = 16 << 20
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost = engineIdleConns, engineIdleConns
	up := &upstream{tr: tr, maxIdle: engineIdleConns, idleFor: tr.IdleConnTimeout}
	r := &Router{cfg: cfg, proxy: httputil.NewSingleHostReverseProxy(cfg.Upstream), hc: &http.Client{Transport: up}, reg: prometheus.NewRegistry()}
	r.proxy.Transport = up
	// FlushInterval 0: an answer of known length is written as it is
	// copied and flushed at its end; server-sent events and answers of
	// unknown length (a stream) are flushed as they come (ReverseProxy's
	// own rule). -1 flushed every answer at once from a timer's goroutine.
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: "gd2fs_router_" + name, Help: help})
	}
	r.m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gd2fs_router_requests_total",
		Help: "Requests proxied, by whether they named a session."}, []string{"session"})
	r.m.plans = c("plans_total", "Plans made for requests with a session.")
	r.m.misses = c("store_misses_total", "Requests with a session forwarded without kv_transfer_params because the store failed.")
	r.m.commits = c("commits_total", "Commits made of what the engine saved.")
	r.m.shortened = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gd2fs_router_plans_shortened_total",
		Help: "Plans whose stored part the store cut short, by reason (server_down: stored bytes on a server that is down)."}, []string{"reason"})
	r.m.failures = c("commit_failures_total", "Commits the store refused or could not make.")
	r.m.cachedTokens = c("cached_tokens_total", "Prompt tokens the plans found stored (prefill the engine saved).")
	r.m.prefillTokens = c("prefill_tokens_total", "Prompt tokens left for the engine to prefill.")
	r.m.untenanted = c("untenanted_total", "Requests that named a session but had no tenant (no key, no tenant header) and were forwarded without one.")
	r.m.unparsed = c("answers_unparsed_total", "Answers longer than --max-answer passed on without looking for what the engine saved.")
	r.m.planSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "gd2fs_router_plan_seconds",
		Help: "Time to count tokens and plan.", Buckets: prometheus.ExponentialBuckets(100e-6, 2, 14)})
	r.m.tokenizeSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "gd2fs_router_tokenize_seconds",
		Help: "Time of the engine's /tokenize, part of gd2fs_router_plan_seconds.", Buckets: prometheus.ExponentialBuckets(100e-6, 2, 14)})
	r.m.waitSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "gd2fs_router_commit_wait_seconds",
		Help: "Time a request with a session waited for its session's previous turn to commit (0 for most).", Buckets: prometheus.ExponentialBuckets(100e-6, 2, 14)})
	r.reg.MustRegister(r.m.requests, r.m.shortened, r.m.plans, r.m.misses, r.m.commits, r.m.failures, r.m.cachedTokens, r.m.prefillTokens, r.m.planSeconds,
		r.m.tokenizeSeconds, r.m.waitSeconds, r.m.untenanted, r.m.unparsed)
	return r
}

// ServeHTTP routes completions with a session through the store and
// everything else straight to the engine.
func (r *Router) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path == "/metrics" && req.Method == http.MethodGet {
		promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{}).ServeHTTP(w, req)
		return
	}
	if req.Method == http.MethodGet || req.Method == http.MethodHead || req.Method == http.MethodOptions {
		r.m.requests.WithLabelValues("no").Inc()
		r.proxy.ServeHTTP(w, req)
		return
	}
	// Every other request's body is read and cleaned of kv_transfer_params
	// (tenant.go), whatever its path: the engine may route more paths to
	// its completions than these two.
	completion := req.Method == http.MethodPost && (req.URL.Path == "/v1/chat/completions" || req.URL.Path == "/v1/completions")
	body, err := r.readBody(w, req)
	if err != nil {
		http.Error(w, fmt.Sprintf("gd2fs router: request body: %v", err), http.StatusRequestEntityTooLarge)
		return
	}
	body, doc, err := stripTransferParams(req.Header.Get("Content-Type"), body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if !completion || doc == nil {
		r.m.requests.WithLabelValues("no").Inc()
		r.forward(w, req, body)
		return
	}
	session, ok, err := r.sessionID(req, doc)
	if err != nil {
		code := http.StatusBadRequest
		if errors.As(err, new(errNoKey)) {
			code = http.StatusUnauthorized
		}
		http.Error(w, err.Error(), code)
		return
	}
	if !ok {
		r.m.requests.WithLabelValues("no").Inc()
		r.forward(w, req, body)
		return
	}
	r.m.requests.WithLabelValues("yes").Inc()
	// The previous turn of this session may still be committing.
	start := time.Now()
	r.order.wait(req.Context(), session, r.cfg.Timeout)
	r.m.waitSeconds.Observe(time.Since(start).Seconds())
	plan, ok := r.plan(req.Context(), req.URL.Path, session, doc)
	if ok {
		params, err := json.Marshal(map[string]any{"kvcache_params": plan.KVCacheParams})
		if err == nil {
			body = withMember(body, "kv_transfer_params", params)
		}
		ok = err == nil
	}
	r.forwardAndCommit(w, req, body, session, plan, ok)
}

// Wait returns when the commits still running after their answers are
// done (each within the store timeout), including the commit of any answer
// whose end a client has already read. Call it after the HTTP server's
// Shutdown has returned, so that no request starts another.
func (r *Router) Wait() { r.order.idle() }

// withMember returns the JSON object body with the member key: value added
// last. body is an object without key (stripTransferParams parsed it and
// removed every spelling of kv_transfer_params), so the client's bytes go on
// as they came instead of being decoded and encoded again.
func withMember(body []byte, key string, value []byte) []byte {
	end := bytes.LastIndexByte(body, '}')
	head := bytes.TrimRight(body[:end], " \t\r\n")
	out := make([]byte, 0, len(head)+len(key)+len(value)+8)
	out = append(out, head...)
	if head[len(head)-1] != '{' {
		out = append(out, ',')
	}
	out = strconv.AppendQuote(out, key)
	out = append(out, ':')
	out = append(out, value...)
	return append(out, '}')
}

// forward sends body on as the request's body, unchanged otherwise.
func (r *Router) forward(w http.ResponseWriter, req *http.Request, body []byte) {
	req.Header.Del("Expect") // the router has read the body
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.ContentLength = int64(len(body))
	r.proxy.ServeHTTP(w, req)
}

// plan tokenizes the prompt and plans with its token ids, so the store
// checks the stored KV's content; ok is false (and the miss counted) when
// the store or the tokenizer failed.
func (r *Router) plan(ctx context.Context, path, session string, doc map[string]json.RawMessage) (client.EnginePlan, bool) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	ids, n, err := r.tokenize(ctx, path, doc)
	r.m.tokenizeSeconds.Observe(time.Since(start).Seconds())
	var p client.EnginePlan
	if err == nil {
		decode := r.cfg.DecodeTokens
		for _, k := range []string{"max_completion_tokens", "max_tokens"} {
			var v int64
			if raw, ok := doc[k]; ok && json.Unmarshal(raw, &v) == nil && v > 0 {
				decode = v
				break
			}
		}
		req := client.PlanRequest{Model: r.cfg.Model, PromptTokens: n, DecodeTokens: decode, TokenIDs: ids, Flags: r.cfg.Flags,
			Format: r.cfg.Format}
		if r.cfg.UnsafeCountOnly {
			req.TokenIDs, req.UnsafeCountOnly = nil, true
		}
		p, err = r.cfg.Planner.PlanEngine(ctx, session, req)
	}
	r.m.planSeconds.Observe(time.Since(start).Seconds())
	if err != nil {
		r.m.misses.Inc()
		r.cfg.Log.Warn("router: forwarding without KV cache", "session", session, "err", err)
		return p, false
	}
	r.m.plans.Inc()
	r.m.cachedTokens.Add(float64(p.CachedTokens))
	if p.Shortened != "" {
		r.m.shortened.WithLabelValues(p.Shortened).Inc()
	}
	r.m.prefillTokens.Add(float64(p.PrefillTokens))
	return p, true
}

// tokenize asks the engine's /tokenize for the prompt's token ids, with the
// request's own messages or prompt (and chat template): vLLM answers
// {"count": n, "max_model_len": m, "tokens": [...]}. Without UnsafeCountOnly
// an answer without the ids is an error (the plan could not check content).
func (r *Router) tokenize(ctx context.Context, path string, doc map[string]json.RawMessage) ([]uint32, int64, error) {
	if err := tokenizable(doc); err != nil {
		return nil, 0, err
	}
	if ids, ok := promptIDs(path, doc); ok {
		return ids, int64(len(ids)), nil
	}
	// Every field of vLLM's TokenizeChatRequest that shapes the prompt: the
	// ids must be those of the prompt the engine runs, or the plan's content
	// check compares the wrong thing (a chat whose tools change would be
	// served KV computed with the old ones). The values are the request's
	// own bytes (each a JSON value the request's parse checked), not
	// encoded again.
	b := []byte("{}")
	for _, k := range []string{"model", "messages", "prompt", "add_generation_prompt", "chat_template", "add_special_tokens",
		"tools", "chat_template_kwargs", "continue_final_message", "mm_processor_kwargs", "media_io_kwargs"} {
		if v, ok := doc[k]; ok {
			b = withMember(b, k, v)
		}
	}
	if path == "/v1/chat/completions" {
		var cont bool
		if _, ok := doc["add_generation_prompt"]; !ok && (json.Unmarshal(doc["continue_final_message"], &cont) != nil || !cont) {
			b = withMember(b, "add_generation_prompt", []byte("true"))
		}
	}
	u := *r.cfg.Upstream
	u.Path = strings.TrimSuffix(u.Path, "/") + "/tokenize"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(b))
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.hc.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("tokenize: %w", err)
	}
	defer func() {
		// Read to its end, so the connection goes back to the pool: a
		// body closed before its end closes the connection.
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
	}()
	if resp.StatusCode != http.StatusOK {
		return nil, 0, fmt.Errorf("tokenize: engine answered %s", resp.Status)
	}
	var out struct {
		Count  *int64          `json:"count"`
		Tokens json.RawMessage `json:"tokens"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&out); err != nil || out.Count == nil || *out.Count < 1 {
		return nil, 0, fmt.Errorf("tokenize: no token count in the engine's answer (%v)", err)
	}
	if r.cfg.UnsafeCountOnly {
		return nil, *out.Count, nil
	}
	ids, err := parseIDs(out.Tokens)
	if err != nil {
		return nil, 0, fmt.Errorf("tokenize: the engine's token ids: %w", err)
	}
	if int64(len(ids)) != *out.Count {
		return nil, 0, fmt.Errorf("tokenize: the engine's answer has %d token ids for a count of %d; the plan needs the ids to check the stored KV's content (or run the router with --unsafe-count-only)",
			len(ids), *out.Count)
	}
	return ids, *out.Count, nil
}

// promptIDs is the prompt of a /v1/completions request that is itself one
// list of token ids: vLLM runs such a prompt as it is (no special tokens
// added, no template), so these are the tokens the engine runs, and a
// client that tokenized already (a KV-aware router, a batch job) is
// planned without a round trip to the engine (whose /tokenize takes only
// text: such a request was not planned before). A batch (a list of lists),
// an empty list or anything else is left to /tokenize.
func promptIDs(path string, doc map[string]json.RawMessage) ([]uint32, bool) {
	if path != "/v1/completions" {
		return nil, false
	}
	raw := bytes.TrimSpace(doc["prompt"])
	if len(raw) < 3 || raw[0] != '[' {
		return nil, false
	}
	ids, err := parseIDs(raw)
	if err != nil || len(ids) == 0 {
		return nil, false
	}
	return ids, true
}

// parseIDs reads a JSON array of token ids (or null, or nothing), as
// json.Unmarshal into []uint32 would, without its reflection on every
// element: a prompt's ids are thousands of numbers on every request's path.
// It also refuses a null id, which json.Unmarshal would read as 0.
func parseIDs(b []byte) ([]uint32, error) {
	b = bytes.TrimSpace(b)
	if len(b) == 0 || string(b) == "null" {
		return nil, nil
	}
	if ids, ok := fastjson.Uint32s(b); ok {
		return ids, nil
	}
	return nil, errors.New("not an array of unsigned 32-bit integers")
}

// hopHeaders are the request's headers that are not passed on to the
// engine: the hop-by-hop ones (as ReverseProxy drops them), the length
// (the body's is set), and Expect (the router has the whole body: the
// engine's 100 Continue would only be waited for).
var hopHeaders = map[string]bool{"Connection": true, "Proxy-Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Content-Length": true,
	"Expect": true}

// forwardAndCommit proxies the request, copying the answer to the client as
// it comes (server-sent events included), and commits the kv_transfer_params
// the engine returns in its answer (for a stream, the last event that has
// them).
func (r *Router) forwardAndCommit(w http.ResponseWriter, req *http.Request, body []byte, session string, plan client.EnginePlan, planned bool) {
	if !planned {
		r.forward(w, req, body)
		return
	}
	u := *r.cfg.Upstream
	u.Path = strings.TrimSuffix(u.Path, "/") + req.URL.Path
	u.RawQuery = req.URL.RawQuery
	out, err := http.NewRequestWithContext(req.Context(), http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, "gd2fs router: "+err.Error(), http.StatusBadGateway)
		return
	}
	for k, v := range req.Header {
		if !hopHeaders[k] {
			out.Header[k] = v
		}
	}
	// And the headers the client's Connection names, as ReverseProxy
	// drops them.
	for _, f := range req.Header["Connection"] {
		for _, k := range strings.Split(f, ",") {
			if k = textproto.TrimString(k); k != "" {
				out.Header.Del(k)
			}
		}
	}
	resp, err := r.hc.Do(out)
	if err != nil {
		http.Error(w, "gd2fs router: engine unreachable: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, v := range resp.Header {
		if k != "Content-Length" {
			w.Header()[k] = v
		}
	}
	// The session is held from before the client can see the end of the
	// answer until the commit is done, so its next turn is planned after it.
	release := func() {}
	defer func() { release() }()
	holdOnce := func() {
		if resp.StatusCode == http.StatusOK {
			release = r.order.hold(session)
		}
	}
	var saved *savedParams
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		w.WriteHeader(resp.StatusCode)
		saved = copyEvents(w, resp.Body, holdOnce)
	} else {
		var b []byte
		var err error
		if resp.ContentLength <= r.cfg.MaxAnswer { // -1: unknown
			b, err = io.ReadAll(io.LimitReader(resp.Body, r.cfg.MaxAnswer+1))
		}
		if err != nil {
			http.Error(w, "gd2fs router: engine answer: "+err.Error(), http.StatusBadGateway)
			return
		}
		if int64(len(b)) > r.cfg.MaxAnswer || resp.ContentLength > r.cfg.MaxAnswer {
			// Too long to hold: pass it on as it comes; nothing is
			// committed (the plan expires, the session is unchanged).
			r.m.unparsed.Inc()
			if resp.ContentLength >= 0 {
				w.Header().Set("Content-Length", strconv.FormatInt(resp.ContentLength, 10))
			}
			w.WriteHeader(resp.StatusCode)
			w.Write(b)
			io.Copy(w, resp.Body)
			return
		}
		// With its length known and flushed, the client has the whole
		// answer before the commit below runs: the commit adds no latency.
		saved = findSaved(b)
		if saved != nil {
			holdOnce()
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.WriteHeader(resp.StatusCode)
		w.Write(b)
		if fl, ok := w.(http.Flusher); ok {
			fl.Flush()
		}
	}
	if resp.StatusCode != http.StatusOK || saved == nil {
		return // the plan expires; the session is unchanged
	}
	// The client has the whole answer. The commit runs apart from this
	// handler, so that the connection takes its next request at once: the
	// server reads a connection's next request only when the handler has
	// returned, so a commit here would delay whatever request the client
	// sends next on it (any session's). The hold keeps this session's
	// next turn behind the commit.
	// The hold also counts the commit as running, for Wait.
	done := release
	release = func() {}
	go func() {
		defer done()
		r.commit(session, plan, saved)
	}()
}

type savedParams struct {
	KVCacheParams *struct {
		Fresh []client.KVRange `json:"fresh_kvcache"`
	} `json:"kvcache_params"`
}

// findSaved reads kv_transfer_params from an answer (or an event) body.
func findSaved(b []byte) *savedParams {
	var doc struct {
		KVTransferParams *savedParams `json:"kv_transfer_params"`
	}
	if json.Unmarshal(b, &doc) != nil || doc.KVTransferParams == nil || doc.KVTransferParams.KVCacheParams == nil {
		return nil
	}
	return doc.KVTransferParams
}

// copyEvents copies a server-sent event stream line by line, flushing each
// event, and returns the last kv_transfer_params seen in a data line;
// onSaved runs before the first line that carries them is passed on.
func copyEvents(w http.ResponseWriter, body io.Reader, onSaved func()) *savedParams {
	fl, _ := w.(http.Flusher)
	br := bufio.NewReaderSize(body, 64<<10)
	var saved *savedParams
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			if data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data: ")); ok && bytes.Contains(data, []byte("kv_transfer_params")) {
				if s := findSaved(data); s != nil {
					if saved == nil {
						onSaved()
					}
					saved = s
				}
			}
			w.Write(line)
			if len(bytes.TrimSpace(line)) == 0 && fl != nil {
				fl.Flush()
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			// A line longer than the buffer: pass it on, unparsed.
			continue
		}
		if err != nil {
			if fl != nil {
				fl.Flush()
			}
			return saved
		}
	}
}

// commit records what the engine saved.
func (r *Router) commit(session string, plan client.EnginePlan, saved *savedParams) {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.Timeout)
	defer cancel()
	// Counted when done, so commits + failures is the commits finished.
	if _, err := r.cfg.Planner.CommitSaved(ctx, session, plan.PlanID, saved.KVCacheParams.Fresh); err != nil {
		r.m.failures.Inc()
		r.cfg.Log.Warn("router: commit failed", "session", session, "plan", plan.PlanID, "err", err)
		return
	}
	r.m.commits.Inc()
}

// tokenizable refuses (a miss: the request goes on without cache) a request
// whose prompt has content its token ids do not show, so that a content
// check on the ids could pass KV computed for other content: media parts
// (an image's placeholder tokens are the same for every image), documents
// and reasoning_effort (they shape the chat template, and vLLM's /tokenize
// does not take them), truncate_prompt_tokens (the engine keeps only the
// prompt's last k tokens, /tokenize all of them), prompt_embeds (content
// with no ids at all), and tools the engine may leave out of the prompt
// (tool_choice "none").
func tokenizable(doc map[string]json.RawMessage) error {
	for _, k := range []string{"documents", "reasoning_effort", "truncate_prompt_tokens", "prompt_embeds"} {
		if v, ok := doc[k]; ok && string(v) != "null" {
			return fmt.Errorf("tokenize: the request's %s shapes the prompt and /tokenize does not take it; no plan", k)
		}
	}
	var choice string
	if json.Unmarshal(doc["tool_choice"], &choice) == nil && choice == "none" {
		if v, ok := doc["tools"]; ok && string(v) != "null" {
			return fmt.Errorf("tokenize: tools with tool_choice none (the engine may leave them out of the prompt); no plan")
		}
	}
	raw, ok := doc["messages"]
	if !ok {
		return nil
	}
	// Maps, not structs: encoding/json matches a struct's fields without
	// regard to case, the engine (pydantic) with it, so {"content": [an
	// image], "Content": "hi"} would read here as the text the engine
	// does not run.
	var msgs []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return fmt.Errorf("tokenize: messages: %w", err)
	}
	for i, m := range msgs {
		c := bytes.TrimSpace(m["content"])
		if len(c) == 0 || c[0] != '[' {
			continue // a string, or none
		}
		var parts []map[string]json.RawMessage
		if err := json.Unmarshal(c, &parts); err != nil {
			return fmt.Errorf("tokenize: message %d content: %w", i, err)
		}
		for _, p := range parts {
			var typ string
			if err := json.Unmarshal(p["type"], &typ); err != nil || typ != "text" {
				return fmt.Errorf("tokenize: message %d has a %.64s part, whose content its token ids do not show; no plan", i, p["type"])
			}
		}
	}
	return nil
}
