package router

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/internal/connpool"
)

// newUpstream is a router's engine client with the given dialer. Off
// Linux it hands every request to net/http's Transport: nothing of its own
// to test.
func newUpstream(t *testing.T, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *upstream {
	if !connpool.Peeks {
		t.Skip("the router's own engine client runs on Linux only")
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if dial != nil {
		tr.DialContext = dial
	}
	return &upstream{tr: tr, maxIdle: 8, idleFor: time.Minute}
}

// post sends body to url through u and returns the answer's body, read
// whole.
func post(t *testing.T, ctx context.Context, u *upstream, url, body string) (string, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := u.RoundTrip(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// rawServer is an engine on a loopback listener closed with t that
// answers each request of a connection with the raw bytes answer gives for
// its path and body, and ends the connection after one whose more is
// false. It returns the URL and the counts of connections and requests.
func rawServer(t *testing.T, answer func(path string, body []byte) (out string, more bool)) (string, *atomic.Int64, *atomic.Int64) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range open {
			c.Close() // ends a serve waiting on a connection the client keeps
		}
		mu.Unlock()
		wg.Wait()
	})
	var conns, reqs atomic.Int64
	serve := func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			body, err := io.ReadAll(req.Body)
			if err != nil {
				return
			}
			reqs.Add(1)
			out, more := answer(req.URL.Path, body)
			if _, err := io.WriteString(c, out); err != nil || !more {
				return
			}
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
			conns.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				serve(c)
			}()
		}
	}()
	return "http://" + l.Addr().String(), &conns, &reqs
}

// TestUpstreamAnswers: what net/http's Transport reads, the router's own
// client reads the same: a chunked answer with trailers, an answer after
// informational ones (103, 100), an answer of known length; connections
// are kept between answers and closed after "Connection: close".
func TestUpstreamAnswers(t *testing.T) {
	url, conns, reqs := rawServer(t, func(path string, body []byte) (string, bool) {
		switch path {
		case "/chunked":
			return "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n3\r\nabc\r\n" +
				"4\r\n" + string(body[:4]) + "\r\n0\r\nX-Sum: 7\r\n\r\n", true
		case "/hints":
			return "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 100 Continue\r\n\r\n" +
				"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", true
		case "/close":
			return "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nbye", false
		}
		return "HTTP/1.1 200 OK\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + string(body), true
	})
	u := newUpstream(t, nil)
	defer u.pool.Close()
	ctx := context.Background()
	for i, c := range []struct{ path, body, want string }{
		{"/echo", "hello", "hello"},
		{"/chunked", "wxyz!", "abcwxyz"},
		{"/hints", "x", "ok"},
		{"/echo", strings.Repeat("k", 100<<10), strings.Repeat("k", 100<<10)},
	} {
		got, err := post(t, ctx, u, url+c.path, c.body)
		if err != nil || got != c.want {
			t.Fatalf("request %d %s: %.40q, %v; want %.40q", i, c.path, got, err, c.want)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("4 answers read whole took %d connections, want 1 kept", n)
	}
	if got, err := post(t, ctx, u, url+"/close", "x"); err != nil || got != "bye" {
		t.Fatalf("/close: %q, %v", got, err)
	}
	if got, err := post(t, ctx, u, url+"/echo", "again"); err != nil || got != "again" {
		t.Fatalf("after Connection: close: %q, %v", got, err)
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2: a new one after the engine's Connection: close", n)
	}
	if reqs.Load() != 6 {
		t.Fatalf("the engine saw %d requests, want 6", reqs.Load())
	}
}

// TestUpstreamTrailers: a chunked answer's trailers reach the caller.
func TestUpstreamTrailers(t *testing.T) {
	url, _, _ := rawServer(t, func(string, []byte) (string, bool) {
		return "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n2\r\nab\r\n0\r\nX-Sum: 7\r\n\r\n", false
	})
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := newUpstream(t, nil).RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || string(b) != "ab" || resp.Trailer.Get("X-Sum") != "7" {
		t.Fatalf("body %q (%v), trailer %v", b, err, resp.Trailer)
	}
}

// flakyConn fails its next write (closing itself first) when armed: an
// engine that closed a kept connection just as it was taken.
type flakyConn struct {
	net.Conn
	arm *atomic.Bool
}

func (c flakyConn) Write(b []byte) (int, error) {
	if c.arm.CompareAndSwap(true, false) {
		c.Conn.Close()
		return 0, errors.New("flaky: connection reset")
	}
	return c.Conn.Write(b)
}

// TestUpstreamRetry: a request whose write fails on a kept connection is
// sent once more on a new one (the engine cannot have read it whole); one
// whose answer fails after the request was written is not (the engine may
// have run it), and neither is a request that fails on a new connection.
func TestUpstreamRetry(t *testing.T) {
	url, conns, seen := rawServer(t, func(_ string, b []byte) (string, bool) {
		if string(b) == "drop" {
			return "", false // read, then the connection ends without an answer
		}
		return "HTTP/1.1 200 OK\r\nContent-Length: " + strconv.Itoa(len(b)) + "\r\n\r\n" + string(b), true
	})
	var arm atomic.Bool
	d := &net.Dialer{}
	u := newUpstream(t, func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return flakyConn{c, &arm}, nil
	})
	ctx := context.Background()
	if got, err := post(t, ctx, u, url, "one"); err != nil || got != "one" {
		t.Fatalf("first: %q, %v", got, err)
	}
	arm.Store(true)
	if got, err := post(t, ctx, u, url, "two"); err != nil || got != "two" {
		t.Fatalf("a kept connection whose write failed: %q, %v; want the request sent again on a new one", got, err)
	}
	if conns.Load() != 2 || seen.Load() != 2 {
		t.Fatalf("%d connections, %d requests seen; want 2 and 2", conns.Load(), seen.Load())
	}
	if _, err := post(t, ctx, u, url, "drop"); err == nil {
		t.Fatal("an answer that never came: no error")
	}
	if seen.Load() != 3 {
		t.Fatalf("the engine saw %d requests, want 3: a request it read is not sent twice", seen.Load())
	}
	// A new connection whose write fails: no second try.
	u2 := newUpstream(t, u.tr.DialContext)
	arm.Store(true)
	if _, err := post(t, ctx, u2, url, "three"); err == nil {
		t.Fatal("a write that failed on a new connection: no error")
	}
	if seen.Load() != 3 {
		t.Fatalf("the engine saw %d requests, want 3", seen.Load())
	}
}

