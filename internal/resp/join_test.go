package resp_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/gd2fs/gd2fs/internal/testutil"
)

// TestFastPathAcrossJoin: a fourth server joins three, with the background
// move held back (KVMoveRate 1 B/s), so the blocks stay on their owners
// under the old map. Each key is then read through the RESP door of its new
// owner, which serves it from its own tiers (the in-process fast path):
// that path must fall back to the earlier owner as the binary protocol
// does (a hit, the bytes last put), EXISTS and STRLEN too, and an
// overwrite there must leave no stale copy behind on the earlier owner.
func TestFastPathAcrossJoin(t *testing.T) {
	ctx := context.Background()
	c, err := cluster.Start(ctx, cluster.Config{Dir: t.TempDir(), Servers: 3, MemBytes: 8 << 20, KVMemBytes: 64 << 20, RESP: true, KVMoveRate: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	r := dial(t, c.RESP[0].Addr())
	const n = 200
	val := func(i int) string { return fmt.Sprintf("value-%d-%s", i, string(make([]byte, i%7))) }
	for i := 0; i < n; i++ {
		if i%5 == 1 { // a TTL, which a move must carry
			eq(t, "SET EX", r.do("SET", fmt.Sprint("j", i), val(i), "EX", "1000"), "+OK\r\n")
			continue
		}
		eq(t, "SET", r.do("SET", fmt.Sprint("j", i), val(i)), "+OK\r\n")
	}
	if _, err := c.AddServer(3); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitServers(ctx, 4); err != nil {
		t.Fatal(err)
	}
	epoch := func() int64 { return c.Servers[3].Epoch() }
	testutil.Eventually(t, 20*time.Second, func() (bool, string) {
		for _, s := range c.Servers {
			if s.Epoch() != epoch() || len(s.Membership().Members) != 4 {
				return false, fmt.Sprintf("%s at epoch %d, server-3 at %d", s.ID(), s.Epoch(), epoch())
			}
		}
		return true, ""
	})
	cl := c.Client()
	defer cl.Close()
	kv := cl.KV("perf")
	if err := cl.RefreshMembers(ctx); err != nil {
		t.Fatal(err)
	}
	doors := map[string]*rconn{}
	moved := 0
	for i := 0; i < n; i++ {
		k := fmt.Sprint("j", i)
		ids, err := kv.Owners(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if ids[0] != "server-3" {
			continue
		}
		if _, held := c.Servers[3].KVExistsLocal("perf", []byte(k)); held {
			continue // moved already (the mover's first block)
		}
		moved++
		d := doors[ids[0]]
		if d == nil {
			d = dial(t, c.RESP[3].Addr())
			doors[ids[0]] = d
		}
		if i%3 == 0 {
			eq(t, "EXISTS "+k, d.do("EXISTS", k), ":1\r\n")
			eq(t, "STRLEN "+k, d.do("STRLEN", k), fmt.Sprintf(":%d\r\n", len(val(i))))
		}
		eq(t, "GET "+k+" on its new owner", d.do("GET", k), bulk(val(i)))
		if i%5 == 1 {
			if _, held := c.Servers[3].KVExistsLocal("perf", []byte(k)); !held {
				t.Fatalf("%s: the read on its new owner did not move it there", k)
			}
			got := d.do("TTL", k)
			if got != ":1000\r\n" && got != ":999\r\n" && got != ":998\r\n" {
				t.Fatalf("%s moved to its new owner with TTL %q, want about 1000", k, got)
			}
		}
		if i%2 == 0 {
			eq(t, "overwrite", d.do("SET", k, "new"), "+OK\r\n")
			for j, s := range c.Servers[:3] {
				if _, held := s.KVExistsLocal("perf", []byte(k)); held {
					t.Fatalf("%s: server %d still holds the old bytes after an overwrite on the new owner", k, j)
				}
			}
			eq(t, "GET after overwrite", r.do("GET", k), bulk("new"))
		}
	}
	if moved < 20 {
		t.Fatalf("only %d keys moved to the new server and stayed behind: the test tested little", moved)
	}
}
