package master

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/testutil"
	"github.com/gd2fs/gd2fs/internal/tlsconf"
)

// raw sends one request with exactly the headers given (name, value pairs;
// "Host" sets the Host header) and returns the status and answer.
func raw(t *testing.T, m *Master, method, path, body string, hdr ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, m.URL()+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
		} else {
			req.Header.Set(hdr[i], hdr[i+1])
		}
	}
	code, b, _ := testutil.Do(t, req)
	return code, b
}

// TestBrowserForgeries: what a web page can make a browser send to a
// master without a token is refused, and refused before it changes
// anything (issue 22 finding 3).
func TestBrowserForgeries(t *testing.T) {
	m := startMaster(t, Config{AllowedHosts: []string{"gd2fs-master.svc"}})
	json := "application/json"
	if code, out := raw(t, m, "POST", "/v1/servers/heartbeat", `{"id":"server-0","addr":"127.0.0.1:9"}`, "Content-Type", json, api.RoleHeader, "server"); code != 200 {
		t.Fatalf("a server's heartbeat: %d %s", code, out)
	}
	forged := `{"id":"server-0","addr":"10.66.66.66:1"}`
	for _, c := range []struct {
		name string
		code int
		hdr  []string
	}{
		{"text/plain, as a page's simple POST", 415, []string{"Content-Type", "text/plain"}},
		{"form body", 415, []string{"Content-Type", "application/x-www-form-urlencoded"}},
		{"no content type", 415, nil},
		{"JSON without the server role", 403, []string{"Content-Type", json}},
		{"cross-origin", 403, []string{"Content-Type", "text/plain", "Origin", "http://attacker.example", api.RoleHeader, "server"}},
		{"cross-site fetch", 403, []string{"Content-Type", json, "Sec-Fetch-Site", "cross-site", api.RoleHeader, "server"}},
		{"rebound host", 421, []string{"Content-Type", json, api.RoleHeader, "server", "Host", "attacker.example:7070"}},
	} {
		if code, out := raw(t, m, "POST", "/v1/servers/heartbeat", forged, c.hdr...); code != c.code {
			t.Errorf("%s: %d %s, want %d", c.name, code, out, c.code)
		}
	}
	m.mu.Lock()
	addr := m.servers["server-0"].info.Addr
	m.mu.Unlock()
	if addr != "127.0.0.1:9" {
		t.Fatalf("a forged heartbeat re-pointed the server to %s", addr)
	}
	// Creates, commits and plans the same.
	for _, p := range []string{"/v1/commit/f", "/v1/link/f", "/v1/sessions/s/plan", "/v1/prefixes"} {
		if code, _ := raw(t, m, "POST", p, `{}`, "Content-Type", "text/plain"); code != 415 {
			t.Errorf("text/plain POST %s: %d", p, code)
		}
	}
	if code, _ := raw(t, m, "PUT", "/v1/files/f", `{"pool":"perf"}`, "Content-Type", json, "Origin", "https://attacker.example"); code != 403 {
		t.Errorf("cross-origin PUT: %d", code)
	}
	if _, err := m.meta.File(t.Context(), "/f"); err == nil {
		t.Fatal("a refused request created /f")
	}
	// DNS rebinding reads: a foreign Host is refused; IP addresses,
	// localhost and the names given are answered.
	if code, _ := raw(t, m, "GET", "/v1/list/", "", "Host", "attacker.example"); code != 421 {
		t.Errorf("rebound list: %d", code)
	}
	for _, h := range []string{"127.0.0.1:7070", "localhost:7070", "[::1]:7070", "gd2fs-master.svc:7070", "LOCALHOST"} {
		if code, out := raw(t, m, "GET", "/v1/list/", "", "Host", h); code != 200 {
			t.Errorf("Host %s: %d %s", h, code, out)
		}
	}
	// Same-origin requests of the console's own pages pass.
	if code, out := raw(t, m, "PUT", "/v1/dirs/d", "", "Content-Type", json, "Origin", m.URL(), "Sec-Fetch-Site", "same-origin"); code != 200 {
		t.Errorf("same-origin PUT: %d %s", code, out)
	}
	// With a token, the Host check is off (a rebound page has no token) and
	// the token authenticates heartbeats.
	mt := startMaster(t, Config{Token: testToken})
	if code, out := raw(t, mt, "POST", "/v1/servers/heartbeat", `{"id":"s","addr":"127.0.0.1:9"}`, "Content-Type", json, "Authorization", "Bearer "+testToken, "Host", "gd2fs.example"); code != 200 {
		t.Errorf("token heartbeat under a DNS name: %d %s", code, out)
	}
}

// TestTokenGuessesThrottled: past a burst of wrong tokens an address is
// answered 429 without its token being checked (issue 22 finding 14).
func TestTokenGuessesThrottled(t *testing.T) {
	m := startMaster(t, Config{Token: testToken})
	codes := map[int]int{}
	for i := range 40 {
		code, _ := raw(t, m, "GET", "/v1/status", "", "Authorization", fmt.Sprintf("Bearer guess-%d", i))
		codes[code]++
	}
	if codes[401] < 5 || codes[401] > 20 || codes[429] < 20 {
		t.Fatalf("40 wrong tokens in a burst were answered %v: want about 10 checked (401), the rest 429", codes)
	}
}

// TestHandshakeErrorsQuiet: failed TLS handshakes are logged once per
// interval with a count, not one line each (issue 22 finding 16).
func TestHandshakeErrorsQuiet(t *testing.T) {
	fs, err := tlsconf.TestCA(t.TempDir(), "node")
	if err != nil {
		t.Fatal(err)
	}
	stls, err := fs["node"].Server()
	if err != nil {
		t.Fatal(err)
	}
	var logs testutil.SyncBuffer // the master's goroutines share it
	m := startMaster(t, Config{TLS: stls, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	addr := strings.TrimPrefix(m.URL(), "https://")
	for range 20 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		io.Copy(io.Discard, c) // until the master closes it
		c.Close()
	}
	if n := strings.Count(logs.String(), "TLS handshake error"); n < 1 || n > 2 {
		t.Fatalf("20 failed handshakes logged %d lines:\n%s", n, logs.String())
	}
}
