package client_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/cluster"
)

// TestPlanWarmsStoredRanges: a plan whose stored range lies on the disk tier
// only has the master ask the server to copy its chunk into DRAM, so the
// engine's load that follows is a DRAM read; with warming off the load has to
// bring the chunk in from disk; the warmed chunk is not pinned (other reads
// push it out again). Bytes are checked on every load.
func TestPlanWarmsStoredRanges(t *testing.T) {
	const mb = 1 << 20
	c := start(t, cluster.Config{Servers: 1, MemBytes: 4 * mb, DiskBytes: 256 * mb})
	cl := c.Client()
	defer cl.Close()
	ctx := context.Background()
	ss := cl.Sessions()
	l, want := warmFirstTurn(t, ss)

	// A filler file of four 1 MiB chunks, read whole, fills the 4 MiB DRAM
	// tier and pushes the session's chunk out to disk only.
	filler := make([]byte, 4*mb)
	f, err := cl.Create(ctx, "/filler", client.CreateOptions{Pool: "perf", ChunkSize: mb})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(filler); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	evict := func() {
		t.Helper()
		f, err := cl.Open(ctx, "/filler")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.ReadAt(filler, 0); err != nil {
			t.Fatal(err)
		}
	}
	srv := c.Servers[0]
	// load plans the next turn, waits for the master's warming of it and
	// the server's copies, loads the stored range and reports whether the
	// load had to bring a chunk in from disk.
	load := func(turn int) (fromDisk bool) {
		t.Helper()
		p, err := ss.Plan(ctx, "s", client.PlanRequest{Model: l.Model, TokenIDs: seq(0, int64(128+16*turn))})
		if err != nil {
			t.Fatal(err)
		}
		if p.CachedTokens != 128 {
			t.Fatalf("turn %d: %d tokens cached, want 128", turn, p.CachedTokens)
		}
		c.Master.WaitPlanWarm()
		srv.WaitChunkPrefetches()
		before := srv.Store().Stats()
		got := make([]byte, p.LoadBytes)
		if _, err := ss.LoadStored(ctx, p, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("turn %d: the stored range reads other bytes", turn)
		}
		after := srv.Store().Stats()
		return after.ReadPromotions > before.ReadPromotions
	}

	c.Master.SetPlanWarm(false)
	evict()
	if !load(1) {
		t.Fatal("without warming, the load after the eviction found the chunk in DRAM: the test does not evict")
	}
	c.Master.SetPlanWarm(true)
	evict()
	if load(2) {
		t.Fatal("with warming, the load read its chunk from disk: the plan did not warm it")
	}
	asked, _ := c.Master.WaitPlanWarm()
	started, _ := srv.WaitChunkPrefetches()
	if asked == 0 || started == 0 {
		t.Fatalf("master asked %d chunk copies, the server started %d", asked, started)
	}
	if c.Master.PlanWarmFromMemory() == 0 {
		t.Fatal("the leading master read the session file's chunks for warming from SQL, not from its memory")
	}
	// Not pinned: the warmed chunk leaves DRAM like any other.
	c.Master.SetPlanWarm(false)
	evict()
	if !load(3) {
		t.Fatal("a warmed chunk stayed in DRAM past a DRAM's worth of other reads: pinned?")
	}
}

// TestPlanWarmSkipsServersWithoutDisk: a server with no disk tier holds a
// chunk in DRAM or not at all, so a plan's stored range on it is not
// warmed: no request to the server (it cost 7 % of turns/s in gd2fs-bench
// turns). Fails if warming asks such a server.
func TestPlanWarmSkipsServersWithoutDisk(t *testing.T) {
	c, err := cluster.Start(context.Background(), cluster.Config{Dir: t.TempDir(), Servers: 1, MemBytes: 64 << 20}) // DiskBytes 0: DRAM only
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl := c.Client()
	defer cl.Close()
	ctx := context.Background()
	ss := cl.Sessions()
	l, _ := warmFirstTurn(t, ss)
	p, err := ss.Plan(ctx, "s", client.PlanRequest{Model: l.Model, TokenIDs: seq(0, 144)})
	if err != nil {
		t.Fatal(err)
	}
	if p.CachedTokens != 128 {
		t.Fatalf("%d tokens cached, want 128", p.CachedTokens)
	}
	if asked, _ := c.Master.WaitPlanWarm(); asked != 0 {
		t.Fatalf("the master asked a server without a disk tier for %d chunk copies into DRAM", asked)
	}
}

// warmFirstTurn sets the warming tests' layout (8 KiB of KV per token: 128
// tokens are one chunk of 1 MiB) and stores 128 tokens in session "s" by a
// plan, a write and a commit; it returns the layout and the bytes written.
func warmFirstTurn(t *testing.T, ss *client.Sessions) (client.Layout, []byte) {
	t.Helper()
	ctx := context.Background()
	l := client.Layout{Model: "warm", Layers: 4, KVHeads: 4, HeadDim: 128, DType: "fp16", PageTokens: 16, Order: "page_first"}
	if err := ss.SetLayout(ctx, l); err != nil {
		t.Fatal(err)
	}
	p, err := ss.Plan(ctx, "s", client.PlanRequest{Model: l.Model, TokenIDs: seq(0, 128)})
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte("kv-bytes"), int(l.RangeBytes(128))/8)
	if err := ss.WriteFresh(ctx, p, want); err != nil {
		t.Fatal(err)
	}
	if _, err := ss.Commit(ctx, "s", p.PlanID); err != nil {
		t.Fatal(err)
	}
	return l, want
}
