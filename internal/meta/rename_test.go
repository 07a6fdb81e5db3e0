package meta

import (
	"context"
	"errors"
	"math/rand/v2"
	"path"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/errs"
)

// sealedFile creates p, sized and sealed, with one chunk on server s1.
func sealedFile(t *testing.T, s Store, p string, size int64) File {
	t.Helper()
	ctx := context.Background()
	f, err := s.CreateFile(ctx, File{Path: p, Pool: "ha", ChunkSize: 1 << 20, Modified: now})
	if err != nil {
		t.Fatalf("create %s: %v", p, err)
	}
	if _, err := s.AddChunks(ctx, f.ID, []Chunk{{Index: 0, Replicas: []string{"s1"}}}); err != nil {
		t.Fatal(err)
	}
	if f, err = s.Commit(ctx, f.ID, size, map[int64]int64{0: size}, true, now); err != nil {
		t.Fatal(err)
	}
	return f
}

// tree is every directory and file (with its id and size) under /, by path.
func tree(t *testing.T, s Store) map[string]string {
	t.Helper()
	out := map[string]string{}
	var walk func(dir string)
	walk = func(dir string) {
		es, err := s.List(context.Background(), dir)
		if err != nil {
			t.Fatalf("list %s: %v", dir, err)
		}
		for _, e := range es {
			if path.Dir(e.Path) != dir {
				t.Fatalf("%s listed in %s", e.Path, dir)
			}
			if e.IsDir {
				out[e.Path] = "dir"
				walk(e.Path)
				continue
			}
			f, err := s.File(context.Background(), e.Path)
			if err != nil || f.ID != e.File.ID {
				t.Fatalf("listed %s (id %d) but File says %+v %v", e.Path, e.File.ID, f, err)
			}
			out[e.Path] = "file"
		}
	}
	walk("/")
	return out
}

