package client

import (
	"context"
	"encoding/json"
	"net/url"
	"strconv"
	"sync"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/kvlayout"
)

// Explicit-mode KV cache: a scheduler asks, before a request runs, which
// token ranges of a session are stored and where the new KV goes
// (docs/kv-cache.md).
type (
	// Layout is a model's KV layout: layers, KV heads, head dim, dtype,
	// tokens per page, layer_first or page_first.
	Layout = api.Layout
	// PlanRequest is what a plan is asked for.
	PlanRequest = api.PlanRequest
	// Plan is the master's answer: stored_kv_cache, fresh_kv_cache and figures.
	Plan = api.Plan
	// KVRange is one stored or fresh range.
	KVRange = api.KVRange
	// Session is a session and its committed ranges.
	Session = api.Session
	// EnginePlan is a plan in the vllm format: kvcache_params to pass as
	// the request's kv_transfer_params, whole blocks, dialable kv_uris.
	EnginePlan = api.EnginePlan
	// KVCacheParams is vLLM's kvcache_params.
	KVCacheParams = api.KVCacheParams
	// URI is a parsed gd2fs:// URI (either form).
	URI = api.URI
	// BlockHash is the chained hash of a block of token ids: what a plan
	// compares with what a session stored (docs/kv-cache.md "The content
	// check").
	BlockHash = kvlayout.BlockHash
)

// BlockHashes is the chain of block hashes of a prompt's token ids in
// blocks of pageTokens (the model layout's page_tokens): PlanRequest's
// BlockHashes, for a caller that would rather not send the ids.
func BlockHashes(ids []uint32, pageTokens int) []BlockHash {
	return kvlayout.BlockHashes(ids, pageTokens)
}

// ParseURI parses gd2fs://<cluster>/<path> and
// gd2fs://<host:port>[,<host:port>...]/<path>?cluster=<name>.
func ParseURI(s string) (URI, error) { return api.ParseURI(s) }

// Sessions is the explicit-mode API.
type Sessions struct{ c *Client }

// Sessions returns the explicit-mode KV API.
func (c *Client) Sessions() *Sessions { return &Sessions{c: c} }

func esc(s string) string { return url.PathEscape(s) }

// planPath is a plan's path with a request id of its own, so the call is
// repeated through a failover like every other master call: a repeat is
// answered with the plan the first made (no second reservation).
func planPath(id string) string {
	return "/v1/sessions/" + esc(id) + "/plan?" + api.RequestIDParam + "=" + requestID()
}

// SetLayout registers (or replaces) the KV layout of model.
func (s *Sessions) SetLayout(ctx context.Context, l Layout) error {
	return s.c.api.Do(ctx, "PUT", "/v1/models/"+esc(l.Model)+"/layout", l, nil)
}

// Layout returns model's KV layout.
func (s *Sessions) Layout(ctx context.Context, model string) (Layout, error) {
	var l Layout
	err := s.c.api.Do(ctx, "GET", "/v1/models/"+esc(model)+"/layout", nil, &l)
	return l, err
}

// RegisterPrefix declares that file path holds the KV of the first tokens
// tokens of a shared prefix (a system prompt, say) of model. Sessions
// created with it start with those tokens stored, but not vouched for:
// plans that check content (all but UnsafeCountOnly ones) do not use them.
// RegisterPrefixIDs is the form to use.
func (s *Sessions) RegisterPrefix(ctx context.Context, path, model string, tokens int64) error {
	return s.c.api.Do(ctx, "POST", "/v1/prefixes", map[string]any{"path": path, "model": model, "tokens": tokens}, nil)
}

// RegisterPrefixIDs declares that file path holds the KV of the token ids
// ids of a shared prefix of model: sessions created with it start with
// those tokens stored and their content known, so a plan whose prompt
// begins with the same ids loads them.
func (s *Sessions) RegisterPrefixIDs(ctx context.Context, path, model string, ids []uint32) error {
	return s.c.api.Do(ctx, "POST", "/v1/prefixes", map[string]any{"path": path, "model": model, "tokens": len(ids), "token_ids": ids}, nil)
}

