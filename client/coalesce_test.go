package client_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/gd2fs/gd2fs/internal/frames"
)

// The session routes whose requests the coalescing tests count.
const (
	routePlan    = "POST /v1/sessions/{id}/plan"
	routePlans   = "POST /v1/sessions/plans"
	routeCommit  = "POST /v1/sessions/{id}/commit"
	routeCommits = "POST /v1/sessions/commits"
)

// masterRequests reads the master's request counters by route (every
// status) from its /metrics.
func masterRequests(t *testing.T, c *cluster.Cluster) map[string]int {
	t.Helper()
	resp, err := http.Get(c.Master.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]int{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "gd2fs_master_requests_total{") {
			continue
		}
		i := strings.Index(line, `route="`)
		j := strings.LastIndexByte(line, ' ')
		if i < 0 || j < 0 {
			t.Fatalf("metrics line %q", line)
		}
		route := line[i+len(`route="`):]
		route = route[:strings.IndexByte(route, '"')]
		v, err := strconv.ParseFloat(line[j+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[route] += int(v)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// dial is a client of c's master with cfg, closed when the test ends.
func dial(t *testing.T, c *cluster.Cluster, cfg client.Config) *client.Client {
	t.Helper()
	cfg.Master = c.Master.URL()
	cl, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// waitFor spins until cond holds (the coalescing state it looks at changes
// as the goroutines under test reach it; no sleeping).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for i := 0; !cond(); i++ {
		if i > 50_000_000 {
			t.Fatalf("waited too long for %s", what)
		}
		runtime.Gosched()
	}
}

// TestCoalescedTurns: many goroutines of one client run chat turns at once
// (plan, write, commit) with coalescing on; every plan and every commit
// answers as the model of each session says a single call would (what is
// stored, what is fresh, the tokens after the commit), every stored range
// reads back the bytes committed, and the master served fewer requests
// than there were calls.
func TestCoalescedTurns(t *testing.T) {
	c := start(t, cluster.Config{MemBytes: 64 << 20})
	cl := dial(t, c, client.Config{CoalesceInFlight: 1})
	ctx := context.Background()
	ss := cl.Sessions()
	if err := ss.SetLayout(ctx, tiny); err != nil {
		t.Fatal(err)
	}
	before := masterRequests(t, c)
	const chats, turns, perTurn = 32, 4, 24
	var calls atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, chats)
	for g := 0; g < chats; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("chat-%d", g)
			var stored int64 // the model: tokens committed, all of them seq(g*1000, stored)
			var kv []byte    // and their bytes
			for turn := 0; turn < turns; turn++ {
				n := stored + perTurn
				p, err := ss.Plan(ctx, id, client.PlanRequest{Model: "tiny", TokenIDs: seq(uint32(g*1000), n)})
				calls.Add(1)
				if err != nil {
					errc <- fmt.Errorf("%s turn %d: plan: %w", id, turn, err)
					return
				}
				if p.CachedTokens != stored || len(p.Fresh) != 1 || p.Fresh[0].TokenStart != stored || p.Fresh[0].TokenLength != perTurn {
					errc <- fmt.Errorf("%s turn %d: plan caches %d tokens, fresh %+v; the model says %d cached, %d fresh from %d", id, turn, p.CachedTokens, p.Fresh, stored, perTurn, stored)
					return
				}
				if stored > 0 {
					got := make([]byte, p.LoadBytes)
					if _, err := ss.LoadStored(ctx, p, got); err != nil || !bytes.Equal(got, kv) {
						errc <- fmt.Errorf("%s turn %d: stored bytes differ from those committed (%v)", id, turn, err)
						return
					}
				}
				fresh := kvBytes(id, stored, perTurn)
				s, err := ss.WriteAndCommit(ctx, id, p, fresh)
				calls.Add(1)
				if err != nil {
					errc <- fmt.Errorf("%s turn %d: commit: %w", id, turn, err)
					return
				}
				stored, kv = n, append(kv, fresh...)
				if s.ID != id || s.Tokens != stored {
					errc <- fmt.Errorf("%s turn %d: commit answers session %s of %d tokens; the model says %d", id, turn, s.ID, s.Tokens, stored)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	after := masterRequests(t, c)
	d := func(r string) int { return after[r] - before[r] }
	reqs := d(routePlan) + d(routePlans) + d(routeCommit) + d(routeCommits)
	t.Logf("%d plan and commit calls in %d requests: %d plans alone, %d plan batches, %d commits alone, %d commit batches",
		calls.Load(), reqs, d(routePlan), d(routePlans), d(routeCommit), d(routeCommits))
	if int64(reqs) >= calls.Load() || d(routePlans) == 0 || d(routeCommits) == 0 {
		t.Fatalf("%d calls cost %d requests (%d plan batches, %d commit batches): nothing was coalesced", calls.Load(), reqs, d(routePlans), d(routeCommits))
	}
}

// coalescedBatch runs calls, each in its own goroutine, behind a lone call
// held back (client.HoldLoneCalls) until they have all queued, so they go
// to the master as one batch; it returns their results in order.
func coalescedBatch[T any](t *testing.T, cl *client.Client, lone func() error, queued func(plans, commits int) bool, calls []func() (T, error)) ([]T, []error) {
	t.Helper()
	release := client.HoldLoneCalls(cl)
	loneErr := make(chan error, 1)
	go func() { loneErr <- lone() }()
	waitFor(t, "the lone call on the wire", func() bool {
		ps, _, cs, _ := client.Coalescing(cl)
		return ps+cs == 1
	})
	outs, errs := make([]T, len(calls)), make([]error, len(calls))
	var wg sync.WaitGroup
	for i, call := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i], errs[i] = call()
		}()
	}
	waitFor(t, "the calls queued", func() bool {
		_, pq, _, cq := client.Coalescing(cl)
		return queued(pq, cq)
	})
	release()
	if err := <-loneErr; err != nil {
		t.Fatalf("the lone call: %v", err)
	}
	wg.Wait()
	return outs, errs
}

