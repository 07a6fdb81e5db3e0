package master

import (
	"context"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/internal/meta"
)

// TestUnsealedExpiry: an unsealed file nothing wrote to for UnsealedTTL is
// removed; an allocation of new chunks counts as a write (the writer is
// alive), so a writer that allocates keeps its file however old its
// create; a sealed file stays; a negative TTL turns the expiry off.
func TestUnsealedExpiry(t *testing.T) {
	m := startMaster(t, Config{Token: testToken, UnsealedTTL: time.Hour})
	heartbeatAs(t, m, "s1", "127.0.0.1:1")
	ctx := context.Background()
	old := time.Now().UTC().Add(-3 * time.Hour)
	for _, p := range []string{"/dead", "/writing", "/sealed"} {
		if _, err := m.meta.CreateFile(ctx, meta.File{Path: p, Pool: "perf", ChunkSize: 65536, Modified: old}); err != nil {
			t.Fatal(err)
		}
	}
	f, _ := m.meta.File(ctx, "/sealed")
	if _, err := m.meta.Commit(ctx, f.ID, 0, nil, true, old); err != nil {
		t.Fatal(err)
	}
	want(t, m, 200, "POST", "/v1/alloc/writing", `{"indexes":[0]}`)
	n, err := m.ExpireUnsealed(ctx, time.Now())
	if err != nil || n != 1 {
		t.Fatalf("expired %d (%v), want 1", n, err)
	}
	want(t, m, 404, "GET", "/v1/files/dead", "")
	want(t, m, 200, "GET", "/v1/files/writing", "")
	want(t, m, 200, "GET", "/v1/files/sealed", "")
	// Past the TTL after its last allocation, the writing file goes too.
	if n, err := m.ExpireUnsealed(ctx, time.Now().Add(2*time.Hour)); err != nil || n != 1 {
		t.Fatalf("expired %d (%v), want 1", n, err)
	}

	off := startMaster(t, Config{Token: testToken, UnsealedTTL: -1})
	if _, err := off.meta.CreateFile(ctx, meta.File{Path: "/dead", Pool: "perf", ChunkSize: 65536, Modified: old}); err != nil {
		t.Fatal(err)
	}
	if n, err := off.ExpireUnsealed(ctx, time.Now()); err != nil || n != 0 {
		t.Fatalf("with the expiry off: expired %d (%v)", n, err)
	}
}
