package meta

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/meta/metatest"
)

// engines returns a fresh store per engine. PostgreSQL runs when
// GD2FS_TEST_POSTGRES names a server (scripts/test.sh starts one); with
// GD2FS_REQUIRE_POSTGRES=1 its absence is a failure, not a skip. Each store
// leads, as a master's does, so its sessions go through the leader's
// session cache (cache.go; the invariants compare it with SQL after every
// batch).
func engines(t *testing.T) map[string]func(t *testing.T) Store {
	return map[string]func(t *testing.T) Store{
		"sqlite":   func(t *testing.T) Store { return leading(t, sqliteForTest(t)) },
		"postgres": func(t *testing.T) Store { return leading(t, PostgresForTest(t)) },
	}
}

func sqliteForTest(t *testing.T) Store {
	s, err := Open(context.Background(), "sqlite://"+filepath.Join(t.TempDir(), "meta.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// testMasterURL is the url test stores lead under.
const testMasterURL = "http://m1:7070"

// leading makes s the leader of its database.
func leading(t *testing.T, s Store) Store {
	if ok, err := s.Lead(context.Background(), testMasterURL); err != nil || !ok {
		t.Fatalf("store does not lead: %v %v", ok, err)
	}
	return s
}

// PostgresForTest opens a store in a fresh schema of the test PostgreSQL.
func PostgresForTest(t testing.TB) Store {
	s, err := Open(context.Background(), PostgresDSNForTest(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// PostgresDSNForTest is metatest.PostgresDSN.
func PostgresDSNForTest(t testing.TB) string { return metatest.PostgresDSN(t) }

// sharedDSNs makes, per engine, a store that several Opens share (two
// masters of one cluster): a SQLite file, a PostgreSQL schema.
var sharedDSNs = map[string]func(t *testing.T) string{
	"sqlite":   func(t *testing.T) string { return "sqlite://" + filepath.Join(t.TempDir(), "meta.db") },
	"postgres": func(t *testing.T) string { return PostgresDSNForTest(t) },
}

// openShared opens dsn as one more master's store, closed with the test.
func openShared(t *testing.T, dsn string) *sqlStore {
	t.Helper()
	s, err := Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s.(*sqlStore)
}

// TestLeadership: of two masters on one store, one leads; when it goes, the
// other takes over.
func TestLeadership(t *testing.T) {
	for name, mk := range sharedDSNs {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			dsn := mk(t)
			a, err := Open(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			b, err := Open(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			if ok, err := a.Lead(ctx, "http://a"); !ok || err != nil {
				t.Fatalf("a: %v %v", ok, err)
			}
			if ok, err := b.Lead(ctx, "http://b"); ok || err != nil {
				t.Fatalf("b leads beside a: %v %v", ok, err)
			}
			if u, _ := b.Leader(ctx); u != "http://a" {
				t.Fatalf("b sees leader %q", u)
			}
			a.Close() // the leader goes away
			var ok bool
			for i := 0; i < 100 && !ok; i++ { // the server notices the closed session
				if ok, err = b.Lead(ctx, "http://b"); err != nil {
					t.Fatal(err)
				}
				if !ok {
					time.Sleep(20 * time.Millisecond)
				}
			}
			if !ok {
				t.Fatal("b does not take over")
			}
			if u, _ := b.Leader(ctx); u != "http://b" {
				t.Fatalf("leader now %q", u)
			}
		})
	}
}

func TestConformance(t *testing.T) {
	all := engines(t)
	// A store that does not lead works from SQL alone (a master that lost
	// the lead without noticing yet): the same rules must hold.
	all["sqlite-unled"] = sqliteForTest
	// Leaders that answer at once and write behind (writebehind.go);
	// the others write behind in flush mode, the default.
	for name, open := range windowEngines(t) {
		all[name] = open
	}
	for name, open := range all {
		t.Run(name, func(t *testing.T) {
			for _, tc := range []struct {
				name string
				fn   func(t *testing.T, s Store)
			}{
				{"namespace", testNamespace},
				{"chunks", testChunks},
				{"servers", testServersPools},
				{"model", testRandomModel},
				{"rename", testRename},
				{"rename-model", testRenameModel},
				{"expire-unsealed", testExpireUnsealed},
				{"sessions", testSessions},
				{"session-quota", testSessionQuota},
				{"session-last-use", testSessionLastUse},
				{"session-engine", testSessionEngine},
				{"session-content", testSessionContent},
				{"session-repeats", testSessionRepeats},
				{"session-down-server", testSessionDownServer},
				{"lead", testLead},
				{"names", testNames},
				{"kv-history", testKVHistory},
			} {
				if strings.HasSuffix(name, "-window") && !strings.HasPrefix(tc.name, "session") {
					continue // write-behind changes only sessions
				}
				t.Run(tc.name, func(t *testing.T) { tc.fn(t, open(t)) })
			}
		})
	}
}

func mustIs(t *testing.T, err, kind error) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("got %v, want %v", err, kind)
	}
}

var now = time.Unix(1700000000, 0).UTC()

func testNamespace(t *testing.T, s Store) {
	ctx := context.Background()
	f, err := s.CreateFile(ctx, File{Path: "/a/b/c.bin", Pool: "ha", ChunkSize: 1 << 20, Modified: now})
	if err != nil || f.ID == 0 {
		t.Fatalf("create: %v %+v", err, f)
	}
	_, err = s.CreateFile(ctx, File{Path: "/a/b/c.bin", Pool: "ha", ChunkSize: 1 << 20, Modified: now})
	mustIs(t, err, errs.ErrExists)
	// A create id is stored with the file, atomically, as an attribute;
	// a failed create leaves the existing file's attributes alone.
	if _, err := s.CreateFile(ctx, File{Path: "/a/id.bin", Pool: "ha", ChunkSize: 1 << 20, Modified: now, CreateID: "r1"}); err != nil {
		t.Fatal(err)
	}
	_, err = s.CreateFile(ctx, File{Path: "/a/id.bin", Pool: "ha", ChunkSize: 1 << 20, Modified: now, CreateID: "r2"})
	mustIs(t, err, errs.ErrExists)
	if a, err := s.Attrs(ctx, "/a/id.bin"); err != nil || a[CreateIDAttr] != "r1" {
		t.Fatalf("create id: %v %v", a, err)
	}
	if err := s.RemoveFile(ctx, "/a/id.bin"); err != nil {
		t.Fatal(err)
	}
	_, err = s.CreateFile(ctx, File{Path: "/a/b", Pool: "ha", ChunkSize: 1, Modified: now})
	mustIs(t, err, errs.ErrIsDir)
	_, err = s.CreateFile(ctx, File{Path: "/a/b/c.bin/d", Pool: "ha", ChunkSize: 1, Modified: now})
	mustIs(t, err, errs.ErrNotDir)
	for _, d := range []string{"/", "/a", "/a/b"} {
		if ok, err := s.IsDir(ctx, d); !ok || err != nil {
			t.Fatalf("%s should be a directory: %v", d, err)
		}
	}
	got, err := s.File(ctx, "/a/b/c.bin")
	if err != nil || got.ID != f.ID || got.Pool != "ha" || got.ChunkSize != 1<<20 {
		t.Fatalf("stat: %v %+v", err, got)
	}
	_, err = s.File(ctx, "/nope")
	mustIs(t, err, errs.ErrNotFound)
	_, err = s.File(ctx, "/a")
	mustIs(t, err, errs.ErrIsDir)

	if err := s.Mkdir(ctx, "/a/e", now); err != nil {
		t.Fatal(err)
	}
	ents, err := s.List(ctx, "/a")
	if err != nil || len(ents) != 2 || ents[0].Path != "/a/b" || !ents[0].IsDir || ents[1].Path != "/a/e" {
		t.Fatalf("list /a: %v %+v", err, ents)
	}
	ents, err = s.List(ctx, "/")
	if err != nil || len(ents) != 1 || ents[0].Path != "/a" {
		t.Fatalf("list /: %v %+v", err, ents)
	}
	_, err = s.List(ctx, "/a/b/c.bin")
	mustIs(t, err, errs.ErrNotDir)
	_, err = s.List(ctx, "/zz")
	mustIs(t, err, errs.ErrNotFound)
	mustIs(t, s.RemoveDir(ctx, "/a/b"), errs.ErrNotEmpty)
	mustIs(t, s.RemoveDir(ctx, "/zz"), errs.ErrNotFound)

	f2, err := s.Commit(ctx, f.ID, 100, nil, false, now.Add(time.Second))
	if err != nil || f2.Size != 100 {
		t.Fatalf("commit: %v %+v", err, f2)
	}
	if f2, _ = s.Commit(ctx, f.ID, 50, nil, true, now); f2.Size != 100 || !f2.Sealed {
		t.Fatalf("size must not shrink and seal must stick: %+v", f2)
	}
	_, err = s.Commit(ctx, f.ID, 200, nil, false, now)
	mustIs(t, err, errs.ErrSealed)
	if n, b, err := s.Totals(ctx); err != nil || n != 1 || b != 100 {
		t.Fatalf("totals %d %d %v", n, b, err)
	}
	if err := s.SetAttrs(ctx, "/a/b/c.bin", map[string]string{"source": "s3://b/k", "sha256": "ab"}); err != nil {
		t.Fatal(err)
	}
	s.SetAttrs(ctx, "/a/b/c.bin", map[string]string{"sha256": "cd", "source": ""})
	if a, err := s.Attrs(ctx, "/a/b/c.bin"); err != nil || len(a) != 1 || a["sha256"] != "cd" {
		t.Fatalf("attrs %v %v", a, err)
	}
	mustIs(t, s.SetAttrs(ctx, "/nope", map[string]string{"x": "y"}), errs.ErrNotFound)
	if err := s.RemoveFile(ctx, "/a/b/c.bin"); err != nil {
		t.Fatal(err)
	}
	mustIs(t, s.RemoveFile(ctx, "/a/b/c.bin"), errs.ErrNotFound)
	if a, _ := s.Attrs(ctx, "/a/b/c.bin"); len(a) != 0 {
		t.Fatalf("attrs outlived their file: %v", a)
	}
	if err := s.RemoveDir(ctx, "/a/b"); err != nil {
		t.Fatal(err)
	}
}

func testChunks(t *testing.T, s Store) {
	ctx := context.Background()
	f, err := s.CreateFile(ctx, File{Path: "/f", Pool: "ha", ChunkSize: 1000, Modified: now})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := s.AddChunks(ctx, f.ID, []Chunk{{Index: 0, Replicas: []string{"s1", "s2", "s3"}}, {Index: 2, Replicas: []string{"s2", "s3", "s1"}}})
	if err != nil || len(cs) != 2 || cs[0].Index != 0 || cs[1].Index != 2 || cs[1].Replicas[0] != "s2" || cs[0].ID == cs[1].ID {
		t.Fatalf("add: %v %+v", err, cs)
	}
	// Asking again returns the existing chunk, not a new placement.
	again, err := s.AddChunks(ctx, f.ID, []Chunk{{Index: 0, Replicas: []string{"s9"}}})
	if err != nil || len(again) != 1 || again[0].ID != cs[0].ID || again[0].Replicas[0] != "s1" {
		t.Fatalf("re-add: %v %+v", err, again)
	}
	if _, err := s.Commit(ctx, f.ID, 2500, map[int64]int64{0: 1000, 2: 500}, false, now); err != nil {
		t.Fatal(err)
	}
	_, err = s.Commit(ctx, f.ID, 2500, map[int64]int64{0: 1001}, false, now)
	mustIs(t, err, errs.ErrBadRequest)
	all, _ := s.Chunks(ctx, f.ID)
	if len(all) != 2 || all[0].Length != 1000 || all[1].Length != 500 {
		t.Fatalf("lengths: %+v", all)
	}
	on, err := s.ChunksOn(ctx, "s3")
	if err != nil || len(on) != 2 || on[0].Pool != "ha" || len(on[0].Replicas) != 3 {
		t.Fatalf("chunks on s3: %v %+v", err, on)
	}
	if err := s.ReplaceReplica(ctx, cs[0].ID, "s3", "s4"); err != nil {
		t.Fatal(err)
	}
	mustIs(t, s.ReplaceReplica(ctx, cs[0].ID, "s3", "s4"), errs.ErrNotFound)
	if ts, err := s.Tombstones(ctx, "s4", 10); err != nil || len(ts) != 0 {
		t.Fatalf("a replica moved once already owes a delete of its live copy: %v %v", ts, err)
	}
	all, _ = s.Chunks(ctx, f.ID)
	if all[0].Replicas[2] != "s4" {
		t.Fatalf("replace kept position? %+v", all[0])
	}
	if ts, _ := s.Tombstones(ctx, "s3", 10); len(ts) != 1 || ts[0] != cs[0].ID {
		t.Fatalf("replaced replica owes a delete: %v", ts)
	}
	// Moved back (a linked chunk re-placed onto a returning server): the
	// delete it owed is void, and the server it leaves owes one.
	if err := s.ReplaceReplica(ctx, cs[0].ID, "s4", "s3"); err != nil {
		t.Fatal(err)
	}
	if ts, _ := s.Tombstones(ctx, "s3", 10); len(ts) != 0 {
		t.Fatalf("a server holding a chunk again still owes its delete: %v", ts)
	}
	if ts, _ := s.Tombstones(ctx, "s4", 10); len(ts) != 1 || ts[0] != cs[0].ID {
		t.Fatalf("the server left owes a delete: %v", ts)
	}
	if err := s.ReplaceReplica(ctx, cs[0].ID, "s3", "s4"); err != nil {
		t.Fatal(err)
	}
	if err := s.ClearTombstones(ctx, "s4", []uint64{cs[0].ID}); err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveFile(ctx, "/f"); err != nil {
		t.Fatal(err)
	}
	ts, err := s.Tombstones(ctx, "s1", 10)
	if err != nil || len(ts) != 2 {
		t.Fatalf("tombstones s1: %v %v", ts, err)
	}
	if err := s.ClearTombstones(ctx, "s1", ts); err != nil {
		t.Fatal(err)
	}
	// A repair that copied a chunk to s9 while its file was removed: the
	// copy is recorded nowhere, so s9 owes its delete.
	mustIs(t, s.ReplaceReplica(ctx, cs[1].ID, "s2", "s9"), errs.ErrNotFound)
	if ts, err := s.Tombstones(ctx, "s9", 10); err != nil || len(ts) != 1 || ts[0] != cs[1].ID {
		t.Fatalf("a copy made for a removed file's chunk owes no delete: %v %v", ts, err)
	}
	if err := s.ClearTombstones(ctx, "s9", []uint64{cs[1].ID}); err != nil {
		t.Fatal(err)
	}
	// A server coming back with chunks nobody assigned it: they owe a delete.
	g, _ := s.CreateFile(ctx, File{Path: "/g", Pool: "perf", ChunkSize: 1000, Modified: now})
	kept, _ := s.AddChunks(ctx, g.ID, []Chunk{{Index: 0, Replicas: []string{"s1"}}})
	if n, err := s.Orphans(ctx, "s1", []uint64{kept[0].ID, 987654}); err != nil || n != 1 {
		t.Fatalf("orphans: %d %v", n, err)
	}
	if ts, _ := s.Tombstones(ctx, "s1", 10); len(ts) != 1 || ts[0] != 987654 {
		t.Fatalf("orphan tombstones %v", ts)
	}
	s.ClearTombstones(ctx, "s1", []uint64{987654})
	s.RemoveFile(ctx, "/g")
	s.ClearTombstones(ctx, "s1", []uint64{kept[0].ID})
	if ts, _ := s.Tombstones(ctx, "s1", 10); len(ts) != 0 {
		t.Fatalf("cleared tombstones remain: %v", ts)
	}
	if on, _ := s.ChunksOn(ctx, "s2"); len(on) != 0 {
		t.Fatalf("removed file's chunks remain: %+v", on)
	}
}

func testServersPools(t *testing.T, s Store) {
	ctx := context.Background()
	e1, _ := s.Epoch(ctx)
	e2, err := s.BumpEpoch(ctx)
	if err != nil || e2 != e1+1 {
		t.Fatalf("epoch %d -> %d %v", e1, e2, err)
	}
	if err := s.PutServer(ctx, Server{ID: "a", Addr: "127.0.0.1:1", MemCap: 1, DiskCap: 2}); err != nil {
		t.Fatal(err)
	}
	s.PutServer(ctx, Server{ID: "a", Addr: "127.0.0.1:9", MemCap: 1, DiskCap: 2})
	svs, err := s.Servers(ctx)
	if err != nil || len(svs) != 1 || svs[0].Addr != "127.0.0.1:9" {
		t.Fatalf("servers %+v %v", svs, err)
	}
	s.PutPool(ctx, Pool{Name: "ha", Replicas: 3})
	s.PutPool(ctx, Pool{Name: "perf", Replicas: 1})
	mustIs(t, s.PutPool(ctx, Pool{Name: "x"}), errs.ErrBadRequest)
	ps, err := s.Pools(ctx)
	if err != nil || len(ps) != 2 || ps[0].Name != "ha" || ps[0].Replicas != 3 {
		t.Fatalf("pools %+v %v", ps, err)
	}
}

// testRandomModel applies random namespace operations to the store and to a
// map, and checks they agree.
func testRandomModel(t *testing.T, s Store) {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(1, 2))
	model := map[string]int64{} // path -> size
	names := []string{"/m/a", "/m/b", "/m/c/d", "/m/c/e", "/n/x"}
	for i := 0; i < 150; i++ {
		p := names[r.IntN(len(names))]
		switch r.IntN(3) {
		case 0:
			_, err := s.CreateFile(ctx, File{Path: p, Pool: "perf", ChunkSize: 10, Modified: now})
			_, ok := model[p]
			if ok != errors.Is(err, errs.ErrExists) || (!ok && err != nil) {
				t.Fatalf("create %s: %v (exists in model: %v)", p, err, ok)
			}
			if !ok {
				model[p] = 0
			}
		case 1:
			err := s.RemoveFile(ctx, p)
			if _, ok := model[p]; ok != (err == nil) {
				t.Fatalf("remove %s: %v", p, err)
			}
			delete(model, p)
		case 2:
			f, err := s.File(ctx, p)
			size, ok := model[p]
			if ok != (err == nil) {
				t.Fatalf("stat %s: %v", p, err)
			}
			if ok {
				if f.Size != size {
					t.Fatalf("size %s %d vs %d", p, f.Size, size)
				}
				n := r.Int64N(100)
				s.Commit(ctx, f.ID, n, nil, false, now)
				model[p] = max(size, n)
			}
		}
	}
	n, _, _ := s.Totals(ctx)
	if n != int64(len(model)) {
		t.Fatalf("store has %d files, model %d", n, len(model))
	}
}

var llama = Layout{Model: "llama", Layers: 2, KVHeads: 2, HeadDim: 4, DType: "bf16", PageTokens: 16, Order: "layer_first"}

// planIn is a plan on counts alone (the rules of ranges, apart from the
// content check, which testSessionContent covers).
func planIn(id string, prompt int64) PlanInput {
	return PlanInput{Session: id, Model: "llama", PromptTokens: prompt, Dir: "/kv-sessions", Pool: "perf",
		ChunkSize: 1 << 20, PlanTTL: time.Hour, Now: now, UnsafeCountOnly: true}
}

// written pretends the engine wrote a plan's fresh range.
func written(t *testing.T, s Store, p Plan) {
	t.Helper()
	ctx := context.Background()
	for _, r := range p.Fresh {
		f, err := s.File(ctx, r.Path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Commit(ctx, f.ID, r.KVStart+r.KVLength, nil, false, now); err != nil {
			t.Fatal(err)
		}
	}
}

func testSessions(t *testing.T, s Store) {
	ctx := context.Background()
	bad := llama
	bad.DType = "fp64"
	mustIs(t, s.PutLayout(ctx, bad), errs.ErrBadRequest)
	_, err := s.PlanSession(ctx, planIn("s1", 10))
	mustIs(t, err, errs.ErrNotFound) // no layout yet
	if err := s.PutLayout(ctx, llama); err != nil {
		t.Fatal(err)
	}
	if tb := llama.TokenBytes(); tb != 2*2*2*4*2 || llama.RangeBytes(17) != 2*16*tb {
		t.Fatalf("token bytes %d", tb)
	}
	// A shared prefix of 32 tokens.
	pf, _ := s.CreateFile(ctx, File{Path: "/prefixes/sys", Pool: "ha", ChunkSize: 1 << 20, Modified: now})
	mustIs(t, s.PutPrefix(ctx, Prefix{Path: "/prefixes/sys", Model: "llama", Tokens: 32}), errs.ErrBadRequest) // not written
	s.Commit(ctx, pf.ID, llama.RangeBytes(32), nil, true, now)
	if err := s.PutPrefix(ctx, Prefix{Path: "/prefixes/sys", Model: "llama", Tokens: 32}); err != nil {
		t.Fatal(err)
	}
	in := planIn("s1", 100)
	in.Prefixes = []string{"/prefixes/sys"}
	p1, err := s.PlanSession(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	if p1.Cached != 32 || p1.Prefill != 68 || len(p1.Stored) != 1 || p1.Stored[0].Path != "/prefixes/sys" || p1.Load != llama.RangeBytes(32) ||
		len(p1.Fresh) != 1 || p1.Fresh[0].TokenStart != 32 || p1.Fresh[0].KVLength != llama.RangeBytes(68) || p1.Fresh[0].KVStart != 0 {
		t.Fatalf("first plan %+v", p1)
	}
	_, err = s.CommitSession(ctx, CommitInput{Session: "s1", PlanID: p1.ID, Now: now})
	mustIs(t, err, errs.ErrBadRequest) // not written yet
	written(t, s, p1)
	sess, err := s.CommitSession(ctx, CommitInput{Session: "s1", PlanID: p1.ID, Now: now})
	if err != nil || sess.Tokens != 100 || len(sess.Ranges) != 2 {
		t.Fatalf("commit: %v %+v", err, sess)
	}
	// A repeat of the last commit (its answer lost to a cut) is answered as
	// done and changes nothing.
	again, err := s.CommitSession(ctx, CommitInput{Session: "s1", PlanID: p1.ID, Now: now})
	if err != nil || again.Tokens != 100 || len(again.Ranges) != 2 || again.Ranges[1] != sess.Ranges[1] {
		t.Fatalf("repeated commit: %v %+v", err, again)
	}
	mustIs(t, s.RemoveFile(ctx, "/prefixes/sys"), errs.ErrExists)
	mustIs(t, s.RemoveFile(ctx, p1.Fresh[0].Path), errs.ErrExists)

	// Two plans at once get disjoint fresh ranges; only the first commits.
	a, _ := s.PlanSession(ctx, planIn("s1", 150))
	b, _ := s.PlanSession(ctx, planIn("s1", 150))
	if a.Cached != 100 || a.Fresh[0].Path != b.Fresh[0].Path || a.Fresh[0].KVStart+a.Fresh[0].KVLength > b.Fresh[0].KVStart {
		t.Fatalf("overlapping fresh ranges: %+v %+v", a.Fresh, b.Fresh)
	}
	written(t, s, b)
	if _, err := s.CommitSession(ctx, CommitInput{Session: "s1", PlanID: a.ID, Now: now}); err != nil {
		t.Fatal(err)
	}
	_, err = s.CommitSession(ctx, CommitInput{Session: "s1", PlanID: b.ID, Now: now})
	mustIs(t, err, errs.ErrExists)
	_, err = s.CommitSession(ctx, CommitInput{Session: "s1", PlanID: p1.ID, Now: now})
	mustIs(t, err, errs.ErrNotFound) // a plan commits once: no repeat after another commit

	// Wrong model, bad token counts, bad ids.
	wrong := planIn("s1", 10)
	wrong.Model = "other"
	s.PutLayout(ctx, Layout{Model: "other", Layers: 1, KVHeads: 1, HeadDim: 1, DType: "fp16", PageTokens: 1, Order: "page_first"})
	_, err = s.PlanSession(ctx, wrong)
	mustIs(t, err, errs.ErrBadRequest)
	_, err = s.PlanSession(ctx, planIn("s1", 0))
	mustIs(t, err, errs.ErrBadRequest)
	_, err = s.PlanSession(ctx, planIn("a/b", 10))
	mustIs(t, err, errs.ErrBadRequest)

	// Fork shares ranges; the fork's new KV goes to its own file.
	if err := s.ForkSession(ctx, "s1", "s2", "", now); err != nil {
		t.Fatal(err)
	}
	mustIs(t, s.ForkSession(ctx, "s1", "s2", "", now), errs.ErrExists)
	f2, _ := s.PlanSession(ctx, planIn("s2", 170))
	if f2.Cached != 150 || len(f2.Stored) != 3 || f2.Fresh[0].Path == a.Fresh[0].Path {
		t.Fatalf("fork plan %+v", f2)
	}
	// A shorter prompt rewinds: stored ranges stop at the last whole range.
	r, _ := s.PlanSession(ctx, planIn("s1", 120))
	if r.Cached != 100 || r.Fresh[0].TokenStart != 100 || r.Fresh[0].TokenLength != 20 {
		t.Fatalf("rewind plan %+v", r)
	}
	// Deleting s1 keeps files s2 still uses; deleting s2 removes them.
	shared := p1.Fresh[0].Path
	if err := s.DeleteSession(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.File(ctx, shared); err != nil {
		t.Fatalf("file shared with a fork was removed: %v", err)
	}
	if err := s.DeleteSession(ctx, "s2"); err != nil {
		t.Fatal(err)
	}
	_, err = s.File(ctx, shared)
	mustIs(t, err, errs.ErrNotFound)
	mustIs(t, s.DeleteSession(ctx, "s2"), errs.ErrNotFound)
	if _, err := s.File(ctx, "/prefixes/sys"); err != nil {
		t.Fatalf("prefix removed with its last session: %v", err)
	}

	// page_first: a prompt ending inside a range uses its whole pages.
	pfl := llama
	pfl.Model, pfl.Order = "pf", "page_first"
	s.PutLayout(ctx, pfl)
	in = planIn("p1", 64)
	in.Model = "pf"
	x, _ := s.PlanSession(ctx, in)
	written(t, s, x)
	s.CommitSession(ctx, CommitInput{Session: "p1", PlanID: x.ID, Now: now})
	in.PromptTokens = 40
	y, _ := s.PlanSession(ctx, in)
	if y.Cached != 32 || y.Stored[0].TokenLength != 32 || y.Stored[0].KVLength != 2*pfl.PageBytes() || y.Fresh[0].TokenLength != 8 {
		t.Fatalf("page_first clip %+v", y)
	}
	list, err := s.Sessions(ctx, "", 10)
	if err != nil || len(list) != 1 || list[0].ID != "p1" || list[0].Tokens != 64 {
		t.Fatalf("sessions %+v %v", list, err)
	}
}

func testSessionQuota(t *testing.T, s Store) {
	ctx := context.Background()
	s.PutLayout(ctx, llama)
	page := llama.PageBytes()
	quota := 5 * page
	t0 := now
	mk := func(id string, tokens int64, at time.Time) Plan {
		in := planIn(id, tokens)
		in.Quota, in.Now = quota, at
		p, err := s.PlanSession(ctx, in)
		if err != nil {
			t.Fatalf("plan %s: %v", id, err)
		}
		written(t, s, p)
		if _, err := s.CommitSession(ctx, CommitInput{Session: id, PlanID: p.ID, Now: at}); err != nil {
			t.Fatal(err)
		}
		return p
	}
	mk("old", 32, t0)                    // 2 pages
	mk("mid", 32, t0.Add(time.Second))   // 2 pages
	mk("new", 16, t0.Add(2*time.Second)) // 1 page: 5 pages, at quota
	in := planIn("next", 32)
	in.Quota, in.Now = quota, t0.Add(3*time.Second)
	p, err := s.PlanSession(ctx, in)
	// Least recently used first, down to 1/32 of the quota below it
	// (quotaLow): "old" leaves 5 pages, at the quota, so "mid" goes too.
	if err != nil || !slices.Equal(p.Evicted, []string{"old", "mid"}) {
		t.Fatalf("eviction: %v %+v", err, p.Evicted)
	}
	for _, id := range p.Evicted {
		_, err = s.Session(ctx, id)
		mustIs(t, err, errs.ErrNotFound)
	}
	// 3 pages more: "new" goes, which leaves the quota's 5 pages, not its
	// low mark, and no idle session is left to evict: the plan is made.
	in3 := planIn("small", 48)
	in3.Quota, in3.Now = quota, t0.Add(3500*time.Millisecond)
	if p, err := s.PlanSession(ctx, in3); err != nil || len(p.Evicted) != 1 || p.Evicted[0] != "new" {
		t.Fatalf("plan under the quota: %v %+v", err, p.Evicted)
	}
	// "next" has a plan outstanding: it is never evicted, even as the LRU.
	in2 := planIn("big", 64)
	in2.Quota, in2.Now = quota, t0.Add(4*time.Second)
	_, err = s.PlanSession(ctx, in2)
	mustIs(t, err, errs.ErrNoSpace)
	if _, err := s.Session(ctx, "next"); err != nil {
		t.Fatalf("session with a plan outstanding was evicted: %v", err)
	}
}

// testSessionLastUse: a plan writes no last_used of its own (lastUsedCol),
// yet it is its session's last use: in the Session answer while it is
// outstanding, and in the quota's LRU order once it expired uncommitted.
func testSessionLastUse(t *testing.T, s Store) {
	ctx := context.Background()
	s.PutLayout(ctx, llama)
	quota := 5 * llama.PageBytes()
	t0 := now
	turn := func(id string, tokens int64, at time.Time, commit bool) Plan {
		t.Helper()
		in := planIn(id, tokens)
		in.Quota, in.Now = quota, at
		p, err := s.PlanSession(ctx, in)
		if err != nil {
			t.Fatalf("plan %s: %v", id, err)
		}
		if commit {
			written(t, s, p)
			if _, err := s.CommitSession(ctx, CommitInput{Session: id, PlanID: p.ID, Now: at}); err != nil {
				t.Fatal(err)
			}
		}
		return p
	}
	lastUse := func(id string, want time.Time) {
		t.Helper()
		got, err := s.Session(ctx, id)
		if err != nil || !got.LastUsed.Equal(want) {
			t.Fatalf("session %s last used %v (%v), want %v", id, got.LastUsed, err, want)
		}
		list, err := s.Sessions(ctx, "", 10)
		i := slices.IndexFunc(list, func(x Session) bool { return x.ID == id })
		if err != nil || i < 0 || !list[i].LastUsed.Equal(want) {
			t.Fatalf("sessions list %+v (%v), want %s last used %v", list, err, id, want)
		}
	}
	turn("a", 32, t0, true)                  // 2 pages
	turn("b", 32, t0.Add(time.Second), true) // 2 pages
	lastUse("a", t0)
	// a plans again (1 page: at quota) and never commits.
	turn("a", 48, t0.Add(2*time.Second), false)
	lastUse("a", t0.Add(2*time.Second))
	lastUse("b", t0.Add(time.Second))
	// c's plan comes after the TTL: a's plan expires (its reservation stays
	// in a's file), and c's page must evict the least recently used: b,
	// planned last before a's plan.
	c := turn("c", 16, t0.Add(2*time.Second+time.Hour+time.Second), false)
	if len(c.Evicted) != 1 || c.Evicted[0] != "b" {
		t.Fatalf("evicted %q, want b (a was last used by its expired plan)", c.Evicted)
	}
	lastUse("a", t0.Add(2*time.Second))
	// A commit keeps the later time of a plan still outstanding.
	turn("c", 16, t0.Add(time.Hour+5*time.Second), false)
	written(t, s, c)
	if _, err := s.CommitSession(ctx, CommitInput{Session: "c", PlanID: c.ID, Now: t0.Add(time.Hour + 4*time.Second)}); err != nil {
		t.Fatal(err)
	}
	lastUse("c", t0.Add(time.Hour+5*time.Second))
}

func testLead(t *testing.T, s Store) {
	ctx := context.Background()
	ok, err := s.Lead(ctx, testMasterURL)
	if err != nil || !ok {
		t.Fatalf("first master does not lead: %v %v", ok, err)
	}
	if ok, _ := s.Lead(ctx, testMasterURL); !ok {
		t.Fatal("leader lost leadership by asking again")
	}
	if u, err := s.Leader(ctx); err != nil || u != testMasterURL {
		t.Fatalf("leader url %q %v", u, err)
	}
}

// testSessionEngine: plans for an engine of whole blocks with tensor
// parallelism, and commits of what it saved, good and bad.
func testSessionEngine(t *testing.T, s Store) {
	ctx := context.Background()
	// A leading master's store: session transactions must not wait on the
	// leadership lock.
	if ok, err := s.Lead(ctx, "http://m"); !ok || err != nil {
		t.Fatalf("lead: %v %v", ok, err)
	}
	l := Layout{Model: "tp", Layers: 2, KVHeads: 4, HeadDim: 8, DType: "bf16", PageTokens: 16, Order: "kv_first", TPSize: 2}
	if err := s.PutLayout(ctx, l); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Layout(ctx, "tp"); got != l || l.TokenBytes() != 2*l.RankTokenBytes() || l.RankTokenBytes() != 2*2*2*8*2 {
		t.Fatalf("layout %+v, token bytes %d", got, l.TokenBytes())
	}
	for _, bad := range []Layout{
		{Model: "x", Layers: 1, KVHeads: 3, HeadDim: 8, DType: "bf16", PageTokens: 16, Order: "kv_first", TPSize: 2},
		{Model: "x", Layers: 1, KVHeads: 2, HeadDim: 8, DType: "bf16", PageTokens: 16, Order: "kv_first", TPSize: 5000},
		{Model: "x", Layers: 1 << 62, KVHeads: 2, HeadDim: 8, DType: "bf16", PageTokens: 16, Order: "kv_first"},
	} {
		mustIs(t, s.PutLayout(ctx, bad), errs.ErrBadRequest)
	}
	in := planIn("e1", 40)
	in.Model, in.DecodeTokens, in.Aligned = "tp", 10, true
	p, err := s.PlanSession(ctx, in)
	if err != nil || p.Cached != 0 || len(p.Fresh) != 1 || p.Fresh[0].TokenLength != 64 || p.Fresh[0].KVLength != 64*l.TokenBytes() {
		t.Fatalf("plan %+v %v", p, err)
	}
	fr := p.Fresh[0]
	written(t, s, p)
	// Another session's file, for the bad commit below.
	other, err := s.PlanSession(ctx, func() PlanInput { x := in; x.Session = "e2"; return x }())
	if err != nil {
		t.Fatal(err)
	}
	seg := func(start, n, kv int64) Range {
		return Range{TokenStart: start, TokenLength: n, Path: fr.Path, KVStart: kv, KVLength: l.RangeBytes(n)}
	}
	bad := map[string][]Range{
		"overlapping":        {seg(0, 32, fr.KVStart), seg(16, 16, fr.KVStart+l.RangeBytes(32))},
		"not block-aligned":  {seg(0, 10, fr.KVStart)},
		"outside the plan":   {seg(0, 32, fr.KVStart+fr.KVLength)},
		"over the reserved":  {seg(0, 80, fr.KVStart)},
		"bytes overlap":      {seg(0, 16, fr.KVStart), seg(16, 16, fr.KVStart+8)},
		"another session's":  {{TokenStart: 0, TokenLength: 16, Path: other.Fresh[0].Path, KVStart: other.Fresh[0].KVStart, KVLength: l.RangeBytes(16)}},
		"wrong size":         {{TokenStart: 0, TokenLength: 16, Path: fr.Path, KVStart: fr.KVStart, KVLength: 7}},
		"not from the start": {seg(16, 16, fr.KVStart)},
		"negative":           {seg(0, -16, fr.KVStart)},
	}
	for name, saved := range bad {
		_, err := s.CommitSession(ctx, CommitInput{Session: "e1", PlanID: p.ID, Partial: true, Saved: saved, Now: now})
		if !errors.Is(err, errs.ErrBadRequest) {
			t.Fatalf("%s segments: %v", name, err)
		}
	}
	if sess, _ := s.Session(ctx, "e1"); sess.Tokens != 0 || len(sess.Ranges) != 0 {
		t.Fatalf("a refused commit recorded something: %+v", sess)
	}
	// The engine saved 2 of the 4 blocks; the commit finds the plan by them.
	sess, err := s.CommitSession(ctx, CommitInput{Session: "e1", Partial: true, Saved: []Range{seg(0, 32, fr.KVStart)}, Now: now})
	if err != nil || sess.Tokens != 32 || len(sess.Ranges) != 1 || sess.Ranges[0] != seg(0, 32, fr.KVStart) {
		t.Fatalf("partial commit: %+v %v", sess, err)
	}
	// Sent again (its answer lost to a cut): recognised by the segments the
	// session now holds, answered as done, nothing changed.
	again, err := s.CommitSession(ctx, CommitInput{Session: "e1", Partial: true, Saved: []Range{seg(0, 32, fr.KVStart)}, Now: now})
	if err != nil || again.Tokens != 32 || len(again.Ranges) != 1 || again.Ranges[0] != sess.Ranges[0] {
		t.Fatalf("repeated partial commit: %+v %v", again, err)
	}
	_, err = s.CommitSession(ctx, CommitInput{Session: "e1", Partial: true, Saved: []Range{seg(0, 32, fr.KVStart+4096)}, Now: now})
	mustIs(t, err, errs.ErrNotFound) // a segment no plan reserved and the session does not hold
	// A prompt of 33 tokens may use both blocks; one of 32 none: the engine
	// must compute the last token, and a kv_first range is not cut inside.
	in.DecodeTokens = 0
	for prompt, want := range map[int64]int64{33: 32, 32: 0, 17: 0, 100: 32} {
		in.PromptTokens = prompt
		q, err := s.PlanSession(ctx, in)
		if err != nil || q.Cached != want {
			t.Fatalf("prompt %d: cached %d, want %d (%v)", prompt, q.Cached, want, err)
		}
	}
	// Committing nothing saved of a plan cuts the session where it kept.
	in.PromptTokens = 20
	q, _ := s.PlanSession(ctx, in)
	if sess, err := s.CommitSession(ctx, CommitInput{Session: "e1", PlanID: q.ID, Partial: true, Now: now}); err != nil || sess.Tokens != 0 {
		t.Fatalf("empty commit of a rewind: %+v %v", sess, err)
	}
	// Nothing saved and no plan named: nothing to commit.
	_, err = s.CommitSession(ctx, CommitInput{Session: "e1", Partial: true, Now: now})
	mustIs(t, err, errs.ErrBadRequest)
	// A commit for a session evicted or deleted meanwhile: plan again.
	mustIs(t, s.DeleteSession(ctx, "e2"), nil)
	_, err = s.CommitSession(ctx, CommitInput{Session: "e2", PlanID: other.ID, Now: now})
	mustIs(t, err, errs.ErrExists)
}

// TestLeaderSessionNoticesSilence: the PostgreSQL session that holds the
// leader lock runs with short keepalives and a user timeout, so the database
// ends it (and frees the lock for a standby) seconds after a leader is cut
// off, not after the kernel's two hours. The partition itself is exercised
// by the chaos harness (leader-partition).
func TestLeaderSessionNoticesSilence(t *testing.T) {
	if os.Getenv("GD2FS_TEST_POSTGRES") == "" && os.Getenv("GD2FS_REQUIRE_POSTGRES") == "" {
		t.Skip("PostgreSQL only: set GD2FS_TEST_POSTGRES")
	}
	ctx := context.Background()
	s := PostgresForTest(t).(*sqlStore)
	if ok, err := s.Lead(ctx, "http://m1"); !ok || err != nil {
		t.Fatalf("lead: %v %v", ok, err)
	}
	for name, want := range map[string]string{"tcp_keepalives_idle": "2", "tcp_keepalives_interval": "1", "tcp_keepalives_count": "3", "tcp_user_timeout": "5000"} {
		var got string
		if err := s.lead.conn.QueryRowContext(ctx, "SHOW "+name).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("leader session %s = %q, want %q", name, got, want)
		}
	}
}

// TestOpenBesideBusyLeader: a master that starts (and migrates the schema)
// while the leader has a write transaction open on its tables neither
// waits for it nor deadlocks with it: an existing schema is not touched.
// Before, CREATE INDEX IF NOT EXISTS took a share lock on the table and
// waited behind the leader's writes (and deadlocked with them).
func TestOpenBesideBusyLeader(t *testing.T) {
	if os.Getenv("GD2FS_TEST_POSTGRES") == "" && os.Getenv("GD2FS_REQUIRE_POSTGRES") == "" {
		t.Skip("PostgreSQL only: set GD2FS_TEST_POSTGRES")
	}
	ctx := context.Background()
	dsn := PostgresDSNForTest(t)
	a, err := Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	tx, err := a.(*sqlStore).db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	for _, q := range []string{
		`INSERT INTO files (id, path, parent, pool, chunk_size, size, sealed, mtime) VALUES (999, '/busy', '/', 'perf', 1, 0, 0, 0)`,
		`INSERT INTO replicas (chunk_id, pos, server_id) VALUES (1, 0, 's1')`,
		`INSERT INTO kv_sessions (id, model, tokens, last_used, created, file_seq) VALUES ('busy', 'm', 0, 0, 0, 0)`,
	} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			t.Fatal(q, err)
		}
	}
	opened := make(chan error, 1)
	go func() {
		b, err := Open(ctx, dsn)
		if err == nil {
			b.Close()
		}
		opened <- err
	}()
	select {
	case err := <-opened:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("opening the store waited for another master's open write transaction")
	}
}

func TestCreatedName(t *testing.T) {
	for q, want := range map[string]string{
		"CREATE TABLE IF NOT EXISTS counters (k TEXT)":         "counters",
		"CREATE INDEX IF NOT EXISTS files_parent ON files (p)": "files_parent",
		"CREATE TABLE IF NOT EXISTS kv_layouts(model TEXT)":    "kv_layouts",
		"INSERT INTO counters (k, v) VALUES ('epoch', 1)":      "",
		"CREATE UNIQUE INDEX IF NOT EXISTS u ON t (a)":         "u",
	} {
		if got := createdName(q); got != want {
			t.Errorf("createdName(%q) = %q, want %q", q, got, want)
		}
	}
}
