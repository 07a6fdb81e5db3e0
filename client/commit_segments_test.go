package client_test

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/gd2fs/gd2fs/internal/limits"
)

// TestCommitTooManySegments: a commit of more saved segments than
// limits.MaxSavedSegments is refused with a 400 before the master asks any
// server what it holds (each segment would be a question to every replica);
// a commit of many segments in one chunk asks its replicas once.
func TestCommitTooManySegments(t *testing.T) {
	c := start(t, cluster.Config{})
	cl := c.Client()
	defer cl.Close()
	ctx := context.Background()
	ss := cl.Sessions()
	l := client.Layout{Model: "m", Layers: 2, KVHeads: 2, HeadDim: 8, DType: "bf16", PageTokens: 16, Order: "kv_first"}
	if err := ss.SetLayout(ctx, l); err != nil {
		t.Fatal(err)
	}
	p, err := ss.PlanEngine(ctx, "s1", client.PlanRequest{Model: "m", TokenIDs: seq(0, 64)})
	if err != nil {
		t.Fatal(err)
	}
	fr := p.KVCacheParams.Fresh[0]
	if err := writeZeros(ctx, cl, fr.KVURI, fr.KVStart, l.RangeBytes(64)); err != nil {
		t.Fatal(err)
	}
	page := l.RangeBytes(16)
	seg := func(i int64) map[string]any {
		return map[string]any{"token_start": 16 * i, "token_length": 16, "kv_uri": fr.KVURI, "kv_start": fr.KVStart + i*page, "kv_length": page}
	}
	before := heldAsks(t, c.Master.URL())
	many := make([]any, limits.MaxSavedSegments+1)
	for i := range many {
		many[i] = seg(0)
	}
	code, body := post(t, c.Master.URL()+"/v1/sessions/s1/commit", map[string]any{"fresh_kvcache": many})
	if code != http.StatusBadRequest || !strings.Contains(body, "saved segments") {
		t.Fatalf("%d segments: %d %s", len(many), code, body)
	}
	if n := heldAsks(t, c.Master.URL()); n != before {
		t.Fatalf("a refused commit asked the servers %d times", n-before)
	}
	// Four segments in one chunk: each replica is asked once.
	code, body = post(t, c.Master.URL()+"/v1/sessions/s1/commit", map[string]any{"fresh_kvcache": []any{seg(0), seg(1), seg(2), seg(3)}})
	if code != http.StatusOK {
		t.Fatalf("4 segments: %d %s", code, body)
	}
	if n := heldAsks(t, c.Master.URL()) - before; n < 1 || n > 3 {
		t.Fatalf("4 segments in one chunk: %d questions to servers, want one per replica", n)
	}
}

// heldAsks reads the master's gd2fs_master_held_asks_total.
func heldAsks(t *testing.T, master string) int64 {
	t.Helper()
	resp, err := http.Get(master + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "gd2fs_master_held_asks_total "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return int64(n)
		}
	}
	t.Fatal("no gd2fs_master_held_asks_total in the master's /metrics")
	return 0
}
