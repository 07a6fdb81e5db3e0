package server

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/internal/master"
	"github.com/gd2fs/gd2fs/internal/meta"
	"github.com/gd2fs/gd2fs/internal/store"
	"github.com/gd2fs/gd2fs/internal/testutil"
	"github.com/gd2fs/gd2fs/internal/version"
)

func probe(t *testing.T, s *Server, path string) (int, string) {
	code, body, _ := testutil.Get(t, "http://"+s.Addr()+path)
	return code, body
}

func serverReady(t *testing.T, s *Server) (int, readiness) {
	t.Helper()
	code, body := probe(t, s, "/readyz")
	var r readiness
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatalf("/readyz: %d %q: %v", code, body, err)
	}
	return code, r
}

// TestServerReadiness: a server is live at once, ready only once a leading
// master took its heartbeat, and not ready again when the master is gone
// for longer than three heartbeats. /metrics carries gd2fs_build_info.
func TestServerReadiness(t *testing.T) {
	ctx := context.Background()
	ms, err := meta.Open(ctx, "sqlite://"+filepath.Join(t.TempDir(), "meta.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	m, err := master.New(ctx, master.Config{Listen: "127.0.0.1:0", Meta: ms})
	if err != nil {
		t.Fatal(err)
	}
	mctx, stopMaster := context.WithCancel(ctx)
	mdone := make(chan struct{})
	// Not run yet: the server's first heartbeats find the port open and
	// nobody answering (the listener is not served until Run).
	s, err := New(Config{Listen: "127.0.0.1:0", Master: m.URL(), Heartbeat: 100 * time.Millisecond, Store: store.Config{MemBytes: 16 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	go s.Run(ctx)
	defer s.Close()
	if code, body := probe(t, s, "/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	if code, r := serverReady(t, s); code != 503 || r.Ready || !strings.Contains(r.Reason, "not registered yet") {
		t.Fatalf("/readyz before any master answered: %d %+v", code, r)
	}
	go func() { m.Run(mctx); close(mdone) }()
	testutil.Eventually(t, 30*time.Second, func() (bool, string) {
		code, r := serverReady(t, s)
		return code == 200 && r.Ready && r.ID == s.ID() && r.Version == version.Get().Version, r.Reason
	})
	if _, body := probe(t, s, "/metrics"); !strings.Contains(body, `gd2fs_build_info{commit="`+version.Get().Short()+`"`) {
		t.Fatal("/metrics has no gd2fs_build_info")
	}
	stopMaster()
	m.Close()
	<-mdone
	testutil.Eventually(t, 30*time.Second, func() (bool, string) {
		code, r := serverReady(t, s)
		return code == 503 && strings.Contains(r.Reason, "no heartbeat accepted"), r.Reason
	})
	if code, _ := probe(t, s, "/healthz"); code != 200 {
		t.Fatalf("/healthz without a master: %d (liveness must not depend on the master)", code)
	}
}

// A server without a master is ready once it accepts connections.
func TestStandaloneReady(t *testing.T) {
	s, err := New(Config{Listen: "127.0.0.1:0", Store: store.Config{MemBytes: 16 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	go s.Run(context.Background())
	defer s.Close()
	if code, r := serverReady(t, s); code != 200 || !r.Ready {
		t.Fatalf("standalone /readyz: %d %+v", code, r)
	}
}
