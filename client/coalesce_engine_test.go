package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/gd2fs/gd2fs/internal/frames"
	"github.com/gd2fs/gd2fs/internal/limits"
)

// The engine commits' batch route.
const routeSaved = "POST /v1/sessions/commits/saved"

// tp2 is a layout of two tensor-parallel ranks, so a hole in a saved
// segment is named by rank.
var tp2 = client.Layout{Model: "tp2", Layers: 2, KVHeads: 4, HeadDim: 8, DType: "bf16", PageTokens: 16, Order: "kv_first", TPSize: 2}

// engineWrite writes the bytes of segments segs as an engine's ranks do
// (every rank its region; ranks, when not nil, says which), then syncs.
func engineWrite(ctx context.Context, cl *client.Client, segs []client.KVRange, ranks []int64) error {
	for _, s := range segs {
		u, err := client.ParseURI(s.KVURI)
		if err != nil {
			return err
		}
		f, err := cl.Open(ctx, u.Path)
		if err != nil {
			return err
		}
		region := s.KVLength / 2
		for _, r := range ranks {
			kv := make([]byte, region)
			for i := range kv {
				kv[i] = byte(int64(i) + s.KVStart + r)
			}
			if _, err := f.WriteAtContext(ctx, kv, s.KVStart+r*region); err != nil {
				return err
			}
		}
		if err := f.Sync(ctx); err != nil {
			return err
		}
	}
	return nil
}

// normal is v's JSON with session id as "ID" (file paths and kv_uris name
// it), plan ids zeroed and times dropped: what two runs of the same turns
// on two sessions answer alike.
func normal(t *testing.T, v any, id string) string {
	t.Helper()
	switch x := v.(type) {
	case client.EnginePlan:
		x.PlanID = 0
		v = x
	case client.Session:
		x.LastUsed, x.Created = time.Time{}, time.Time{}
		v = x
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return strings.ReplaceAll(string(b), id, "ID")
}

// kvFile is a session file's name in a kv_uri: its number is the
// store's, which differs between runs.
var kvFile = regexp.MustCompile(`/kv-[0-9]+(\?|")`)

// renumber names each chat's session files by the order the chat met
// them (so two runs compare, and a file a chat reuses stays one file).
func renumber(answers [][]string) [][]string {
	for _, as := range answers {
		seen := map[string]string{}
		for i, a := range as {
			as[i] = kvFile.ReplaceAllStringFunc(a, func(f string) string {
				name, end := f[:len(f)-1], f[len(f)-1:]
				if _, ok := seen[name]; !ok {
					seen[name] = fmt.Sprintf("/kv-#%d", len(seen))
				}
				return seen[name] + end
			})
		}
	}
	return answers
}

// TestCoalescedEngineTurns: many goroutines of one client (a router) run
// engine turns at once — PlanEngine, the ranks' writes, CommitSaved — with
// coalescing on, and every plan and commit answers exactly (the same JSON)
// what the same turns answer through the single routes; the master served
// them in batches.
func TestCoalescedEngineTurns(t *testing.T) {
	c := start(t, cluster.Config{MemBytes: 64 << 20})
	cl := dial(t, c, client.Config{CoalesceInFlight: 1})
	single := dial(t, c, client.Config{NoCoalesce: true})
	ctx := context.Background()
	if err := cl.Sessions().SetLayout(ctx, tp2); err != nil {
		t.Fatal(err)
	}
	const chats, turns, perTurn = 16, 3, 48
	// run runs every chat's turns through c, its sessions named by prefix;
	// answers[g] are chat g's plans and sessions, normalised.
	run := func(c *client.Client, prefix string) [][]string {
		answers := make([][]string, chats)
		var wg sync.WaitGroup
		errc := make(chan error, chats)
		for g := 0; g < chats; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id := fmt.Sprintf("%s-chat-%02d", prefix, g)
				ss := c.Sessions()
				for turn := 1; turn <= turns; turn++ {
					req := client.PlanRequest{Model: "tp2", TokenIDs: seq(uint32(g*1000), int64(turn*perTurn)), LoadThreshold: int64(g)}
					if g%4 == 1 {
						req.Flags = map[string]any{"prefill-only": true, "n": float64(g)}
					}
					if g%4 == 2 {
						req.Format = "sglang"
					}
					p, err := ss.PlanEngine(ctx, id, req)
					if err != nil {
						errc <- fmt.Errorf("%s turn %d: plan: %w", id, turn, err)
						return
					}
					answers[g] = append(answers[g], normal(t, p, id))
					if err := engineWrite(ctx, c, p.KVCacheParams.Fresh, []int64{0, 1}); err != nil {
						errc <- fmt.Errorf("%s turn %d: write: %w", id, turn, err)
						return
					}
					s, err := ss.CommitSaved(ctx, id, p.PlanID, p.KVCacheParams.Fresh)
					if err != nil {
						errc <- fmt.Errorf("%s turn %d: commit: %w", id, turn, err)
						return
					}
					answers[g] = append(answers[g], normal(t, s, id))
				}
			}()
		}
		wg.Wait()
		close(errc)
		for err := range errc {
			t.Error(err)
		}
		return answers
	}
	before := masterRequests(t, c)
	co := renumber(run(cl, "co"))
	after := masterRequests(t, c)
	one := renumber(run(single, "one"))
	if t.Failed() {
		return
	}
	for g := range co {
		for i := range co[g] {
			if co[g][i] != one[g][i] {
				t.Fatalf("chat %d answer %d:\ncoalesced %s\nsingle    %s", g, i, co[g][i], one[g][i])
			}
		}
	}
	d := func(r string) int { return after[r] - before[r] }
	t.Logf("%d engine plans and %d engine commits in %d plans alone, %d plan batches, %d commits alone, %d commit batches",
		chats*turns, chats*turns, d(routePlan), d(routePlans), d(routeCommit), d(routeSaved))
	if d(routePlans) == 0 || d(routeSaved) == 0 || d(routeCommits) != 0 {
		t.Fatalf("%d plan batches, %d engine commit batches, %d plain commit batches: engine calls were not coalesced (or went to the plain route)",
			d(routePlans), d(routeSaved), d(routeCommits))
	}
}

