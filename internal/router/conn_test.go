package router

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/gd2fs/gd2fs/internal/testutil"
)

var connLayout = client.Layout{Model: "m", Layers: 2, KVHeads: 2, HeadDim: 4, DType: "fp16", PageTokens: 4, Order: "kv_first"}

// TestEngineConnectionsReused: the router keeps its connections to the
// engine for the next requests, with more in flight than net/http's
// default of two idle ones a host (each request beyond those dialed a new
// connection and closed it after). Rounds of 8 requests with sessions are
// held at the engine until all 8 are there, so 8 connections are in use
// at once each round; over 6 rounds they are the same connections.
func TestEngineConnectionsReused(t *testing.T) {
	const n, rounds = 8, 6
	held := testutil.NewRounds(n)
	e := &engine{t: t, hook: func(r *http.Request) {
		if r.URL.Path == "/v1/completions" {
			held.Arrive()
		}
	}}
	p := startRouter(t, cluster.Config{MemBytes: 8 << 20, DiskBytes: 64 << 20}, connLayout, e,
		func(cl *client.Client) Config { return Config{Planner: cl.Sessions(), SharedSessions: true} })
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	defer hc.CloseIdleConnections()
	for round := 0; round < rounds; round++ {
		var wg sync.WaitGroup
		errc := make(chan error, n)
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				body := fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":2}`, strings.TrimSpace(strings.Repeat("w ", 8+4*round)))
				req, _ := http.NewRequest("POST", p.front.URL+"/v1/completions", strings.NewReader(body))
				req.Header.Set("X-Session-ID", fmt.Sprintf("s%d", i))
				resp, err := hc.Do(req)
				if err != nil {
					errc <- err
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					errc <- fmt.Errorf("round %d request %d: %s", round, i, resp.Status)
				}
			}(i)
		}
		wg.Wait()
		close(errc)
		for err := range errc {
			t.Fatal(err)
		}
	}
	e.mu.Lock()
	conns := len(e.conns)
	e.mu.Unlock()
	// n in use at once; a few more may be dialed while another goes back
	// to the pool. Without the pool, rounds after the first dial n-2 anew.
	if conns > 2*n {
		t.Fatalf("the engine saw %d connections from the router for %d rounds of %d requests: the router does not keep its connections", conns, rounds, n)
	}
}

// gatedCommits is the real store whose commits wait for gate to close
// (started says one has begun): a commit the test holds at will.
type gatedCommits struct {
	Planner
	started chan struct{}
	gate    chan struct{}
}

func (g gatedCommits) CommitSaved(ctx context.Context, id string, planID int64, saved []client.KVRange) (client.Session, error) {
	g.started <- struct{}{}
	<-g.gate // not ctx: the commit is held for as long as the test says
	return g.Planner.CommitSaved(ctx, id, planID, saved)
}