// Plan asks what session id has stored for a prompt and reserves where the
// new KV goes. The session is created on its first plan. req carries the
// prompt's TokenIDs (or BlockHashes): the stored part is the longest
// prefix whose content matches what the session stored, the rest is
// computed again. A request with neither is refused unless it sets
// UnsafeCountOnly (counts alone: wrong KV after an edited message).
//
// Plans in the gd2fs format that other goroutines of this client make at
// the same time go to the master together, in batches (coalesce.go;
// Config.NoCoalesce turns it off); each call gets its own plan or error.
func (s *Sessions) Plan(ctx context.Context, id string, req PlanRequest) (Plan, error) {
	if co := s.c.co; co != nil && !co.noPlans.Load() && (req.Format == "" || req.Format == "gd2fs") {
		return co.plans.do(ctx, planCall{id: id, req: req})
	}
	return s.planOne(ctx, id, req)
}

// planOne is Plan by the single route.
func (s *Sessions) planOne(ctx context.Context, id string, req PlanRequest) (Plan, error) {
	var p Plan
	err := s.c.api.Do(ctx, "POST", planPath(id), req, &p)
	return p, err
}

// PlanBatchItem is one plan of PlanBatch: session ID's plan for Request.
// RequestID names it (PlanBatch makes one when it is empty); a batch sent
// again with the same ids is answered with the same plans while they are
// outstanding, so a caller whose batch failed mid-way sends it again.
type PlanBatchItem struct {
	ID        string
	RequestID string
	Request   PlanRequest
}

// PlanBatchResult is one plan of a batch, or the error it alone met.
type PlanBatchResult struct {
	Plan Plan
	Err  error
}

// PlanBatch makes many plans in one call to the master, for a scheduler
// that plans a batch of requests at once: each is made as Plan makes it,
// and they share the master's transactions. Plans in the gd2fs format
// only (PlanEngine for engines); at most api.MaxPlanBatch (256) per call.
// The error is the call's; each result carries its plan's own.
func (s *Sessions) PlanBatch(ctx context.Context, items []PlanBatchItem) ([]PlanBatchResult, error) {
	for i, it := range items {
		if f := it.Request.Format; f != "" && f != "gd2fs" {
			return nil, errs.New(errs.ErrBadRequest, "plan %d asks for format %q: PlanBatch answers gd2fs plans; use PlanEngine", i, f)
		}
	}
	out := make([]PlanBatchResult, len(items))
	err := s.planBatch(ctx, items, func(i int, raw json.RawMessage) error { return api.DecodePlan(raw, &out[i].Plan) },
		func(i int, err error) { out[i].Err = err })
	if err != nil {
		return nil, err
	}
	return out, nil
}

// planBatch sends items as one batch (any format) and gives each plan's
// bytes to decode, or its error to fail; the error is the call's.
func (s *Sessions) planBatch(ctx context.Context, items []PlanBatchItem, decode func(i int, raw json.RawMessage) error, fail func(i int, err error)) error {
	req := api.PlanBatchRequest{Plans: make([]api.PlanBatchItem, len(items))}
	for i, it := range items {
		if it.RequestID == "" {
			it.RequestID = requestID()
		}
		req.Plans[i] = api.PlanBatchItem{Session: it.ID, RequestID: it.RequestID, Plan: it.Request}
	}
	var ans api.PlanBatchAnswer
	if err := s.c.api.Do(ctx, "POST", "/v1/sessions/plans", req, &ans); err != nil {
		return err
	}
	if len(ans.Plans) != len(items) {
		return errs.New(errs.ErrInternal, "the master answered %d plans for a batch of %d", len(ans.Plans), len(items))
	}
	for i, r := range ans.Plans {
		switch {
		case r.Error != nil:
			fail(i, errs.FromCode(r.Error.Code, r.Error.Error))
		default:
			if err := decode(i, r.Plan); err != nil {
				fail(i, errs.New(errs.ErrInternal, "plan %d of the batch: %v", i, err))
			}
		}
	}
	return nil
}

// Commit records plan's fresh range as stored. Write it first (WriteFresh).
// Concurrent commits of this client go to the master in batches, as plans
// do (Plan).
func (s *Sessions) Commit(ctx context.Context, id string, planID int64) (Session, error) {
	return s.commit(ctx, api.CommitBatchItem{Session: id, PlanID: planID})
}

