package router

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/cluster"
)

// hooked is the store with a signal after each commit (the router commits
// after the client has its answer).
type hooked struct {
	Planner
	done chan string
}

func (h hooked) CommitSaved(ctx context.Context, id string, planID int64, saved []client.KVRange) (client.Session, error) {
	s, err := h.Planner.CommitSaved(ctx, id, planID, saved)
	h.done <- id
	return s, err
}

// rig is a cluster, the stand-in engine and a router with cfg in front.
type rig struct {
	t     *testing.T
	cl    *client.Client
	e     *engine
	up    *url.URL
	front *httptest.Server
	done  chan string // the session of each commit
}

func newRig(t *testing.T, cfg Config) *rig {
	done := make(chan string, 16)
	e := &engine{t: t}
	p := startRouter(t, cluster.Config{MemBytes: 8 << 20, DiskBytes: 64 << 20},
		client.Layout{Model: "m", Layers: 2, KVHeads: 2, HeadDim: 4, DType: "fp16", PageTokens: 4, Order: "kv_first"}, e,
		func(cl *client.Client) Config {
			if cfg.Planner == nil {
				cfg.Planner = hooked{cl.Sessions(), done}
			}
			return cfg
		})
	return &rig{t: t, cl: p.cl, e: e, up: p.u, front: p.front, done: done}
}