// TestCommitFreesConnection: the commit after an answer does not hold the
// client's connection. A client whose next request goes on the same
// keep-alive connection (here the only one it may open) gets its answer
// while the previous request's commit is still running; the commit still
// lands, and the session's next turn sees it.
func TestCommitFreesConnection(t *testing.T) {
	g := gatedCommits{started: make(chan struct{}, 4), gate: make(chan struct{})}
	p := startRouter(t, cluster.Config{MemBytes: 8 << 20, DiskBytes: 64 << 20}, connLayout, &engine{t: t},
		func(cl *client.Client) Config {
			g.Planner = cl.Sessions()
			return Config{Planner: g, SharedSessions: true}
		})
	var open sync.Once
	release := func() { open.Do(func() { close(g.gate) }) }
	t.Cleanup(release) // before the router closes: it waits for its commits
	hc := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
	defer hc.CloseIdleConnections()
	post := func(ctx context.Context, session string) error {
		req, _ := http.NewRequestWithContext(ctx, "POST", p.front.URL+"/v1/completions",
			strings.NewReader(`{"model":"m","prompt":"a b c d e f g h i j","max_tokens":2}`))
		if session != "" {
			req.Header.Set("X-Session-ID", session)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return err
		}
		if resp.StatusCode != 200 {
			return fmt.Errorf("%s", resp.Status)
		}
		return nil
	}
	ctx := context.Background()
	if err := post(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	<-g.started // a's commit has begun and is held
	// The same connection's next request, of no session. Without the fix
	// it waits for a's commit, which waits for this test: the deadline
	// turns that deadlock into a failure.
	ctx2, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := post(ctx2, ""); err != nil {
		t.Fatalf("a request on the connection of an answered one waited for its commit: %v", err)
	}
	release()
	p.r.Wait()
	s, err := p.cl.Sessions().Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if s.Tokens != 8 { // the whole blocks of the 10-token prompt
		t.Fatalf("session a holds %d tokens after its commit, want 8", s.Tokens)
	}
}

// TestForwardedBodyAsSent: the router forwards the client's bytes as they
// came (field order, spacing, escapes) with kv_transfer_params added last,
// and a client's own kv_transfer_params never reach the engine.
func TestForwardedBodyAsSent(t *testing.T) {
	var hmu sync.Mutex
	var heads []http.Header
	e := &engine{t: t, hook: func(r *http.Request) {
		hmu.Lock()
		heads = append(heads, r.Header.Clone())
		hmu.Unlock()
	}}
	p := startRouter(t, cluster.Config{MemBytes: 8 << 20, DiskBytes: 64 << 20}, connLayout, e,
		func(cl *client.Client) Config { return Config{Planner: cl.Sessions(), SharedSessions: true} })
	for _, tc := range []struct{ body, prefix string }{
		{`{"prompt": "x <y> \u00e9",  "model":"m" , "max_tokens":2 }` + "\n", `{"prompt": "x <y> \u00e9",  "model":"m" , "max_tokens":2,"kv_transfer_params":`},
		// The client's params: the body is encoded again without them.
		{`{"model":"m","prompt":"x y","kv_transfer_params":{"kvcache_params":{"id":"evil"}}}`, `{"model":"m","prompt":"x y","kv_transfer_params":`},
	} {
		req, _ := http.NewRequest("POST", p.front.URL+"/v1/completions", strings.NewReader(tc.body))
		req.Header.Set("X-Session-ID", "b")
		req.Header.Set("X-Trace", "t1")
		req.Header.Set("Expect", "100-continue") // the router has the body: not passed on
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatal(resp.Status)
		}
		p.r.Wait()
		e.mu.Lock()
		got := string(e.lastBody)
		e.mu.Unlock()
		if !strings.HasPrefix(got, tc.prefix) {
			t.Fatalf("forwarded %s\nwant it to start %s", got, tc.prefix)
		}
		var doc struct {
			KTP struct {
				KP struct {
					ID    string           `json:"id"`
					Fresh []client.KVRange `json:"fresh_kvcache"`
				} `json:"kvcache_params"`
			} `json:"kv_transfer_params"`
		}
		if err := json.Unmarshal(e.lastBody, &doc); err != nil || doc.KTP.KP.ID != "b" || len(doc.KTP.KP.Fresh) == 0 {
			t.Fatalf("forwarded %s: not the router's plan (%v)", got, err)
		}
		hmu.Lock()
		h := heads[len(heads)-1]
		hmu.Unlock()
		if h.Get("X-Trace") != "t1" || h.Get("Expect") != "" || h.Get("X-Session-ID") != "b" {
			t.Fatalf("the engine got the headers %v: want the client's, without Expect", h)
		}
	}
}

// FuzzWithMember: whatever JSON body a client sends, the body the router
// forwards is a JSON object with every member of the client's (except
// kv_transfer_params) and the router's kv_transfer_params, exactly.
func FuzzWithMember(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1}`, ` { "a" : "}" } `, `{"kv_transfer_params":1,"b":[1,{"c":"}"}]}`, "{\"kv_transfer\\u005fparams\":2}\n", `[1]`, `"x"`} {
		f.Add([]byte(s))
	}
	params := []byte(`{"kvcache_params":{"id":7}}`)
	f.Fuzz(func(t *testing.T, body []byte) {
		out, doc, err := stripTransferParams("application/json", body)
		if err != nil || doc == nil {
			return
		}
		var got map[string]json.RawMessage
		b := withMember(out, "kv_transfer_params", params)
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("%q became %q: %v", body, b, err)
		}
		if string(got["kv_transfer_params"]) != string(params) || len(got) != len(doc)+1 {
			t.Fatalf("%q became %q", body, b)
		}
		for k, v := range doc {
			var x, y any
			json.Unmarshal(v, &x)
			json.Unmarshal(got[k], &y)
			if fmt.Sprint(x) != fmt.Sprint(y) {
				t.Fatalf("%q became %q: member %q changed", body, b, k)
			}
		}
	})
}

// FuzzParseIDs: parseIDs reads what json.Unmarshal into []uint32 reads, the
// same ids, and refuses whatever it refuses (it also refuses a null id,
// which json would read as 0).
func FuzzParseIDs(f *testing.F) {
	for _, s := range []string{`[]`, `null`, `[1,2,3]`, ` [ 0 , 4294967295 ] `, `[4294967296]`, `[-1]`, `[1.5]`, `[1e3]`, `[null]`, `["1"]`, `{"a":1}`, `[1,]`, `[01]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if !json.Valid(b) {
			return // parseIDs is given a JSON value
		}
		got, err := parseIDs(b)
		var want []uint32
		jerr := json.Unmarshal(b, &want)
		if err == nil && (jerr != nil || fmt.Sprint(got) != fmt.Sprint(want)) {
			t.Fatalf("%q: parseIDs %v, json %v (%v)", b, got, want, jerr)
		}
		if jerr != nil && err == nil {
			t.Fatalf("%q: json refuses it (%v), parseIDs does not", b, jerr)
		}
	})
}