// commit sends a plain commit, coalesced with others when that is on.
func (s *Sessions) commit(ctx context.Context, it api.CommitBatchItem) (Session, error) {
	if co := s.c.co; co != nil && !co.noCommits.Load() {
		return co.commits.do(ctx, it)
	}
	return s.commitOne(ctx, it)
}

// commitOne is a commit by the single route: plain, or an engine's (Fresh).
func (s *Sessions) commitOne(ctx context.Context, it api.CommitBatchItem) (Session, error) {
	var out Session
	err := s.c.api.Do(ctx, "POST", "/v1/sessions/"+esc(it.Session)+"/commit", api.CommitSessionRequest{PlanID: it.PlanID, Written: it.Written, Fresh: it.Fresh}, &out)
	return out, err
}

// PlanEngine is Plan in the vllm format (req.Format is set): whole blocks
// of the layout's page_tokens, stored segments contiguous from token 0,
// fresh segments rounded up to whole blocks, kv_uris an engine can dial.
//
// req.Format "sglang" is the same answer for SGLang's explicit-KV cache
// (which has no flags); anything else is taken as "vllm".
//
// Concurrent engine plans of this client go to the master in batches, as
// Plan's do (a router's chats).
func (s *Sessions) PlanEngine(ctx context.Context, id string, req PlanRequest) (EnginePlan, error) {
	if req.Format != "sglang" {
		req.Format = "vllm"
	}
	// Flags the master refuses (any size: planSize counts only scalars)
	// go alone, to their own 400, not into a batch.
	if co := s.c.co; co != nil && !co.noPlans.Load() && api.CheckEngineFlags(req.Flags) == nil {
		return co.engines.do(ctx, planCall{id: id, req: req})
	}
	return s.engineOne(ctx, id, req)
}

// engineOne is PlanEngine by the single route.
func (s *Sessions) engineOne(ctx context.Context, id string, req PlanRequest) (EnginePlan, error) {
	var p EnginePlan
	err := s.c.api.Do(ctx, "POST", planPath(id), req, &p)
	return p, err
}

// CommitSaved records what the engine saved of plan planID's fresh
// segments (its answer's fresh_kvcache; empty when it saved nothing). With
// planID 0 the plan is found by the first saved segment. Concurrent calls
// of this client go to the master in batches (POST
// /v1/sessions/commits/saved), as Commit's do.
func (s *Sessions) CommitSaved(ctx context.Context, id string, planID int64, saved []KVRange) (Session, error) {
	if saved == nil {
		saved = []KVRange{}
	}
	it := api.CommitBatchItem{Session: id, PlanID: planID, Fresh: &saved}
	if co := s.c.co; co != nil && !co.noSaved.Load() {
		return co.saved.do(ctx, it)
	}
	return s.commitOne(ctx, it)
}

// Fork makes newID a session sharing id's stored ranges, without copying bytes.
func (s *Sessions) Fork(ctx context.Context, id, newID string) (Session, error) {
	var out Session
	err := s.c.api.Do(ctx, "POST", "/v1/sessions/"+esc(id)+"/fork?"+api.RequestIDParam+"="+requestID(), api.ForkRequest{NewID: newID}, &out)
	return out, err
}

// Get returns a session and its ranges.
func (s *Sessions) Get(ctx context.Context, id string) (Session, error) {
	var out Session
	err := s.c.api.Do(ctx, "GET", "/v1/sessions/"+esc(id), nil, &out)
	return out, err
}

// List returns up to limit sessions with ids after after, in id order.
func (s *Sessions) List(ctx context.Context, after string, limit int) ([]Session, error) {
	var out api.SessionList
	err := s.c.api.Do(ctx, "GET", "/v1/sessions?after="+url.QueryEscape(after)+"&limit="+strconv.Itoa(limit), nil, &out)
	return out.Sessions, err
}

// Delete removes a session; its files go when no fork still uses them.
func (s *Sessions) Delete(ctx context.Context, id string) error {
	return s.c.api.Do(ctx, "DELETE", "/v1/sessions/"+esc(id), nil, nil)
}

