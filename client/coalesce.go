package client

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/limits"
)

// Coalescing (issue 20). A chat turn is two master calls, a plan and a
// commit, and with many chats in one client (a router, a scheduler) a
// third of the master's CPU was under net/http's serving of each request
// (an eighth net/http's own reading and writing, the rest our handlers'
// per-request passes), and most of the client's was net/http's transport.
// So a client sends its concurrent plans, and its concurrent commits, as
// batches (POST /v1/sessions/plans, POST /v1/sessions/commits), as a
// database's group commit does: per kind, a call that finds fewer than
// CoalesceInFlight batches in flight goes at once — alone, by the single
// route, when nothing is queued — and one that finds them all busy queues;
// when a batch returns, everything queued (up to the batch maximum) goes
// in the next. No timer: a call waits only behind a request already on
// the wire, so at low load nothing changes.
//
// Each caller gets exactly its own answer. A caller whose context ends
// while queued returns its error and is never sent. A batch is sent under
// a context that ends when every one of its callers' contexts has ended,
// and through api.Client.Do, which retries it through a failover as it
// retries the single call: both batch routes are idempotent (every plan
// carries a request id; a repeated commit is answered as done).
//
// Four kinds: plans (Plan), engine plans (PlanEngine; the same batch
// route, which answers each plan in its own format), plain commits
// (Commit, WriteAndCommit) and engine commits (CommitSaved, which carry
// the segments the engine saved). Engine commits go to a route of their
// own, POST /v1/sessions/commits/saved: a master from before it refuses
// an engine item at the plain route (its strict decoder knows no
// fresh_kvcache) and answers 404 at the new one, so no master records an
// engine commit as a plain one (api.CommitBatchRequest).
//
// A master from before a batch route answers it 404 or 405
// (api.ErrNoRoute): the client then sends that kind one call at a time,
// from then on.

// DefaultCoalesceInFlight is Config.CoalesceInFlight's default: the
// batches of each kind a client keeps in flight before it queues calls.
const DefaultCoalesceInFlight = 2

// batcher coalesces the calls of one kind. one sends a call alone (the
// single route); many sends two or more as one batch and answers each.
type batcher[In, Out any] struct {
	inFlight, max int
	// size, when set, is a bound on the bytes a call adds to a batch's
	// body; a batch holds at most maxBytes of them (a call bigger than
	// that goes alone), so it stays within the master's body limit.
	size     func(In) int
	maxBytes int
	one      func(ctx context.Context, in In) (Out, error)
	many     func(ctx context.Context, ins []In) ([]Out, []error, error)

	mu      sync.Mutex
	sending int // batches (or lone calls) on the wire
	queue   []*bcall[In, Out]
}

// bcall is one caller's call. taken and gone are guarded by batcher.mu;
// out and err are written before done is closed.
type bcall[In, Out any] struct {
	ctx   context.Context
	in    In
	out   Out
	err   error
	done  chan struct{}
	taken bool // in a batch
	gone  bool // its caller left the queue
}

// do sends in, alone or in a batch, and returns its own answer.
func (b *batcher[In, Out]) do(ctx context.Context, in In) (Out, error) {
	c := &bcall[In, Out]{ctx: ctx, in: in, done: make(chan struct{})}
	b.mu.Lock()
	if b.sending < b.inFlight {
		b.sending++
		batch := b.takeLocked(c)
		b.mu.Unlock()
		if len(batch) == 1 {
			b.send(batch) // alone, under ctx: as the single call
			return c.out, c.err
		}
		// With others that queued: sent for them all, so this caller
		// waits for it as they do and may leave when its ctx ends.
		go b.send(batch)
	} else {
		b.queue = append(b.queue, c)
		b.mu.Unlock()
	}
	select {
	case <-c.done:
		return c.out, c.err
	case <-ctx.Done():
		b.mu.Lock()
		if !c.taken {
			c.gone = true
		}
		b.mu.Unlock()
		// Taken: its batch is on the wire and goes on for the others; this
		// caller leaves as a single call cut by its context does.
		var zero Out
		return zero, ctx.Err()
	}
}

// takeLocked is the next batch: first (when not nil) and the queued calls
// whose callers still wait, in order, up to max calls and maxBytes.
func (b *batcher[In, Out]) takeLocked(first *bcall[In, Out]) []*bcall[In, Out] {
	var batch []*bcall[In, Out]
	bytes := 0
	add := func(c *bcall[In, Out]) bool {
		if b.size != nil {
			n := b.size(c.in)
			if len(batch) > 0 && bytes+n > b.maxBytes {
				return false
			}
			bytes += n
		}
		c.taken = true
		batch = append(batch, c)
		return true
	}
	if first != nil {
		add(first)
	}
	k := 0
	for ; k < len(b.queue) && len(batch) < b.max; k++ {
		if c := b.queue[k]; !c.gone && !add(c) {
			break
		}
	}
	n := copy(b.queue, b.queue[k:])
	clear(b.queue[n:])
	b.queue = b.queue[:n]
	return batch
}