// TestCoalescedEngineErrors: in one batch of engine plans and one of
// engine commits, each item that fails answers exactly the single route's
// error (status and message: a saved segment no server holds is named by
// TP rank), and the others succeed.
func TestCoalescedEngineErrors(t *testing.T) {
	c := start(t, cluster.Config{MemBytes: 64 << 20})
	cl := dial(t, c, client.Config{})
	single := dial(t, c, client.Config{NoCoalesce: true})
	ctx := context.Background()
	ss := cl.Sessions()
	if err := ss.SetLayout(ctx, tp2); err != nil {
		t.Fatal(err)
	}
	// Plans: good ones, and ones the master refuses (nothing is created for
	// them, so the single route asked after answers the same).
	reqs := []struct {
		id  string
		req client.PlanRequest
	}{
		{"good", client.PlanRequest{Model: "tp2", TokenIDs: seq(1, 48)}},
		{"hole", client.PlanRequest{Model: "tp2", TokenIDs: seq(2, 48)}},
		{"model", client.PlanRequest{Model: "no-such-model", TokenIDs: seq(1, 8)}},
		{"a?b", client.PlanRequest{Model: "tp2", TokenIDs: seq(1, 8)}},
		{"sgl", client.PlanRequest{Model: "tp2", TokenIDs: seq(1, 8), Format: "sglang", Flags: map[string]any{"x": true}}},
		{"notoken", client.PlanRequest{Model: "tp2"}},
		{"many", client.PlanRequest{Model: "tp2", TokenIDs: seq(3, 48)}},
	}
	var planCalls []func() (client.EnginePlan, error)
	for _, r := range reqs {
		planCalls = append(planCalls, func() (client.EnginePlan, error) { return ss.PlanEngine(ctx, r.id, r.req) })
	}
	before := masterRequests(t, c)
	plans, perrs := coalescedBatch(t, cl, func() error {
		_, err := ss.PlanEngine(ctx, "lone", client.PlanRequest{Model: "tp2", TokenIDs: seq(9, 16)})
		return err
	}, func(pq, _ int) bool { return pq == len(planCalls) }, planCalls)
	if n := masterRequests(t, c)[routePlans] - before[routePlans]; n != 1 {
		t.Fatalf("%d plan batches sent, want 1", n)
	}
	for i, r := range reqs {
		if perrs[i] == nil {
			if len(plans[i].KVCacheParams.Fresh) == 0 || plans[i].KVCacheParams.ID != r.id {
				t.Fatalf("plan %s: %+v", r.id, plans[i])
			}
			continue
		}
		_, want := single.Sessions().PlanEngine(ctx, r.id, r.req)
		if want == nil || perrs[i].Error() != want.Error() || errs.Code(perrs[i]) != errs.Code(want) {
			t.Fatalf("plan %s: coalesced %v, single %v", r.id, perrs[i], want)
		}
	}
	for _, i := range []int{0, 1, 6} {
		if perrs[i] != nil {
			t.Fatalf("plan %s: %v", reqs[i].id, perrs[i])
		}
	}
	good, hole, many := plans[0], plans[1], plans[6]
	if err := engineWrite(ctx, cl, good.KVCacheParams.Fresh, []int64{0, 1}); err != nil {
		t.Fatal(err)
	}
	// TP rank 0 wrote its region, rank 1 did not: the engine's bug.
	if err := engineWrite(ctx, cl, hole.KVCacheParams.Fresh, []int64{0}); err != nil {
		t.Fatal(err)
	}
	tooMany := make([]client.KVRange, limits.MaxSavedSegments+1)
	for i := range tooMany {
		tooMany[i] = many.KVCacheParams.Fresh[0]
	}
	badURI := append([]client.KVRange(nil), many.KVCacheParams.Fresh...)
	badURI[0].KVURI = "gd2fs://h:x/p"
	type commit struct {
		id     string
		planID int64
		saved  []client.KVRange
	}
	cs := []commit{
		{"good", good.PlanID, good.KVCacheParams.Fresh},
		{"hole", hole.PlanID, hole.KVCacheParams.Fresh},
		{"many", many.PlanID, tooMany},
		{"many", many.PlanID, badURI},
		{"nobody", many.PlanID, nil},
		{"many", 1 << 40, many.KVCacheParams.Fresh}, // no such plan, and unwritten
	}
	var commitCalls []func() (client.Session, error)
	for _, x := range cs {
		commitCalls = append(commitCalls, func() (client.Session, error) { return ss.CommitSaved(ctx, x.id, x.planID, x.saved) })
	}
	lone, err := single.Sessions().PlanEngine(ctx, "lone-c", client.PlanRequest{Model: "tp2", TokenIDs: seq(8, 16)})
	if err != nil {
		t.Fatal(err)
	}
	if err := engineWrite(ctx, cl, lone.KVCacheParams.Fresh, []int64{0, 1}); err != nil {
		t.Fatal(err)
	}
	before = masterRequests(t, c)
	sessions, cerrs := coalescedBatch(t, cl, func() error {
		_, err := ss.CommitSaved(ctx, "lone-c", lone.PlanID, lone.KVCacheParams.Fresh)
		return err
	}, func(_, cq int) bool { return cq == len(commitCalls) }, commitCalls)
	after := masterRequests(t, c)
	if n := after[routeSaved] - before[routeSaved]; n != 1 {
		t.Fatalf("%d engine commit batches sent, want 1", n)
	}
	if cerrs[0] != nil || sessions[0].Tokens != 48 {
		t.Fatalf("the written commit: %+v, %v", sessions[0], cerrs[0])
	}
	if cerrs[1] == nil || !strings.Contains(cerrs[1].Error(), "TP rank 1's region") || !errors.Is(cerrs[1], errs.ErrBadRequest) {
		t.Fatalf("a commit of a segment rank 1 did not write: %v", cerrs[1])
	}
	for i, x := range cs[1:] {
		i++
		if cerrs[i] == nil {
			t.Fatalf("commit %d (%s): succeeded: %+v", i, x.id, sessions[i])
		}
		// The batch recorded nothing for it: the single route answers the
		// same error, word for word.
		_, want := single.Sessions().CommitSaved(ctx, x.id, x.planID, x.saved)
		if want == nil || cerrs[i].Error() != want.Error() || errs.Code(cerrs[i]) != errs.Code(want) {
			t.Fatalf("commit %d (%s): coalesced %v, single %v", i, x.id, cerrs[i], want)
		}
		t.Logf("commit %d (%s): %.200v", i, x.id, cerrs[i])
	}
	if s, err := ss.Get(ctx, "hole"); err != nil || s.Tokens != 0 {
		t.Fatalf("the session of the refused commit: %+v, %v", s, err)
	}
}

