package meta

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/errs"
)

// engines returns a fresh store per engine. PostgreSQL runs when
// GD2FS_TEST_POSTGRES names a server (scripts/test.sh starts one); with
// GD2FS_REQUIRE_POSTGRES=1 its absence is a failure, not a skip.
func engines(t *testing.T) map[string]func(t *testing.T) Store {
	return map[string]func(t *testing.T) Store{
		"sqlite": func(t *testing.T) Store {
			s, err := Open(context.Background(), "sqlite://"+filepath.Join(t.TempDir(), "meta.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
		"postgres": func(t *testing.T) Store { return PostgresForTest(t) },
	}
}

// PostgresForTest opens a store in a fresh schema of the test PostgreSQL.
func PostgresForTest(t testing.TB) Store {
	dsn := os.Getenv("GD2FS_TEST_POSTGRES")
	if dsn == "" {
		if os.Getenv("GD2FS_REQUIRE_POSTGRES") == "1" {
			t.Fatal("GD2FS_TEST_POSTGRES is not set: run the tests with scripts/test.sh")
		}
		t.Skip("GD2FS_TEST_POSTGRES not set; scripts/test.sh starts PostgreSQL and sets it")
	}
	ctx := context.Background()
	admin, err := Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	schema := fmt.Sprintf("t_%d_%d", time.Now().UnixNano(), rand.IntN(1e6))
	if _, err := admin.(*sqlStore).db.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	s, err := Open(ctx, dsn+sep+"search_path="+schema)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		admin.(*sqlStore).db.ExecContext(ctx, "DROP SCHEMA "+schema+" CASCADE")
		admin.Close()
	})
	return s
}

func TestConformance(t *testing.T) {
	for name, open := range engines(t) {
		t.Run(name, func(t *testing.T) {
			for _, tc := range []struct {
				name string
				fn   func(t *testing.T, s Store)
			}{
				{"namespace", testNamespace},
				{"chunks", testChunks},
				{"servers", testServersPools},
				{"model", testRandomModel},
			} {
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
	if err := s.RemoveFile(ctx, "/a/b/c.bin"); err != nil {
		t.Fatal(err)
	}
	mustIs(t, s.RemoveFile(ctx, "/a/b/c.bin"), errs.ErrNotFound)
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
	all, _ = s.Chunks(ctx, f.ID)
	if all[0].Replicas[2] != "s4" {
		t.Fatalf("replace kept position? %+v", all[0])
	}
	if ts, _ := s.Tombstones(ctx, "s3", 10); len(ts) != 1 || ts[0] != cs[0].ID {
		t.Fatalf("replaced replica owes a delete: %v", ts)
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