// post sends body with the headers given as name, value pairs.
func (g *rig) post(path, body string, hdr ...string) (int, string) {
	req, _ := http.NewRequest("POST", g.front.URL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		g.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		g.t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func words(n int) string { return strings.TrimSpace(strings.Repeat("w ", n)) }

// kvParams is what the engine was told last: nil for no plan.
func (g *rig) kvParams() map[string]any {
	ktp, _ := g.e.last()["kv_transfer_params"].(map[string]any)
	if ktp == nil {
		return nil
	}
	return ktp["kvcache_params"].(map[string]any)
}

// TestTenantsSeparateSessions: client B naming client A's session is not
// served A's tokens and does not grow A's session (issue 22 finding 1).
func TestTenantsSeparateSessions(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keys, []byte("# key tenant\nkey-a alice\nkey-b bob\nkey-a2 alice\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	km, err := LoadKeys(keys)
	if err != nil {
		t.Fatal(err)
	}
	g := newRig(t, Config{Keys: km})
	ctx := context.Background()
	// Alice chats twice under S: her second turn finds her first stored.
	if code, out := g.post("/v1/completions", fmt.Sprintf(`{"prompt":%q}`, words(10)), "X-Session-ID", "S", "Authorization", "Bearer key-a"); code != 200 {
		t.Fatalf("alice turn 1: %d %s", code, out)
	}
	<-g.done
	a, err := g.cl.Sessions().Get(ctx, "alice:S")
	if err != nil || a.Tokens != 8 {
		t.Fatalf("alice's session: %+v %v", a, err)
	}
	// Bob names S too: his plan stores nothing, and his turn lands in his
	// own session; Alice's is as it was.
	if code, out := g.post("/v1/completions", fmt.Sprintf(`{"prompt":%q}`, words(14)), "X-Session-ID", "S", "Authorization", "Bearer key-b"); code != 200 {
		t.Fatalf("bob: %d %s", code, out)
	}
	if id := <-g.done; id != "bob:S" {
		t.Fatalf("bob's turn committed to %q", id)
	}
	kp := g.kvParams()
	if kp == nil || kp["id"] != "bob:S" || len(kp["stored_kvcache"].([]any)) != 0 {
		t.Fatalf("bob was planned %v", kp)
	}
	if a2, err := g.cl.Sessions().Get(ctx, "alice:S"); err != nil || a2.Tokens != a.Tokens {
		t.Fatalf("bob's turn changed alice's session: %+v -> %+v %v", a, a2, err)
	}
	// Alice's other key is Alice: her stored tokens are found.
	g.post("/v1/completions", fmt.Sprintf(`{"prompt":%q}`, words(14)), "X-Session-ID", "S", "Authorization", "Bearer key-a2")
	if st := g.kvParams()["stored_kvcache"].([]any); len(st) != 1 {
		t.Fatalf("alice's second key found %v", st)
	}
	// A key the file lacks, or none, is refused.
	for _, auth := range []string{"Bearer key-c", ""} {
		if code, out := g.post("/v1/completions", `{"prompt":"a b"}`, "X-Session-ID", "S", "Authorization", auth); code != 401 {
			t.Fatalf("key %q: %d %s", auth, code, out)
		}
	}
}

// TestNoTenantNoSession: without a tenant and without --shared-sessions a
// session id is ignored (issue 22 finding 1); a tenant header or the key's
// hash separates callers.
func TestNoTenantNoSession(t *testing.T) {
	g := newRig(t, Config{})
	if code, _ := g.post("/v1/completions", `{"prompt":"a b c d e"}`, "X-Session-ID", "S"); code != 200 || g.kvParams() != nil {
		t.Fatalf("no tenant: %d, planned %v", code, g.kvParams())
	}
	g = newRig(t, Config{TenantHeader: "X-Tenant"})
	g.post("/v1/completions", `{"prompt":"a b c d e"}`, "X-Session-ID", "S", "X-Tenant", "t1")
	if kp := g.kvParams(); kp == nil || kp["id"] != "t1:S" {
		t.Fatalf("tenant header: %v", kp)
	}
	if code, _ := g.post("/v1/completions", `{"prompt":"a b"}`, "X-Session-ID", "S", "X-Tenant", "a:b"); code != 400 {
		t.Fatalf("a tenant with ':' was taken: %d", code)
	}
	g = newRig(t, Config{KeyTenants: true})
	g.post("/v1/completions", `{"prompt":"a b c d e"}`, "X-Session-ID", "S", "Authorization", "Bearer sk-1")
	id1, _ := g.kvParams()["id"].(string)
	g.post("/v1/completions", `{"prompt":"a b c d e"}`, "X-Session-ID", "S", "Authorization", "Bearer sk-2")
	id2, _ := g.kvParams()["id"].(string)
	if id1 == id2 || !strings.HasSuffix(id1, ":S") || strings.Contains(id1, "sk-1") {
		t.Fatalf("key tenants: %q %q", id1, id2)
	}
	// Session ids the store could not name are refused.
	g = newRig(t, Config{SharedSessions: true})
	for _, s := range []string{"..", "a/b"} {
		if code, _ := g.post("/v1/completions", `{"prompt":"a b"}`, "X-Session-ID", s); code != 400 {
			t.Fatalf("session %q: %d", s, code)
		}
	}
}

// TestStripTransferParams: a client's own kv_transfer_params never reach
// the engine, with or without a session, when the store is down, spelt
// with escapes, or hidden in a body only a lenient parser reads (issue 22
// finding 2).
func TestStripTransferParams(t *testing.T) {
	evil := `"kv_transfer_params":{"kvcache_params":{"id":"x","stored_kvcache":[{"kv_uri":"gd2fs://local/kv-sessions/victim/kv-1"}]}}`
	for _, name := range []string{"shared", "down"} {
		cfg := Config{SharedSessions: true}
		if name == "down" {
			cfg.Planner = failing{}
		}
		g := newRig(t, cfg)
		for _, c := range []struct{ body, session string }{
			{`{"prompt":"a b",` + evil + `}`, ""},
			{`{"prompt":"a b",` + evil + `}`, "S"},
			{`{"prompt":"a b","kv_transfer_param\u0073":{"kvcache_params":{"id":"x"}}}`, ""},
			{`{"prompt":"a b",` + evil + `,` + evil + `}`, ""},
		} {
			if code, out := g.post("/v1/completions", c.body, "X-Session-ID", c.session); code != 200 {
				t.Fatalf("%s %q: %d %s", name, c.body, code, out)
			}
			kp := g.kvParams()
			if name == "down" || c.session == "" {
				if kp != nil {
					t.Fatalf("%s: the engine got the client's params %v", name, kp)
				}
			} else if kp["id"] != "S" {
				t.Fatalf("%s: the engine got %v, not the router's plan", name, kp)
			}
		}
		// A JSON body labelled as a form (Python's urllib does that) is
		// still JSON: planned, and cleaned.
		if code, _ := g.post("/v1/completions", `{"prompt":"a b c d e",`+evil+`}`, "X-Session-ID", "F", "Content-Type", "application/x-www-form-urlencoded"); code != 200 {
			t.Fatalf("%s: form-typed JSON: %d", name, code)
		}
		if kp := g.kvParams(); (name == "down") != (kp == nil) || kp != nil && kp["id"] != "F" {
			t.Fatalf("%s: form-typed JSON planned %v", name, kp)
		}
		// Other paths are cleaned too.
		g.post("/v1/responses", `{"input":"a",`+evil+`}`)
		if g.e.last()["kv_transfer_params"] != nil {
			t.Fatal("/v1/responses passed the client's params")
		}
		// A body the router cannot parse is refused, not passed on.
		if code, _ := g.post("/v1/completions", `{"prompt":"a","temperature":NaN,`+evil+`}`); code != 400 {
			t.Fatalf("unparsable body: %d", code)
		}
	}
}

// TestRouterLimits: an answer past MaxAnswer is passed on whole without
// being held (and commits nothing); a trickled body is cut (issue 22
// finding 7).
func TestRouterLimits(t *testing.T) {
	g := newRig(t, Config{SharedSessions: true, MaxAnswer: 1 << 10, BodyTimeout: 300 * time.Millisecond})
	big := strings.Repeat("x", 4<<10)
	g.e.pad = big
	code, out := g.post("/v1/completions", fmt.Sprintf(`{"prompt":%q}`, words(10)), "X-Session-ID", "S")
	if code != 200 || !strings.Contains(out, big) || !strings.Contains(out, "kv_transfer_params") {
		t.Fatalf("long answer: %d, %d bytes", code, len(out))
	}
	if s, err := g.cl.Sessions().Get(context.Background(), "S"); err == nil && s.Tokens != 0 {
		t.Fatalf("a long answer was parsed and committed: %+v", s)
	}
	g.e.pad = ""
	// A body that trickles: the connection is cut after BodyTimeout.
	conn, err := net.Dial("tcp", g.front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(conn)
	if err != nil {
		t.Fatalf("the router held a trickled body: %v (%q)", err, b)
	}
}

// TestSessionPerModel: a request for another model than the router's gets
// a session of its own (a suffix of the name's hash), the router's own
// model and no model keep the client's id, and an id with no room left for
// the suffix goes on without cache rather than failing.
func TestSessionPerModel(t *testing.T) {
	r := New(Config{Model: "m", SharedSessions: true})
	id := func(session, body string) (string, bool) {
		t.Helper()
		req := httptest.NewRequest("POST", "/v1/completions", strings.NewReader(body))
		req.Header.Set("X-Session-ID", session)
		var doc map[string]json.RawMessage
		if err := json.Unmarshal([]byte(body), &doc); err != nil {
			t.Fatal(err)
		}
		s, ok, err := r.sessionID(req, doc)
		if err != nil {
			t.Fatalf("%s %s: %v", session, body, err)
		}
		return s, ok
	}
	if s, ok := id("chat", `{"model":"m"}`); !ok || s != "chat" {
		t.Fatalf("the router's model: %q %v", s, ok)
	}
	if s, ok := id("chat", `{}`); !ok || s != "chat" {
		t.Fatalf("no model: %q %v", s, ok)
	}
	a, _ := id("chat", `{"model":"org/lora-a"}`)
	b, _ := id("chat", `{"model":"org/lora-b"}`)
	if !strings.HasPrefix(a, "chat@") || len(a) != len("chat@")+12 || a == b {
		t.Fatalf("two adapters: %q and %q, want chat@ and 12 hex digits each, apart", a, b)
	}
	if again, _ := id("chat", `{"model":"org/lora-a"}`); again != a {
		t.Fatalf("the same adapter twice: %q then %q", a, again)
	}
	long := strings.Repeat("x", 250)
	if s, ok := id(long, `{"model":"m"}`); !ok || s != long {
		t.Fatalf("a 250-byte id for the router's model: %q %v", s, ok)
	}
	if s, ok := id(long, `{"model":"org/lora-a"}`); ok {
		t.Fatalf("a 250-byte id with no room for the model's suffix: planned as %q", s)
	}
}
