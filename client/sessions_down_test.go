package client_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/gd2fs/gd2fs/internal/testutil"
)

// TestPlanAvoidsDownServer: when the server holding a session's stored
// bytes goes down, the plan's stored part ends before them (shortened:
// server_down) instead of sending the engine there; its fresh range goes
// to a server that is up, and the turn completes. The session keeps the
// ranges until that commit replaces them.
func TestPlanAvoidsDownServer(t *testing.T) {
	c := start(t, cluster.Config{Servers: 2, DownAfter: 500 * time.Millisecond})
	cl := c.Client()
	defer cl.Close()
	ctx := context.Background()
	ss := cl.Sessions()
	if err := ss.SetLayout(ctx, tiny); err != nil {
		t.Fatal(err)
	}
	turn := func(n int64) client.Plan {
		t.Helper()
		p, err := ss.Plan(ctx, "d", client.PlanRequest{Model: "tiny", TokenIDs: seq(1, n)})
		if err != nil {
			t.Fatal(err)
		}
		var size int64
		for _, r := range p.Fresh {
			size += r.KVLength
		}
		if _, err := ss.WriteAndCommit(ctx, "d", p, kvBytes("d", 0, size/tiny.TokenBytes())[:size]); err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := turn(32)
	if len(p.FreshFiles) == 0 || len(p.FreshFiles[0].Chunks) == 0 {
		t.Fatalf("no placed chunks in %+v", p)
	}
	holder := p.FreshFiles[0].Chunks[0].Replicas[0].Server
	for _, s := range c.Servers {
		if s.ID() == holder {
			s.Close()
		}
	}
	testutil.Eventually(t, 20*time.Second, func() (bool, string) {
		st, err := cl.Status(ctx)
		if err != nil {
			return false, err.Error()
		}
		for _, s := range st.Servers {
			if s.ID == holder {
				return s.State == "down", fmt.Sprintf("%s is %s", holder, s.State)
			}
		}
		return false, "no " + holder
	})
	q := turn(48)
	if q.Shortened != "server_down" || q.ShortenedTokens != 32 || q.CachedTokens != 0 || len(q.Stored) != 0 {
		t.Fatalf("plan with the stored bytes' server down: %+v", q)
	}
	for _, ch := range q.FreshFiles[0].Chunks {
		for _, r := range ch.Replicas {
			if r.Server == holder {
				t.Fatalf("fresh chunk placed on the server that is down: %+v", ch)
			}
		}
	}
	if s, err := ss.Get(ctx, "d"); err != nil || s.Tokens != 48 {
		t.Fatalf("after the shortened turn: %+v %v", s, err)
	}
}
