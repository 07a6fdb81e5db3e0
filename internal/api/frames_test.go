package api

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/internal/frames"
)

// framedMaster answers plain requests and framed connections with h.
func framedMaster(t *testing.T, h http.HandlerFunc) *httptest.Server {
	fs := &frames.Server{}
	var top http.Handler
	top = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == frames.Path {
			fs.Upgrade(w, r, top)
			return
		}
		h(w, r)
	})
	srv := httptest.NewServer(top)
	t.Cleanup(func() { fs.Close(); srv.Close() })
	return srv
}

// TestFramedFailover: a call on a framed connection fails over as a plain
// call does. A master that takes the call and never answers costs an
// idempotent call one HTTP.Timeout, then the next master answers it; a
// master that never answers the upgrade, or is not there, got nothing, so
// even a call that may not be repeated goes on to the next.
func TestFramedFailover(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	var hung, answered atomic.Int32
	hang := framedMaster(t, func(w http.ResponseWriter, r *http.Request) {
		hung.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	good := framedMaster(t, func(w http.ResponseWriter, r *http.Request) {
		answered.Add(1)
		w.Write([]byte(`{}`))
	})
	silent, err := net.Listen("tcp", "127.0.0.1:0") // takes connections, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	newClient := func(base string) *Client {
		return &Client{Base: base, RetryFor: -1, HTTP: &http.Client{Timeout: 300 * time.Millisecond}, Frames: &frames.Client{}}
	}
	ctx := context.Background()

	c := newClient(hang.URL + "," + good.URL)
	if err := c.Do(ctx, "POST", "/v1/sessions/s/commit", struct{}{}, nil); err != nil {
		t.Fatalf("an idempotent call to a master that hangs, then to one that answers: %v", err)
	}
	if hung.Load() != 1 || answered.Load() != 1 {
		t.Fatalf("%d calls hung, %d answered; want 1 and 1", hung.Load(), answered.Load())
	}
	for _, first := range []string{"http://" + silent.Addr().String(), deadAddr(t)} {
		c := newClient(first + "," + good.URL)
		if err := c.Do(ctx, "POST", "/v1/sessions/s/plan", struct{}{}, nil); err != nil { // no request id: not to be repeated
			t.Fatalf("a call that may not be repeated, first master %s (never upgraded): %v", first, err)
		}
	}
	if answered.Load() != 3 {
		t.Fatalf("%d calls answered, want 3", answered.Load())
	}
	// The caller's own context ending is final, on a framed call too.
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	c = newClient(hang.URL + "," + good.URL)
	c.HTTP.Timeout = time.Minute
	if err := c.Do(cctx, "POST", "/v1/sessions/s/commit", struct{}{}, nil); err == nil || cctx.Err() == nil || answered.Load() != 3 {
		t.Fatalf("a call whose context ended: %v, %d answered", err, answered.Load())
	}
}
