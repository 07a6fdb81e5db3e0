package meta

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/errs"
)

// TestNamespaceRaces: changes of the tree of names that race leave one
// tree. On PostgreSQL, under READ COMMITTED, a create and a mkdir of one
// path each checked that the other's table lacked it and both inserted (a
// file and a directory at one path), and a create in a directory raced a
// remove of it (a file in no directory); two allocations of one chunk
// both passed the check that it was not there, and one failed on the
// unique index; an allocation beside a file's removal left chunks of no
// file; attributes set beside a rename stayed on the old path. Each pair
// runs at once, many times; the tree is checked after every round.
func TestNamespaceRaces(t *testing.T) {
	for name, open := range engines(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t).(*sqlStore)
			ctx := context.Background()
			now := time.Now().UTC()
			// both runs a and b at once and returns their errors.
			both := func(a, b func() error) (error, error) {
				var wg sync.WaitGroup
				start := make(chan struct{})
				var ea, eb error
				wg.Add(2)
				go func() { defer wg.Done(); <-start; ea = a() }()
				go func() { defer wg.Done(); <-start; eb = b() }()
				close(start)
				wg.Wait()
				return ea, eb
			}
			// expected: the loser of a race is refused with one of these.
			expected := func(err error, kinds ...error) error {
				if err == nil {
					return nil
				}
				for _, k := range kinds {
					if errors.Is(err, k) {
						return nil
					}
				}
				return err
			}
			check := func(round int) {
				t.Helper()
				tx, err := s.snapshot(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback()
				if err := namespaceTx(ctx, tx); err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
			}
			for i := 0; i < 40; i++ {
				p := fmt.Sprintf("/race/same/%d", i)
				ef, ed := both(
					func() error {
						_, err := s.CreateFile(ctx, File{Path: p, Pool: "perf", ChunkSize: 1 << 20, Modified: now})
						return err
					},
					func() error { return s.Mkdir(ctx, p, now) })
				if err := expected(ef, errs.ErrIsDir); err != nil {
					t.Fatalf("create %s: %v", p, err)
				}
				if err := expected(ed, errs.ErrNotDir, errs.ErrExists); err != nil {
					t.Fatalf("mkdir %s: %v", p, err)
				}
				if (ef == nil) == (ed == nil) {
					t.Fatalf("round %d: create (%v) and mkdir (%v) of %s: exactly one must win", i, ef, ed, p)
				}
				check(i)

				d := fmt.Sprintf("/race/dir/%d", i)
				if err := s.Mkdir(ctx, d, now); err != nil {
					t.Fatal(err)
				}
				ef, er := both(
					func() error {
						_, err := s.CreateFile(ctx, File{Path: d + "/f", Pool: "perf", ChunkSize: 1 << 20, Modified: now})
						return err
					},
					func() error { return s.RemoveDir(ctx, d) })
				if ef != nil {
					t.Fatalf("create in %s: %v", d, ef)
				}
				if err := expected(er, errs.ErrNotEmpty); err != nil {
					t.Fatalf("rmdir %s: %v", d, err)
				}
				check(i)

				// Two writers allocate one chunk of a file at once: both
				// get it, and it is one chunk.
				f, err := s.CreateFile(ctx, File{Path: fmt.Sprintf("/race/chunks/%d", i), Pool: "perf", ChunkSize: 1 << 20, Modified: now})
				if err != nil {
					t.Fatal(err)
				}
				var got [2][]Chunk
				add := func(k int, idx int64) func() error {
					return func() error {
						var err error
						got[k], err = s.AddChunks(ctx, f.ID, []Chunk{{Index: idx, Replicas: []string{"s1"}}})
						return err
					}
				}
				if e1, e2 := both(add(0, 3), add(1, 3)); e1 != nil || e2 != nil {
					t.Fatalf("round %d: two allocations of one chunk: %v, %v", i, e1, e2)
				}
				if len(got[0]) != 1 || len(got[1]) != 1 || got[0][0].ID != got[1][0].ID {
					t.Fatalf("round %d: two allocations of one chunk got %+v and %+v", i, got[0], got[1])
				}
				check(i)

				// A new chunk allocated while its file is removed: either
				// the allocation saw the file gone, or the removal took the
				// chunk.
				ea, erm := both(add(0, 4), func() error { return s.RemoveFile(ctx, f.Path) })
				if erm != nil {
					t.Fatalf("round %d: remove: %v", i, erm)
				}
				if err := expected(ea, errs.ErrNotFound); err != nil {
					t.Fatalf("round %d: allocation beside a removal: %v", i, err)
				}
				check(i)
			}

			// Attributes set while their file is renamed back and forth:
			// each goes with the file or is refused (the file was not
			// there), never left behind on a path with no file.
			f, err := s.CreateFile(ctx, File{Path: "/race/attrs/a", Pool: "perf", ChunkSize: 1 << 20, Modified: now})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Commit(ctx, f.ID, 0, nil, true, now); err != nil {
				t.Fatal(err)
			}
			ea, erm := both(func() error {
				for i := range 300 {
					err := s.SetAttrs(ctx, "/race/attrs/a", map[string]string{"n": fmt.Sprint(i)})
					if err := expected(err, errs.ErrNotFound); err != nil {
						return err
					}
				}
				return nil
			}, func() error {
				for i := range 150 {
					from, to := "/race/attrs/a", "/race/attrs/b"
					if i%2 == 1 {
						from, to = to, from
					}
					if err := s.Rename(ctx, from, to, RenameOptions{}, now); err != nil {
						return err
					}
				}
				return nil
			})
			if ea != nil || erm != nil {
				t.Fatalf("attributes beside renames: %v; renames: %v", ea, erm)
			}
			check(-1)
		})
	}
}
