package master

import (
	"net/http"
	"strconv"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/meta"
)

// sessionRoutes adds the explicit-mode KV endpoints (docs/api.md).
func (m *Master) sessionRoutes(h func(pattern string, fn func(r *http.Request) (any, error))) {
	h("PUT /v1/models/{model}/layout", func(r *http.Request) (any, error) {
		var l meta.Layout
		if err := readJSON(r, &l); err != nil {
			return nil, err
		}
		l.Model = r.PathValue("model")
		return l, m.meta.PutLayout(r.Context(), l)
	})
	h("GET /v1/models/{model}/layout", func(r *http.Request) (any, error) {
		return m.meta.Layout(r.Context(), r.PathValue("model"))
	})
	h("POST /v1/prefixes", func(r *http.Request) (any, error) {
		var p meta.Prefix
		if err := readJSON(r, &p); err != nil {
			return nil, err
		}
		var err error
		if p.Path, err = meta.CleanPath(p.Path); err != nil {
			return nil, err
		}
		return p, m.meta.PutPrefix(r.Context(), p)
	})
	h("POST /v1/sessions/{id}/plan", m.plan)
	h("POST /v1/sessions/{id}/commit", func(r *http.Request) (any, error) {
		var req api.CommitSessionRequest
		if err := readJSON(r, &req); err != nil {
			return nil, err
		}
		s, err := m.meta.CommitSession(r.Context(), r.PathValue("id"), req.PlanID, time.Now())
		return m.sessionOut(s), err
	})
	h("POST /v1/sessions/{id}/fork", func(r *http.Request) (any, error) {
		var req api.ForkRequest
		if err := readJSON(r, &req); err != nil {
			return nil, err
		}
		if err := m.meta.ForkSession(r.Context(), r.PathValue("id"), req.NewID, time.Now()); err != nil {
			return nil, err
		}
		s, err := m.meta.Session(r.Context(), req.NewID)
		return m.sessionOut(s), err
	})
	h("GET /v1/sessions/{id}", func(r *http.Request) (any, error) {
		s, err := m.meta.Session(r.Context(), r.PathValue("id"))
		return m.sessionOut(s), err
	})
	h("DELETE /v1/sessions/{id}", func(r *http.Request) (any, error) {
		return struct{}{}, m.meta.DeleteSession(r.Context(), r.PathValue("id"))
	})
	h("GET /v1/sessions", func(r *http.Request) (any, error) {
		limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
		if limit <= 0 || limit > 10000 {
			limit = 1000
		}
		ss, err := m.meta.Sessions(r.Context(), r.URL.Query().Get("after"), limit)
		out := api.SessionList{Sessions: make([]api.Session, 0, len(ss))}
		for _, s := range ss {
			out.Sessions = append(out.Sessions, m.sessionOut(s))
		}
		return out, err
	})
}

func (m *Master) uri(path string) string { return "gd2fs://" + m.cfg.Cluster + path }

func (m *Master) rangesOut(rs []meta.Range) []api.KVRange {
	out := make([]api.KVRange, 0, len(rs))
	for _, r := range rs {
		out = append(out, api.KVRange{TokenStart: r.TokenStart, TokenLength: r.TokenLength, KVURI: m.uri(r.Path),
			KVStart: r.KVStart, KVLength: r.KVLength})
	}
	return out
}

func (m *Master) sessionOut(s meta.Session) api.Session {
	return api.Session{ID: s.ID, Model: s.Model, Tokens: s.Tokens, Bytes: s.Bytes, LastUsed: s.LastUsed, Created: s.Created,
		Ranges: m.rangesOut(s.Ranges)}
}

func (m *Master) plan(r *http.Request) (any, error) {
	var req api.PlanRequest
	if err := readJSON(r, &req); err != nil {
		return nil, err
	}
	if req.Model == "" {
		return nil, errs.New(errs.ErrBadRequest, "plan needs a model")
	}
	prefixes := make([]string, len(req.Prefixes))
	for i, p := range req.Prefixes {
		var err error
		if prefixes[i], err = m.localPath(p); err != nil {
			return nil, err
		}
	}
	p, err := m.meta.PlanSession(r.Context(), meta.PlanInput{
		Session: r.PathValue("id"), Model: req.Model, Prefixes: prefixes, PromptTokens: req.PromptTokens,
		DecodeTokens: req.DecodeTokens, NewFile: req.NewFile, Dir: "/kv-sessions", Pool: m.cfg.SessionPool,
		ChunkSize: DefaultChunkSize, Quota: m.cfg.SessionQuota, PlanTTL: 10 * time.Minute, Now: time.Now(),
	})
	if err != nil {
		return nil, err
	}
	if len(p.Evicted) > 0 {
		m.metrics.evictions.Add(float64(len(p.Evicted)))
	}
	out := api.Plan{PlanID: p.ID, Stored: m.rangesOut(p.Stored), Fresh: m.rangesOut(p.Fresh), CachedTokens: p.Cached,
		PrefillTokens: p.Prefill, DecodeTokens: p.Decode, LoadBytes: p.Load, Evicted: p.Evicted}
	if req.PromptTokens > 0 {
		out.HitRate = float64(p.Cached) / float64(req.PromptTokens)
	}
	return out, nil
}

// localPath accepts a namespace path or a gd2fs://<cluster>/path URI of this cluster.
func (m *Master) localPath(p string) (string, error) {
	if rest, ok := cutPrefix(p, "gd2fs://"); ok {
		i := 0
		for i < len(rest) && rest[i] != '/' {
			i++
		}
		if rest[:i] != m.cfg.Cluster {
			return "", errs.New(errs.ErrBadRequest, "%s names cluster %q; this is %q", p, rest[:i], m.cfg.Cluster)
		}
		p = rest[i:]
	}
	return meta.CleanPath(p)
}

func cutPrefix(s, prefix string) (string, bool) {
	if len(s) >= len(prefix) && s[:len(prefix)] == prefix {
		return s[len(prefix):], true
	}
	return s, false
}