// TestCoalescedErrors: in one batch of plans and one of commits, the items
// that fail (an unknown model, a commit of an unknown session, of a plan
// that does not exist, of a stale plan, of a fresh range never written)
// answer each its own error — the one the single call answers — and the
// others succeed.
func TestCoalescedErrors(t *testing.T) {
	c := start(t, cluster.Config{MemBytes: 64 << 20})
	cl := dial(t, c, client.Config{})
	single := dial(t, c, client.Config{NoCoalesce: true})
	ctx := context.Background()
	ss := cl.Sessions()
	if err := ss.SetLayout(ctx, tiny); err != nil {
		t.Fatal(err)
	}
	// A session with a stale plan: planned twice, the second committed
	// (the first now plans a range that overlaps what is stored).
	stale, err := ss.Plan(ctx, "stale", client.PlanRequest{Model: "tiny", TokenIDs: seq(5, 32)})
	if err != nil {
		t.Fatal(err)
	}
	p2, err := single.Sessions().Plan(ctx, "stale", client.PlanRequest{Model: "tiny", TokenIDs: seq(5, 32)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := single.Sessions().WriteAndCommit(ctx, "stale", p2, kvBytes("stale", 0, 32)); err != nil {
		t.Fatal(err)
	}

	// Plans: good ones, an unknown model, and one of a bad session id.
	before := masterRequests(t, c)
	reqs := []struct {
		id  string
		req client.PlanRequest
	}{
		{"e0", client.PlanRequest{Model: "tiny", TokenIDs: seq(1, 40)}},
		{"e1", client.PlanRequest{Model: "no-such-model", TokenIDs: seq(1, 8)}},
		{"e2", client.PlanRequest{Model: "tiny", TokenIDs: seq(2, 40)}},
		{"e3", client.PlanRequest{Model: "tiny"}}, // no token ids: refused
		{"e4", client.PlanRequest{Model: "tiny", TokenIDs: seq(3, 17)}},
		{"unwritten", client.PlanRequest{Model: "tiny", TokenIDs: seq(4, 20)}},
	}
	var planCalls []func() (client.Plan, error)
	for _, r := range reqs {
		planCalls = append(planCalls, func() (client.Plan, error) { return ss.Plan(ctx, r.id, r.req) })
	}
	plans, perrs := coalescedBatch(t, cl, func() error {
		_, err := ss.Plan(ctx, "lone", client.PlanRequest{Model: "tiny", TokenIDs: seq(9, 16)})
		return err
	}, func(pq, _ int) bool { return pq == len(planCalls) }, planCalls)
	after := masterRequests(t, c)
	if n := after[routePlans] - before[routePlans]; n != 1 {
		t.Fatalf("%d plan batches sent, want 1", n)
	}
	for i, r := range reqs {
		// What the single route answers: for a failure, the same kind of
		// error; for a plan, the same ranges (asked again with the same
		// ids it is a new plan of the same shape).
		_, want := single.Sessions().Plan(ctx, r.id+"-single", r.req)
		switch {
		case (perrs[i] == nil) != (want == nil):
			t.Fatalf("plan %s: coalesced %v, single %v", r.id, perrs[i], want)
		case want != nil && errs.Code(perrs[i]) != errs.Code(want):
			t.Fatalf("plan %s: coalesced %v, single %v", r.id, perrs[i], want)
		case want == nil && (plans[i].CachedTokens != 0 || len(plans[i].Fresh) != 1 || plans[i].Fresh[0].TokenLength != int64(len(r.req.TokenIDs))):
			t.Fatalf("plan %s: %+v", r.id, plans[i])
		}
	}

	// Commits: the good plans written, and the failures.
	type commit struct {
		name string
		run  func(*client.Client) (client.Session, error)
	}
	var cs []commit
	for i, r := range reqs {
		if perrs[i] != nil || r.id == "unwritten" {
			continue
		}
		p := plans[i]
		cs = append(cs, commit{r.id, func(cl *client.Client) (client.Session, error) {
			return cl.Sessions().WriteAndCommit(ctx, r.id, p, kvBytes(r.id, 0, p.Fresh[0].TokenLength))
		}})
	}
	good := len(cs)
	unwritten := plans[len(plans)-1]
	cs = append(cs,
		commit{"unknown session", func(cl *client.Client) (client.Session, error) { return cl.Sessions().Commit(ctx, "nobody", 1) }},
		commit{"no such plan", func(cl *client.Client) (client.Session, error) { return cl.Sessions().Commit(ctx, "e0", 1<<40) }},
		commit{"stale plan", func(cl *client.Client) (client.Session, error) {
			return cl.Sessions().Commit(ctx, "stale", stale.PlanID)
		}},
		commit{"not written", func(cl *client.Client) (client.Session, error) {
			// The first half of the fresh range written, then a commit of
			// the whole as written: the servers' extents show the hole.
			half := unwritten
			half.Fresh = append([]client.KVRange(nil), unwritten.Fresh...)
			half.Fresh[0].KVLength /= 2
			return cl.Sessions().WriteAndCommit(ctx, "unwritten", half, kvBytes("unwritten", 0, 20)[:half.Fresh[0].KVLength])
		}},
	)
	var commitCalls []func() (client.Session, error)
	for _, x := range cs {
		commitCalls = append(commitCalls, func() (client.Session, error) { return x.run(cl) })
	}
	// The lone commit ahead of them: e0's plan written by another path
	// would be a second commit of it, so a session of its own.
	lp, err := single.Sessions().Plan(ctx, "lone-c", client.PlanRequest{Model: "tiny", TokenIDs: seq(8, 16)})
	if err != nil {
		t.Fatal(err)
	}
	before = masterRequests(t, c)
	sessions, cerrs := coalescedBatch(t, cl, func() error {
		_, err := ss.WriteAndCommit(ctx, "lone-c", lp, kvBytes("lone-c", 0, 16))
		return err
	}, func(_, cq int) bool { return cq == len(commitCalls) }, commitCalls)
	after = masterRequests(t, c)
	if n := after[routeCommits] - before[routeCommits]; n != 1 {
		t.Fatalf("%d commit batches sent, want 1", n)
	}
	for i, x := range cs {
		if i < good {
			if cerrs[i] != nil || sessions[i].Tokens == 0 || sessions[i].ID != x.name {
				t.Fatalf("commit %s: %+v, %v", x.name, sessions[i], cerrs[i])
			}
			continue
		}
		if cerrs[i] == nil {
			t.Fatalf("commit %s: succeeded: %+v", x.name, sessions[i])
		}
		// The single call answers the same failure (the batch recorded
		// nothing for it: its plan, if any, is still outstanding).
		_, want := x.run(single)
		if want == nil || errs.Code(cerrs[i]) != errs.Code(want) {
			t.Fatalf("commit %s: coalesced %v, single %v", x.name, cerrs[i], want)
		}
		t.Logf("commit %s: %v", x.name, cerrs[i])
	}
	if s, err := ss.Get(ctx, "unwritten"); err != nil || s.Tokens != 0 {
		t.Fatalf("the unwritten plan's session after its refused commit: %+v, %v", s, err)
	}
}

// TestCoalescedCancel: a call whose context ends while it is queued
// returns the context's error and is never sent.
func TestCoalescedCancel(t *testing.T) {
	c := start(t, cluster.Config{})
	cl := dial(t, c, client.Config{})
	ctx := context.Background()
	ss := cl.Sessions()
	if err := ss.SetLayout(ctx, tiny); err != nil {
		t.Fatal(err)
	}
	before := masterRequests(t, c)
	cctx, cancel := context.WithCancel(ctx)
	release := client.HoldLoneCalls(cl)
	loneErr := make(chan error, 1)
	go func() {
		_, err := ss.Plan(ctx, "lone", client.PlanRequest{Model: "tiny", TokenIDs: seq(1, 16)})
		loneErr <- err
	}()
	waitFor(t, "the lone plan on the wire", func() bool { ps, _, _, _ := client.Coalescing(cl); return ps == 1 })
	// Queued behind it: a plan whose context ends, and one that goes on.
	queuedErr := make(chan error, 1)
	go func() {
		_, err := ss.Plan(cctx, "cancelled", client.PlanRequest{Model: "tiny", TokenIDs: seq(1, 16)})
		queuedErr <- err
	}()
	waitFor(t, "the plan queued", func() bool { _, pq, _, _ := client.Coalescing(cl); return pq == 1 })
	liveErr := make(chan error, 1)
	go func() {
		_, err := ss.Plan(ctx, "live", client.PlanRequest{Model: "tiny", TokenIDs: seq(1, 16)})
		liveErr <- err
	}()
	waitFor(t, "the plans queued", func() bool { _, pq, _, _ := client.Coalescing(cl); return pq == 2 })
	cancel()
	if err := <-queuedErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("a queued plan whose context ended: %v", err)
	}
	release()
	if err := <-loneErr; err != nil {
		t.Fatal(err)
	}
	if err := <-liveErr; err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the plans done", func() bool { ps, _, _, _ := client.Coalescing(cl); return ps == 0 })
	after := masterRequests(t, c)
	if one, batches := after[routePlan]-before[routePlan], after[routePlans]-before[routePlans]; one != 2 || batches != 0 {
		t.Fatalf("%d plans alone and %d batches, want the lone plan and the live one alone", one, batches)
	}
	if _, err := ss.Get(ctx, "cancelled"); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("the cancelled plan's session: %v, want not found (never planned)", err)
	}
}

