package cluster

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/meta"
)

// startDurable starts two servers and a master of session durability mode,
// and a client of it.
func startDurable(t *testing.T, mode string) (*Cluster, *client.Client) {
	t.Helper()
	c, err := Start(context.Background(), Config{Dir: t.TempDir(), Servers: 2, MemBytes: 8 << 20, DiskBytes: 256 << 20, SessionDurability: mode})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	cl := c.Client()
	t.Cleanup(func() { cl.Close() })
	return c, cl
}

// writeThrough writes each range of fresh through f, with bytes of its
// own (seeded by how much kv holds), and returns kv with them appended.
func writeThrough(t *testing.T, f *client.File, fresh []client.KVRange, kv []byte) []byte {
	t.Helper()
	for _, r := range fresh {
		b := rnd(int(r.KVLength), uint64(len(kv)+3))
		if _, err := f.WriteAtContext(context.Background(), b, r.KVStart); err != nil {
			t.Fatal(err)
		}
		kv = append(kv, b...)
	}
	return kv
}

// loadsBack plans session id's next turn (a prompt of prompt token ids
// of model) and checks that it finds want tokens stored and that they load
// as exactly the first bytes of kv, naming the first byte that differs.
func loadsBack(t *testing.T, cl *client.Client, id, model string, prompt int, want int64, kv []byte, when string) {
	t.Helper()
	ctx := context.Background()
	q, err := cl.Sessions().Plan(ctx, id, client.PlanRequest{Model: model, TokenIDs: ids(prompt)})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, q.LoadBytes)
	if _, err := cl.Sessions().LoadStored(ctx, q, buf); err != nil {
		t.Fatal(err)
	}
	if q.CachedTokens != want || q.LoadBytes > int64(len(kv)) {
		t.Fatalf("%s: %d tokens stored in %d bytes, want %d tokens of the %d bytes written", when, q.CachedTokens, q.LoadBytes, want, len(kv))
	}
	for i := range buf {
		if buf[i] != kv[i] {
			t.Fatalf("%s: the bytes loaded differ from those written from byte %d", when, i)
		}
	}
}

// TestSessionFileSyncFromMemory: an engine's Sync of the KV it wrote into
// a session file (flush and window mode) is answered from the leader's
// memory, and keeps every check a Sync made in SQL: a size past what the
// servers hold is refused and records nothing; the Sync of what was
// written records it, the engine's commit names it, and the next plan
// loads exactly those bytes — also after the master restarts from SQL.
func TestSessionFileSyncFromMemory(t *testing.T) {
	for _, mode := range []string{meta.DurabilityFlush, meta.DurabilityWindow} {
		t.Run(mode, func(t *testing.T) {
			c, cl := startDurable(t, mode)
			ctx := context.Background()
			syncs := func() int64 { return c.Meta.(meta.WriteBehindStatser).WriteBehindStats().Syncs }
			// The whole fresh range written, not yet synced (no hole).
			p, kv, f, _ := planWithHole(t, cl, "m1", 0, 0)
			path := f.Info().Path
			r := p.Fresh[len(p.Fresh)-1]
			end := r.KVStart + r.KVLength
			chunk := f.Info().ChunkSize
			lengths := func(size int64) map[string]int64 {
				out := map[string]int64{}
				for idx := int64(0); idx*chunk < size; idx++ {
					out[fmt.Sprint(idx)] = min(size-idx*chunk, chunk)
				}
				return out
			}
			before := syncs()
			// 4 KiB more than was written: refused, nothing recorded.
			code, msg := post(t, c, "/v1/commit"+path, map[string]any{"size": end + 4096, "lengths": lengths(end + 4096)})
			if code != http.StatusBadRequest || !strings.Contains(msg, "holds") {
				t.Fatalf("Sync past the written bytes: %d %s", code, msg)
			}
			if st, err := cl.Stat(ctx, path); err != nil || st.Size != 0 {
				t.Fatalf("a refused Sync recorded the file's size: %+v %v", st, err)
			}
			if n := syncs() - before; n != 0 {
				t.Fatalf("a refused Sync counted as answered from memory (%d)", n)
			}
			// What was written: answered from memory.
			code, msg = post(t, c, "/v1/commit"+path, map[string]any{"size": end, "lengths": lengths(end)})
			if code != http.StatusOK || !strings.Contains(msg, fmt.Sprintf(`"size":%d`, end)) {
				t.Fatalf("Sync of the written bytes: %d %s", code, msg)
			}
			if n := syncs() - before; n != 1 {
				t.Fatalf("%d Syncs answered from memory, want 1", n)
			}
			// The engine's commit asks the servers about the chunks memory
			// holds: no wait for the leader's log (in window mode a flush
			// forced by every engine commit).
			waits := c.Meta.(meta.WriteBehindStatser).WriteBehindStats().LogWaits
			if _, err := cl.Sessions().CommitSaved(ctx, "m1", p.PlanID, p.Fresh); err != nil {
				t.Fatal(err)
			}
			if n := c.Meta.(meta.WriteBehindStatser).WriteBehindStats().LogWaits - waits; n != 0 {
				t.Fatalf("the engine's commit waited %d times for the leader's log", n)
			}
			if st, err := cl.Stat(ctx, path); err != nil || st.Size != end {
				t.Fatalf("after the Sync of %d bytes: %+v %v", end, st, err)
			}
			load := func(when string) { t.Helper(); loadsBack(t, cl, "m1", "w", 120, 100, kv, when) }
			load("after the Sync and commit")
			if err := c.RestartMaster(ctx); err != nil {
				t.Fatal(err)
			}
			cl2 := c.Client()
			defer cl2.Close()
			cl = cl2
			if st, err := cl.Stat(ctx, path); err != nil || st.Size != end {
				t.Fatalf("after a restart: %+v %v", st, err)
			}
			load("after a restart")
		})
	}
}