// TestCoalescedEngineCancel: an engine plan and an engine commit whose
// contexts end while they are queued return the context's error and are
// never sent.
func TestCoalescedEngineCancel(t *testing.T) {
	c := start(t, cluster.Config{})
	cl := dial(t, c, client.Config{})
	ctx := context.Background()
	ss := cl.Sessions()
	if err := ss.SetLayout(ctx, tp2); err != nil {
		t.Fatal(err)
	}
	p, err := ss.PlanEngine(ctx, "queued", client.PlanRequest{Model: "tp2", TokenIDs: seq(1, 16)})
	if err != nil {
		t.Fatal(err)
	}
	if err := engineWrite(ctx, cl, p.KVCacheParams.Fresh, []int64{0, 1}); err != nil {
		t.Fatal(err)
	}
	before := masterRequests(t, c)
	release := client.HoldLoneCalls(cl)
	loneErr := make(chan error, 2)
	go func() {
		_, err := ss.PlanEngine(ctx, "lone", client.PlanRequest{Model: "tp2", TokenIDs: seq(2, 16)})
		loneErr <- err
	}()
	go func() {
		_, err := ss.CommitSaved(ctx, "nobody", 1, nil)
		loneErr <- err
	}()
	waitFor(t, "the lone calls on the wire", func() bool { ps, _, cs, _ := client.Coalescing(cl); return ps == 1 && cs == 1 })
	cctx, cancel := context.WithCancel(ctx)
	queuedErr := make(chan error, 2)
	go func() {
		_, err := ss.PlanEngine(cctx, "cancelled", client.PlanRequest{Model: "tp2", TokenIDs: seq(1, 16)})
		queuedErr <- err
	}()
	go func() {
		_, err := ss.CommitSaved(cctx, "queued", p.PlanID, p.KVCacheParams.Fresh)
		queuedErr <- err
	}()
	waitFor(t, "the calls queued", func() bool { _, pq, _, cq := client.Coalescing(cl); return pq == 1 && cq == 1 })
	cancel()
	for range 2 {
		if err := <-queuedErr; !errors.Is(err, context.Canceled) {
			t.Fatalf("a queued call whose context ended: %v", err)
		}
	}
	release()
	if err := <-loneErr; err != nil && !errors.Is(err, errs.ErrExists) && !errors.Is(err, errs.ErrNotFound) {
		t.Fatal(err)
	}
	if err := <-loneErr; err != nil && !errors.Is(err, errs.ErrExists) && !errors.Is(err, errs.ErrNotFound) {
		t.Fatal(err)
	}
	waitFor(t, "the calls done", func() bool { ps, _, cs, _ := client.Coalescing(cl); return ps == 0 && cs == 0 })
	after := masterRequests(t, c)
	d := func(r string) int { return after[r] - before[r] }
	if d(routePlan) != 1 || d(routeCommit) != 1 || d(routePlans) != 0 || d(routeSaved) != 0 {
		t.Fatalf("%d plans alone, %d commits alone, %d plan batches, %d commit batches: want only the lone calls", d(routePlan), d(routeCommit), d(routePlans), d(routeSaved))
	}
	if _, err := ss.Get(ctx, "cancelled"); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("the cancelled plan's session: %v, want not found (never planned)", err)
	}
	if s, err := ss.Get(ctx, "queued"); err != nil || s.Tokens != 0 {
		t.Fatalf("the cancelled commit's session: %+v, %v (want nothing committed)", s, err)
	}
}

