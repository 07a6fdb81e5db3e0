package server_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/gd2fs/gd2fs/internal/tcp"
	"github.com/gd2fs/gd2fs/internal/testutil"
	"github.com/gd2fs/gd2fs/internal/wire"
)

// heartbeats is the number of heartbeats the master has answered.
func heartbeats(t *testing.T, c *cluster.Cluster) int {
	return testutil.MasterRequests(t, c.Master.URL(), "POST /v1/servers/heartbeat")
}

// TestFutureEpochBounded: frames that claim an epoch the master never
// reached cost the master at most one heartbeat per server per quarter
// second, not one per frame (issue 22 finding 6).
func TestFutureEpochBounded(t *testing.T) {
	// DownAfter 20s: the servers' own heartbeats come every 4 s, so what
	// the master sees below is the refreshes.
	c, err := cluster.Start(context.Background(), cluster.Config{Dir: t.TempDir(), MemBytes: 8 << 20, KVMemBytes: 8 << 20, DownAfter: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := tcp.NewPool(tcp.Options{Name: "liar"})
	defer p.Close()
	ctx := context.Background()
	before := heartbeats(t, c)
	start := time.Now()
	const frames = 600
	for i := range frames {
		for _, s := range c.Servers {
			// Most keys are another server's: each asks for a refresh.
			_, err := p.KVPut(ctx, s.Addr(), wire.KVRef{Pool: "perf", Key: []byte(fmt.Sprint("k", i))}, 1<<40, []byte("v"), true, 0)
			if err != nil && !errors.Is(err, errs.ErrMoved) {
				t.Fatal(err)
			}
		}
	}
	elapsed := time.Since(start)
	got := heartbeats(t, c) - before
	limit := len(c.Servers) * (int(elapsed/(250*time.Millisecond)) + 2)
	if got > limit {
		t.Fatalf("%d frames with a future epoch cost %d heartbeats in %s; at most %d", frames*len(c.Servers), got, elapsed, limit)
	}
	t.Logf("%d frames, %d heartbeats, %s", frames*len(c.Servers), got, elapsed)
}
