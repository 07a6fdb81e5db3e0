package console_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/gd2fs/gd2fs/internal/cold"
	"github.com/gd2fs/gd2fs/internal/s3test"
	"github.com/gd2fs/gd2fs/internal/weights"
)

const token = "console-test-token"

// Names an attacker could choose: they must show as text everywhere.
const (
	evilDir     = `/models/<script>alert("dir")</script>`
	evilFile    = evilDir + `/w<img src=x onerror=alert(1)>.bin`
	evilSession = `<script>alert("session")<img src=x onerror=alert(2)>` // ids hold no "/"
)

var tiny = client.Layout{Model: "tiny", Layers: 2, KVHeads: 2, HeadDim: 8, DType: "bf16", PageTokens: 16, Order: "page_first"}

// env is a real cluster (master, 3 servers with KV tiers, a fake S3 on
// loopback) holding some files, KV blocks, sessions and a linked model, with
// the console's samples taken around the activity.
// reservedSession is planned and never committed: it owns bytes and no ranges.
const reservedSession = "chat-reserved"

type env struct {
	c  *cluster.Cluster
	cl *client.Client
	s3 *s3test.Server
	// What the pages should show.
	kvKeys, gets, misses int
	plans, evictions     int
	sessions             []string
	evilRanges           int
	modelFiles           int

	warmLinked int64 // bytes of the linked model read (one chunk)
}

