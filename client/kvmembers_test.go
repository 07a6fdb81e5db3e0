package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/gd2fs/gd2fs/internal/testutil"
)

// TestKVMembersLagJoin: a membership list fetched as a server joins can
// lack it for a moment (the master publishes a new list with its new
// epoch). A put to a pool that needs every server then looks again
// before failing with "start more servers" (CI saw that failure once, in
// TestKVKeyLimits, right after a cluster started).
func TestKVMembersLagJoin(t *testing.T) {
	c := start(t, cluster.Config{KVMemBytes: 8 << 20})
	u, err := url.Parse(c.Master.URL())
	if err != nil {
		t.Fatal(err)
	}
	// The servers registered (start waits for that) may not all be in
	// the KV membership yet: the lagging list below is cut from the whole.
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		resp, err := http.Get(c.Master.URL() + "/v1/members")
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		var m api.Membership
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
			return false, err.Error()
		}
		return len(m.Members) == 3, fmt.Sprintf("%d members", len(m.Members))
	})
	var fetches atomic.Int64
	proxy := httputil.NewSingleHostReverseProxy(u)
	lagging := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/members" || fetches.Add(1) > 1 {
			proxy.ServeHTTP(w, r)
			return
		}
		// The first list: the real one less its last server.
		resp, err := http.Get(c.Master.URL() + "/v1/members")
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		var m api.Membership
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil || len(m.Members) != 3 {
			http.Error(w, "unexpected membership", http.StatusBadGateway)
			return
		}
		m.Members = m.Members[:2]
		json.NewEncoder(w).Encode(m)
	}))
	defer lagging.Close()
	cl, err := client.New(client.Config{Master: lagging.URL})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.KV("ha").Put(context.Background(), "k", []byte("v")); err != nil {
		t.Fatalf("put to a pool of 3 copies after a list of 2 servers: %v", err)
	}
	if n := fetches.Load(); n != 2 {
		t.Fatalf("the membership was fetched %d times, want 2 (the lagging list, then the real one)", n)
	}
}