// TestCoalescedEngineOldMaster: a master from before engine commits in
// batches (a proxy answers POST /v1/sessions/commits/saved 404, as such a
// master does) gets engine commits one at a time: the batch is tried once,
// its commits sent alone answer correctly, and the client remembers.
func TestCoalescedEngineOldMaster(t *testing.T) {
	c := start(t, cluster.Config{})
	u, err := url.Parse(c.Master.URL())
	if err != nil {
		t.Fatal(err)
	}
	var tries atomic.Int64
	proxy := httputil.NewSingleHostReverseProxy(u)
	old := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/sessions/commits/saved" {
			tries.Add(1)
			http.NotFound(w, r)
			return
		}
		if r.URL.Path == frames.Path { // nor framed connections
			http.NotFound(w, r)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	defer old.Close()
	cl, err := client.New(client.Config{Master: old.URL})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	ss := cl.Sessions()
	if err := ss.SetLayout(ctx, tp2); err != nil {
		t.Fatal(err)
	}
	const n = 4
	var ps []client.EnginePlan
	for i := 0; i <= n; i++ {
		p, err := ss.PlanEngine(ctx, fmt.Sprintf("o%d", i), client.PlanRequest{Model: "tp2", TokenIDs: seq(uint32(i), 32)})
		if err != nil {
			t.Fatal(err)
		}
		if err := engineWrite(ctx, cl, p.KVCacheParams.Fresh, []int64{0, 1}); err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	var calls []func() (client.Session, error)
	for i := 0; i < n; i++ {
		calls = append(calls, func() (client.Session, error) {
			return ss.CommitSaved(ctx, fmt.Sprintf("o%d", i), ps[i].PlanID, ps[i].KVCacheParams.Fresh)
		})
	}
	sessions, cerrs := coalescedBatch(t, cl, func() error {
		_, err := ss.CommitSaved(ctx, fmt.Sprintf("o%d", n), ps[n].PlanID, ps[n].KVCacheParams.Fresh)
		return err
	}, func(_, cq int) bool { return cq == n }, calls)
	for i := range sessions {
		if cerrs[i] != nil || sessions[i].Tokens != 32 {
			t.Fatalf("engine commit %d through an old master: %+v, %v", i, sessions[i], cerrs[i])
		}
	}
	if got := tries.Load(); got != 1 {
		t.Fatalf("%d engine commit batches tried, want 1 (then remembered)", got)
	}
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := ss.CommitSaved(ctx, fmt.Sprintf("nobody%d", i), 1, nil); !errors.Is(err, errs.ErrExists) && !errors.Is(err, errs.ErrNotFound) {
				t.Errorf("a commit after the master was found old: %v", err)
			}
		}()
	}
	wg.Wait()
	if got := tries.Load(); got != 1 {
		t.Fatalf("%d engine commit batches tried after the master was found old, want 1", got)
	}
}

