package master

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/limits"
	"github.com/gd2fs/gd2fs/internal/meta"
	"github.com/gd2fs/gd2fs/internal/nspath"
)

// sessionRoutes adds the explicit-mode KV endpoints (docs/api.md).
func (m *Master) sessionRoutes(h func(pattern string, fn func(r *http.Request) (any, error))) {
	h("PUT /v1/models/{model}/layout", func(r *http.Request) (any, error) {
		var l meta.Layout
		if err := readJSON(r, &l); err != nil {
			return nil, err
		}
		l.Model = r.PathValue("model")
		return l, m.sessions.PutLayout(r.Context(), l)
	})
	h("GET /v1/models/{model}/layout", func(r *http.Request) (any, error) {
		return m.sessions.Layout(r.Context(), r.PathValue("model"))
	})
	h("POST /v1/prefixes", func(r *http.Request) (any, error) {
		var p meta.Prefix
		if err := readJSON(r, &p); err != nil {
			return nil, err
		}
		var err error
		if p.Path, err = nspath.Clean(p.Path); err != nil {
			return nil, err
		}
		return p, m.sessions.PutPrefix(r.Context(), p)
	})
	h("POST /v1/sessions/{id}/plan", m.plan)
	h("POST /v1/sessions/plans", m.planBatch)
	h("POST /v1/sessions/{id}/commit", m.commitSession)
	h("POST /v1/sessions/commits", func(r *http.Request) (any, error) { return m.commitBatch(r, false) })
	// Batches with engine commits (api.CommitBatchRequest says why a route
	// of their own).
	h("POST /v1/sessions/commits/saved", func(r *http.Request) (any, error) { return m.commitBatch(r, true) })
	h("GET /v1/sessions/{id}/plans/{plan}", m.outstandingPlan) // session_plans.go
	h("POST /v1/sessions/{id}/fork", func(r *http.Request) (any, error) {
		var req api.ForkRequest
		if err := readJSON(r, &req); err != nil {
			return nil, err
		}
		rid, err := requestID(r)
		if err != nil {
			return nil, err
		}
		if err := m.sessions.ForkSession(r.Context(), r.PathValue("id"), req.NewID, rid, time.Now()); err != nil {
			return nil, err
		}
		s, err := m.sessions.Session(r.Context(), req.NewID)
		return m.sessionOut(s), err
	})
	h("GET /v1/sessions/{id}", func(r *http.Request) (any, error) {
		s, err := m.sessions.Session(r.Context(), r.PathValue("id"))
		return m.sessionOut(s), err
	})
	h("DELETE /v1/sessions/{id}", func(r *http.Request) (any, error) {
		return struct{}{}, m.sessions.DeleteSession(r.Context(), r.PathValue("id"))
	})
	h("GET /v1/sessions", func(r *http.Request) (any, error) {
		limit, err := queryInt(r, "limit", 1000, 1, limits.MaxListLimit)
		if err != nil {
			return nil, err
		}
		ss, err := m.sessions.Sessions(r.Context(), r.URL.Query().Get("after"), limit)
		out := api.SessionList{Sessions: make([]api.Session, 0, len(ss))}
		for _, s := range ss {
			out.Sessions = append(out.Sessions, m.sessionOut(s))
		}
		return out, err
	})
}

func (m *Master) uri(path string) string { return "gd2fs://" + m.cfg.Cluster + path }

// engineURI is the kv_uri form a process can dial without other
// configuration: gd2fs://<master host:port>[,...]/<path>?cluster=<name>.
func (m *Master) engineURI(path string) string {
	return "gd2fs://" + strings.Join(m.publicMasters(), ",") + path + "?cluster=" + url.QueryEscape(m.cfg.Cluster)
}

// publicMasters are the host:port of the masters named in engine kv_uris:
// Config.PublicMasters, or this master's advertised address.
func (m *Master) publicMasters() []string {
	if len(m.cfg.PublicMasters) > 0 {
		return m.cfg.PublicMasters
	}
	if u, err := url.Parse(m.url); err == nil && u.Host != "" {
		return []string{u.Host}
	}
	return []string{m.ln.Addr().String()}
}