func testRename(t *testing.T, s Store) {
	ctx := context.Background()
	// A file keeps its id, chunks, size, time and attributes; the old name
	// is gone, new parents exist.
	a := sealedFile(t, s, "/m/a.incomplete", 100)
	if err := s.SetAttrs(ctx, "/m/a.incomplete", map[string]string{"source": "s3://b/k", "sha256": "ab"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Rename(ctx, "/m/a.incomplete", "/m/new/a", RenameOptions{RequestID: "r1"}, now); err != nil {
		t.Fatal(err)
	}
	got, err := s.File(ctx, "/m/new/a")
	if err != nil || got.ID != a.ID || got.Size != 100 || !got.Sealed || !got.Modified.Equal(a.Modified) {
		t.Fatalf("renamed file %+v %v; was %+v", got, err, a)
	}
	if cs, err := s.Chunks(ctx, a.ID); err != nil || len(cs) != 1 || cs[0].Length != 100 {
		t.Fatalf("chunks after rename %+v %v", cs, err)
	}
	if at, err := s.Attrs(ctx, "/m/new/a"); err != nil || at["source"] != "s3://b/k" || at["sha256"] != "ab" || at[RenameIDAttr] != "r1" {
		t.Fatalf("attrs after rename %v %v", at, err)
	}
	if at, _ := s.Attrs(ctx, "/m/a.incomplete"); len(at) != 0 {
		t.Fatalf("attrs left at the old name: %v", at)
	}
	_, err = s.File(ctx, "/m/a.incomplete")
	mustIs(t, err, errs.ErrNotFound)
	mustIs(t, s.Rename(ctx, "/m/a.incomplete", "/m/x", RenameOptions{}, now), errs.ErrNotFound)
	if err := s.Rename(ctx, "/m/new/a", "/m/new/a", RenameOptions{}, now); err != nil {
		t.Fatalf("rename onto itself: %v", err)
	}

	// Onto a sealed file: replaced (its chunks tombstoned), unless NoReplace.
	b := sealedFile(t, s, "/m/b", 7)
	mustIs(t, s.Rename(ctx, "/m/new/a", "/m/b", RenameOptions{NoReplace: true}, now), errs.ErrExists)
	if err := s.Rename(ctx, "/m/new/a", "/m/b", RenameOptions{}, now); err != nil {
		t.Fatal(err)
	}
	if got, err := s.File(ctx, "/m/b"); err != nil || got.ID != a.ID {
		t.Fatalf("/m/b is %+v %v, want file %d", got, err, a.ID)
	}
	if cs, _ := s.Chunks(ctx, b.ID); len(cs) != 0 {
		t.Fatalf("replaced file's chunks stayed: %+v", cs)
	}
	if ids, err := s.Tombstones(ctx, "s1", 100); err != nil || len(ids) != 1 {
		t.Fatalf("replaced file's chunk not tombstoned: %v %v", ids, err)
	}
	if n, bytes, _ := s.Totals(ctx); n != 1 || bytes != 100 {
		t.Fatalf("totals %d files %d bytes, want 1 and 100", n, bytes)
	}

	// A file being written is busy, as source and as target.
	w, err := s.CreateFile(ctx, File{Path: "/m/w", Pool: "ha", ChunkSize: 1 << 20, Modified: now})
	if err != nil {
		t.Fatal(err)
	}
	mustIs(t, s.Rename(ctx, "/m/w", "/m/w2", RenameOptions{}, now), errs.ErrBusy)
	mustIs(t, s.Rename(ctx, "/m/b", "/m/w", RenameOptions{}, now), errs.ErrBusy)
	// Onto a directory, or under a file: refused.
	if err := s.Mkdir(ctx, "/m/d", now); err != nil {
		t.Fatal(err)
	}
	mustIs(t, s.Rename(ctx, "/m/b", "/m/d", RenameOptions{}, now), errs.ErrIsDir)
	mustIs(t, s.Rename(ctx, "/m/b", "/m/b/c", RenameOptions{}, now), errs.ErrNotDir)
	mustIs(t, s.Rename(ctx, "/m/b", "/", RenameOptions{}, now), errs.ErrBadRequest)
	mustIs(t, s.Rename(ctx, "/m/b", "/m/x\x00", RenameOptions{}, now), errs.ErrBadRequest)

	// Directories: with everything under them; onto an empty directory;
	// not onto a full one, a file, or into themselves; not while a file
	// under them is being written.
	mustIs(t, s.Rename(ctx, "/m", "/n", RenameOptions{}, now), errs.ErrBusy) // /m/w
	if _, err := s.Commit(ctx, w.ID, 0, nil, true, now); err != nil {
		t.Fatal(err)
	}
	sealedFile(t, s, "/m/d/e/f", 3)
	sealedFile(t, s, "/m_x/g", 3) // a sibling whose name starts with "/m": stays
	if err := s.SetAttrs(ctx, "/m/d/e/f", map[string]string{"sha256": "ff"}); err != nil {
		t.Fatal(err)
	}
	mustIs(t, s.Rename(ctx, "/m", "/m/d/m", RenameOptions{}, now), errs.ErrBadRequest)
	mustIs(t, s.Rename(ctx, "/m", "/m_x/g", RenameOptions{}, now), errs.ErrNotDir)
	mustIs(t, s.Rename(ctx, "/m", "/m_x", RenameOptions{}, now), errs.ErrNotEmpty)
	if err := s.Mkdir(ctx, "/empty", now); err != nil {
		t.Fatal(err)
	}
	mustIs(t, s.Rename(ctx, "/m", "/empty", RenameOptions{NoReplace: true}, now), errs.ErrExists)
	before := tree(t, s)
	if err := s.Rename(ctx, "/m", "/empty", RenameOptions{}, now); err != nil {
		t.Fatal(err)
	}
	after := tree(t, s)
	want := map[string]string{}
	for p, kind := range before {
		if p == "/m" || strings.HasPrefix(p, "/m/") {
			p = "/empty" + strings.TrimPrefix(p, "/m")
		}
		want[p] = kind
	}
	if !sameTree(want, after) {
		t.Fatalf("after moving /m to /empty:\n got %v\nwant %v", keys(after), keys(want))
	}
	if at, err := s.Attrs(ctx, "/empty/d/e/f"); err != nil || at["sha256"] != "ff" {
		t.Fatalf("attrs of a file in a moved directory: %v %v", at, err)
	}
	// Moving a directory into a new parent creates the parent.
	if err := s.Rename(ctx, "/empty/d", "/p/q/d", RenameOptions{}, now); err != nil {
		t.Fatal(err)
	}
	if _, err := s.File(ctx, "/p/q/d/e/f"); err != nil {
		t.Fatal(err)
	}
	mustIs(t, s.RemoveDir(ctx, "/p/q"), errs.ErrNotEmpty)

	// Files of KV sessions keep their names.
	if err := s.PutLayout(ctx, llama); err != nil {
		t.Fatal(err)
	}
	pf := sealedFile(t, s, "/prefixes/sys", llama.RangeBytes(32))
	_ = pf
	if err := s.PutPrefix(ctx, Prefix{Path: "/prefixes/sys", Model: "llama", Tokens: 32}); err != nil {
		t.Fatal(err)
	}
	mustIs(t, s.Rename(ctx, "/prefixes/sys", "/prefixes/sys2", RenameOptions{}, now), errs.ErrBusy)
	mustIs(t, s.Rename(ctx, "/prefixes", "/prefixes2", RenameOptions{}, now), errs.ErrBusy)
	mustIs(t, s.Rename(ctx, "/empty/b", "/prefixes/sys", RenameOptions{}, now), errs.ErrBusy)
}

func sameTree(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// testRenameModel runs random creates, renames (of files and folders) and
// removes against a map of what should be there, and compares the whole
// tree after each step.
func testRenameModel(t *testing.T, s Store) {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(3, 4))
	names := []string{"/a", "/a/b", "/a/b/c", "/a/%", "/a/_", "/x", "/x/y", "/é", "/é/z"}
	model := map[string]int64{} // file path -> id
	dirs := map[string]bool{}   // directories that exist
	addDirs := func(p string) {
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	under := func(p, d string) bool { return p == d || strings.HasPrefix(p, d+"/") }
	for i := 0; i < 300; i++ {
		p, q := names[r.IntN(len(names))], names[r.IntN(len(names))]
		switch r.IntN(4) {
		case 0:
			f, err := s.CreateFile(ctx, File{Path: p, Pool: "perf", ChunkSize: 1 << 20, Modified: now})
			if err != nil {
				continue // exists, or a folder is in the way: the namespace test covers those
			}
			if _, err := s.Commit(ctx, f.ID, 1, nil, true, now); err != nil {
				t.Fatal(err)
			}
			model[p] = f.ID
			addDirs(p)
		case 1:
			if s.RemoveFile(ctx, p) == nil {
				delete(model, p)
			} else if s.RemoveDir(ctx, p) == nil {
				delete(dirs, p)
			}
		default:
			err := s.Rename(ctx, p, q, RenameOptions{}, now)
			_, isFile := model[p]
			switch {
			case err != nil && (isFile || dirs[p]) && !(dirs[p] && strings.HasPrefix(q, p+"/")):
				// Legal refusals: onto a folder, a full folder, a file, below a file.
				if !errors.Is(err, errs.ErrIsDir) && !errors.Is(err, errs.ErrNotEmpty) && !errors.Is(err, errs.ErrNotDir) {
					t.Fatalf("step %d: rename %s %s: %v", i, p, q, err)
				}
			case err != nil:
			case isFile:
				if p != q {
					model[q] = model[p]
					delete(model, p)
					addDirs(q)
				}
			case dirs[p]:
				if p == q {
					break
				}
				nm, nd := map[string]int64{}, map[string]bool{}
				for f, id := range model {
					if under(f, p) {
						f = q + strings.TrimPrefix(f, p)
					}
					nm[f] = id
				}
				for d := range dirs {
					if under(d, p) {
						d = q + strings.TrimPrefix(d, p)
					}
					nd[d] = true
				}
				model, dirs = nm, nd
				addDirs(q)
			default:
				t.Fatalf("step %d: rename of missing %s to %s succeeded", i, p, q)
			}
		}
		got := tree(t, s)
		want := map[string]string{}
		for d := range dirs {
			want[d] = "dir"
		}
		for f, id := range model {
			want[f] = "file"
			if g, err := s.File(ctx, f); err != nil || g.ID != id {
				t.Fatalf("step %d: %s is %+v %v, want file %d", i, f, g, err, id)
			}
		}
		if !sameTree(want, got) {
			t.Fatalf("step %d:\n got %v\nwant %v", i, keys(got), keys(want))
		}
	}
}

// testExpireUnsealed: unsealed files last written before the cut-off go
// (chunks tombstoned); sealed files, files written since, and files of KV
// sessions stay.
func testExpireUnsealed(t *testing.T, s Store) {
	ctx := context.Background()
	old := now.Add(-48 * time.Hour)
	dead, err := s.CreateFile(ctx, File{Path: "/w/dead", Pool: "ha", ChunkSize: 1 << 20, Modified: old})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddChunks(ctx, dead.ID, []Chunk{{Index: 0, Replicas: []string{"s1", "s2"}}}); err != nil {
		t.Fatal(err)
	}
	live, err := s.CreateFile(ctx, File{Path: "/w/live", Pool: "ha", ChunkSize: 1 << 20, Modified: old})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(ctx, live.ID, 10, nil, false, now.Add(2*time.Hour)); err != nil { // written lately
		t.Fatal(err)
	}
	sealed, err := s.CreateFile(ctx, File{Path: "/w/sealed", Pool: "ha", ChunkSize: 1 << 20, Modified: old})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(ctx, sealed.ID, 0, nil, true, old); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateFile(ctx, File{Path: "/prefixes/p", Pool: "ha", ChunkSize: 1 << 20, Modified: old}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutLayout(ctx, llama); err != nil {
		t.Fatal(err)
	}
	// A KV session's file (its plan reserved it): the sessions' expiry.
	p, err := s.PlanSession(ctx, planIn("s-exp", 20))
	if err != nil {
		t.Fatal(err)
	}
	gone, err := s.ExpireUnsealed(ctx, now.Add(time.Hour), 100)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range gone {
		names = append(names, f.Path)
	}
	sort.Strings(names)
	if strings.Join(names, " ") != "/prefixes/p /w/dead" {
		t.Fatalf("expired %v, want /prefixes/p and /w/dead", names)
	}
	if ids, err := s.Tombstones(ctx, "s2", 10); err != nil || len(ids) != 1 {
		t.Fatalf("the expired file's chunk: tombstones %v %v", ids, err)
	}
	for _, keep := range []string{"/w/live", "/w/sealed"} {
		if _, err := s.File(ctx, keep); err != nil {
			t.Fatalf("%s: %v", keep, err)
		}
	}
	if len(p.Fresh) == 0 {
		t.Fatal("the plan reserved no file")
	}
	for _, r := range p.Fresh {
		if _, err := s.File(ctx, r.Path); err != nil {
			t.Fatalf("a session's file %s: %v", r.Path, err)
		}
	}
	if again, err := s.ExpireUnsealed(ctx, now.Add(time.Hour), 100); err != nil || len(again) != 0 {
		t.Fatalf("a second pass: %v %v", again, err)
	}
}