// TestCoalescedBigEngineCommits: engine commits of many saved segments
// are batched only as far as a batch's body stays well within the
// master's body limit (the client counts each segment); the rest go in
// the next batch (here alone), and each gets the single route's answer.
func TestCoalescedBigEngineCommits(t *testing.T) {
	c := start(t, cluster.Config{MemBytes: 64 << 20})
	cl := dial(t, c, client.Config{})
	single := dial(t, c, client.Config{NoCoalesce: true})
	ctx := context.Background()
	ss := cl.Sessions()
	if err := ss.SetLayout(ctx, tp2); err != nil {
		t.Fatal(err)
	}
	// Each about 2,500 × 170 bytes = 425 KB of segments in a batch of at
	// most 1 MiB: two fit. The segments repeat one never written, so each
	// commit is refused (by the servers' answer), and nothing changes for
	// the single route asked after.
	const n, segs = 3, 2500
	var calls []func() (client.Session, error)
	var args []struct {
		id     string
		planID int64
		saved  []client.KVRange
	}
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("big%d", i)
		p, err := single.Sessions().PlanEngine(ctx, id, client.PlanRequest{Model: "tp2", TokenIDs: seq(uint32(i), 32)})
		if err != nil {
			t.Fatal(err)
		}
		saved := make([]client.KVRange, segs)
		for k := range saved {
			saved[k] = p.KVCacheParams.Fresh[0]
		}
		args = append(args, struct {
			id     string
			planID int64
			saved  []client.KVRange
		}{id, p.PlanID, saved})
		calls = append(calls, func() (client.Session, error) { return ss.CommitSaved(ctx, id, p.PlanID, saved) })
	}
	before := masterRequests(t, c)
	_, cerrs := coalescedBatch(t, cl, func() error {
		_, err := ss.CommitSaved(ctx, "nobody", 1, nil)
		if errors.Is(err, errs.ErrExists) || errors.Is(err, errs.ErrNotFound) {
			return nil
		}
		return err
	}, func(_, cq int) bool { return cq == n }, calls)
	waitFor(t, "the commits done", func() bool { _, _, cs, _ := client.Coalescing(cl); return cs == 0 })
	after := masterRequests(t, c)
	for i, a := range args {
		_, want := single.Sessions().CommitSaved(ctx, a.id, a.planID, a.saved)
		if cerrs[i] == nil || want == nil || cerrs[i].Error() != want.Error() {
			t.Fatalf("big commit %d: coalesced %v, single %v", i, cerrs[i], want)
		}
	}
	if b, one := after[routeSaved]-before[routeSaved], after[routeCommit]-before[routeCommit]; b != 1 || one != 2 {
		t.Fatalf("%d engine commit batches and %d commits alone; want 1 batch of two and the third alone, beside the lone commit", b, one)
	}
}
