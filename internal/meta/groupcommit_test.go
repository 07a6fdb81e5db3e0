package meta

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/errs"
)

// TestGroupCommit holds the first group transaction until 28 more
// operations have queued behind it, so they run as one transaction: every
// good plan and commit takes effect and answers, each bad one (a commit of
// a plan that does not exist; an operation that writes a row and then
// fails or panics; one whose caller gave up while it waited) answers its
// own error and leaves nothing behind, and the invariants hold after.
func TestGroupCommit(t *testing.T) {
	for name, open := range engines(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			s := open(t).(*sqlStore)
			l := Layout{Model: "m", Layers: 2, KVHeads: 1, HeadDim: 8, DType: "fp16", PageTokens: 4, Order: "layer_first"}
			if err := s.PutLayout(ctx, l); err != nil {
				t.Fatal(err)
			}
			place := func(fileID, idx int64) ([]string, error) { return []string{"s1"}, nil }
			in := func(id string, prompt int64) PlanInput {
				return PlanInput{Session: id, Model: "m", PromptTokens: prompt, Dir: "/kv-sessions", Pool: "perf", ChunkSize: 1 << 20,
					PlanTTL: time.Hour, Now: time.Now(), Place: place, UnsafeCountOnly: true} // the content check is testSessionContent's
			}
			// Sessions g0..g7 with one outstanding plan each.
			plans := make([]Plan, 8)
			for i := range plans {
				var err error
				if plans[i], err = s.PlanSession(ctx, in(fmt.Sprintf("g%d", i), 10)); err != nil {
					t.Fatal(err)
				}
			}
			started, release := make(chan struct{}), make(chan struct{})
			var sizes []int
			var mu sync.Mutex
			groupHook = func(n int) {
				mu.Lock()
				sizes = append(sizes, n)
				first := len(sizes) == 1
				mu.Unlock()
				if first {
					close(started)
					<-release
				}
			}
			t.Cleanup(func() { groupHook = nil })
			blocker := make(chan error, 1)
			go func() { _, err := s.PlanSession(ctx, in("first", 10)); blocker <- err }()
			<-started
			var wg sync.WaitGroup
			errsOf := make([]error, 24)
			for i := 0; i < 24; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					switch g := i % 3; {
					case g == 0: // a good commit
						_, errsOf[i] = s.CommitSession(ctx, CommitInput{Session: fmt.Sprintf("g%d", i/3), PlanID: plans[i/3].ID, Written: true, Now: time.Now()})
					case g == 1: // a commit of a plan that does not exist
						_, errsOf[i] = s.CommitSession(ctx, CommitInput{Session: fmt.Sprintf("g%d", i/3), PlanID: 1 << 40, Now: time.Now()})
					default: // a plan of a new session
						_, errsOf[i] = s.PlanSession(ctx, in(fmt.Sprintf("n%d", i), 7))
					}
				}(i)
			}
			// Operations that write and then fail: their savepoint takes
			// the write back, and only theirs.
			ghostErr := errs.New(errs.ErrBadRequest, "ghost")
			for i := 0; i < 3; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					err := s.groupTx(ctx, func(tx *sql.Tx) error {
						if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO kv_sessions (id, model, tokens, last_used, created, file_seq) VALUES (?, 'm', 0, 0, 0, 0)`),
							fmt.Sprintf("ghost-%d", i)); err != nil {
							return err
						}
						if i == 2 {
							panic("ghost") // answered as an error of this operation alone
						}
						return ghostErr
					})
					if i == 2 && errors.Is(err, errs.ErrInternal) {
						return
					}
					if !errors.Is(err, ghostErr) {
						t.Errorf("ghost %d answered %v", i, err)
					}
				}(i)
			}
			// An operation whose caller gives up while it waits is not run.
			cctx, cancel := context.WithCancel(ctx)
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := s.groupTx(cctx, func(tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, s.q(`INSERT INTO kv_sessions (id, model, tokens, last_used, created, file_seq) VALUES ('ghost-c', 'm', 0, 0, 0, 0)`))
					return err
				})
				if !errors.Is(err, context.Canceled) {
					t.Errorf("an operation cancelled while queued answered %v", err)
				}
			}()
			for { // every operation queued behind the held transaction
				s.group.mu.Lock()
				n := len(s.group.queue)
				s.group.mu.Unlock()
				if n == 28 {
					break
				}
				runtime.Gosched()
			}
			cancel()
			close(release)
			wg.Wait()
			if err := <-blocker; err != nil {
				t.Fatal(err)
			}
			if len(sizes) < 2 || sizes[1] != 28 {
				t.Fatalf("batches %v: the 28 queued operations did not run as one transaction", sizes)
			}
			for i, err := range errsOf {
				if i%3 == 1 {
					if !errors.Is(err, errs.ErrNotFound) {
						t.Fatalf("op %d: commit of no plan answered %v", i, err)
					}
				} else if err != nil {
					t.Fatalf("op %d: %v", i, err)
				}
			}
			for i := range plans {
				sess, err := s.Session(ctx, fmt.Sprintf("g%d", i))
				if err != nil || sess.Tokens != 10 || len(sess.Ranges) != 1 {
					t.Fatalf("g%d after its commit: %+v, %v", i, sess, err)
				}
			}
			for i := 2; i < 24; i += 3 {
				if _, err := s.Session(ctx, fmt.Sprintf("n%d", i)); err != nil {
					t.Fatalf("n%d planned in the batch: %v", i, err)
				}
			}
			for _, g := range []string{"ghost-0", "ghost-1", "ghost-2", "ghost-c"} {
				if _, err := s.Session(ctx, g); !errors.Is(err, errs.ErrNotFound) {
					t.Fatalf("%s, written by an operation that failed or was cancelled, is there: %v", g, err)
				}
			}
			tx, err := s.db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			if err := s.invariantsTx(ctx, tx); err != nil {
				t.Fatal(err)
			}
		})
	}
}
