package cluster

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/internal/testutil"
)

// TestKVHistorySurvivesMasterRestart: a server joins and another is drained
// with background moves held still (every block stays where it was put),
// then the master restarts. The new master still lists the drained server as
// draining and names the earlier member lists, so every block is found at
// its earlier owner (read-through), bytes checked. A master that kept the
// history in memory only forgot both: the drained server came back as a
// member and the blocks owned by the new server were misses.
//
// DownAfter is 5 s, not 1 s: on a loaded machine a server that misses
// heartbeats for a second drops out of the list and back, and each such
// change pushes an earlier list out of the two the history keeps.
func TestKVHistorySurvivesMasterRestart(t *testing.T) {
	ctx := context.Background()
	c := startKVWith(t, 3, func(cfg *Config) { cfg.KVMoveRate = 1 })
	cl := c.Client()
	defer cl.Close()
	kv := cl.KV("perf")
	keys, vals := putBlocks(ctx, t, kv, "h", 400)
	if _, err := c.AddServer(3); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitServers(ctx, 4); err != nil {
		t.Fatal(err)
	}
	drained := c.Servers[1].ID()
	if _, err := cl.DrainServer(ctx, drained, false); err != nil {
		t.Fatal(err)
	}
	held := c.Servers[1].KV().Stats().Keys
	if held == 0 {
		t.Fatal("the drained server holds no blocks: the test moves nothing")
	}

	if err := c.RestartMaster(ctx); err != nil {
		t.Fatal(err)
	}
	cl2 := c.Client()
	defer cl2.Close()
	// Every server has the new master's map.
	testutil.Eventually(t, 30*time.Second, func() (bool, string) {
		st, err := cl2.Status(ctx)
		if err != nil {
			return false, err.Error()
		}
		for _, s := range c.Servers {
			if s.Epoch() < st.Epoch {
				return false, fmt.Sprintf("%s at epoch %d, master %d", s.ID(), s.Epoch(), st.Epoch)
			}
		}
		return true, ""
	})
	st, err := cl2.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st.Servers {
		if s.ID == drained && s.State != "draining" {
			t.Fatalf("after the master restart the drained server is %q, want draining", s.State)
		}
	}
	got, err := cl2.KV("perf").BatchGet(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	var miss []string
	for i, k := range keys {
		if !bytes.Equal(got[i], vals[i]) {
			if got[i] != nil {
				t.Fatalf("key %s: wrong bytes after the master restart", k)
			}
			miss = append(miss, k)
		}
	}
	if len(miss) > 0 {
		for _, s := range c.Servers {
			t.Logf("%s epoch %d moves %+v", s.ID(), s.Epoch(), s.KVMoves())
		}
		st, _ := cl2.Status(ctx)
		t.Logf("status epoch %d servers %+v", st.Epoch, st.Servers)
		for _, k := range miss[:3] {
			var where []string
			for _, s := range c.Servers {
				if _, h := s.KVExistsLocal("perf", []byte(k)); h {
					where = append(where, s.ID())
				}
			}
			t.Logf("miss %s held by %v", k, where)
		}
		t.Fatalf("after the master restart %d of %d blocks missed (e.g. %v); the drained server held %d", len(miss), len(keys), miss[:min(3, len(miss))], held)
	}
}