func (m *Master) rangesOut(rs []meta.Range) []api.KVRange { return m.rangesAs(rs, m.uri) }

func (m *Master) rangesAs(rs []meta.Range, uri func(string) string) []api.KVRange {
	out := make([]api.KVRange, 0, len(rs))
	for _, r := range rs {
		out = append(out, api.KVRange{TokenStart: r.TokenStart, TokenLength: r.TokenLength, KVURI: uri(r.Path),
			KVStart: r.KVStart, KVLength: r.KVLength})
	}
	return out
}

func (m *Master) sessionOut(s meta.Session) api.Session {
	return api.Session{ID: s.ID, Model: s.Model, Tokens: s.Tokens, Bytes: s.Bytes, LastUsed: s.LastUsed, Created: s.Created,
		Ranges: m.rangesOut(s.Ranges), HashedTokens: s.HashedTokens}
}

func (m *Master) plan(r *http.Request) (any, error) {
	var req planWire // planjson.go
	if err := readJSON(r, &req); err != nil {
		return nil, err
	}
	rid, err := requestID(r)
	if err != nil {
		return nil, err
	}
	return m.planOne(r.Context(), r.PathValue("id"), rid, req.request())
}

// planBatch answers POST /v1/sessions/plans: every plan of the batch made
// as planOne makes it, all at once, so they share group transactions (one
// SQL transaction for many plans); each answers its own error.
func (m *Master) planBatch(r *http.Request) (any, error) {
	var wire planBatchWire // planjson.go
	if err := readJSON(r, &wire); err != nil {
		return nil, err
	}
	req := wire.request()
	if n := len(req.Plans); n < 1 || n > api.MaxPlanBatch {
		return nil, errs.New(errs.ErrBadRequest, "a plan batch of %d plans: send 1 to %d (split bigger batches)", n, api.MaxPlanBatch)
	}
	for i, it := range req.Plans {
		if err := checkRequestID(it.RequestID); err != nil {
			return nil, errs.New(errs.ErrBadRequest, "plan %d: %w", i, err)
		}
	}
	out := api.PlanBatchAnswer{Plans: make([]api.PlanBatchResult, len(req.Plans))}
	var wg sync.WaitGroup
	for i, it := range req.Plans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := &out.Plans[i]
			p, err := m.planOne(r.Context(), it.Session, it.RequestID, it.Plan)
			if err == nil {
				res.Plan, err = marshalPlan(p)
			}
			if err != nil {
				res.Plan, res.Error = nil, &api.Error{Error: err.Error(), Code: errs.Code(err)}
			}
		}()
	}
	wg.Wait()
	return out, nil
}

// marshalPlan writes a plan of a batch as json.Marshal does, by hand where
// it can (api.AppendPlanJSON): into a pooled buffer, then copied at its
// exact size, as the batch's answer copies it again (a buffer grown from
// nothing left about twice its size to the collector, a plan a turn).
func marshalPlan(p any) ([]byte, error) {
	buf := answers.Get().(*answerBuf)
	var b []byte
	ok := false
	switch a := p.(type) {
	case api.Plan:
		b, ok = api.AppendPlanJSON(buf.B[:0], &a)
	case api.EnginePlan:
		b, ok = api.AppendEnginePlanJSON(buf.B[:0], &a)
	}
	var out []byte
	if ok {
		out = bytes.Clone(b)
	}
	putAnswer(buf, b)
	if ok {
		return out, nil
	}
	return json.Marshal(p)
}

