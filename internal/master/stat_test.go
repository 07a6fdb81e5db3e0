package master

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/internal/meta"
)

// removingStore removes the file being looked up between the master's
// reading of the file and of its chunks, once armed: the race a client's
// stat can lose to another client's remove.
type removingStore struct {
	meta.Store
	path  string
	armed atomic.Bool
}

func (s *removingStore) Chunks(ctx context.Context, fileID int64) ([]meta.Chunk, error) {
	if s.armed.CompareAndSwap(true, false) {
		if err := s.Store.RemoveFile(ctx, s.path); err != nil {
			return nil, err
		}
	}
	return s.Store.Chunks(ctx, fileID)
}

// TestStatRacingRemove: a stat that loses the race to a remove answers not
// found, never the file's size with no chunks (which a client reads as
// zeros where the data was).
func TestStatRacingRemove(t *testing.T) {
	ctx := context.Background()
	ms, err := meta.Open(ctx, "sqlite://"+filepath.Join(t.TempDir(), "meta.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	rs := &removingStore{Store: ms, path: "/race/f"}
	m, err := New(ctx, Config{Listen: "127.0.0.1:0", Meta: rs, Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	go m.Run(ctx)
	if err := ms.Mkdir(ctx, "/race", time.Now()); err != nil {
		t.Fatal(err)
	}
	f, err := ms.CreateFile(ctx, meta.File{Path: "/race/f", Pool: "perf", ChunkSize: 1 << 20, Modified: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ms.AddChunks(ctx, f.ID, []meta.Chunk{{Index: 0, Replicas: []string{"s1"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ms.Commit(ctx, f.ID, 1000, map[int64]int64{0: 1000}, false, time.Now()); err != nil {
		t.Fatal(err)
	}
	if code, body := call(t, m, "GET", "/v1/files/race/f", ""); code != http.StatusOK || !strings.Contains(body, `"size":1000`) {
		t.Fatalf("stat before the race: %d %s", code, body)
	}
	rs.armed.Store(true)
	if code, body := call(t, m, "GET", "/v1/files/race/f", ""); code != http.StatusNotFound {
		t.Fatalf("stat racing a remove: %d %s; want 404, not a size without chunks", code, body)
	}
}