// send sends batch and answers its callers; then, with what queued
// meanwhile as the next batch, it goes on in a goroutine of its own (the
// caller that sent this one has its answer and returns).
func (b *batcher[In, Out]) send(batch []*bcall[In, Out]) {
	b.exec(batch)
	b.mu.Lock()
	next := b.takeLocked(nil)
	if len(next) == 0 {
		b.sending--
	}
	b.mu.Unlock()
	if len(next) > 0 {
		go b.send(next)
	}
}

// exec sends one batch and gives each call its answer.
func (b *batcher[In, Out]) exec(batch []*bcall[In, Out]) {
	if len(batch) == 1 {
		c := batch[0]
		c.out, c.err = b.one(c.ctx, c.in)
		close(c.done)
		return
	}
	ctx, stop := batchContext(batch)
	defer stop()
	ins := make([]In, len(batch))
	for i, c := range batch {
		ins[i] = c.in
	}
	outs, errs, err := b.many(ctx, ins)
	for i, c := range batch {
		switch {
		case err != nil:
			c.err = err
		case errs[i] != nil:
			c.err = errs[i]
		default:
			c.out = outs[i]
		}
		close(c.done)
	}
}

// batchContext ends when the contexts of all of batch's callers have ended.
func batchContext[In, Out any](batch []*bcall[In, Out]) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var left atomic.Int32
	left.Store(int32(len(batch)))
	stops := make([]func() bool, len(batch))
	for i, c := range batch {
		stops[i] = context.AfterFunc(c.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, s := range stops {
			s()
		}
		cancel()
	}
}

// coalescers are a client's batchers: plans, engine plans, plain commits
// and engine commits.
type coalescers struct {
	plans   *batcher[planCall, Plan]
	engines *batcher[planCall, EnginePlan]
	commits *batcher[api.CommitBatchItem, Session]
	saved   *batcher[api.CommitBatchItem, Session]
	// noPlans, noCommits, noSaved: the master answered a batch route 404
	// or 405 (a master from before it): calls of that kind (noPlans: both
	// kinds of plan) go alone.
	noPlans, noCommits, noSaved atomic.Bool
}

// planCall is one coalesced plan.
type planCall struct {
	id  string
	req PlanRequest
}

// newCoalescers returns c's batchers; nil when coalescing is off.
func newCoalescers(c *Client) *coalescers {
	k := c.cfg.CoalesceInFlight
	if c.cfg.NoCoalesce || k < 0 {
		return nil
	}
	if k == 0 {
		k = DefaultCoalesceInFlight
	}
	co := &coalescers{}
	ss := &Sessions{c: c}
	co.plans = &batcher[planCall, Plan]{inFlight: k, max: api.MaxPlanBatch, size: planSize, maxBytes: maxPlanBatchBytes,
		one: func(ctx context.Context, p planCall) (Plan, error) { return ss.planOne(ctx, p.id, p.req) },
		many: func(ctx context.Context, ps []planCall) ([]Plan, []error, error) {
			if co.noPlans.Load() {
				return alone(ctx, ps, func(ctx context.Context, p planCall) (Plan, error) { return ss.planOne(ctx, p.id, p.req) })
			}
			items := make([]PlanBatchItem, len(ps))
			for i, p := range ps {
				items[i] = PlanBatchItem{ID: p.id, Request: p.req}
			}
			res, err := ss.PlanBatch(ctx, items)
			if errors.Is(err, api.ErrNoRoute) {
				co.noPlans.Store(true)
				return alone(ctx, ps, func(ctx context.Context, p planCall) (Plan, error) { return ss.planOne(ctx, p.id, p.req) })
			}
			if err != nil {
				return nil, nil, err
			}
			outs, errs := make([]Plan, len(ps)), make([]error, len(ps))
			for i, r := range res {
				outs[i], errs[i] = r.Plan, r.Err
			}
			return outs, errs, nil
		}}
	co.engines = &batcher[planCall, EnginePlan]{inFlight: k, max: api.MaxPlanBatch, size: planSize, maxBytes: maxPlanBatchBytes,
		one: func(ctx context.Context, p planCall) (EnginePlan, error) { return ss.engineOne(ctx, p.id, p.req) },
		many: func(ctx context.Context, ps []planCall) ([]EnginePlan, []error, error) {
			one := func(ctx context.Context, p planCall) (EnginePlan, error) { return ss.engineOne(ctx, p.id, p.req) }
			if co.noPlans.Load() {
				return alone(ctx, ps, one)
			}
			items := make([]PlanBatchItem, len(ps))
			for i, p := range ps {
				items[i] = PlanBatchItem{ID: p.id, Request: p.req}
			}
			outs, errs := make([]EnginePlan, len(ps)), make([]error, len(ps))
			err := ss.planBatch(ctx, items, func(i int, raw json.RawMessage) error { return api.DecodeEnginePlan(raw, &outs[i]) },
				func(i int, err error) { outs[i], errs[i] = EnginePlan{}, err })
			if errors.Is(err, api.ErrNoRoute) {
				co.noPlans.Store(true)
				return alone(ctx, ps, one)
			}
			if err != nil {
				return nil, nil, err
			}
			return outs, errs, nil
		}}
	commits := func(path string, no *atomic.Bool) *batcher[api.CommitBatchItem, Session] {
		return &batcher[api.CommitBatchItem, Session]{inFlight: k, max: api.MaxCommitBatch, size: commitSize, maxBytes: maxCommitBatchBytes,
			one: ss.commitOne,
			many: func(ctx context.Context, its []api.CommitBatchItem) ([]Session, []error, error) {
				if !no.Load() {
					outs, errs, err := ss.commitBatch(ctx, path, its)
					if !errors.Is(err, api.ErrNoRoute) {
						return outs, errs, err
					}
					no.Store(true)
				}
				return alone(ctx, its, ss.commitOne)
			}}
	}
	co.commits = commits("/v1/sessions/commits", &co.noCommits)
	co.saved = commits("/v1/sessions/commits/saved", &co.noSaved)
	return co
}

