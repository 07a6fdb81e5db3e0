package master

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/meta"
)

const testToken = "t0ken"

// startMaster runs a master on SQLite in a temp dir, with cfg's limits.
func startMaster(t testing.TB, cfg Config) *Master {
	t.Helper()
	ctx := context.Background()
	ms := cfg.Meta // a test may bring its own (PostgreSQL)
	if ms == nil {
		var err error
		if ms, err = meta.Open(ctx, "sqlite://"+filepath.Join(t.TempDir(), "meta.db")); err != nil {
			t.Fatal(err)
		}
	}
	cfg.Listen, cfg.Meta = "127.0.0.1:0", ms
	m, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { m.Run(rctx); close(done) }()
	t.Cleanup(func() { cancel(); m.Close(); <-done; ms.Close() })
	return m
}

// call sends body (raw) and returns the status code and answer.
func call(t testing.TB, m *Master, method, path, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, m.URL()+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(api.RoleHeader, "server")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func want(t *testing.T, m *Master, code int, method, path, body string) {
	t.Helper()
	if got, ans := call(t, m, method, path, body); got != code {
		t.Errorf("%s %s %.80s: %d %s, want %d", method, path, body, got, strings.TrimSpace(ans), code)
	}
}

// TestHostileRequests: one authenticated request with a hostile figure gets a
// clear 400 and leaves nothing behind; status keeps working (issue 16, 2-4, 6).
func TestHostileRequests(t *testing.T) {
	m := startMaster(t, Config{Token: testToken})
	// 2: link sizes that allocate by the request's figure.
	for _, size := range []int64{1 << 62, math.MaxInt64, 1 << 51, 2 << 40} {
		want(t, m, 400, "POST", "/v1/link/l/"+strconv.FormatInt(size, 10), `{"source":"s3://b/k","size":`+strconv.FormatInt(size, 10)+`}`)
		want(t, m, 404, "GET", "/v1/files/l/"+strconv.FormatInt(size, 10), "")
	}
	// 3: a commit past the maximum size; status answers.
	want(t, m, 200, "PUT", "/v1/files/big", `{"pool":"perf"}`)
	want(t, m, 400, "POST", "/v1/commit/big", `{"size":9223372036854775807}`)
	want(t, m, 200, "GET", "/v1/status", "")
	// 4: layouts and plans whose figures overflow.
	want(t, m, 400, "PUT", "/v1/models/m/layout", `{"layers":4611686018427387904,"kv_heads":8,"head_dim":128,"dtype":"bf16","page_tokens":16,"layout":"layer_first"}`)
	want(t, m, 200, "PUT", "/v1/models/m/layout", `{"layers":32,"kv_heads":8,"head_dim":128,"dtype":"bf16","page_tokens":16,"layout":"layer_first"}`)
	want(t, m, 400, "POST", "/v1/sessions/s/plan", `{"model":"m","prompt_tokens":16,"decode_tokens":9223372036854775807,"unsafe_count_only":true}`)
	// The content check: a plan names its prompt's content, in the right form.
	want(t, m, 400, "POST", "/v1/sessions/s/plan", `{"model":"m","prompt_tokens":16}`)
	want(t, m, 400, "POST", "/v1/sessions/s/plan", `{"model":"m","token_ids":[1,-2]}`)
	want(t, m, 400, "POST", "/v1/sessions/s/plan", `{"model":"m","prompt_tokens":17,"block_hashes":["00112233445566778899aabbccddeeff"]}`)
	want(t, m, 400, "POST", "/v1/sessions/s/plan", `{"model":"m","prompt_tokens":16,"block_hashes":["0011"]}`)
	want(t, m, 200, "POST", "/v1/sessions/s/plan", `{"model":"m","prompt_tokens":16,"block_hashes":["00112233445566778899aabbccddeeff"]}`)
	want(t, m, 200, "POST", "/v1/sessions/s2/plan", `{"model":"m","token_ids":[5,6,7]}`)
	// 6: strict JSON, query figures, names.
	want(t, m, 400, "PUT", "/v1/files/n", `null`)
	want(t, m, 400, "PUT", "/v1/files/n", `{"pool":"perf"}{"pool":"ha"}`)
	want(t, m, 400, "PUT", "/v1/files/n", ``)
	want(t, m, 400, "PUT", "/v1/files/n", `{"pool":"perf","nope":1}`)
	want(t, m, 400, "PUT", "/v1/files/n", strings.Repeat(" ", 5<<20))
	want(t, m, 400, "GET", "/v1/sessions?limit=abc", "")
	want(t, m, 400, "GET", "/v1/sessions?limit=-1", "")
	want(t, m, 200, "GET", "/v1/sessions?limit=5", "")
	want(t, m, 400, "PUT", "/v1/files/a%0Ab", `{"pool":"perf"}`)
	want(t, m, 400, "PUT", "/v1/files/a%FFb", `{"pool":"perf"}`)
	want(t, m, 400, "PUT", "/v1/dirs/a%1B%5B2J", ``)
	want(t, m, 200, "GET", "/v1/status", "")
	// A wrong token of the right length is refused.
	req, _ := http.NewRequest("GET", m.URL()+"/v1/status", nil)
	req.Header.Set("Authorization", "Bearer "+strings.Repeat("x", len(testToken)))
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 401 {
		t.Fatalf("wrong token: %v %v", resp, err)
	}
}

// closedWithin reports whether the peer closes c within d.
func closedWithin(c net.Conn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	return err == nil || !errors.Is(err, os.ErrDeadlineExceeded)
}

// TestHTTPTimeouts: a request that never sends its body and an idle
// keep-alive connection are closed; past MaxConns a connection is refused
// (issue 16.5).
func TestHTTPTimeouts(t *testing.T) {
	m := startMaster(t, Config{Token: testToken, ReadTimeout: 300 * time.Millisecond, IdleTimeout: 300 * time.Millisecond, MaxConns: 3})
	addr := strings.TrimPrefix(m.URL(), "http://")
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	c := dial()
	io.WriteString(c, "PUT /v1/files/x HTTP/1.1\r\nHost: m\r\nAuthorization: Bearer "+testToken+"\r\nContent-Length: 100\r\n\r\n")
	if !closedWithin(c, 5*time.Second) {
		t.Error("a request without its body holds its connection")
	}
	c = dial()
	io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: m\r\n\r\n")
	if !closedWithin(c, 5*time.Second) {
		t.Error("an idle keep-alive connection is kept open")
	}
	c = dial()
	io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: m\r\nX-Big: "+strings.Repeat("a", 128<<10)+"\r\n\r\n")
	b, _ := io.ReadAll(io.LimitReader(c, 64))
	if !bytes.Contains(b, []byte("431")) {
		t.Errorf("oversize headers: %q, want 431", b)
	}
	// Three authenticated idle connections fill MaxConns: a fourth is
	// closed at once.
	m = startMaster(t, Config{Token: testToken, MaxConns: 3})
	addr = strings.TrimPrefix(m.URL(), "http://")
	for range 3 {
		c := dial()
		io.WriteString(c, "GET /v1/status HTTP/1.1\r\nHost: m\r\nAuthorization: Bearer "+testToken+"\r\n\r\n")
		if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || !strings.Contains(line, "200") {
			t.Fatalf("authenticated request: %q %v", line, err)
		}
	}
	c = dial()
	io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: m\r\n\r\n")
	b, _ = io.ReadAll(io.LimitReader(c, 64))
	if bytes.Contains(b, []byte("200")) {
		t.Error("a connection past MaxConns was served")
	}
}

// TestUnauthenticatedFirstOut: connections that never authenticated (one
// GET /healthz each, then idle) fill every slot; an authenticated client
// still gets in, and one address cannot hold more than MaxConnsPerIP of
// them (issue 22 finding 4).
func TestUnauthenticatedFirstOut(t *testing.T) {
	m := startMaster(t, Config{Token: testToken, MaxConns: 8, MaxConnsPerIP: 6})
	addr := strings.TrimPrefix(m.URL(), "http://")
	var idle []net.Conn
	for range 12 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: m\r\n\r\n")
		idle = append(idle, c)
	}
	for range 3 {
		if code, ans := call(t, m, "GET", "/v1/status", ""); code != 200 {
			t.Fatalf("authenticated status behind idle sockets: %d %s", code, ans)
		}
	}
	if n := m.guard.Evicted.Load(); n < 6 {
		t.Fatalf("evicted %d of 12 idle unauthenticated connections, want at least 6 (at most 6 per address)", n)
	}
}