// TestCoalescingOldMaster: a master without the batch routes (a proxy in
// front of a real one answers them 404 and 405, as an older master's
// router does) gets every call alone: the batch fails once per kind, the
// calls in it are sent alone and answer correctly, and the client does not
// try the batch route again.
func TestCoalescingOldMaster(t *testing.T) {
	c := start(t, cluster.Config{})
	u, err := url.Parse(c.Master.URL())
	if err != nil {
		t.Fatal(err)
	}
	var batchTries atomic.Int64
	proxy := httputil.NewSingleHostReverseProxy(u)
	old := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case frames.Path: // nor framed connections
			http.NotFound(w, r)
		case "/v1/sessions/plans":
			batchTries.Add(1)
			http.NotFound(w, r)
		case "/v1/sessions/commits": // an older master's GET/DELETE /v1/sessions/{id}
			batchTries.Add(1)
			http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
		default:
			proxy.ServeHTTP(w, r)
		}
	}))
	defer old.Close()
	cl, err := client.New(client.Config{Master: old.URL})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	ss := cl.Sessions()
	if err := ss.SetLayout(ctx, tiny); err != nil {
		t.Fatal(err)
	}
	const n = 4
	var planCalls []func() (client.Plan, error)
	for i := 0; i < n; i++ {
		planCalls = append(planCalls, func() (client.Plan, error) {
			return ss.Plan(ctx, fmt.Sprintf("o%d", i), client.PlanRequest{Model: "tiny", TokenIDs: seq(uint32(i), 32)})
		})
	}
	plans, perrs := coalescedBatch(t, cl, func() error {
		_, err := ss.Plan(ctx, "lone", client.PlanRequest{Model: "tiny", TokenIDs: seq(1, 16)})
		return err
	}, func(pq, _ int) bool { return pq == n }, planCalls)
	var commitCalls []func() (client.Session, error)
	for i := 0; i < n; i++ {
		if perrs[i] != nil {
			t.Fatalf("plan %d through an old master: %v", i, perrs[i])
		}
		commitCalls = append(commitCalls, func() (client.Session, error) {
			id := fmt.Sprintf("o%d", i)
			return ss.WriteAndCommit(ctx, id, plans[i], kvBytes(id, 0, 32))
		})
	}
	lp, err := ss.Plan(ctx, "lone-c", client.PlanRequest{Model: "tiny", TokenIDs: seq(2, 16)})
	if err != nil {
		t.Fatal(err)
	}
	sessions, cerrs := coalescedBatch(t, cl, func() error {
		_, err := ss.WriteAndCommit(ctx, "lone-c", lp, kvBytes("lone-c", 0, 16))
		return err
	}, func(_, cq int) bool { return cq == n }, commitCalls)
	for i := range sessions {
		if cerrs[i] != nil || sessions[i].Tokens != 32 {
			t.Fatalf("commit %d through an old master: %+v, %v", i, sessions[i], cerrs[i])
		}
	}
	if got := batchTries.Load(); got != 2 {
		t.Fatalf("%d batch requests to the old master, want 2 (one per kind, then remembered)", got)
	}
	// Remembered: concurrent calls go alone without trying a batch again.
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := ss.Plan(ctx, fmt.Sprintf("r%d", i), client.PlanRequest{Model: "tiny", TokenIDs: seq(3, 16)}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if got := batchTries.Load(); got != 2 {
		t.Fatalf("%d batch requests to the old master after it was found old, want 2", got)
	}
}