// bigLayout's KV is 128 KiB a token: a 16 MiB chunk every 128 tokens, so a
// turn of a chat enters a new chunk as a real model's do.
var bigLayout = client.Layout{Model: "big", Layers: 32, KVHeads: 8, HeadDim: 128, DType: "fp16", PageTokens: 16, Order: "page_first"}

// TestCachedHandleWritesPlannedChunk: a writer that keeps one handle a
// session file (pygd2fs does) writes a later turn that enters a chunk the
// plan allocated: it asks the master for that chunk (POST /v1/alloc),
// which answers it from memory, and the session stays in the leader's
// memory — its next plan and commit are not sent to SQL, as they were when
// the allocation made memory forget the file. The bytes load back exact.
func TestCachedHandleWritesPlannedChunk(t *testing.T) {
	for _, mode := range []string{meta.DurabilityFlush, meta.DurabilityWindow} {
		t.Run(mode, func(t *testing.T) {
			c, cl := startDurable(t, mode)
			ctx := context.Background()
			ss := cl.Sessions()
			if err := ss.SetLayout(ctx, bigLayout); err != nil {
				t.Fatal(err)
			}
			stats := func() meta.WriteBehindStats { return c.Meta.(meta.WriteBehindStatser).WriteBehindStats() }
			var f *client.File
			var kv []byte
			turn := func(tokens int) {
				t.Helper()
				p, err := ss.Plan(ctx, "big1", client.PlanRequest{Model: "big", TokenIDs: ids(tokens)})
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range p.Fresh {
					b := rnd(int(r.KVLength), uint64(len(kv)+7))
					if f == nil {
						u, err := client.ParseURI(r.KVURI)
						if err != nil {
							t.Fatal(err)
						}
						if f, err = cl.Open(ctx, u.Path); err != nil {
							t.Fatal(err)
						}
					}
					if _, err := f.WriteAtContext(ctx, b, r.KVStart); err != nil {
						t.Fatal(err)
					}
					kv = append(kv, b...)
				}
				if err := f.Sync(ctx); err != nil {
					t.Fatal(err)
				}
				if _, err := ss.CommitSaved(ctx, "big1", p.PlanID, p.Fresh); err != nil {
					t.Fatal(err)
				}
			}
			turn(100) // chunk 0; the handle is opened here
			before := stats()
			turn(200) // enters chunk 1, which this plan allocated
			turn(300) // and chunk 2
			after := stats()
			for op, name := range []string{"plans", "commits"} {
				for r, n := range after.Slow[op] {
					if d := n - before.Slow[op][r]; d > 0 {
						t.Errorf("%d %s ran in SQL (%s) after a write through the older handle", d, name, meta.SlowReasonNames[r])
					}
				}
			}
			loadsBack(t, cl, "big1", "big", 320, 300, kv, "after three turns through one handle")
		})
	}
}