// planOne makes session id's plan for req (request id rid, "" for none).
func (m *Master) planOne(ctx context.Context, id, rid string, req api.PlanRequest) (any, error) {
	if req.Model == "" {
		return nil, errs.New(errs.ErrBadRequest, "plan needs a model")
	}
	engine := false
	switch req.Format {
	case "", "gd2fs":
	case "vllm", "sglang":
		// The engines' explicit-KV connectors take the same kvcache_params
		// (id, stored_kvcache, fresh_kvcache, load_threshold) with kv_uris
		// they can dial; SGLang's have no flags and fail on unknown fields.
		engine = true
		if err := checkURISafe(id); err != nil {
			return nil, err
		}
		if req.Format == "sglang" && len(req.Flags) > 0 {
			return nil, errs.New(errs.ErrBadRequest, "plan flags: SGLang's kvcache_params have no flags (it would refuse the request); drop them or use format vllm")
		}
	default:
		return nil, errs.New(errs.ErrBadRequest, "unknown plan format %q: gd2fs (the default), vllm or sglang", req.Format)
	}
	if req.LoadThreshold < 0 {
		return nil, errs.New(errs.ErrBadRequest, "load_threshold must not be negative")
	}
	if err := api.CheckEngineFlags(req.Flags); err != nil {
		return nil, errs.New(errs.ErrBadRequest, "plan flags: %w", err)
	}
	if len(req.Flags) > 0 && !engine {
		return nil, errs.New(errs.ErrBadRequest, "plan flags are passed to an engine in kvcache_params: give them with format vllm")
	}
	prefixes := make([]string, len(req.Prefixes))
	for i, p := range req.Prefixes {
		var err error
		if prefixes[i], err = m.localPath(p); err != nil {
			return nil, err
		}
	}
	p, err := m.sessions.PlanSession(ctx, meta.PlanInput{
		Session: id, Model: req.Model, Prefixes: prefixes, PromptTokens: req.PromptTokens,
		TokenIDs: req.TokenIDs, BlockHashes: req.BlockHashes, UnsafeCountOnly: req.UnsafeCountOnly,
		DecodeTokens: req.DecodeTokens, NewFile: req.NewFile, Dir: sessionDir, Pool: m.cfg.SessionPool,
		ChunkSize: DefaultChunkSize, Quota: m.cfg.SessionQuota, PlanTTL: 10 * time.Minute, Now: time.Now(), Aligned: engine,
		Place: m.sessionPlacer(ctx, engine), RequestID: rid, Reachable: m.reachable(),
	})
	if err != nil {
		return nil, err
	}
	// planwarm.go: the load that follows finds the stored chunks in DRAM.
	m.warmPlan(p.Stored)
	prompt := p.Prefill + p.Cached // prompt_tokens may be left out with token_ids
	if !p.Repeat {                 // a repeat was counted the first time
		m.plans.record(prompt, p.Cached, p.Evicted)
		if len(p.Evicted) > 0 {
			m.metrics.evictions.Add(float64(len(p.Evicted)))
		}
		m.metrics.plans.Inc()
		m.metrics.cachedTokens.Add(float64(p.Cached))
		if p.Shortened != "" {
			m.metrics.shortened.WithLabelValues(p.Shortened).Inc()
		}
	}
	if engine {
		out := api.EnginePlan{PlanID: p.ID, CachedTokens: p.Cached, VerifiedTokens: p.Verified, PrefillTokens: p.Prefill, DecodeTokens: p.Decode,
			Shortened: p.Shortened, ShortenedTokens: p.ShortenedTokens,
			LoadBytes: p.Load, Evicted: p.Evicted, KVCacheParams: api.KVCacheParams{ID: id,
				Stored: m.rangesAs(p.Stored, m.engineURI), Fresh: m.rangesAs(p.Fresh, m.engineURI), LoadThreshold: req.LoadThreshold,
				Flags: req.Flags}}
		if prompt > 0 {
			out.HitRate = float64(p.Cached) / float64(prompt)
		}
		return out, nil
	}
	out := api.Plan{PlanID: p.ID, Stored: m.rangesOut(p.Stored), Fresh: m.rangesOut(p.Fresh), CachedTokens: p.Cached, VerifiedTokens: p.Verified,
		Shortened: p.Shortened, ShortenedTokens: p.ShortenedTokens,
		PrefillTokens: p.Prefill, DecodeTokens: p.Decode, LoadBytes: p.Load, Evicted: p.Evicted}
	if len(p.FreshChunks) > 0 {
		m.planHeld.put(p.ID, p.Fresh, p.FreshFile, p.FreshChunks) // written.go
		f := fileOut(p.FreshFile)
		f.Chunks = m.chunksOut(p.FreshChunks)
		out.FreshFiles = []api.File{f}
	}
	if prompt > 0 {
		out.HitRate = float64(p.Cached) / float64(prompt)
	}
	return out, nil
}

