package console_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/gd2fs/gd2fs/internal/master"
	"github.com/gd2fs/gd2fs/internal/meta"
	"github.com/gd2fs/gd2fs/internal/version"
)

func body(t *testing.T, r *http.Response) string {
	t.Helper()
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestConsoleHandlers runs the handler tests on one cluster.
func TestConsoleHandlers(t *testing.T) {
	e := setup(t)
	t.Run("Access", func(t *testing.T) { testAccess(t, e) })
	t.Run("Escapes", func(t *testing.T) { testEscapes(t, e) })
	t.Run("KVPins", func(t *testing.T) {
		r := get(t, e.url("/ui/api/kv"), map[string]string{"Authorization": "Bearer " + token})
		var v struct {
			Sections []struct {
				Stats []struct{ ID, Value, Sub string }
			}
		}
		if err := json.NewDecoder(r.Body).Decode(&v); err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		for _, s := range v.Sections {
			for _, st := range s.Stats {
				if st.ID == "kv-pinned" {
					if st.Value != "2 blocks" || !strings.Contains(st.Sub, "2 with a TTL") {
						t.Errorf("pinned: %q, %q; want 2 blocks, 2 with a TTL", st.Value, st.Sub)
					}
					return
				}
			}
		}
		t.Error("no kv-pinned figure on the KV page")
	})
	t.Run("UnknownSession", func(t *testing.T) {
		r := get(t, e.url("/ui/sessions?id=no-such-session"), map[string]string{"Authorization": "Bearer " + token})
		if b := body(t, r); r.StatusCode != 200 || !strings.Contains(b, "Session no-such-session") || !strings.Contains(b, "no-such-session") {
			t.Errorf("unknown session: %d", r.StatusCode)
		}
	})
}

// testAccess checks the token is needed on every page and JSON view, and
// the three ways to give it: ?token= once, the login form, a bearer header;
// and that the cookie never holds the token.
func testAccess(t *testing.T, e *env) {
	pages := []string{"/ui/cluster", "/ui/kv", "/ui/sessions", "/ui/models", "/ui/sessions?id=chat-a"}
	for _, p := range pages {
		r := get(t, e.url(p), nil)
		b := body(t, r)
		if r.StatusCode != http.StatusUnauthorized || !strings.Contains(b, `name="token"`) {
			t.Errorf("GET %s without token: %d, want 401 and the login form", p, r.StatusCode)
		}
		if r.Header.Get("Content-Security-Policy") == "" || r.Header.Get("Cache-Control") != "no-store" {
			t.Errorf("GET %s: missing CSP or no-store", p)
		}
		api := strings.Replace(p, "/ui/", "/ui/api/", 1)
		if r := get(t, e.url(api), nil); r.StatusCode != http.StatusUnauthorized || !strings.Contains(body(t, r), "unauthorized") {
			t.Errorf("GET %s without token: %d, want 401 JSON", api, r.StatusCode)
		}
		if r := get(t, e.url(api), map[string]string{"Authorization": "Bearer " + token}); r.StatusCode != 200 {
			t.Errorf("GET %s with bearer token: %d", api, r.StatusCode)
		} else {
			var v map[string]any
			if err := json.NewDecoder(r.Body).Decode(&v); err != nil || v["sections"] == nil {
				t.Errorf("GET %s: bad JSON view: %v", api, err)
			}
			r.Body.Close()
		}
		if r := get(t, e.url(api), map[string]string{"Authorization": "Bearer wrong"}); r.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s with a wrong bearer token: %d", api, r.StatusCode)
		}
	}
	// Wrong token in the URL: 401, and the form does not echo it.
	r := get(t, e.url("/ui/kv?token=nope"), nil)
	if b := body(t, r); r.StatusCode != 401 || strings.Contains(b, "nope") || !strings.Contains(b, "wrong token") {
		t.Errorf("wrong ?token=: %d", r.StatusCode)
	}
	// Right token in the URL: a cookie, and a redirect to the URL without it.
	r = get(t, e.url("/ui/sessions?id=chat-a&token="+token), nil)
	body(t, r)
	if r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != "/ui/sessions?id=chat-a" {
		t.Fatalf("?token=: %d to %q, want 303 to /ui/sessions?id=chat-a", r.StatusCode, r.Header.Get("Location"))
	}
	ck := cookieOf(t, r)
	if !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/ui/" || strings.Contains(ck.Value, token) {
		t.Errorf("cookie %+v: want HttpOnly, SameSite=Strict, Path=/ui/, not holding the token", ck)
	}
	for _, p := range pages {
		r := get(t, e.url(p), map[string]string{"Cookie": ck.Name + "=" + ck.Value})
		if b := body(t, r); r.StatusCode != 200 || !strings.Contains(b, `<main id="main">`) {
			t.Errorf("GET %s with the cookie: %d", p, r.StatusCode)
		}
	}
	if r := get(t, e.url("/ui/cluster"), map[string]string{"Cookie": ck.Name + "=" + strings.Repeat("0", len(ck.Value))}); r.StatusCode != 401 {
		t.Errorf("forged cookie: %d, want 401", r.StatusCode)
	}
	// The login form: a wrong token stays out, the right one lands on next;
	// next never leaves the console.
	post := func(tok, next string) *http.Response {
		resp, err := noRedirect.PostForm(e.url("/ui/login"), url.Values{"token": {tok}, "next": {next}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if r := post("bad", "/ui/kv"); r.StatusCode != 401 || len(r.Cookies()) != 0 {
		t.Errorf("login with a wrong token: %d, %d cookies", r.StatusCode, len(r.Cookies()))
	}
	if r := post(token, "/ui/kv"); r.StatusCode != 303 || r.Header.Get("Location") != "/ui/kv" || len(r.Cookies()) != 1 {
		t.Errorf("login: %d to %q", r.StatusCode, r.Header.Get("Location"))
	}
	for _, next := range []string{"//evil.example/ui/", "https://evil.example/", "/ui/\\evil", "javascript:alert(1)"} {
		if r := post(token, next); r.Header.Get("Location") != "/ui/cluster" {
			t.Errorf("login with next=%q redirects to %q", next, r.Header.Get("Location"))
		}
	}
	// Static files need no token; unknown pages are 404; the root leads to /ui/.
	if r := get(t, e.url("/ui/static/console.js"), nil); r.StatusCode != 200 || !strings.Contains(r.Header.Get("Content-Type"), "javascript") {
		t.Errorf("console.js: %d %s", r.StatusCode, r.Header.Get("Content-Type"))
	}
	if r := get(t, e.url("/ui/nope"), map[string]string{"Cookie": ck.Name + "=" + ck.Value}); r.StatusCode != 404 {
		t.Errorf("/ui/nope: %d", r.StatusCode)
	}
	if r := get(t, e.url("/"), nil); r.StatusCode != http.StatusFound || r.Header.Get("Location") != "/ui/" {
		t.Errorf("/: %d to %q", r.StatusCode, r.Header.Get("Location"))
	}
	if r := get(t, e.url("/ui/"), map[string]string{"Cookie": ck.Name + "=" + ck.Value}); r.StatusCode != http.StatusFound {
		t.Errorf("/ui/: %d", r.StatusCode)
	}
	// The API itself still wants its bearer token, not the cookie.
	if r := get(t, e.url("/v1/status"), map[string]string{"Cookie": ck.Name + "=" + ck.Value}); r.StatusCode != 401 {
		t.Errorf("/v1/status with only the console cookie: %d", r.StatusCode)
	}
}

func cookieOf(t *testing.T, r *http.Response) *http.Cookie {
	t.Helper()
	for _, c := range r.Cookies() {
		if c.Name == "gd2fs_console" {
			return c
		}
	}
	t.Fatal("no gd2fs_console cookie set")
	return nil
}

// testEscapes checks hostile file names and session ids show as text on
// the pages (the template escapes them) and in the JSON views.
func testEscapes(t *testing.T, e *env) {
	auth := map[string]string{"Authorization": "Bearer " + token}
	for _, p := range []string{"/ui/models", "/ui/sessions", "/ui/sessions?id=" + url.QueryEscape(evilSession)} {
		b := body(t, get(t, e.url(p), auth))
		for _, bad := range []string{`<script>alert`, `<img src=x`, `onerror=alert(1)>`} {
			if strings.Contains(b, bad) {
				t.Errorf("%s: page holds %q unescaped", p, bad)
			}
		}
		if strings.Count(b, "<script") != 1 { // console.js only
			t.Errorf("%s: %d script elements, want 1", p, strings.Count(b, "<script"))
		}
	}
	models := body(t, get(t, e.url("/ui/models"), auth))
	if !strings.Contains(models, `&lt;script&gt;alert(&#34;dir&#34;)&lt;/script&gt;`) || !strings.Contains(models, `w&lt;img src=x onerror=alert(1)&gt;.bin`) {
		t.Errorf("models page does not show the hostile names as text")
	}
	one := body(t, get(t, e.url("/ui/sessions?id="+url.QueryEscape(evilSession)), auth))
	if !strings.Contains(one, `Session &lt;script&gt;alert(&#34;session&#34;)&lt;img src=x onerror=alert(2)&gt;`) || !strings.Contains(one, `id="session-bar"`) {
		t.Errorf("session page does not show the hostile id as text with its bar")
	}
	if !strings.Contains(one, `href="/ui/sessions?id=%3Cscript%3Ealert%28%22session%22%29%3Cimg&#43;src%3Dx&#43;onerror%3Dalert%282%29%3E"`) {
		t.Errorf("session link not URL-encoded")
	}
	if !strings.Contains(one, `value="&lt;script&gt;alert(&#34;session&#34;)&lt;img src=x onerror=alert(2)&gt;"`) {
		t.Errorf("search box does not hold the id as an attribute value")
	}
	js := body(t, get(t, e.url("/ui/api/sessions?id="+url.QueryEscape(evilSession)), auth))
	if strings.Contains(js, "<script>") || !strings.Contains(js, `\u003cscript\u003ealert(\"session\")\u003cimg src=x onerror=alert(2)\u003e`) {
		t.Errorf("JSON view holds the hostile id raw")
	}
}

// TestConsoleServerDown stops a server holding HA replicas and checks the
// cluster page's banners; a cluster without a token needs no login.
func TestConsoleServerDown(t *testing.T) {
	ctx := context.Background()
	c, err := cluster.Start(ctx, cluster.Config{Dir: t.TempDir(), MemBytes: 32 << 20, DownAfter: time.Second, RepairAfter: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl := c.Client()
	defer cl.Close()
	f, err := cl.Create(ctx, "/ha.bin", client.CreateOptions{Pool: "ha", ChunkSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	f.Write(make([]byte, 2<<20))
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	c.Servers[2].Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := cl.Status(ctx)
		if err == nil && st.Servers[2].State == "down" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("server-2 never went down")
		}
		time.Sleep(50 * time.Millisecond) // polling a condition
	}
	r := get(t, c.Master.URL()+"/ui/api/cluster", nil)
	var v struct {
		Banners []struct{ Level, Text string }
	}
	if err := json.NewDecoder(r.Body).Decode(&v); err != nil || r.StatusCode != 200 {
		t.Fatalf("%d %v", r.StatusCode, err)
	}
	r.Body.Close()
	var texts []string
	for _, b := range v.Banners {
		texts = append(texts, b.Level+": "+b.Text)
	}
	all := strings.Join(texts, "\n")
	if !strings.Contains(all, "error: 1 server(s) down: server-2") ||
		!strings.Contains(all, "warn: 2 HA chunk(s) under-replicated") || !strings.Contains(all, "down 1h0m0s") {
		t.Errorf("banners:\n%s", all)
	}
	page := body(t, get(t, c.Master.URL()+"/ui/cluster", nil))
	if !strings.Contains(page, `class="banner error" role="alert">1 server(s) down: server-2`) {
		t.Error("cluster page has no down banner")
	}
	if !strings.Contains(page, `<footer class="version">gd2fs `+version.Get().String()+`</footer>`) {
		t.Error("cluster page has no version footer")
	}
	if strings.Contains(page, "log out") { // no token: nothing to log out of
		t.Error("a cluster without a token shows log out")
	}
}

// TestConsoleStandby: a second master on the same SQLite file is a standby;
// its console points at the leader and raises no down-server alarm (a
// standby hears no heartbeats, so every server looks down from there).
func TestConsoleStandby(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	c, err := cluster.Start(ctx, cluster.Config{Dir: dir, MemBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ms, err := meta.Open(ctx, "sqlite://"+filepath.Join(dir, "meta.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	m2, err := master.New(ctx, master.Config{Listen: "127.0.0.1:0", Meta: ms})
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	go m2.Run(ctx)
	if m2.Leader() {
		t.Fatal("the second master leads")
	}
	b := body(t, get(t, m2.URL()+"/ui/cluster", nil))
	if !strings.Contains(b, "This master is a standby: live figures are on the leader, "+c.Master.URL()) {
		t.Error("no standby banner naming the leader")
	}
	if strings.Contains(b, "down:") || strings.Contains(b, "under-replicated (a replica") {
		t.Error("a standby raises server alarms")
	}
}
