package console_test

import (
	"fmt"
	"net/http"
	"net/url"
	"testing"
)

// TestLogoutEndsCookie: each log-in has its own cookie; after log out it
// no longer opens a page; a log-in expires (issue 22 finding 12).
func TestLogoutEndsCookie(t *testing.T) {
	e := setup(t)
	login := func() *http.Cookie {
		r, err := noRedirect.PostForm(e.url("/ui/login"), url.Values{"token": {token}, "next": {"/ui/kv"}})
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		return cookieOf(t, r)
	}
	a, b := login(), login()
	if a.Value == b.Value {
		t.Fatal("two log-ins share a cookie")
	}
	open := func(ck *http.Cookie) int {
		r := get(t, e.url("/ui/cluster"), map[string]string{"Cookie": ck.Name + "=" + ck.Value})
		r.Body.Close()
		return r.StatusCode
	}
	if open(a) != 200 || open(b) != 200 {
		t.Fatal("a fresh cookie is refused")
	}
	req, _ := http.NewRequest("POST", e.url("/ui/logout"), nil)
	req.AddCookie(a)
	r, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if code := open(a); code != 401 {
		t.Fatalf("the cookie still opens pages after log out: %d", code)
	}
	if open(b) != 200 {
		t.Fatal("logging out one log-in ended another")
	}
}

// TestSafeNext: the page after log-in stays inside /ui/, dot segments and
// their escapes included (issue 22 finding 13).
func TestSafeNext(t *testing.T) {
	e := setup(t)
	for in, want := range map[string]string{
		"/ui/kv":                     "/ui/kv",
		"/ui/sessions?id=chat-a":     "/ui/sessions?id=chat-a",
		"/ui/../../metrics":          "/ui/cluster",
		"/ui/%2e%2e/%2e%2e/metrics":  "/ui/cluster",
		"/ui/./kv":                   "/ui/cluster",
		"/ui//evil":                  "/ui/cluster",
		"//evil.example/ui/":         "/ui/cluster",
		"https://evil.example/ui/":   "/ui/cluster",
		"/ui/\\evil":                 "/ui/cluster",
		"/metrics":                   "/ui/cluster",
		"/ui/..":                     "/ui/cluster",
		"/ui/%2E%2E/v1/list/?x=/ui/": "/ui/cluster",
	} {
		r, err := noRedirect.PostForm(e.url("/ui/login"), url.Values{"token": {token}, "next": {in}})
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if got := r.Header.Get("Location"); got != want {
			t.Errorf("log in with next=%q goes to %q, want %q", in, got, want)
		}
	}
}

// TestStaticNoListing: /ui/static/ serves files, not a listing of them
// (issue 22 finding 17).
func TestStaticNoListing(t *testing.T) {
	e := setup(t)
	for _, p := range []string{"/ui/static/"} {
		r := get(t, e.url(p), nil)
		r.Body.Close()
		if r.StatusCode != 404 {
			t.Errorf("GET %s: %d, want 404", p, r.StatusCode)
		}
	}
	r := get(t, e.url("/ui/static/console.js"), nil)
	r.Body.Close()
	if r.StatusCode != 200 {
		t.Errorf("console.js: %d", r.StatusCode)
	}
}

// TestLoginGuessesThrottled: the log-in form stops checking tokens from an
// address after a burst of wrong ones (issue 22 finding 14).
func TestLoginGuessesThrottled(t *testing.T) {
	e := setup(t)
	for i := range 30 {
		r, err := noRedirect.PostForm(e.url("/ui/login"), url.Values{"token": {fmt.Sprint("guess-", i)}, "next": {"/ui/kv"}})
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode != 401 {
			t.Fatalf("guess %d: %d", i, r.StatusCode)
		}
	}
	r, err := noRedirect.PostForm(e.url("/ui/login"), url.Values{"token": {token}, "next": {"/ui/kv"}})
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != 401 {
		t.Fatalf("the right token was checked right after 30 wrong ones: %d", r.StatusCode)
	}
}