// localPath accepts a namespace path or a gd2fs:// URI of this cluster, in
// either form (api.ParseURI).
func (m *Master) localPath(p string) (string, error) {
	if strings.HasPrefix(p, "gd2fs://") {
		u, err := api.ParseURI(p)
		if err != nil {
			return "", err
		}
		if u.Cluster != "" && u.Cluster != m.cfg.Cluster {
			return "", errs.New(errs.ErrBadRequest, "%s names cluster %q; this is %q", p, u.Cluster, m.cfg.Cluster)
		}
		p = u.Path
	}
	return nspath.Clean(p)
}

// reachable is what a plan asks of the data servers (meta.PlanInput.Reachable):
// whether the server heartbeats. A server the master has never heard of
// (none of its chunks' replicas could be) counts as down.
func (m *Master) reachable() func(string) bool {
	m.mu.Lock()
	up := make(map[string]bool, len(m.servers))
	for id, s := range m.servers {
		up[id] = s.up || s.presumed // presumed: a new leader before their first heartbeat
	}
	m.mu.Unlock()
	return func(id string) bool { return up[id] }
}

// requestID is a plan's or fork's request id (api.RequestIDParam), which
// makes a repeat of it answer as the first did; "" when there is none.
func requestID(r *http.Request) (string, error) {
	id := r.URL.Query().Get(api.RequestIDParam)
	return id, checkRequestID(id)
}

// checkRequestID refuses request ids that are too long or not printable.
func checkRequestID(id string) error {
	if len(id) > 128 {
		return errs.New(errs.ErrBadRequest, "request_id of %d bytes: at most 128", len(id))
	}
	for _, c := range id {
		if c <= ' ' || c == 0x7f {
			return errs.New(errs.ErrBadRequest, "request_id %q: printable characters only", id)
		}
	}
	return nil
}

// checkURISafe refuses session ids that cannot stand unescaped in a kv_uri
// path (engines pass the URI's path through as it is).
func checkURISafe(id string) error {
	for _, c := range id {
		if c <= ' ' || c == 0x7f || strings.ContainsRune("?#%\\\"<>`^{|}", c) {
			return errs.New(errs.ErrBadRequest, "session id %q cannot stand in a kv_uri: use letters, digits and -._~:@!$&'()*+,;=", id)
		}
	}
	return nil
}

// commitSession records a plan, or what its engine saved (docs/api.md).
func (m *Master) commitSession(r *http.Request) (any, error) {
	var wire commitWire // planjson.go
	if err := readJSON(r, &wire); err != nil {
		return nil, err
	}
	in, err := m.commitInput(r.PathValue("id"), &wire.CommitSessionRequest, time.Now())
	if err != nil {
		return nil, err
	}
	in.Held = m.heldHook(r.Context(), m.sessionHeld(r.Context(), in), in.Partial) // written.go
	s, err := m.sessions.CommitSession(r.Context(), in)
	if err != nil {
		m.metrics.commitFailures.Inc()
	}
	return m.sessionOut(s), err
}

// commitInput checks session id's commit req — a plan id, written or not,
// or what an engine saved (kvcache_params or fresh_kvcache) — and makes
// it the store's input, without Held. The single route and every item of
// a batch go through it, so both check a commit alike.
func (m *Master) commitInput(id string, req *api.CommitSessionRequest, now time.Time) (meta.CommitInput, error) {
	in := meta.CommitInput{Session: id, PlanID: req.PlanID, Written: req.Written, Now: now}
	var saved []api.KVRange
	switch {
	case req.KVCacheParams != nil && req.Fresh != nil:
		return in, errs.New(errs.ErrBadRequest, "give kvcache_params or fresh_kvcache, not both")
	case req.KVCacheParams != nil:
		if kid := req.KVCacheParams.ID; kid != "" && kid != in.Session {
			return in, errs.New(errs.ErrBadRequest, "kvcache_params are of session %q, not %q", kid, in.Session)
		}
		in.Partial, saved = true, req.KVCacheParams.Fresh
	case req.Fresh != nil:
		in.Partial, saved = true, *req.Fresh
	}
	if len(saved) > limits.MaxSavedSegments {
		return in, errs.New(errs.ErrBadRequest, "%d saved segments: at most %d in one commit; join adjacent segments, or commit in parts", len(saved), limits.MaxSavedSegments)
	}
	for i, k := range saved {
		path, err := m.localPath(k.KVURI)
		if err != nil {
			return in, errs.New(errs.ErrBadRequest, "saved segment %d: kv_uri %q: %w", i, k.KVURI, err)
		}
		in.Saved = append(in.Saved, meta.Range{TokenStart: k.TokenStart, TokenLength: k.TokenLength, Path: path, KVStart: k.KVStart, KVLength: k.KVLength})
	}
	return in, nil
}

