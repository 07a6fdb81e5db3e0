package master

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/meta"
	"github.com/gd2fs/gd2fs/internal/testutil"
)

// heldKVSave is a metadata store whose KV history saves wait, once armed,
// until release is closed: a store slow under load, as the one beside
// TestKVMembershipUnderLoad was.
type heldKVSave struct {
	meta.Store
	armed   *atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (h heldKVSave) SaveKVHistory(ctx context.Context, b []byte) error {
	if h.armed.Load() {
		select {
		case h.entered <- struct{}{}:
		default:
		}
		select {
		case <-h.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return h.Store.SaveKVHistory(ctx, b)
}

func members(t *testing.T, m *Master) api.Membership {
	t.Helper()
	code, body := call(t, m, "GET", "/v1/members", "")
	var ms api.Membership
	if err := json.Unmarshal([]byte(body), &ms); code != 200 || err != nil {
		t.Fatalf("GET /v1/members: %d %s %v", code, body, err)
	}
	return ms
}

// threeMembers runs a master on a SQLite store that wrap wraps (cfg's
// Meta and Listen are set here), makes s1, s2 and s3 members by their
// heartbeats, and returns it with its membership map.
func threeMembers(t *testing.T, cfg Config, wrap func(meta.Store) meta.Store) (*Master, api.Membership) {
	t.Helper()
	ctx := context.Background()
	ms, err := meta.Open(ctx, "sqlite://"+filepath.Join(t.TempDir(), "meta.db"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen, cfg.Meta = "127.0.0.1:0", wrap(ms)
	m, err := New(ctx, cfg)
	if err != nil {
		ms.Close()
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { m.Run(rctx); close(done) }()
	t.Cleanup(func() { cancel(); m.Close(); <-done; ms.Close() })
	for _, id := range []string{"s1", "s2", "s3"} {
		beat(t, m, id)
	}
	before := members(t, m)
	if len(before.Members) != 3 {
		t.Fatalf("members before the drain: %+v", before)
	}
	return m, before
}

// TestMemberListChangesWithEpoch: a membership map never shows a new member
// list under the epoch of an earlier one. Servers compare epochs to learn
// that the map changed (a peer's held request with a newer epoch makes a
// server fetch the map, and from then on it answers "moved" to clients with
// the old one); a list changed under the same epoch leaves the old owner
// serving keys whose blocks the new owner is moving away, and the client
// sees a miss. A drain marks the server, saves the history and only then
// bumps the epoch: with the save held, the map must still be the old list
// at the old epoch.
func TestMemberListChangesWithEpoch(t *testing.T) {
	var armed atomic.Bool
	store := heldKVSave{armed: &armed, entered: make(chan struct{}, 1), release: make(chan struct{})}
	m, before := threeMembers(t, Config{}, func(ms meta.Store) meta.Store { store.Store = ms; return store })
	var released atomic.Bool
	release := func() {
		if released.CompareAndSwap(false, true) {
			close(store.release)
		}
	}
	t.Cleanup(release) // before the master closes (cleanups run last first)
	armed.Store(true)
	drained := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest("POST", m.URL()+"/v1/servers/s1/drain", strings.NewReader(""))
		req.Header.Set("Content-Type", "application/json") // as call, which may not run here (t.Fatal)
		req.Header.Set(api.RoleHeader, "server")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			drained <- 0
			return
		}
		resp.Body.Close()
		drained <- resp.StatusCode
	}()
	select {
	case <-store.entered:
	case code := <-drained:
		t.Fatalf("the drain answered %d without saving the history", code)
	case <-time.After(30 * time.Second):
		t.Fatal("the drain did not save the history")
	}
	// The drain is marked and its save held: the epoch is not bumped yet.
	during := members(t, m)
	if !slices.Equal(during.Members, before.Members) && during.Epoch <= before.Epoch {
		t.Fatalf("the member list changed from %v to %v under epoch %d", before.Members, during.Members, during.Epoch)
	}
	release()
	if code := <-drained; code != 200 {
		t.Fatalf("drain: %d", code)
	}
	after := members(t, m)
	if len(after.Members) != 2 || after.Epoch <= before.Epoch {
		t.Fatalf("after the drain: epoch %d (before %d), members %v", after.Epoch, before.Epoch, after.Members)
	}
	if len(after.Previous) == 0 || !slices.Equal(after.Previous[0].Members, before.Members) {
		t.Fatalf("after the drain: previous %+v, want the 3 members first", after.Previous)
	}
}

// failingBump is a metadata store whose epoch bumps fail while armed (a
// store error, or a caller's cancelled context).
type failingBump struct {
	meta.Store
	armed *atomic.Bool
}

func (f failingBump) BumpEpoch(ctx context.Context) (int64, error) {
	if f.armed.Load() {
		return 0, errors.New("test: the epoch bump fails")
	}
	return f.Store.BumpEpoch(ctx)
}

// TestHeldMemberListIsShownAfterAFailedBump: a drain whose epoch bump fails
// (it is only logged) leaves the new member list held back; it must not stay
// held until some other change bumps the epoch. Repeating the drain is no
// change, so nothing else would bump it: the drained server stayed a member
// for good and gd2fs server drain waited for ever. The master bumps the
// epoch itself at the next heartbeat.
func TestHeldMemberListIsShownAfterAFailedBump(t *testing.T) {
	var armed atomic.Bool
	// No server is declared down (another bump) however slow the machine.
	m, before := threeMembers(t, Config{DownAfter: time.Hour}, func(ms meta.Store) meta.Store { return failingBump{Store: ms, armed: &armed} })
	armed.Store(true)
	want(t, m, 200, "POST", "/v1/servers/s1/drain", "")
	want(t, m, 200, "POST", "/v1/servers/s1/drain", "") // no change: no bump
	during := members(t, m)
	if !slices.Equal(during.Members, before.Members) && during.Epoch <= before.Epoch {
		t.Fatalf("the member list changed from %v to %v under epoch %d", before.Members, during.Members, during.Epoch)
	}
	armed.Store(false)
	beat(t, m, "s2")
	// The saver bumps the epoch in the background; then the map shows the
	// new list (nothing else bumps it: no server changes).
	testutil.Eventually(t, 30*time.Second, func() (bool, string) {
		after := members(t, m)
		if len(after.Members) != 2 || after.Epoch <= before.Epoch {
			return false, fmt.Sprintf("epoch %d (before %d), members %v: the drained server stays in the member list", after.Epoch, before.Epoch, after.Members)
		}
		return true, ""
	})
}
