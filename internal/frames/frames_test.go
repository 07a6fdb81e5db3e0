package frames

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestCodec(t *testing.T) {
	h := http.Header{"Authorization": {"Bearer x"}, "X-A": {"1", "2"}}
	b, err := AppendRequest([]byte("keep"), http.MethodPost, "/v1/sessions/plans?x=1", h, []byte(`{"a":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if string(b[:4]) != "keep" {
		t.Fatalf("AppendRequest overwrote what was before: %q", b[:4])
	}
	var pre [4]byte
	copy(pre[:], b[4:])
	n, err := Length(pre, MaxRequest)
	if err != nil || n != len(b)-8 {
		t.Fatalf("length %d, %v; want %d", n, err, len(b)-8)
	}
	r, err := ParseRequest(b[8:])
	if err != nil {
		t.Fatal(err)
	}
	if r.Method != http.MethodPost || r.Path != "/v1/sessions/plans?x=1" || string(r.Body) != `{"a":1}` || !reflect.DeepEqual(r.Header, h) {
		t.Fatalf("parsed %+v", r)
	}
	a, err := AppendAnswer(nil, 503, http.Header{"Retry-After": {"1"}}, []byte("no"))
	if err != nil {
		t.Fatal(err)
	}
	ans, err := ParseAnswer(a[4:])
	if err != nil || ans.Status != 503 || ans.Header.Get("Retry-After") != "1" || string(ans.Body) != "no" {
		t.Fatalf("answer %+v, %v", ans, err)
	}

	// What cannot be framed is refused before anything is written.
	for _, c := range []struct {
		method, path string
		h            http.Header
		body         int
	}{
		{"PATCH", "/x", nil, 0},
		{"GET", "x", nil, 0},
		{"GET", "", nil, 0},
		{"POST", "/x", nil, MaxRequest},
		{"POST", "/x", http.Header{"K": make([]string, MaxHeaders+1)}, 0},
		{"POST", "/x", http.Header{strings.Repeat("k", 256): {"v"}}, 0},
		{"POST", "/x", http.Header{"K": {strings.Repeat("v", 1<<16)}}, 0},
	} {
		if b, err := AppendRequest([]byte("k"), c.method, c.path, c.h, make([]byte, c.body)); err == nil || string(b) != "k" {
			t.Errorf("%s %q: %q, %v; want an error and nothing appended", c.method, c.path, b, err)
		}
	}
	if _, err := AppendAnswer(nil, 42, nil, nil); err == nil {
		t.Error("status 42 framed")
	}
	// A length over the bound is refused before anything is allocated.
	binary.BigEndian.PutUint32(pre[:], MaxRequest+1)
	if _, err := Length(pre, MaxRequest); !errors.Is(err, ErrFrame) {
		t.Errorf("length over the bound: %v", err)
	}
	binary.BigEndian.PutUint32(pre[:], 0xffffffff)
	if _, err := Length(pre, MaxAnswer); !errors.Is(err, ErrFrame) {
		t.Errorf("length 2^32-1: %v", err)
	}
	// Cut or bad frames.
	for _, b := range [][]byte{nil, {2}, {9, 0, 1, '/', 0}, {2, 0, 5, '/', 0}, {2, 0, 1, 'x', 0}, {2, 0, 2, '/', ' ', 0},
		{2, 0, 1, '/'}, {2, 0, 1, '/', 1}, {2, 0, 1, '/', 1, 1, 'k', 0, 9, 'v'}, {2, 0, 1, '/', 1, 0, 0, 0}, {2, 0, 1, '/', 33},
		{2, 0, 1, '/', 1, 1, ':', 0, 0}, {2, 0, 1, '/', 1, 1, 'k', 0, 1, '\n'}} {
		if r, err := ParseRequest(b); !errors.Is(err, ErrFrame) {
			t.Errorf("ParseRequest(%q) = %+v, %v; want ErrFrame", b, r, err)
		}
	}
	for _, b := range [][]byte{nil, {0, 200}, {0, 10, 0}, {4, 0, 0}, {0, 200, 1}} {
		if a, err := ParseAnswer(b); !errors.Is(err, ErrFrame) {
			t.Errorf("ParseAnswer(%q) = %+v, %v; want ErrFrame", b, a, err)
		}
	}
}

// FuzzParseRequest: any bytes parse or fail with ErrFrame, and what
// parses frames again to the same request.
func FuzzParseRequest(f *testing.F) {
	b, _ := AppendRequest(nil, http.MethodPost, "/v1/sessions/plans", http.Header{"A": {"b"}}, []byte("{}"))
	f.Add(b[4:])
	f.Add([]byte{1, 0, 1, '/', 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseRequest(b)
		if err != nil {
			if !errors.Is(err, ErrFrame) {
				t.Fatalf("error without ErrFrame: %v", err)
			}
			return
		}
		again, err := AppendRequest(nil, r.Method, r.Path, r.Header, r.Body)
		if err != nil {
			t.Fatalf("a parsed request does not frame again: %v", err)
		}
		r2, err := ParseRequest(again[4:])
		if err != nil || r2.Method != r.Method || r2.Path != r.Path || !bytes.Equal(r2.Body, r.Body) || !reflect.DeepEqual(r2.Header, r.Header) {
			t.Fatalf("%+v framed again parses as %+v, %v", r, r2, err)
		}
	})
}

// FuzzParseAnswer: the same for answers.
func FuzzParseAnswer(f *testing.F) {
	b, _ := AppendAnswer(nil, 200, http.Header{"Content-Type": {"application/json"}}, []byte("{}"))
	f.Add(b[4:])
	f.Add([]byte{0, 200, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := ParseAnswer(b)
		if err != nil {
			if !errors.Is(err, ErrFrame) {
				t.Fatalf("error without ErrFrame: %v", err)
			}
			return
		}
		again, err := AppendAnswer(nil, a.Status, a.Header, a.Body)
		if err != nil {
			t.Fatalf("a parsed answer does not frame again: %v", err)
		}
		a2, err := ParseAnswer(again[4:])
		if err != nil || a2.Status != a.Status || !bytes.Equal(a2.Body, a.Body) || !reflect.DeepEqual(a2.Header, a.Header) {
			t.Fatalf("%+v framed again parses as %+v, %v", a, a2, err)
		}
	})
}

// testServer is an HTTP server with the upgrade route and a few handlers.
type testServer struct {
	*httptest.Server
	fs       *Server
	upgrades atomic.Int64
	plain    atomic.Int64 // requests that came as plain HTTP
	release  chan struct{}
}

func newTestServer(t *testing.T, tls bool, refuse bool) *testServer {
	ts := &testServer{fs: &Server{Idle: time.Minute, Read: time.Minute, Write: time.Minute}, release: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /echo", func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil || int64(len(b)) != r.ContentLength {
			http.Error(w, fmt.Sprintf("body %d bytes of %d: %v", len(b), r.ContentLength, err), 500)
			return
		}
		w.Header().Set("X-Seen", r.Method+" "+r.URL.Path+"?"+r.URL.RawQuery+" "+r.Header.Get("Authorization")+" "+r.Header.Get("X-A")+" "+r.Host)
		w.Write(b)
	})
	mux.HandleFunc("POST /close", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		w.WriteHeader(503)
	})
	mux.HandleFunc("POST /panic", func(w http.ResponseWriter, r *http.Request) { panic("a handler's bug") })
	mux.HandleFunc("POST /wait", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-ts.release:
		case <-r.Context().Done():
		}
	})
	mux.HandleFunc("POST /big", func(w http.ResponseWriter, r *http.Request) {
		// Past MaxAnswer in pieces: what was written before must not go
		// out as a whole answer.
		for range MaxAnswer / (1 << 20) {
			if _, err := w.Write(make([]byte, 1<<20)); err != nil {
				return
			}
		}
	})
	var top http.Handler
	top = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == Path {
			if refuse {
				http.NotFound(w, r)
				return
			}
			ts.upgrades.Add(1)
			ts.fs.Upgrade(w, r, top)
			return
		}
		if _, framed := w.(*respWriter); !framed {
			ts.plain.Add(1)
		}
		mux.ServeHTTP(w, r)
	})
	if tls {
		ts.Server = httptest.NewTLSServer(top)
	} else {
		ts.Server = httptest.NewServer(top)
	}
	t.Cleanup(func() { ts.fs.Close(); ts.Close() })
	return ts
}

func (ts *testServer) client() *Client {
	return &Client{Transport: ts.Client().Transport.(*http.Transport), Header: http.Header{"Authorization": {"Bearer tok"}}}
}

func TestServeAndCall(t *testing.T) {
	for _, tls := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", tls), func(t *testing.T) {
			ts := newTestServer(t, tls, false)
			c := ts.client()
			defer c.Close()
			ctx := context.Background()
			for i := range 5 {
				body := []byte(strings.Repeat("x", i*1000))
				a, err := c.Do(ctx, ts.URL, http.MethodPost, "/echo?i="+fmt.Sprint(i), http.Header{"X-A": {"a"}}, body, false)
				if err != nil {
					t.Fatal(err)
				}
				host := strings.TrimPrefix(strings.TrimPrefix(ts.URL, "http://"), "https://")
				if a.Status != 200 || !bytes.Equal(a.Body, body) || a.Header.Get("X-Seen") != fmt.Sprintf("POST /echo?i=%d Bearer tok a %s", i, host) {
					t.Fatalf("call %d: %d %q %q", i, a.Status, a.Header.Get("X-Seen"), a.Body[:min(len(a.Body), 20)])
				}
			}
			if n := ts.upgrades.Load(); n != 1 {
				t.Fatalf("%d upgrades for 5 calls one after another, want 1", n)
			}
			if n := ts.plain.Load(); n != 0 {
				t.Fatalf("%d calls came as plain HTTP", n)
			}
			// Concurrent calls each take a connection of their own.
			var wg sync.WaitGroup
			for i := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					a, err := c.Do(ctx, ts.URL, http.MethodPost, "/echo", nil, []byte{byte(i)}, false)
					if err != nil || a.Status != 200 || len(a.Body) != 1 || a.Body[0] != byte(i) {
						t.Errorf("concurrent call %d: %+v, %v", i, a, err)
					}
				}()
			}
			wg.Wait()
			if n := ts.upgrades.Load(); n < 2 || n > 9 {
				t.Fatalf("%d upgrades after 8 concurrent calls", n)
			}
			if got, want := ts.fs.Open(), ts.upgrades.Load(); got != want {
				t.Fatalf("%d connections open on the server, want %d", got, want)
			}
		})
	}
}

func TestHandlerAnswers(t *testing.T) {
	ts := newTestServer(t, false, false)
	c := ts.client()
	defer c.Close()
	ctx := context.Background()
	// A panic is answered 500; the connection serves on.
	a, err := c.Do(ctx, ts.URL, http.MethodPost, "/panic", nil, nil, false)
	if err != nil || a.Status != 500 {
		t.Fatalf("a panicking handler: %+v, %v", a, err)
	}
	// An answer over MaxAnswer is refused, not sent.
	a, err = c.Do(ctx, ts.URL, http.MethodPost, "/big", nil, nil, false)
	if err != nil || a.Status != 500 || !strings.Contains(string(a.Body), "plain HTTP") {
		t.Fatalf("an answer too large: %d %q, %v", a.Status, a.Body[:min(len(a.Body), 200)], err)
	}
	if n := ts.upgrades.Load(); n != 1 {
		t.Fatalf("%d upgrades, want 1", n)
	}
	// Connection: close is obeyed on both sides.
	a, err = c.Do(ctx, ts.URL, http.MethodPost, "/close", nil, nil, false)
	if err != nil || a.Status != 503 {
		t.Fatalf("a closing answer: %+v, %v", a, err)
	}
	if _, err := c.Do(ctx, ts.URL, http.MethodPost, "/echo", nil, nil, false); err != nil {
		t.Fatal(err)
	}
	if n := ts.upgrades.Load(); n != 2 {
		t.Fatalf("%d upgrades, want 2 (a new connection after Connection: close)", n)
	}
}

func TestRefusedUpgrade(t *testing.T) {
	ts := newTestServer(t, false, true)
	c := ts.client()
	for range 3 {
		if _, err := c.Do(context.Background(), ts.URL, http.MethodPost, "/echo", nil, nil, false); !errors.Is(err, ErrNotUsed) {
			t.Fatalf("a server without the route: %v, want ErrNotUsed", err)
		}
	}
	if n := ts.plain.Load(); n != 0 {
		t.Fatalf("%d plain calls", n)
	}
	// Tried once, then remembered for Retry.
	var tries atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { tries.Add(1); http.NotFound(w, r) }))
	defer srv.Close()
	c = &Client{Transport: srv.Client().Transport.(*http.Transport)}
	for range 3 {
		c.Do(context.Background(), srv.URL, http.MethodPost, "/echo", nil, nil, false)
	}
	if n := tries.Load(); n != 1 {
		t.Fatalf("%d upgrades tried, want 1", n)
	}
	// A dead address is a transport error (the caller's dial error), not
	// ErrNotUsed.
	if _, err := c.Do(context.Background(), "http://127.0.0.1:1", http.MethodPost, "/echo", nil, nil, false); err == nil || errors.Is(err, ErrNotUsed) {
		t.Fatalf("a dead address: %v", err)
	}
}

func TestCancelAndClose(t *testing.T) {
	ts := newTestServer(t, false, false)
	c := ts.client()
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.Do(ctx, ts.URL, http.MethodPost, "/wait", nil, nil, false); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a call whose context ends: %v", err)
	}
	// The connection was closed with the call; the next call opens another.
	if _, err := c.Do(context.Background(), ts.URL, http.MethodPost, "/echo", nil, nil, false); err != nil {
		t.Fatal(err)
	}
	if n := ts.upgrades.Load(); n != 2 {
		t.Fatalf("%d upgrades, want 2", n)
	}
	// Close ends a handler in progress (its context) and the connection.
	done := make(chan error, 1)
	go func() {
		_, err := c.Do(context.Background(), ts.URL, http.MethodPost, "/wait", nil, nil, false)
		done <- err
	}()
	for ts.fs.Calls() < 3 {
		time.Sleep(time.Millisecond)
	}
	ts.fs.Close()
	if err := <-done; err == nil {
		t.Fatal("a call in flight when the server closed succeeded")
	}
	for ts.fs.Open() != 0 {
		time.Sleep(time.Millisecond)
	}
}

// TestClosedWhileIdle: a kept connection that the master closed while it
// was idle (its idle timeout, a restart, a failover) is found closed
// before it is used, so even a call that may not be sent twice goes on a
// new one.
func TestClosedWhileIdle(t *testing.T) {
	for _, tls := range []bool{false, true} {
		ts := newTestServer(t, tls, false)
		c := ts.client()
		defer c.Close()
		ctx := context.Background()
		for i := range 2 {
			if _, err := c.Do(ctx, ts.URL, http.MethodPost, "/echo", nil, nil, false); err != nil {
				t.Fatal(err)
			}
			ts.fs.mu.Lock()
			for nc := range ts.fs.conns {
				nc.Close()
			}
			ts.fs.mu.Unlock()
			for ts.fs.Open() != 0 {
				time.Sleep(time.Millisecond)
			}
			if a, err := c.Do(ctx, ts.URL, http.MethodPost, "/echo", nil, []byte("r"), false); err != nil || string(a.Body) != "r" {
				t.Fatalf("tls %v, round %d: a call after the master closed the kept connection: %+v, %v", tls, i, a, err)
			}
		}
	}
}

// TestReplay: a call on a kept connection that fails before any byte of
// its answer is sent again on a new connection when it may be sent twice,
// and fails when it may not.
func TestReplay(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var frames atomic.Int64
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				br := bufio.NewReader(nc)
				if _, err := http.ReadRequest(br); err != nil {
					return
				}
				fmt.Fprintf(nc, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", Protocol)
				for {
					var pre [4]byte
					if _, err := io.ReadFull(br, pre[:]); err != nil {
						return
					}
					n, _ := Length(pre, MaxRequest)
					if _, err := io.ReadFull(br, make([]byte, n)); err != nil {
						return
					}
					if frames.Add(1)%2 == 0 {
						return // every second frame: closed without an answer
					}
					a, _ := AppendAnswer(nil, 200, nil, []byte("ok"))
					nc.Write(a)
				}
			}()
		}
	}()
	base := "http://" + ln.Addr().String()
	c := &Client{Transport: &http.Transport{}}
	defer c.Close()
	ctx := context.Background()
	if a, err := c.Do(ctx, base, http.MethodPost, "/x", nil, nil, true); err != nil || string(a.Body) != "ok" {
		t.Fatalf("first call: %+v, %v", a, err)
	}
	// The second frame is dropped on the kept connection; the call goes
	// again on a new one, as the third frame.
	if a, err := c.Do(ctx, base, http.MethodPost, "/x", nil, nil, true); err != nil || string(a.Body) != "ok" || frames.Load() != 3 {
		t.Fatalf("a call that may be sent twice, dropped: %+v, %v after %d frames", a, err, frames.Load())
	}
	// The fourth is dropped and not sent again.
	if _, err := c.Do(ctx, base, http.MethodPost, "/x", nil, nil, false); err == nil || errors.Is(err, ErrNotSent) || frames.Load() != 4 {
		t.Fatalf("a call that may not be sent twice, dropped: %v after %d frames", err, frames.Load())
	}
}

// TestAllow: a frame the server does not take is answered 400 and the
// connection serves on.
func TestAllow(t *testing.T) {
	ts := newTestServer(t, false, false)
	ts.fs.Allow = func(method, path string) bool { return path != "/panic" }
	c := ts.client()
	defer c.Close()
	a, err := c.Do(context.Background(), ts.URL, http.MethodPost, "/panic?x=1", nil, nil, false)
	if err != nil || a.Status != 400 || !strings.Contains(string(a.Body), "plain HTTP") {
		t.Fatalf("a refused call: %d %s, %v", a.Status, a.Body, err)
	}
	if _, err := c.Do(context.Background(), ts.URL, http.MethodPost, "/echo", nil, nil, false); err != nil || ts.upgrades.Load() != 1 {
		t.Fatalf("after a refused call: %v, %d upgrades", err, ts.upgrades.Load())
	}
}

// TestTakes: a call of a family the master does not name in its upgrade
// (a file's commit, to an older master) is not sent framed (ErrNotUsed:
// the caller sends it as plain HTTP) and its connection stays for the
// calls that are; to a master that names it, it goes framed.
func TestTakes(t *testing.T) {
	ts := newTestServer(t, false, false)
	c := ts.client()
	defer c.Close()
	ctx := context.Background()
	if _, err := c.Do(ctx, ts.URL, http.MethodPost, "/v1/commit/f", nil, nil, true); !errors.Is(err, ErrNotUsed) {
		t.Fatalf("a commit to a master that does not take it framed: %v, want ErrNotUsed", err)
	}
	if a, err := c.Do(ctx, ts.URL, http.MethodPost, "/echo", nil, []byte("x"), true); err != nil || string(a.Body) != "x" || ts.upgrades.Load() != 1 {
		t.Fatalf("the next call: %+v, %v after %d upgrades, want the same connection", a, err, ts.upgrades.Load())
	}
	// With no idle connection, the master's last word is enough: no
	// upgrade to find out again.
	c.Close()
	if _, err := c.Do(ctx, ts.URL, http.MethodPost, "/v1/commit/f", nil, nil, true); !errors.Is(err, ErrNotUsed) || ts.upgrades.Load() != 1 {
		t.Fatalf("a commit with no idle connection: %v after %d upgrades, want ErrNotUsed after 1", err, ts.upgrades.Load())
	}
	// A master that takes commits: they go framed (a new client, as after
	// a restart; Close ends a client's pool for good).
	ts.fs.Takes = []string{"other", CallCommit}
	c = ts.client()
	defer c.Close()
	if _, err := c.Do(ctx, ts.URL, http.MethodPost, "/echo", nil, nil, true); err != nil || ts.upgrades.Load() != 2 {
		t.Fatalf("a session call: %v after %d upgrades", err, ts.upgrades.Load())
	}
	a, err := c.Do(ctx, ts.URL, http.MethodPost, "/v1/commit/f", nil, nil, true)
	if err != nil || a.Status != http.StatusNotFound || ts.upgrades.Load() != 2 {
		t.Fatalf("a commit to a master that takes it: %+v, %v after %d upgrades; want the test mux's 404 on the session call's connection", a, err, ts.upgrades.Load())
	}
	// A session file's stat is its own family: not taken by this master.
	if _, err := c.Do(ctx, ts.URL, http.MethodGet, "/v1/files/kv-sessions/s/kv-1", nil, nil, true); !errors.Is(err, ErrNotUsed) {
		t.Fatalf("a session file's stat to a master that does not name it: %v, want ErrNotUsed", err)
	}
	for call, want := range map[[2]string]string{
		{http.MethodGet, "/v1/files/kv-sessions/s/kv-1"}: CallStat, {http.MethodGet, "/v1/files/data/x"}: "",
		{http.MethodPost, "/v1/commit/kv-sessions/s/kv-1"}: CallCommit, {http.MethodGet, "/v1/commit/x"}: "",
	} {
		if got := family(call[0], call[1]); got != want {
			t.Errorf("family(%s %s) = %q, want %q", call[0], call[1], got, want)
		}
	}
}

// TestServerRefusesBadFrames: a frame over the bound, or one that does not
// parse, closes the connection without an answer; the server serves on.
func TestServerRefusesBadFrames(t *testing.T) {
	ts := newTestServer(t, false, false)
	for _, frame := range [][]byte{
		binary.BigEndian.AppendUint32(nil, MaxRequest+1),
		append(binary.BigEndian.AppendUint32(nil, 3), 7, 0, 0),
		append(binary.BigEndian.AppendUint32(nil, 5), 2, 0, 1, 'x', 0),
	} {
		nc, err := net.Dial("tcp", ts.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(nc, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", Path, Protocol)
		br := bufio.NewReader(nc)
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 101 {
			t.Fatalf("upgrade: %v, %v", resp, err)
		}
		nc.Write(frame)
		nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		if b, err := io.ReadAll(br); err != nil || len(b) != 0 {
			t.Fatalf("after a bad frame %x: read %q, %v; want the connection closed", frame[:min(len(frame), 8)], b, err)
		}
		nc.Close()
	}
	// A plain GET of the route is told what it takes.
	resp, err := http.Get(ts.URL + Path)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Fatalf("a GET without Upgrade: %s", resp.Status)
	}
	c := ts.client()
	defer c.Close()
	if _, err := c.Do(context.Background(), ts.URL, http.MethodPost, "/echo", nil, nil, false); err != nil {
		t.Fatal(err)
	}
}