// uriPath is the path of a gd2fs:// URI of either form.
func uriPath(uri string) (string, error) {
	u, err := api.ParseURI(uri)
	return u.Path, err
}

// WriteFresh writes kv (the fresh ranges' bytes back to back, exactly their
// total kv_length) where the plan says, and syncs the files so Commit sees
// them.
func (s *Sessions) WriteFresh(ctx context.Context, p Plan, kv []byte) error {
	var want int64
	for _, r := range p.Fresh {
		want += r.KVLength
	}
	if int64(len(kv)) != want {
		return errs.New(errs.ErrBadRequest, "plan %d's fresh ranges take %d bytes, got %d", p.PlanID, want, len(kv))
	}
	return s.writeFresh(ctx, p, kv, true)
}

// writeFresh writes the fresh ranges into the chunks the plan allocated
// (p.FreshFiles; a master that did not allocate them is asked as the file
// is opened and written) and, with sync, records their size at the master.
func (s *Sessions) writeFresh(ctx context.Context, p Plan, kv []byte, sync bool) error {
	for _, r := range p.Fresh {
		path, err := uriPath(r.KVURI)
		if err != nil {
			return err
		}
		var f *File
		for _, ff := range p.FreshFiles {
			if ff.Path == path {
				f = newFile(s.c, ff)
			}
		}
		if f == nil {
			if f, err = s.c.Open(ctx, path); err != nil {
				return err
			}
		}
		if _, err := f.WriteAtContext(ctx, kv[:r.KVLength], r.KVStart); err != nil {
			return err
		}
		if sync {
			if err := f.Sync(ctx); err != nil {
				return err
			}
		}
		kv = kv[r.KVLength:]
	}
	return nil
}

// WriteAndCommit is a turn's second half in the fewest round trips: it
// writes kv (as WriteFresh takes it) straight to the servers the plan
// placed its fresh range on, then commits the plan in one master call that
// also records the written size (no Sync between). A master that gave no
// fresh_files costs the older way's Open and Sync. Concurrent commits of
// this client go to the master in batches, as plans do (Plan).
func (s *Sessions) WriteAndCommit(ctx context.Context, id string, p Plan, kv []byte) (Session, error) {
	var want int64
	for _, r := range p.Fresh {
		want += r.KVLength
	}
	if int64(len(kv)) != want {
		return Session{}, errs.New(errs.ErrBadRequest, "plan %d's fresh ranges take %d bytes, got %d", p.PlanID, want, len(kv))
	}
	written := len(p.FreshFiles) > 0
	if err := s.writeFresh(ctx, p, kv, !written); err != nil {
		return Session{}, err
	}
	return s.commit(ctx, api.CommitBatchItem{Session: id, PlanID: p.PlanID, Written: written})
}

// LoadStored reads the plan's stored ranges back to back into dst (at least
// LoadBytes long), ranges in parallel, and returns the bytes read.
func (s *Sessions) LoadStored(ctx context.Context, p Plan, dst []byte) (int64, error) {
	if int64(len(dst)) < p.LoadBytes {
		return 0, errs.New(errs.ErrTooLarge, "plan %d stores %d bytes; the buffer has %d", p.PlanID, p.LoadBytes, len(dst))
	}
	files := map[string]*File{}
	var mu sync.Mutex
	open := func(path string) (*File, error) {
		mu.Lock()
		defer mu.Unlock()
		if f := files[path]; f != nil {
			return f, nil
		}
		f, err := s.c.Open(ctx, path)
		if err == nil {
			files[path] = f
		}
		return f, err
	}
	var wg sync.WaitGroup
	errc := make(chan error, len(p.Stored))
	var off int64
	for _, r := range p.Stored {
		part := dst[off : off+r.KVLength]
		off += r.KVLength
		wg.Add(1)
		go func() {
			defer wg.Done()
			path, err := uriPath(r.KVURI)
			if err == nil {
				var f *File
				if f, err = open(path); err == nil {
					_, err = f.ReadAtContext(ctx, part, r.KVStart)
				}
			}
			if err != nil {
				errc <- err
			}
		}()
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return 0, err
	}
	return off, nil
}