// TestEngineCommitRecordsWritten: an engine that writes a turn's KV into a
// session file and commits what it saved, with no Sync between (pygd2fs's
// Write of a file the master marks CommitRecordsSize), has the commit
// record the file's size once the servers vouch for every byte — in
// memory (flush, window) and in SQL (sync). A saved segment with a hole is
// refused and records nothing, the hole's bytes named; once written, the
// same plan commits; the next plans load exactly the bytes written, also
// after the master restarts. A file a user made under the sessions'
// directory is not marked: its writer still Syncs.
func TestEngineCommitRecordsWritten(t *testing.T) {
	for _, mode := range []string{meta.DurabilityFlush, meta.DurabilityWindow, meta.DurabilitySync} {
		t.Run(mode, func(t *testing.T) {
			c, cl := startDurable(t, mode)
			ctx := context.Background()
			ss := cl.Sessions()
			p, kv, f, hole := planWithHole(t, cl, "e1", 8_192, 4_096)
			path := f.Info().Path
			if !f.Info().CommitRecordsSize {
				t.Fatalf("the session file %s is not marked CommitRecordsSize", path)
			}
			_, err := ss.CommitSaved(ctx, "e1", p.PlanID, p.Fresh)
			if err == nil || !strings.Contains(err.Error(), "not written") || !strings.Contains(err.Error(), fmt.Sprintf("%d to %d", hole, hole+4_096)) {
				t.Fatalf("an engine commit over a hole at %d: %v", hole, err)
			}
			if st, err := cl.Stat(ctx, path); err != nil || st.Size != 0 {
				t.Fatalf("a refused commit recorded the file's size: %+v %v", st, err)
			}
			if s, err := ss.Get(ctx, "e1"); err != nil || s.Tokens != 0 {
				t.Fatalf("a refused commit recorded tokens: %+v %v", s, err)
			}
			if _, err := f.WriteAtContext(ctx, kv[8_192:8_192+4_096], hole); err != nil {
				t.Fatal(err)
			}
			if _, err := ss.CommitSaved(ctx, "e1", p.PlanID, p.Fresh); err != nil {
				t.Fatalf("the engine's commit of what it wrote, without a Sync: %v", err)
			}
			r := p.Fresh[len(p.Fresh)-1]
			end := r.KVStart + r.KVLength
			if st, err := cl.Stat(ctx, path); err != nil || st.Size != end {
				t.Fatalf("after the commit: %+v %v, want size %d", st, err, end)
			}
			// A second turn through the same handle, again without a Sync.
			q, err := ss.Plan(ctx, "e1", client.PlanRequest{Model: "w", TokenIDs: ids(150)})
			if err != nil {
				t.Fatal(err)
			}
			kv = writeThrough(t, f, q.Fresh, kv)
			if _, err := ss.CommitSaved(ctx, "e1", q.PlanID, q.Fresh); err != nil {
				t.Fatal(err)
			}
			load := func(when string) { t.Helper(); loadsBack(t, cl, "e1", "w", 170, 150, kv, when) }
			load("after two turns without a Sync")
			if err := c.RestartMaster(ctx); err != nil {
				t.Fatal(err)
			}
			cl2 := c.Client()
			defer cl2.Close()
			cl = cl2
			load("after a restart")
			// Not a session's file: a user's, under the same directory, or
			// anywhere else.
			for _, p := range []string{"/kv-sessions/mine", "/data/x"} {
				uf, err := cl.Create(ctx, p, client.CreateOptions{Pool: "perf"})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := uf.WriteAt([]byte("hello"), 0); err != nil {
					t.Fatal(err)
				}
				if err := uf.Sync(ctx); err != nil {
					t.Fatal(err)
				}
				of, err := cl.Open(ctx, p)
				if err != nil {
					t.Fatal(err)
				}
				if of.Info().CommitRecordsSize {
					t.Fatalf("%s, a user's file, is marked CommitRecordsSize", p)
				}
			}
		})
	}
}

