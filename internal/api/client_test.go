package api

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/errs"
)

// deadAddr is a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}

func writeErrJSON(w http.ResponseWriter, code int, e Error, retry bool) {
	w.Header().Set("Content-Type", "application/json")
	if retry {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(code)
	w.Write([]byte(`{"error":"` + e.Error + `","code":"` + e.Code + `"}`))
}

// cut answers nothing: it closes the connection after reading the request,
// as a master SIGKILLed mid-request does.
func cut(w http.ResponseWriter) {
	c, _, err := w.(http.Hijacker).Hijack()
	if err == nil {
		c.Close()
	}
}

// A dead master and a standby that takes a while to lead: Do waits for it.
func TestDoWaitsForLeader(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= 3 {
			w.Header().Set(LeaderHeader, "http://gone")
			writeErrJSON(w, 503, Error{Error: "this master is a standby", Code: "unavailable"}, true)
			return
		}
		if calls.Load() <= 5 {
			writeErrJSON(w, 503, Error{Error: "waiting for heartbeats", Code: "unavailable"}, true)
			return
		}
		w.Write([]byte(`{"cluster":"x"}`))
	}))
	defer srv.Close()
	c := &Client{Base: deadAddr(t) + "," + srv.URL, RetryFor: 30 * time.Second}
	var st Status
	if err := c.Do(context.Background(), "POST", "/v1/sessions/s/plan", struct{}{}, &st); err != nil || st.Cluster != "x" {
		t.Fatalf("Do across a failover: %v %+v", err, st)
	}
}

