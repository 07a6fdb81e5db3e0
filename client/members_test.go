package client_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/gd2fs/gd2fs/internal/testutil"
)

// membersCalls is how many GET /v1/members the master has answered.
func membersCalls(t *testing.T, c *cluster.Cluster) int {
	return testutil.MasterRequests(t, c.Master.URL(), "GET /v1/members")
}

// TestMovedRefreshShared: a batch whose every put meets "moved" (a server
// joined since the client read the map) refreshes the map about once, not
// once per key (issue 22 finding 6, the client's side).
func TestMovedRefreshShared(t *testing.T) {
	c, err := cluster.Start(context.Background(), cluster.Config{Dir: t.TempDir(), Servers: 1, MemBytes: 8 << 20, KVMemBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	cl := c.Client()
	defer cl.Close()
	kv := cl.KV("perf")
	if err := kv.Put(ctx, "first", []byte("v")); err != nil { // the client now holds the one-server map
		t.Fatal(err)
	}
	for i := 1; i < 4; i++ {
		if _, err := c.AddServer(i); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.WaitServers(ctx, 4); err != nil {
		t.Fatal(err)
	}
	// The first server learns the new map before the batch (its next
	// heartbeat, within a second), so it answers "moved" for the keys it
	// no longer owns.
	var ms api.Membership
	if err := (&api.Client{Base: c.Master.URL()}).Do(ctx, "GET", "/v1/members", nil, &ms); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(10 * time.Second); c.Servers[0].Epoch() < ms.Epoch && time.Now().Before(end); {
		time.Sleep(20 * time.Millisecond) // the server's heartbeat timer, not a race
	}
	if c.Servers[0].Epoch() < ms.Epoch { // newer is fine: a later heartbeat may move the epoch on
		t.Fatalf("server 0 at epoch %d, the master at %d", c.Servers[0].Epoch(), ms.Epoch)
	}
	keys := make([]string, 512)
	vals := make([][]byte, len(keys))
	for i := range keys {
		keys[i], vals[i] = fmt.Sprint("k", i), []byte("v")
	}
	before := membersCalls(t, c)
	if err := kv.BatchPut(ctx, keys, vals); err != nil {
		t.Fatal(err)
	}
	if got := membersCalls(t, c) - before; got < 1 || got > 8 {
		t.Fatalf("a batch of %d moved keys made %d membership calls", len(keys), got)
	}
	got, err := kv.BatchGet(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range got {
		if string(v) != "v" {
			t.Fatalf("key %s: %q", keys[i], v)
		}
	}
}