// maxCommitBatchBytes bounds the body of a batch of coalesced commits, as
// maxPlanBatchBytes does plans': an engine's commit may carry up to
// limits.MaxSavedSegments segments, each with its kv_uri.
const maxCommitBatchBytes = limits.MaxJSONBody / 4

// commitSize bounds the bytes it adds to a batch's body: its strings as
// JSON may escape them (jsonLen), and at most 100 bytes of keys and
// figures for the item and each saved segment.
func commitSize(it api.CommitBatchItem) int {
	n := 100 + jsonLen(it.Session)
	if it.Fresh != nil {
		for _, r := range *it.Fresh {
			n += 100 + jsonLen(r.KVURI)
		}
	}
	return n
}

// jsonLen bounds the bytes of s quoted by encoding/json: a byte it may
// escape as \u00XX, or (not UTF-8) replace by \ufffd, counts 6.
func jsonLen(s string) int {
	n := 2
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '<' || c == '>' || c == '&' || c == '"' || c == '\\' {
			n += 6
		} else {
			n++
		}
	}
	return n
}

// maxPlanBatchBytes bounds the body of a batch of coalesced plans, well
// within the master's limit on a request body (limits.MaxJSONBody, 4 MiB):
// long prompts' token ids make big plans.
const maxPlanBatchBytes = limits.MaxJSONBody / 4

// planSize bounds the bytes p adds to a batch's body: at most 11 a token
// id (ten digits and a comma), 35 a block hash, its strings and an
// engine plan's flags.
func planSize(p planCall) int {
	r := &p.req
	n := 256 + len(p.id) + len(r.Model) + 11*len(r.TokenIDs) + 35*len(r.BlockHashes)
	for _, x := range r.Prefixes {
		n += len(x) + 3
	}
	for k, v := range r.Flags {
		n += 32 + jsonLen(k) // a number, bool or null fits in 32
		if s, ok := v.(string); ok {
			n += jsonLen(s)
		}
	}
	return n
}

// alone sends each call by itself, in parallel: for a master without the
// batch route.
func alone[In, Out any](ctx context.Context, ins []In, one func(context.Context, In) (Out, error)) ([]Out, []error, error) {
	outs, errs := make([]Out, len(ins)), make([]error, len(ins))
	var wg sync.WaitGroup
	for i, in := range ins {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i], errs[i] = one(ctx, in)
		}()
	}
	wg.Wait()
	return outs, errs, nil
}

// commitBatch commits its items in one master call to path; the error is
// the call's, errs[i] item i's own.
func (s *Sessions) commitBatch(ctx context.Context, path string, items []api.CommitBatchItem) ([]Session, []error, error) {
	var ans api.CommitBatchAnswer
	if err := s.c.api.Do(ctx, "POST", path, api.CommitBatchRequest{Commits: items}, &ans); err != nil {
		return nil, nil, err
	}
	if len(ans.Commits) != len(items) {
		return nil, nil, errs.New(errs.ErrInternal, "the master answered %d commits for a batch of %d", len(ans.Commits), len(items))
	}
	outs, es := make([]Session, len(items)), make([]error, len(items))
	for i, r := range ans.Commits {
		switch {
		case r.Error != nil:
			es[i] = errs.FromCode(r.Error.Code, r.Error.Error)
		case r.Session == nil:
			es[i] = errs.New(errs.ErrInternal, "commit %d of the batch: the master answered neither a session nor an error", i)
		default:
			outs[i] = *r.Session
		}
	}
	return outs, es, nil
}