// commitBatch answers POST /v1/sessions/commits (engine false: plain
// commits only) and POST /v1/sessions/commits/saved (engine commits too):
// every commit of the batch checked and recorded as commitSession does
// (commitInput, heldHook), all at once, so they share group transactions;
// the servers are asked about the ranges of the whole batch in one round
// (sessionsHeld), before any transaction. Each answers its own error.
func (m *Master) commitBatch(r *http.Request, engine bool) (any, error) {
	var wire commitBatchWire // planjson.go
	if err := readJSON(r, &wire); err != nil {
		return nil, err
	}
	req := wire.CommitBatchRequest
	n := len(req.Commits)
	if n < 1 || n > api.MaxCommitBatch {
		return nil, errs.New(errs.ErrBadRequest, "a commit batch of %d commits: send 1 to %d (split bigger batches)", n, api.MaxCommitBatch)
	}
	ctx, now := r.Context(), time.Now()
	out := api.CommitBatchAnswer{Commits: make([]api.CommitBatchResult, n)}
	fail := func(i int, err error) {
		out.Commits[i].Error = &api.Error{Error: err.Error(), Code: errs.Code(err)}
	}
	ins := make([]meta.CommitInput, 0, n)
	idx := make([]int, 0, n) // the item of each of ins
	for i, it := range req.Commits {
		if it.Fresh != nil && !engine {
			return nil, errs.New(errs.ErrBadRequest, "commit %d of the batch has fresh_kvcache: send engine commits to POST /v1/sessions/commits/saved", i)
		}
		in, err := m.commitInput(it.Session, &api.CommitSessionRequest{PlanID: it.PlanID, Written: it.Written, Fresh: it.Fresh}, now)
		if err != nil {
			fail(i, err)
			continue
		}
		ins, idx = append(ins, in), append(idx, i)
	}
	held := m.sessionsHeld(ctx, ins) // written.go
	var wg sync.WaitGroup
	for k := range ins {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in, i := ins[k], idx[k]
			in.Held = m.heldHook(ctx, held[k], in.Partial)
			s, err := m.sessions.CommitSession(ctx, in)
			if err != nil {
				m.metrics.commitFailures.Inc()
				fail(i, err)
				return
			}
			so := m.sessionOut(s)
			out.Commits[i].Session = &so
		}()
	}
	wg.Wait()
	return out, nil
}

// sessionPlacer places the chunks of a gd2fs-format plan's fresh range
// (meta.PlanInput.Place), so the client writes them with no master call;
// vllm-format plans go to engines that open the file themselves.
func (m *Master) sessionPlacer(ctx context.Context, engine bool) meta.PlaceFunc {
	if engine {
		return nil
	}
	// Looked up before the plan's transaction (on SQLite that transaction
	// holds the store's one connection), once: pools are written only when
	// a master starts on an empty store (New). A read per plan queued every
	// plan answered from memory behind the write-behind flush.
	var pool meta.Pool
	if p := m.sessionPool.Load(); p != nil {
		pool = *p
	} else {
		var err error
		if pool, err = m.pool(ctx, m.cfg.SessionPool); err != nil {
			return nil // the client allocates as it writes, and sees the error
		}
		m.sessionPool.Store(&pool)
	}
	return func(fileID, idx int64) ([]string, error) {
		return m.place(fileID, idx, pool.Replicas, DefaultChunkSize)
	}
}
