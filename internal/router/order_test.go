package router

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/cluster"
)

// slowCommits wraps the store: a commit waits until a plan of the same
// session starts (or a grace period passes), and the order of finished
// commits and started plans is recorded.
type slowCommits struct {
	Planner
	mu      sync.Mutex
	events  []string
	planned chan struct{}
}

func (s *slowCommits) log(e string) {
	s.mu.Lock()
	s.events = append(s.events, e)
	s.mu.Unlock()
}

func (s *slowCommits) PlanEngine(ctx context.Context, id string, req client.PlanRequest) (client.EnginePlan, error) {
	s.log("plan")
	select {
	case s.planned <- struct{}{}:
	default:
	}
	return s.Planner.PlanEngine(ctx, id, req)
}

func (s *slowCommits) CommitSaved(ctx context.Context, id string, planID int64, saved []client.KVRange) (client.Session, error) {
	select {
	case <-s.planned:
	case <-time.After(300 * time.Millisecond):
	}
	sess, err := s.Planner.CommitSaved(ctx, id, planID, saved)
	s.log("commit")
	return sess, err
}

// TestNextTurnWaitsForCommit: a client that sends its next turn the moment
// it has the answer is planned after the previous turn's commit, so the
// commit is not refused and the turn finds its tokens stored (the python
// engine loop failed on this under load before the router held sessions).
func TestNextTurnWaitsForCommit(t *testing.T) {
	ctx := context.Background()
	var store *slowCommits
	p := startRouter(t, cluster.Config{MemBytes: 8 << 20, DiskBytes: 64 << 20},
		client.Layout{Model: "m", Layers: 2, KVHeads: 2, HeadDim: 4, DType: "fp16", PageTokens: 4, Order: "kv_first"}, &engine{t: t},
		func(cl *client.Client) Config {
			store = &slowCommits{Planner: cl.Sessions(), planned: make(chan struct{}, 1)}
			return Config{Planner: store, Timeout: 30 * time.Second, SharedSessions: true}
		})
	cl, front := p.cl, p.front
	words := func(n int) string { return strings.TrimSpace(strings.Repeat("w ", n)) }
	for turn, stream := range []bool{false, true, false} {
		body := fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":4,"stream":%v}`, words(8+8*turn), stream)
		req, _ := http.NewRequest("POST", front.URL+"/v1/completions", strings.NewReader(body))
		req.Header.Set("X-Session-ID", "chat-1")
		// A new connection per turn, as urllib makes: on one kept-alive
		// connection the HTTP server itself would wait for the handler.
		hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadAll(resp.Body); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	// Wait for the last commit, then check the order.
	front.Close()
	p.r.Wait()
	store.mu.Lock()
	got := strings.Join(store.events, ",")
	store.mu.Unlock()
	if got != "plan,commit,plan,commit,plan,commit" {
		t.Fatalf("plans and commits ran as %s; each plan must follow the previous turn's commit", got)
	}
	s, err := cl.Sessions().Get(ctx, "chat-1")
	if err != nil || s.Tokens != 24 {
		t.Fatalf("session after three turns: %+v %v (want 24 tokens stored)", s, err)
	}
}