// TestUnhealthyServer: a server that reports it cannot accept connections
// leaves membership (and so placement and KV ownership) until it recovers.
func TestUnhealthyServer(t *testing.T) {
	m := startMaster(t, Config{Token: testToken})
	members := func() int {
		var ms api.Membership
		c := api.Client{Base: m.URL(), Token: testToken}
		if err := c.Do(context.Background(), "GET", "/v1/members", nil, &ms); err != nil {
			t.Fatal(err)
		}
		return len(ms.Members)
	}
	hb := func(unhealthy string) {
		c := api.Client{Base: m.URL(), Token: testToken}
		if err := c.Do(context.Background(), "POST", "/v1/servers/heartbeat",
			api.Heartbeat{ServerInfo: api.ServerInfo{ID: "s1", Addr: "127.0.0.1:1", MemCap: 1 << 30, Unhealthy: unhealthy}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	hb("")
	if n := members(); n != 1 {
		t.Fatalf("members %d", n)
	}
	hb("accept failing: too many open files")
	if n := members(); n != 0 {
		t.Fatalf("an unhealthy server stays a member")
	}
	if _, ans := call(t, m, "GET", "/v1/status", ""); !strings.Contains(ans, `"unhealthy"`) {
		t.Fatalf("status does not show the server unhealthy: %s", ans)
	}
	hb("")
	if n := members(); n != 1 {
		t.Fatalf("a recovered server did not come back")
	}
}