func setup(t *testing.T) *env {
	t.Helper()
	ctx := context.Background()
	e := &env{s3: s3test.Start("AKID", "secret")}
	t.Cleanup(e.s3.Close)
	e.s3.CreateBucket("models")
	model := make([]byte, 3<<20)
	for i := range model {
		model[i] = byte(i * 13)
	}
	e.s3.Put("models", "org/tiny/model.safetensors", model)
	e.s3.Put("models", "org/tiny/config.json", []byte(`{"architectures": ["LlamaForCausalLM"]}`))
	cc := cold.Config{Endpoint: e.s3.URL, AccessKey: "AKID", SecretKey: "secret", Region: "us-east-1"}
	page := tiny.PageBytes()
	var err error
	e.c, err = cluster.Start(ctx, cluster.Config{Dir: t.TempDir(), MemBytes: 64 << 20, DiskBytes: 64 << 20,
		KVMemBytes: 1 << 20, KVDiskBytes: 32 << 20, Token: token, Cold: &cc, DownAfter: 3 * time.Second,
		SessionQuota: 40 * page})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.Close() })
	e.cl = e.c.Client()
	t.Cleanup(func() { e.cl.Close() })
	e.waitHeartbeat(t)
	e.sample(t)

	// Files: an HA file and a "pulled" model file with a hostile name.
	f, err := e.cl.Create(ctx, evilFile, client.CreateOptions{Pool: "ha", ChunkSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	f.Write(make([]byte, 1500<<10))
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.cl.SetAttrs(ctx, evilFile, map[string]string{"sha256": "ab" + fmt.Sprintf("%062x", 1)}); err != nil {
		t.Fatal(err)
	}
	// A linked model; reading its first MiB fills one chunk from S3.
	src, err := cold.New(cc)
	if err != nil {
		t.Fatal(err)
	}
	linked, err := weights.Link(ctx, e.cl, src, "s3://models/org/tiny", "/models/org/tiny", client.LinkOptions{ChunkSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	e.modelFiles = len(linked) + 1
	g, err := e.cl.Open(ctx, "/models/org/tiny/model.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.ReadAt(make([]byte, 1<<20), 0); err != nil {
		t.Fatal(err)
	}
	e.warmLinked = 1 << 20

	// KV blocks: 24 of 128 KiB over 3 MiB of DRAM in all, so some are
	// demoted to disk; then every one read back, and a few misses.
	kv := e.cl.KV("perf")
	block := make([]byte, 128<<10)
	for i := 0; i < 24; i++ {
		block[0] = byte(i)
		if err := kv.Put(ctx, fmt.Sprintf("llama/tp0/%04d", i), block); err != nil {
			t.Fatal(err)
		}
	}
	e.kvKeys = 24
	for _, k := range []string{"llama/tp0/0003", "llama/tp0/0004"} { // the KV page shows pins
		if _, _, err := kv.Retain(ctx, k, client.RetainOptions{Pin: "disk", SetTTL: true, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	e.waitKV(t)
	e.sample(t)
	buf := make([]byte, 128<<10)
	for round := 0; round < 2; round++ {
		for i := 0; i < 24; i++ {
			if _, err := kv.GetInto(ctx, fmt.Sprintf("llama/tp0/%04d", i), buf); err != nil {
				t.Fatal(err)
			}
			e.gets++
		}
		for i := 0; i < 3; i++ {
			kv.GetInto(ctx, fmt.Sprintf("llama/tp0/miss-%d-%d", round, i), buf)
			e.gets++
			e.misses++
		}
		kv.BatchExists(ctx, []string{"llama/tp0/0000", "llama/tp0/0001"})
		if round == 0 { // two intervals with gets: the charts draw lines
			e.waitKV(t)
			e.sample(t)
		}
	}

	// Sessions: two turns each; the quota (40 pages) evicts the oldest.
	ss := e.cl.Sessions()
	if err := ss.SetLayout(ctx, tiny); err != nil {
		t.Fatal(err)
	}
	turn := func(id string, prompt int64) {
		t.Helper()
		ids := make([]uint32, prompt) // one conversation of token ids 0, 1, 2, ... per session
		for i := range ids {
			ids[i] = uint32(i)
		}
		p, err := ss.Plan(ctx, id, client.PlanRequest{Model: "tiny", TokenIDs: ids})
		if err != nil {
			t.Fatal(err)
		}
		e.plans++
		e.evictions += len(p.Evicted)
		var n int64
		for _, r := range p.Fresh {
			n += r.KVLength
		}
		if err := ss.WriteFresh(ctx, p, make([]byte, n)); err != nil {
			t.Fatal(err)
		}
		if _, err := ss.Commit(ctx, id, p.PlanID); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"chat-a", "chat-b", "chat-c", evilSession} {
		turn(id, 100)
		turn(id, 150)
	}
	// A session planned and never committed: it owns reserved bytes only.
	rp, err := ss.Plan(ctx, reservedSession, client.PlanRequest{Model: "tiny", TokenIDs: make([]uint32, 16)})
	if err != nil {
		t.Fatal(err)
	}
	e.plans++
	e.evictions += len(rp.Evicted)
	list, err := ss.List(ctx, "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list {
		e.sessions = append(e.sessions, s.ID)
	}
	es, err := ss.Get(ctx, evilSession)
	if err != nil {
		t.Fatal(err)
	}
	e.evilRanges = len(es.Ranges)
	if e.evictions == 0 || e.evilRanges == 0 {
		t.Fatalf("fixture: want evictions and ranges, got %d evictions, %d ranges", e.evictions, e.evilRanges)
	}
	e.waitKV(t)
	e.sample(t)
	return e
}

func (e *env) sample(t *testing.T) {
	t.Helper()
	if err := e.c.Master.Console().Sample(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// waitHeartbeat waits until every server has sent a heartbeat with KV figures.
func (e *env) waitHeartbeat(t *testing.T) {
	t.Helper()
	e.waitFor(t, "servers to report KV figures", func(st []kvFig) bool { return len(st) == 3 })
}

// waitKV waits until the servers' heartbeats carry every put and get made.
func (e *env) waitKV(t *testing.T) {
	t.Helper()
	e.waitFor(t, "heartbeats to carry the KV activity", func(st []kvFig) bool {
		var keys, gets int
		for _, s := range st {
			keys += int(s.keys)
			gets += int(s.gets)
		}
		return len(st) == 3 && keys == e.kvKeys && gets == e.gets
	})
}

type kvFig struct{ keys, gets uint64 }

func (e *env) waitFor(t *testing.T, what string, ok func([]kvFig) bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := e.cl.Status(context.Background())
		if err == nil {
			var figs []kvFig
			for _, s := range st.Servers {
				if s.KV != nil && s.State == "up" {
					figs = append(figs, kvFig{uint64(s.KV.Keys), s.KV.MemHits + s.KV.DiskHits + s.KV.Misses})
				}
			}
			if ok(figs) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s (last status error: %v)", what, err)
		}
		time.Sleep(50 * time.Millisecond) // polling a condition, not synchronising on time
	}
}

func (e *env) url(p string) string { return e.c.Master.URL() + p }

// get fetches p with the given headers, not following redirects.
func get(t *testing.T, url string, hdr map[string]string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