// TestCoalescedBigPlans: plans of long prompts are batched only as far as
// a batch's body stays well within the master's body limit; the rest go in
// the next batch (here alone), and each gets its plan.
func TestCoalescedBigPlans(t *testing.T) {
	c := start(t, cluster.Config{MemBytes: 64 << 20})
	cl := dial(t, c, client.Config{})
	ctx := context.Background()
	ss := cl.Sessions()
	if err := ss.SetLayout(ctx, tiny); err != nil {
		t.Fatal(err)
	}
	const n, tokens = 3, 40_000 // each about 440 KB of ids in a batch of at most 1 MiB: two fit
	var calls []func() (client.Plan, error)
	for i := 0; i < n; i++ {
		calls = append(calls, func() (client.Plan, error) {
			return ss.Plan(ctx, fmt.Sprintf("big%d", i), client.PlanRequest{Model: "tiny", TokenIDs: seq(uint32(i), tokens)})
		})
	}
	before := masterRequests(t, c)
	plans, perrs := coalescedBatch(t, cl, func() error {
		_, err := ss.Plan(ctx, "lone", client.PlanRequest{Model: "tiny", TokenIDs: seq(1, 16)})
		return err
	}, func(pq, _ int) bool { return pq == n }, calls)
	waitFor(t, "the plans done", func() bool { ps, _, _, _ := client.Coalescing(cl); return ps == 0 })
	after := masterRequests(t, c)
	for i := range plans {
		if perrs[i] != nil || plans[i].PrefillTokens != tokens {
			t.Fatalf("big plan %d: %+v, %v", i, plans[i], perrs[i])
		}
	}
	if b, one := after[routePlans]-before[routePlans], after[routePlan]-before[routePlan]; b != 1 || one != 2 {
		t.Fatalf("%d batches and %d plans alone; want 1 batch of two and the third alone, beside the lone plan", b, one)
	}
}