// TestSessionStatFromMemory: in window mode the stat of a session file (an
// engine's first Open of a new chat's file, a load's Open) is answered
// from the leader's memory without waiting for its log — a flush forced by
// every new chat — and shows what the commits answered from memory made
// it: the committed range readable through a handle opened after the
// commit, byte for byte. In flush mode (SQL holds all that was answered;
// a stat reads it without a wait) and sync mode SQL answers, and the same
// must hold. A registered prefix that memory holds is not marked as a
// session's file.
func TestSessionStatFromMemory(t *testing.T) {
	for _, mode := range []string{meta.DurabilityFlush, meta.DurabilityWindow, meta.DurabilitySync} {
		t.Run(mode, func(t *testing.T) {
			c, cl := startDurable(t, mode)
			ctx := context.Background()
			waits := func() int64 { return c.Meta.(meta.WriteBehindStatser).WriteBehindStats().LogWaits }
			ss := cl.Sessions()
			if err := ss.SetLayout(ctx, writtenLayout); err != nil {
				t.Fatal(err)
			}
			var kv []byte
			for turn, n := range []int{100, 150} {
				p, err := ss.Plan(ctx, "st1", client.PlanRequest{Model: "w", TokenIDs: ids(n)})
				if err != nil {
					t.Fatal(err)
				}
				u, err := client.ParseURI(p.Fresh[0].KVURI)
				if err != nil {
					t.Fatal(err)
				}
				before := waits()
				f, err := cl.Open(ctx, u.Path)
				if err != nil {
					t.Fatal(err)
				}
				if w := waits() - before; mode != meta.DurabilitySync && w != 0 {
					t.Fatalf("turn %d: the Open of the session file waited %d times for the leader's log", turn, w)
				}
				info := f.Info()
				if !info.CommitRecordsSize || int64(len(kv)) != info.Size || len(info.Chunks) == 0 {
					t.Fatalf("turn %d: the file as opened: %+v, want size %d and its chunks", turn, info, len(kv))
				}
				kv = writeThrough(t, f, p.Fresh, kv)
				if _, err := ss.CommitSaved(ctx, "st1", p.PlanID, p.Fresh); err != nil {
					t.Fatal(err)
				}
				before = waits()
				g, err := cl.Open(ctx, u.Path) // a reader's fresh handle, after the commit
				if err != nil {
					t.Fatal(err)
				}
				if w := waits() - before; mode != meta.DurabilitySync && w != 0 {
					t.Fatalf("turn %d: the reader's Open waited %d times for the leader's log", turn, w)
				}
				buf := make([]byte, len(kv))
				if _, err := g.ReadAtContext(ctx, buf, 0); err != nil {
					t.Fatalf("turn %d: reading the committed %d bytes: %v (size %d)", turn, len(kv), err, g.Info().Size)
				}
				if !bytes.Equal(buf, kv) {
					t.Fatalf("turn %d: the committed bytes read back differ", turn)
				}
			}
			// A prefix file (unsealed, synced) that a plan reads is not a
			// session's: its writer must Sync.
			pf, err := cl.Create(ctx, "/kv-sessions/shared-prefix", client.CreateOptions{Pool: "perf"})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := pf.WriteAt(make([]byte, writtenLayout.RangeBytes(32)), 0); err != nil {
				t.Fatal(err)
			}
			if err := pf.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			if err := ss.RegisterPrefixIDs(ctx, "/kv-sessions/shared-prefix", "w", ids(32)); err != nil {
				t.Fatal(err)
			}
			p, err := ss.Plan(ctx, "st2", client.PlanRequest{Model: "w", TokenIDs: ids(60), Prefixes: []string{"/kv-sessions/shared-prefix"}})
			if err != nil {
				t.Fatal(err)
			}
			if p.CachedTokens != 32 {
				t.Fatalf("the plan found %d tokens of the prefix, want 32", p.CachedTokens)
			}
			if st, err := cl.Stat(ctx, "/kv-sessions/shared-prefix"); err != nil || st.CommitRecordsSize {
				t.Fatalf("a registered prefix's stat: %+v, %v (marked as a session's file)", st, err)
			}
		})
	}
}

