package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/tcp"
	"github.com/gd2fs/gd2fs/internal/testutil"
)

// What a commit records is what the servers hold (docs/kv-cache.md, "What
// the master checks"): these tests write with holes through real servers on
// loopback sockets and commit as a client would.

func startWritten(t *testing.T, servers int) *Cluster {
	t.Helper()
	c, err := Start(context.Background(), Config{Dir: t.TempDir(), Servers: servers, MemBytes: 8 << 20, DiskBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// post sends body as JSON to the master and returns the status and answer.
func post(t *testing.T, c *Cluster, path string, body any) (int, string) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(c.Master.URL()+path, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(out)
}

var writtenLayout = client.Layout{Model: "w", Layers: 2, KVHeads: 2, HeadDim: 64, DType: "fp16", PageTokens: 16, Order: "page_first"}

func ids(n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(i)
	}
	return out
}

// planWithHole plans a 100-token turn of session id and writes its fresh
// bytes except [holeAt, holeAt+holeLen) of the first fresh range, without a
// Sync. It returns the plan, the bytes, the file and the hole's file offset.
func planWithHole(t *testing.T, cl *client.Client, id string, holeAt, holeLen int64) (client.Plan, []byte, *client.File, int64) {
	t.Helper()
	ctx := context.Background()
	ss := cl.Sessions()
	if err := ss.SetLayout(ctx, writtenLayout); err != nil {
		t.Fatal(err)
	}
	p, err := ss.Plan(ctx, id, client.PlanRequest{Model: "w", TokenIDs: ids(100)})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.FreshFiles) == 0 || len(p.Fresh) == 0 {
		t.Fatalf("plan without fresh_files: %+v", p)
	}
	var kv []byte
	for _, r := range p.Fresh {
		kv = append(kv, rnd(int(r.KVLength), uint64(len(kv)+1))...)
	}
	u, err := client.ParseURI(p.Fresh[0].KVURI)
	if err != nil {
		t.Fatal(err)
	}
	f, err := cl.Open(ctx, u.Path)
	if err != nil {
		t.Fatal(err)
	}
	start := p.Fresh[0].KVStart
	if holeAt+holeLen > p.Fresh[0].KVLength {
		t.Fatalf("hole past the first fresh range of %d bytes", p.Fresh[0].KVLength)
	}
	if _, err := f.WriteAt(kv[:holeAt], start); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(kv[holeAt+holeLen:], start+holeAt+holeLen); err != nil {
		t.Fatal(err)
	}
	return p, kv, f, start + holeAt
}

func rnd(n int, seed uint64) []byte { return testutil.RandomBytes(n, seed) }

// TestWrittenCommitWithHoleRefused: a "written" commit (WriteAndCommit's)
// of a fresh range with 1,000 bytes no write covered is refused, naming the
// bytes, and records nothing (the session holds no token, the file has no
// size); once the hole is written, the same plan commits, and the next plan
// loads exactly the bytes written.
func TestWrittenCommitWithHoleRefused(t *testing.T) {
	c := startWritten(t, 3)
	cl := c.Client()
	defer cl.Close()
	ctx := context.Background()
	p, kv, f, hole := planWithHole(t, cl, "w1", 20_000, 1_000)
	code, msg := post(t, c, "/v1/sessions/w1/commit", map[string]any{"plan_id": p.PlanID, "written": true})
	if code != http.StatusBadRequest || !strings.Contains(msg, "not written") || !strings.Contains(msg, fmt.Sprintf("bytes %d to %d", hole, hole+1_000)) {
		t.Fatalf("written commit over a hole at %d: %d %s", hole, code, msg)
	}
	s, err := cl.Sessions().Get(ctx, "w1")
	if err != nil {
		t.Fatal(err)
	}
	if s.Tokens != 0 || len(s.Ranges) != 0 {
		t.Fatalf("a refused commit recorded %d tokens: %+v", s.Tokens, s.Ranges)
	}
	if st, err := cl.Stat(ctx, f.Info().Path); err != nil || st.Size != 0 {
		t.Fatalf("a refused commit recorded the file's size: %+v %v", st, err)
	}
	// The hole written, the same plan commits.
	if _, err := f.WriteAt(kv[20_000:21_000], hole); err != nil {
		t.Fatal(err)
	}
	if code, msg := post(t, c, "/v1/sessions/w1/commit", map[string]any{"plan_id": p.PlanID, "written": true}); code != http.StatusOK {
		t.Fatalf("commit of the whole range: %d %s", code, msg)
	}
	q, err := cl.Sessions().Plan(ctx, "w1", client.PlanRequest{Model: "w", TokenIDs: ids(120)})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, q.LoadBytes)
	if _, err := cl.Sessions().LoadStored(ctx, q, buf); err != nil {
		t.Fatal(err)
	}
	if q.CachedTokens == 0 || !bytes.Equal(buf, kv[:q.LoadBytes]) {
		t.Fatalf("stored %d tokens that load other bytes than were written", q.CachedTokens)
	}
}

