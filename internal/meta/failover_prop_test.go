package meta

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/errs"
)

// TestSessionPropertyFailover is the property test across changes of
// leader: two masters on one store (a PostgreSQL schema),
// both in window mode (plans and commits answered from memory before they
// are written), with a quarter of the flushes failing as well. Every
// switchEvery calls the leader loses its lock without noticing (its
// process goes on, its lead term unchanged) and the other takes the lead;
// a quarter of the calls after that still go to the old one, which answers
// from its memory until its next flush finds the newer term, then works
// from SQL. What a stale leader answered and lost must read as a shorter
// or older stored range, never as bytes of another conversation: every
// stored range a plan hands out, from either master, is checked byte for
// byte, and a rival of a commit in the store must fail on either master.
//
// PostgreSQL only: there a leader's lock is a connection's, which can drop
// while its process goes on. A SQLite master's lock is its process's own
// flock, so a SQLite master is never a stale leader (and two masters
// writing one SQLite file would mostly meet SQLITE_BUSY).
func TestSessionPropertyFailover(t *testing.T) {
	engs := map[string]func(t *testing.T) Store{}
	for name, dsn := range sharedDSNs {
		if name != "postgres" {
			continue
		}
		engs[name+"-failover"] = func(t *testing.T) Store {
			d := dsn(t)
			f := &failover{a: openShared(t, d), b: openShared(t, d), switchEvery: 400, r: rand.New(rand.NewPCG(uint64(len(name)), 3))}
			for _, s := range []*sqlStore{f.a, f.b} {
				if err := s.SetSessionDurability(DurabilityWindow); err != nil {
					t.Fatal(err)
				}
			}
			if ok, err := f.a.Lead(context.Background(), "http://a"); !ok || err != nil {
				t.Fatalf("a does not lead: %v %v", ok, err)
			}
			f.Store = f.a
			t.Cleanup(func() {
				f.mu.Lock()
				defer f.mu.Unlock()
				t.Logf("%d changes of leader, %d calls to a stale leader", f.switches, f.stale)
				if f.switches == 0 || f.stale == 0 {
					t.Errorf("the traffic saw %d changes of leader and %d calls to a stale one", f.switches, f.stale)
				}
			})
			return f
		}
	}
	propertyRuns(t, engs, 120, 9, true, nil, nil)
}

// failover routes the property test's calls to the leader of two masters
// on one store, changing leader every switchEvery calls; a quarter of the
// calls go to the other, the old leader until it noticed, by then a
// follower that works from SQL. Methods it does not route go to a.
type failover struct {
	Store
	a, b        *sqlStore
	switchEvery int

	mu       sync.Mutex
	r        *rand.Rand
	calls    int
	leader   int // 0: a, 1: b
	switches int
	stale    int
}

func (f *failover) pick() Store {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	both := [2]*sqlStore{f.a, f.b}
	if f.calls%f.switchEvery == 0 {
		// The leader's lock goes (its process does not notice: its term
		// stays), and the other takes the lead and a new term. First the
		// old leader's logs are written, so that its memory is still on
		// when its next call comes: it answers that from memory.
		old := both[f.leader]
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := old.barrier(ctx); err != nil && !errors.Is(err, errs.ErrUnavailable) {
			panic("the leader's log: " + err.Error())
		}
		old.lead.release()
		f.leader = 1 - f.leader
		if ok, err := both[f.leader].Lead(ctx, "http://new"); !ok || err != nil {
			panic("the standby does not take the lead: " + errString(err))
		}
		f.switches++
	}
	if f.switches > 0 && f.r.IntN(4) == 0 {
		f.stale++
		return both[1-f.leader]
	}
	return both[f.leader]
}

func errString(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}

func (f *failover) CreateFile(ctx context.Context, x File) (File, error) {
	return f.pick().CreateFile(ctx, x)
}
func (f *failover) File(ctx context.Context, path string) (File, error) {
	return f.pick().File(ctx, path)
}
func (f *failover) Commit(ctx context.Context, fileID int64, size int64, lengths map[int64]int64, seal bool, now time.Time) (File, error) {
	return f.pick().Commit(ctx, fileID, size, lengths, seal, now)
}
func (f *failover) PutLayout(ctx context.Context, l Layout) error { return f.pick().PutLayout(ctx, l) }
func (f *failover) PutPrefix(ctx context.Context, p Prefix) error { return f.pick().PutPrefix(ctx, p) }
func (f *failover) PlanSession(ctx context.Context, in PlanInput) (Plan, error) {
	return f.pick().PlanSession(ctx, in)
}
func (f *failover) CommitSession(ctx context.Context, in CommitInput) (Session, error) {
	return f.pick().CommitSession(ctx, in)
}
func (f *failover) ForkSession(ctx context.Context, src, dst, requestID string, now time.Time) error {
	return f.pick().ForkSession(ctx, src, dst, requestID, now)
}
func (f *failover) DeleteSession(ctx context.Context, id string) error {
	return f.pick().DeleteSession(ctx, id)
}
func (f *failover) Session(ctx context.Context, id string) (Session, error) {
	return f.pick().Session(ctx, id)
}