// TestCommitRecordsEveryChunk: a turn's range that reaches two chunks,
// the later part written and synced through one handle (a TP rank on an
// older pygd2fs, which Syncs), the earlier part through another without a
// Sync: the Sync raises the file's size past the whole range but only its
// own chunk's length, and the commit must still record the earlier
// chunk's — else a reader takes its bytes past the old length for zeros.
// Every byte of the session loads back as written, through a new handle.
func TestCommitRecordsEveryChunk(t *testing.T) {
	for _, mode := range []string{meta.DurabilityFlush, meta.DurabilityWindow, meta.DurabilitySync} {
		t.Run(mode, func(t *testing.T) {
			c, cl := startDurable(t, mode)
			ctx := context.Background()
			ss := cl.Sessions()
			if err := ss.SetLayout(ctx, bigLayout); err != nil {
				t.Fatal(err)
			}
			var kv []byte
			var a *client.File
			crossed := false
			for _, n := range []int{100, 200} { // chunk 0; then chunks 0 and 1
				p, err := ss.Plan(ctx, "mc", client.PlanRequest{Model: "big", TokenIDs: ids(n)})
				if err != nil {
					t.Fatal(err)
				}
				u, err := client.ParseURI(p.Fresh[0].KVURI)
				if err != nil {
					t.Fatal(err)
				}
				if a == nil {
					if a, err = cl.Open(ctx, u.Path); err != nil {
						t.Fatal(err)
					}
				}
				cs := a.Info().ChunkSize
				for _, r := range p.Fresh {
					b := rnd(int(r.KVLength), uint64(len(kv)+5))
					kv = append(kv, b...)
					split := max(r.KVStart, min(r.KVStart+r.KVLength, (r.KVStart/cs+1)*cs)) // the end of the range's first chunk
					if split < r.KVStart+r.KVLength {
						crossed = true
						bh, err := cl.Open(ctx, u.Path) // the other rank's handle
						if err != nil {
							t.Fatal(err)
						}
						if _, err := bh.WriteAtContext(ctx, b[split-r.KVStart:], split); err != nil {
							t.Fatal(err)
						}
						if err := bh.Sync(ctx); err != nil {
							t.Fatal(err)
						}
					}
					if _, err := a.WriteAtContext(ctx, b[:split-r.KVStart], r.KVStart); err != nil {
						t.Fatal(err)
					}
				}
				fast := c.Meta.(meta.WriteBehindStatser).WriteBehindStats().Fast
				if _, err := ss.CommitSaved(ctx, "mc", p.PlanID, p.Fresh); err != nil {
					t.Fatal(err)
				}
				if mode != meta.DurabilitySync && n == 200 && c.Meta.(meta.WriteBehindStatser).WriteBehindStats().Fast == fast {
					t.Fatal("the commit of the range over two chunks was not answered from memory")
				}
			}
			if !crossed {
				t.Fatal("no range reached two chunks: the test checks nothing (the chunk size changed?)")
			}
			loadsBack(t, cl, "mc", "big", 210, 200, kv, "two turns, the second over two chunks")
		})
	}
}

// TestCommitIntoSealedFile: a writer that closes its handle (Close seals a
// file it wrote, recording its size) before the engine's commit: the
// commit names bytes the sealed file holds, and is recorded; the bytes
// load back exact.
func TestCommitIntoSealedFile(t *testing.T) {
	for _, mode := range []string{meta.DurabilityWindow, meta.DurabilitySync} {
		t.Run(mode, func(t *testing.T) {
			_, cl := startDurable(t, mode)
			ctx := context.Background()
			ss := cl.Sessions()
			p, kv, f, _ := planWithHole(t, cl, "sealed1", 0, 0) // every byte written
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			if st, err := cl.Stat(ctx, f.Info().Path); err != nil || !st.Sealed {
				t.Fatalf("after Close: %+v, %v", st, err)
			}
			if _, err := ss.CommitSaved(ctx, "sealed1", p.PlanID, p.Fresh); err != nil {
				t.Fatalf("the commit of bytes the sealed file holds: %v", err)
			}
			loadsBack(t, cl, "sealed1", "w", 120, 100, kv, "after a commit into the sealed file")
		})
	}
}