// TestExtentsKeptAcrossServerRestart: a server restarted between the writes
// and the commit still knows which bytes were written: the hole is not
// claimed after the restart (a store that took a chunk as whole up to its
// length would claim it), and the bytes that were written still are.
func TestExtentsKeptAcrossServerRestart(t *testing.T) {
	c := startWritten(t, 1)
	cl := c.Client()
	defer cl.Close()
	ctx := context.Background()
	p, kv, f, hole := planWithHole(t, cl, "w2", 4_096, 65_536)
	c.Servers[0].Close()
	s, err := c.AddServer(0)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, func() (bool, string) {
		st, err := cl.Status(ctx)
		if err != nil {
			return false, err.Error()
		}
		for _, si := range st.Servers {
			if si.ID == s.ID() && si.Addr == s.Addr() && si.State == "up" {
				return true, ""
			}
		}
		return false, "the master has not heard from the restarted server"
	})
	code, msg := post(t, c, "/v1/sessions/w2/commit", map[string]any{"plan_id": p.PlanID, "written": true})
	if code != http.StatusBadRequest || !strings.Contains(msg, "not written") {
		t.Fatalf("written commit over a hole after a restart: %d %s", code, msg)
	}
	f2, err := cl.Open(ctx, f.Info().Path) // the restarted server has a new address
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f2.WriteAt(kv[4_096:4_096+65_536], hole); err != nil {
		t.Fatal(err)
	}
	if code, msg := post(t, c, "/v1/sessions/w2/commit", map[string]any{"plan_id": p.PlanID, "written": true}); code != http.StatusOK {
		t.Fatalf("commit after the hole was written: %d %s", code, msg)
	}
}

// TestFileCommitPastWhatServersHold (issue 22 finding 15): a Sync claiming
// a chunk longer than its servers hold is refused, and for an ha file every
// replica must hold it: bytes written to the primary alone (no forward) do
// not make a commit.
func TestFileCommitPastWhatServersHold(t *testing.T) {
	c := startWritten(t, 3)
	cl := c.Client()
	defer cl.Close()
	ctx := context.Background()
	f, err := cl.Create(ctx, "/w/f", client.CreateOptions{Pool: "ha", ChunkSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(rnd(100, 1)); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	code, msg := post(t, c, "/v1/commit/w/f", map[string]any{"size": 5000, "lengths": map[string]int64{"0": 5000}})
	if code != http.StatusBadRequest || !strings.Contains(msg, "holds 100 bytes") {
		t.Fatalf("commit past the written bytes: %d %s", code, msg)
	}
	st, err := cl.Stat(ctx, "/w/f")
	if err != nil || st.Size != 100 || len(st.Chunks) != 1 || len(st.Chunks[0].Replicas) != 3 {
		t.Fatalf("after a refused commit: %+v %v", st, err)
	}
	// 100 more bytes on the primary only.
	pool := tcp.NewPool(tcp.Options{Name: "test", Streams: 1})
	defer pool.Close()
	rs := st.Chunks[0].Replicas
	if err := pool.WriteChunk(ctx, rs[0].Addr, st.Chunks[0].ID, 100, rnd(100, 2), nil); err != nil {
		t.Fatal(err)
	}
	code, msg = post(t, c, "/v1/commit/w/f", map[string]any{"size": 200, "lengths": map[string]int64{"0": 200}})
	if code != http.StatusBadRequest || !(strings.Contains(msg, rs[1].Server) || strings.Contains(msg, rs[2].Server)) {
		t.Fatalf("commit of bytes on one replica of three: %d %s", code, msg)
	}
	for _, r := range rs[1:] {
		if err := pool.WriteChunk(ctx, r.Addr, st.Chunks[0].ID, 100, rnd(100, 2), nil); err != nil {
			t.Fatal(err)
		}
	}
	if code, msg := post(t, c, "/v1/commit/w/f", map[string]any{"size": 200, "lengths": map[string]int64{"0": 200}}); code != http.StatusOK {
		t.Fatalf("commit of bytes every replica holds: %d %s", code, msg)
	}
}

// TestCopyKeepsHoles: a repair copy of a chunk copies what was written,
// extent by extent: the copy claims the same bytes as its source, not the
// hole between them (a whole copy would make the hole a claim).
func TestCopyKeepsHoles(t *testing.T) {
	c := startWritten(t, 2)
	ctx := context.Background()
	pool := tcp.NewPool(tcp.Options{Name: "test", Streams: 1})
	defer pool.Close()
	src, dst := c.Servers[0].Addr(), c.Servers[1].Addr()
	const id = 1 << 40
	for _, off := range []int64{0, 100_000} {
		if err := pool.WriteChunk(ctx, src, id, off, rnd(100, uint64(off)), nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := pool.CopyChunk(ctx, dst, id, src); err != nil {
		t.Fatal(err)
	}
	ext, length, _, err := pool.ChunkExtents(ctx, dst, id, 0, 1<<20)
	if err != nil || length != 100_100 || !slices.Equal(ext, []int64{0, 100, 100_000, 100_100}) {
		t.Fatalf("copy holds %v of %d bytes (%v), want the source's [0, 100) and [100000, 100100)", ext, length, err)
	}
	got := make([]byte, 100)
	if err := pool.ReadChunk(ctx, dst, id, 100_000, got); err != nil || !bytes.Equal(got, rnd(100, 100_000)) {
		t.Fatalf("copied bytes differ (%v)", err)
	}
}