// countedServer is an engine of net/http serving h, closed with t, and
// its count of connections.
func countedServer(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int64) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &conns
}

// TestUpstreamIdleClosed: connections the engine closed while they were
// idle (its idle timeout, a restart) are not used: every request gets its
// answer, on a new connection.
func TestUpstreamIdleClosed(t *testing.T) {
	var seen atomic.Int64
	srv, conns := countedServer(t, func(w http.ResponseWriter, r *http.Request) {
		seen.Add(1)
		io.Copy(w, r.Body)
	})
	u := newUpstream(t, nil)
	defer u.pool.Close()
	for i := range 20 {
		want := "n" + strconv.Itoa(i)
		if got, err := post(t, context.Background(), u, srv.URL, want); err != nil || got != want {
			t.Fatalf("request %d: %q, %v", i, got, err)
		}
		if i%2 == 1 {
			srv.CloseClientConnections() // the kept connection too
		}
	}
	if seen.Load() != 20 || conns.Load() != 10 {
		t.Fatalf("the engine saw %d requests on %d connections, want 20 on 10", seen.Load(), conns.Load())
	}
}

// TestUpstreamCancel: a request whose context ends while the engine works
// returns at once with the context's error, and its connection is not
// kept (the engine sees it closed).
func TestUpstreamCancel(t *testing.T) {
	started, gone := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			io.ReadAll(r.Body) // read whole: the server then watches the connection
			close(started)
			<-r.Context().Done() // the router closed the connection
			close(gone)
			return
		}
		io.WriteString(w, "fast")
	}))
	defer srv.Close()
	u := newUpstream(t, nil)
	defer u.pool.Close()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := post(t, ctx, u, srv.URL+"/slow", "x")
		errc <- err
	}()
	<-started
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled request: %v, want context.Canceled", err)
	}
	select {
	case <-gone:
	case <-time.After(10 * time.Second):
		t.Fatal("the engine's request was not ended by the router's cancel")
	}
	if got, err := post(t, context.Background(), u, srv.URL+"/fast", "x"); err != nil || got != "fast" {
		t.Fatalf("after a cancel: %q, %v", got, err)
	}
}

// TestUpstreamBodyClosedEarly: an answer closed before its end closes its
// connection; one read whole keeps it.
func TestUpstreamBodyClosedEarly(t *testing.T) {
	srv, conns := countedServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Write(bytes.Repeat([]byte("z"), 64<<10))
	})
	u := newUpstream(t, nil)
	defer u.pool.Close()
	req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := u.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := resp.Body.Read(make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if _, err := resp.Body.Read(make([]byte, 10)); !errors.Is(err, errBodyClosed) {
		t.Fatalf("read after Close: %v", err)
	}
	for range 2 {
		if got, err := post(t, context.Background(), u, srv.URL, "x"); err != nil || len(got) != 64<<10 {
			t.Fatalf("%d bytes, %v", len(got), err)
		}
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2: the closed answer's, then one kept for two answers", n)
	}
}

// TestUpstreamReplay: a GET on a kept connection that the engine closes
// without a byte of an answer is sent again (it may be sent twice); the
// POST case is TestUpstreamRetry's "drop".
func TestUpstreamReplay(t *testing.T) {
	var drops atomic.Int64
	url, conns, seen := rawServer(t, func(path string, body []byte) (string, bool) {
		if path == "/flaky" && drops.Add(1) == 1 {
			return "", false
		}
		return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", true
	})
	u := newUpstream(t, nil)
	defer u.pool.Close()
	if got, err := post(t, context.Background(), u, url+"/first", "x"); err != nil || got != "ok" {
		t.Fatalf("first: %q, %v", got, err)
	}
	req, err := http.NewRequest(http.MethodGet, url+"/flaky", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := u.RoundTrip(req)
	if err != nil {
		t.Fatalf("a GET the engine dropped on a kept connection: %v; want it sent again", err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || string(b) != "ok" || seen.Load() != 3 || conns.Load() != 2 {
		t.Fatalf("%q, %v; the engine saw %d requests on %d connections, want 3 on 2", b, err, seen.Load(), conns.Load())
	}
}

// TestUpstreamNoBody: an answer without a body (204, HEAD) frees its
// connection at once, read or not.
func TestUpstreamNoBody(t *testing.T) {
	srv, conns := countedServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	u := newUpstream(t, nil)
	defer u.pool.Close()
	for _, m := range []string{http.MethodPost, http.MethodHead, http.MethodPost} {
		req, err := http.NewRequest(m, srv.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := u.RoundTrip(req)
		if err != nil || resp.StatusCode != http.StatusNoContent {
			t.Fatalf("%s: %v, %v", m, resp, err)
		}
		resp.Body.Close() // not read
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections for three answers without a body, want 1", n)
	}
}