// Past RetryFor, Do says no master led.
func TestDoGivesUp(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{}`)) }))
	c := &Client{Base: srv.URL, RetryFor: 300 * time.Millisecond}
	if err := c.Do(context.Background(), "GET", "/v1/status", nil, nil); err != nil {
		t.Fatal(err)
	}
	srv.Close() // the only master dies
	c.Base = srv.URL + "," + deadAddr(t)
	err := c.Do(context.Background(), "GET", "/v1/status", nil, nil)
	if !errors.Is(err, errs.ErrUnavailable) || !strings.Contains(err.Error(), "no master led within") {
		t.Fatalf("all masters dead: %v", err)
	}
	// Negative: one pass, no waiting, the plain error.
	c.RetryFor = -1
	if err := c.Do(context.Background(), "GET", "/v1/status", nil, nil); !errors.Is(err, errs.ErrUnavailable) || strings.Contains(err.Error(), "no master led") {
		t.Fatalf("one pass: %v", err)
	}
	// A context that ends first: the last error, and the context's.
	c.RetryFor = time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := c.Do(ctx, "GET", "/v1/status", nil, nil); !errors.Is(err, errs.ErrUnavailable) || !strings.Contains(err.Error(), "context ended") {
		t.Fatalf("context ended: %v", err)
	}
}

// A client that never reached a master, with every one refusing
// connections, fails at once: nothing runs there.
func TestDoFailsFastWithoutMaster(t *testing.T) {
	c := &Client{Base: deadAddr(t) + "," + deadAddr(t), RetryFor: time.Hour}
	err := c.Do(context.Background(), "GET", "/v1/status", nil, nil)
	if !errors.Is(err, errs.ErrUnavailable) || !strings.Contains(err.Error(), "is it running") {
		t.Fatalf("no master at all: %v", err)
	}
}

// A final answer (not found, a real 503 without Retry-After) is not retried.
func TestDoFinalAnswers(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if strings.HasPrefix(r.URL.Path, "/v1/files/") {
			writeErrJSON(w, 404, Error{Error: "no such file", Code: "not_found"}, false)
			return
		}
		writeErrJSON(w, 503, Error{Error: "placement needs 3 servers", Code: "unavailable"}, false)
	}))
	defer srv.Close()
	c := &Client{Base: srv.URL}
	if err := c.Do(context.Background(), "GET", "/v1/files/a", nil, nil); !errors.Is(err, errs.ErrNotFound) {
		t.Fatal(err)
	}
	if err := c.Do(context.Background(), "POST", "/v1/alloc/a", struct{}{}, nil); !errors.Is(err, errs.ErrUnavailable) {
		t.Fatal(err)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("%d calls for two final answers", n)
	}
}

// A request cut mid-way may have been applied: Do repeats it only when it
// is idempotent; a delete whose repeat finds nothing succeeded.
func TestDoCutRequests(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		switch {
		case n == 1:
			cut(w)
		case r.Method == "DELETE":
			writeErrJSON(w, 404, Error{Error: "no such file", Code: "not_found"}, false)
		default:
			w.Write([]byte(`{}`))
		}
	}))
	defer srv.Close()
	c := &Client{Base: srv.URL, RetryFor: 10 * time.Second}
	ctx := context.Background()

	if err := c.Do(ctx, "POST", "/v1/sessions/s/plan", struct{}{}, nil); err == nil || calls.Load() != 1 {
		t.Fatalf("a cut session plan was repeated (%d calls) or did not fail: %v", calls.Load(), err)
	}
	calls.Store(0)
	if err := c.Do(ctx, "POST", "/v1/sessions/s/plan?request_id=r1", struct{}{}, nil); err != nil || calls.Load() != 2 {
		t.Fatalf("a cut session plan with a request id: %v after %d calls", err, calls.Load())
	}
	calls.Store(0)
	if err := c.Do(ctx, "POST", "/v1/sessions/s/fork?request_id=r1", struct{}{}, nil); err != nil || calls.Load() != 2 {
		t.Fatalf("a cut fork with a request id: %v after %d calls", err, calls.Load())
	}
	calls.Store(0)
	if err := c.Do(ctx, "POST", "/v1/commit/a", struct{}{}, &struct{}{}); err != nil || calls.Load() != 2 {
		t.Fatalf("a cut commit: %v after %d calls", err, calls.Load())
	}
	calls.Store(0)
	if err := c.Do(ctx, "DELETE", "/v1/files/a", nil, nil); err != nil || calls.Load() != 2 {
		t.Fatalf("a cut delete: %v after %d calls", err, calls.Load())
	}
	calls.Store(1) // no cut: a plain not found stays one
	if err := c.Do(ctx, "DELETE", "/v1/files/a", nil, nil); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("delete of a missing file: %v", err)
	}
}

func TestIdempotent(t *testing.T) {
	for _, c := range []struct {
		method, path string
		want         bool
	}{
		{"GET", "/v1/status", true},
		{"PUT", "/v1/files/a", true},
		{"PUT", "/v1/attrs/a", true},
		{"POST", "/v1/alloc/a", true},
		{"POST", "/v1/commit/a", true},
		{"POST", "/v1/servers/heartbeat", true},
		{"DELETE", "/v1/files/a", true},
		{"POST", "/v1/sessions/s/plan", false},
		{"POST", "/v1/sessions/s/commit", true},
		{"POST", "/v1/sessions/s/fork", false},
		{"POST", "/v1/sessions/s/plan?request_id=r1", true},
		{"POST", "/v1/sessions/s/fork?request_id=r1", true},
		{"POST", "/v1/sessions/s/plan?request_id=", false},
		{"POST", "/v1/sessions/s/plan?x=1", false},
		{"POST", "/v1/sessions/s/commit?request_id=r1", true},
		{"POST", "/v1/prefixes?request_id=r1", false},
		{"POST", "/v1/prefixes", false},
		{"DELETE", "/v1/sessions/s", false},
		{"PUT", "/v1/models/m/layout", false},
		{"POST", "/v1/sessions/plans", true},   // the SDK names every plan of a batch
		{"POST", "/v1/sessions/commits", true}, // as each commit is
		{"GET", "/v1/sessions/commits", false},
	} {
		if got := Idempotent(c.method, c.path); got != c.want {
			t.Errorf("Idempotent(%s %s) = %v", c.method, c.path, got)
		}
	}
}

// TestDoNoRoute: a 404 or 405 without a gd2fs error (net/http's router of
// an older master) is ErrNoRoute; a gd2fs not_found, or a 500, is not.
func TestDoNoRoute(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/404":
			http.NotFound(w, r)
		case "/405":
			http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
		case "/gd2fs404":
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"error":"no session s","code":"not_found"}`))
		default:
			http.Error(w, "boom", http.StatusInternalServerError)
		}
	}))
	defer srv.Close()
	c := &Client{Base: srv.URL, RetryFor: -1}
	for path, want := range map[string]bool{"/404": true, "/405": true, "/gd2fs404": false, "/500": false} {
		err := c.Do(context.Background(), "POST", path, map[string]int{"a": 1}, nil)
		if err == nil {
			t.Fatalf("%s: no error", path)
		}
		if got := errors.Is(err, ErrNoRoute); got != want {
			t.Errorf("%s: errors.Is(%v, ErrNoRoute) = %v, want %v", path, err, got, want)
		}
	}
}
